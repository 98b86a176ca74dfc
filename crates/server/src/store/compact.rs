//! Compaction: a journal appended to for long holds mostly records of slices
//! since evicted and metadata since refreshed. Once it holds more than twice
//! its directory's live records, it is rewritten with only those (in a
//! temporary file, synced, renamed over it), so that replay at open stays
//! proportional to what the store holds. A growing cache's journal holds
//! mostly live records; it is rewritten too once more than half of it lies
//! after the part its shard map describes, so that a start after a crash never
//! reads more than half of it before it serves (the rewrites cost twice the
//! journal's final size in all).
//!
//! The records are written shard by shard, after a token record, and a shard
//! map ([`shardmap`]) saying where each shard's block starts is written once
//! the journal is in place: the next start reads a shard's block only when a
//! lookup needs it. The server also compacts at a clean stop when much was
//! appended since ([`tail_worth_compacting`]), so that its next start is quick.
//!
//! The rewrite holds the journal's lock throughout: appends to that directory
//! (fills, not hits) wait for it. Changes to the index take a shard lock and
//! then append, never the other way round, so a change is either in the index
//! the rewrite walks or appended after it; both at worst (a duplicate, which
//! replay applies twice to the same effect).

use super::journal::{Record, Rewrite};
use super::shardmap::{self, ShardMap};
use super::{key_hash, lock, Shared, StoreError};

/// Journals shorter than this are left alone: rewriting them gains nothing.
const MIN_LINES: u64 = 1024;

/// Whether a journal of `lines` lines, `sorted` of them described by its shard
/// map, whose directory holds `live` records, should be rewritten.
pub(super) fn needed(lines: u64, sorted: u64, live: u64) -> bool {
    lines >= MIN_LINES && (lines > 2 * live || lines - sorted.min(lines) > sorted)
}

/// Whether a journal has enough lines past its compacted part (`sorted`) that a
/// start would spend noticeable time reading them.
pub(super) fn tail_worth_compacting(lines: u64, sorted: u64) -> bool {
    lines.saturating_sub(sorted) >= MIN_LINES
}

/// Rewrites directory `dir`'s journal when [`needed`] (or always, when
/// `force`); returns its lines when it did.
pub(super) fn compact(s: &Shared, dir: usize, force: bool) -> Result<Option<u64>, StoreError> {
    let d = &s.dirs[dir];
    if !d.writable(s.now_ms()) {
        return Ok(None);
    }
    let mut journal = lock(&d.journal);
    if !force && !needed(journal.lines, journal.sorted_lines, d.live_records()) {
        return Ok(None);
    }
    let failed = |e| d.failed(e, s.now_ms(), s.retry);
    // A leftover of this run's last failed attempt.
    let _ = std::fs::remove_file(&journal.tmp);
    let mut w = Rewrite::create(journal.tmp.clone()).map_err(failed)?;
    // Unique to this rewrite: the map names it.
    let token = key_hash(format!("{}.{}.{}", s.run, dir, s.next_seq()).as_bytes());
    if let Err(e) = w.push(&shardmap::token_record(token)) {
        w.abandon();
        return Err(failed(e));
    }
    let mut offsets = Vec::with_capacity(s.shards.len() + 1);
    let mut max_seq = 0;
    for k in 0..s.shards.len() {
        offsets.push(w.bytes);
        let shard = s.shard_at(k);
        for (key, e) in shard.objects.iter().filter(|(_, e)| e.dir == dir) {
            let object = Record::Object { seq: e.seq, key: *key, gen: e.gen, meta: e.meta.clone() };
            let slices = e.slices.iter().map(|(&index, sl)| Record::Slice {
                seq: sl.seq,
                key: *key,
                gen: e.gen,
                index,
                file: sl.file,
            });
            for r in std::iter::once(object).chain(slices) {
                max_seq = max_seq.max(r.seq());
                if let Err(e) = w.push(&r) {
                    w.abandon();
                    return Err(failed(e));
                }
            }
        }
    }
    offsets.push(w.bytes);
    let id = w.file_id();
    let map = id.map(|(dev, ino)| ShardMap { dev, ino, token, sorted_end: w.bytes, lines: w.lines, max_seq, offsets });
    let before = journal.lines;
    let lines = w.finish(&journal.path).map_err(failed)?;
    // The journal is complete and in place: now the map may name it. Without
    // one (it failed), the next start reads the whole journal; the failure marks
    // the directory like any failed write, which also keeps the growing-journal
    // rule from rewriting it again at once.
    let mapped = match map.and_then(|m| m.write(&shardmap::path(&d.path), &journal.tmp.with_extension("shards"))) {
        Ok(()) => lines,
        Err(e) => {
            tracing::warn!(dir = %d.path.display(), "cache shard map not written (the next start reads the whole journal): {e}");
            let _ = failed(e);
            0
        }
    };
    journal.replaced(lines, mapped);
    tracing::debug!(dir = %d.path.display(), "journal compacted from {before} to {lines} lines");
    Ok(Some(lines))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_is_rewritten_past_twice_its_live_records() {
        assert!(!needed(2048, 2048, 1024), "exactly twice");
        assert!(needed(2049, 2049, 1024));
        assert!(needed(1024, 1024, 0));
        assert!(!needed(1023, 0, 0), "too short to bother");
    }

    #[test]
    fn a_growing_journal_is_rewritten_once_half_of_it_is_past_its_map() {
        assert!(needed(1024, 0, 1024), "no map yet");
        assert!(!needed(1023, 0, 1023), "too short to bother");
        assert!(!needed(4000, 2000, 4000), "exactly half");
        assert!(needed(4001, 2000, 4001));
    }
}
