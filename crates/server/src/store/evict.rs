//! Eviction: when a directory's slices outgrow `max_size_bytes`, or its file
//! system's free space falls under `min_free_bytes`, which slices go.
//!
//! The policy is two pure functions, [`bytes_to_evict`] (how much) and
//! [`victims`] (which), tested apart from the pass that applies them.
//!
//! Slices are ranked as the page cache ranks files ([`crate::server::pagecache::admission`]):
//! by demand per byte, the passes over the slice file the admission's estimate
//! counts, so the long tail goes first and the titles everyone watches stay. A
//! file the estimate does not know counts 0 (nobody started it lately); ties
//! go by least recent use. Last of all go the slices a viewer is part-way
//! through ([`super::READER_RETURNS_WITHIN_MS`]): their rest is asked for within
//! seconds, and a fresh slice has no demand counted yet, so without this a cache
//! much smaller than its catalogue evicts slices between a viewer's two requests
//! for them and fetches each one again for its second half.
//!
//! Slices of objects a prefill manifest pinned ([`super::Store::set_pins`]) go
//! after all of those, the manifest's last entries first: pre-positioned titles
//! are kept ahead of the popularity ranking for as long as the manifest lasts.
//!
//! Removing a slice's file while a reader has it open is safe on Linux: the
//! reader keeps its descriptor, and the space returns when it closes it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::{KeyHash, Shared};

/// Past a limit, eviction goes this far under it (1/20: 5%), so that it runs
/// once per burst of fills rather than once per slice.
const HEADROOM_DIVISOR: u64 = 20;

/// Bytes to remove from a directory holding `used` bytes of slices (limit
/// `max`) on a file system with `free` bytes (floor `min_free`): none within
/// both limits; past one, enough to be 5% under it.
pub(super) fn bytes_to_evict(used: u64, max: u64, free: u64, min_free: u64) -> u64 {
    let by_size = if used > max { used - (max - max / HEADROOM_DIVISOR) } else { 0 };
    let by_free = if free < min_free { (min_free + min_free / HEADROOM_DIVISOR).saturating_sub(free) } else { 0 };
    by_size.max(by_free)
}

/// A slice that may be evicted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Candidate {
    pub key: KeyHash,
    pub gen: u64,
    pub index: u64,
    /// Its record: a slice committed anew since is not this one.
    pub seq: u64,
    pub len: u64,
    /// `(dev, ino)` of its file.
    pub file: (u64, u64),
    pub used_ms: i64,
    /// A viewer is part-way through it.
    pub midway: bool,
    /// Its object's rank in the prefill manifest, if pinned.
    pub pin: Option<u32>,
}

/// The slices to remove to free `bytes`: unpinned before pinned; among the
/// unpinned, those no viewer is part-way through before those one is, then the
/// least demand per byte first (a file `density` does not know counts 0), then
/// the least recently used; among the pinned, the manifest's last entries first.
pub(super) fn victims(candidates: Vec<Candidate>, density: &HashMap<(u64, u64), f64>, bytes: u64) -> Vec<Candidate> {
    let mut ranked: Vec<(f64, Candidate)> =
        candidates.into_iter().map(|c| (density.get(&c.file).copied().unwrap_or(0.0), c)).collect();
    ranked.sort_by(|(da, a), (db, b)| {
        a.pin
            .is_some()
            .cmp(&b.pin.is_some())
            .then(b.pin.cmp(&a.pin))
            .then(a.midway.cmp(&b.midway))
            .then(da.total_cmp(db))
            .then(a.used_ms.cmp(&b.used_ms))
    });
    let mut freed = 0;
    ranked
        .into_iter()
        .map(|(_, c)| c)
        .take_while(|c| {
            let more = freed < bytes;
            freed += c.len;
            more
        })
        .collect()
}

/// One look at directory `dir`: measures its free space and, past a limit,
/// removes the slices [`victims`] picks. Returns the bytes evicted.
pub(super) fn pass(s: &Shared, dir: usize) -> u64 {
    // The gauges count only the shards whose records are applied.
    s.load_all();
    let d = &s.dirs[dir];
    let free = match (s.free_bytes)(&d.path) {
        Ok(f) => f,
        Err(e) => {
            tracing::debug!(dir = %d.path.display(), "statvfs: {e}");
            u64::MAX
        }
    };
    d.free_bytes.store(free, Ordering::Relaxed);
    let bytes = bytes_to_evict(d.bytes(), d.max_size_bytes, free, d.min_free_bytes);
    if bytes == 0 {
        return 0;
    }
    let mut candidates = Vec::new();
    let now_ms = super::unix_ms();
    let pins = super::lock(&s.pins).clone();
    for k in 0..s.shards.len() {
        let shard = s.shard_at(k);
        for (key, e) in shard.objects.iter().filter(|(_, e)| e.dir == dir) {
            candidates.extend(e.slices.iter().map(|(&index, sl)| Candidate {
                key: *key,
                gen: e.gen,
                index,
                seq: sl.seq,
                len: sl.file.len,
                file: (sl.file.dev, sl.file.ino),
                used_ms: sl.used_ms,
                midway: sl.midway_until_ms > now_ms,
                pin: pins.get(key).copied(),
            }));
        }
    }
    let density = (s.popularity)();
    let mut evicted = 0;
    let victims = victims(candidates, &density, bytes);
    // Logged at most once a minute (the pass runs every second).
    static PIN_LOGGED_MS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
    let worst = victims.iter().filter_map(|v| v.pin).min();
    if let Some(worst) = worst.filter(|_| now_ms - PIN_LOGGED_MS.load(Ordering::Relaxed) >= 60_000) {
        PIN_LOGGED_MS.store(now_ms, Ordering::Relaxed);
        tracing::warn!(
            dir = %d.path.display(),
            pinned = pins.len(),
            down_to_rank = worst,
            "the prefill manifest's titles do not fit in the cache directory: evicting pinned slices, from the manifest's last entries up"
        );
    }
    for v in victims {
        if let Some(len) = s.drop_slice(&v.key, v.gen, v.index, Some(v.seq), true) {
            d.evictions.fetch_add(1, Ordering::Relaxed);
            d.evicted_bytes.fetch_add(len, Ordering::Relaxed);
            evicted += len;
        }
    }
    evicted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_starts_past_a_limit_and_goes_5_percent_under_it() {
        let gib = 1 << 30;
        // Within both limits: nothing, even at the limit.
        assert_eq!(bytes_to_evict(100 * gib, 100 * gib, 50 * gib, 10 * gib), 0);
        assert_eq!(bytes_to_evict(0, 100 * gib, 10 * gib, 10 * gib), 0);
        // Over the size limit: to 95 GiB.
        assert_eq!(bytes_to_evict(100 * gib + 1, 100 * gib, 50 * gib, 10 * gib), 5 * gib + 1);
        // Under the free-space floor: to 10.5 GiB free.
        assert_eq!(bytes_to_evict(50 * gib, 100 * gib, 9 * gib, 10 * gib), 3 * gib / 2);
        // Both: the larger of the two.
        assert_eq!(bytes_to_evict(101 * gib, 100 * gib, 0, 10 * gib), 21 * gib / 2);
        // No floor set.
        assert_eq!(bytes_to_evict(1, 100, 0, 0), 0);
    }

    fn candidate(n: u8, len: u64, used_ms: i64) -> Candidate {
        Candidate {
            key: [n; 16],
            gen: 1,
            index: n as u64,
            seq: n as u64,
            len,
            file: (1, n as u64),
            used_ms,
            midway: false,
            pin: None,
        }
    }

    #[test]
    fn the_least_demanded_go_first_then_the_least_recently_used() {
        let density = HashMap::from([((1, 1), 5.0), ((1, 2), 0.5), ((1, 3), 0.5), ((1, 9), 9.0)]);
        // 4 and 5 are unknown to the estimate (0), 5 used less recently.
        let all = vec![
            candidate(1, 10, 0),
            candidate(2, 10, 300),
            candidate(3, 10, 200),
            candidate(4, 10, 500),
            candidate(5, 10, 400),
        ];
        let order = |bytes| victims(all.clone(), &density, bytes).iter().map(|c| c.index).collect::<Vec<_>>();
        assert_eq!(order(0), Vec::<u64>::new());
        assert_eq!(order(1), [5]);
        assert_eq!(order(10), [5]);
        assert_eq!(order(11), [5, 4]);
        assert_eq!(order(35), [5, 4, 3, 2]);
        assert_eq!(order(1000), [5, 4, 3, 2, 1]);
    }

    #[test]
    fn a_slice_a_viewer_is_part_way_through_goes_last() {
        // 2 is the least demanded and least recently used, but a viewer is in it.
        let density = HashMap::from([((1, 1), 5.0), ((1, 3), 0.5)]);
        let mut midway = candidate(2, 10, 0);
        midway.midway = true;
        let all = vec![candidate(1, 10, 100), midway, candidate(3, 10, 300)];
        let order = |bytes| victims(all.clone(), &density, bytes).iter().map(|c| c.index).collect::<Vec<_>>();
        assert_eq!(order(10), [3]);
        assert_eq!(order(20), [3, 1]);
        assert_eq!(order(30), [3, 1, 2]);
    }

    #[test]
    fn pinned_slices_go_after_all_others_the_manifest_bottom_first() {
        // 1 and 2 are pinned (ranks 0 and 7); 3 is popular, 4 part-way read.
        let density = HashMap::from([((1, 3), 50.0), ((1, 1), 0.0)]);
        let mut top = candidate(1, 10, 0);
        top.pin = Some(0);
        let mut bottom = candidate(2, 10, 0);
        bottom.pin = Some(7);
        let mut midway = candidate(4, 10, 900);
        midway.midway = true;
        let all = vec![top, bottom, candidate(3, 10, 500), midway, candidate(5, 10, 100)];
        let order = |bytes| victims(all.clone(), &density, bytes).iter().map(|c| c.index).collect::<Vec<_>>();
        assert_eq!(order(10), [5]);
        assert_eq!(order(30), [5, 3, 4], "every unpinned slice first, even a popular or part-way one");
        assert_eq!(order(40), [5, 3, 4, 2], "then the manifest's last entry");
        assert_eq!(order(50), [5, 3, 4, 2, 1]);
    }
}
