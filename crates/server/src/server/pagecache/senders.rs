//! Who is sending which window of which file, across all workers: the rule that
//! makes a page-cache drop safe.
//!
//! Page-cache admission drops the pages of a file outside the kept set once they
//! have been sent. Another viewer, on this worker or another, may be sending the
//! same window at that moment (a slow viewer can take seconds over one window);
//! evicting it under them makes their `sendfile` read the disk on the worker's
//! thread, stalling every viewer of that worker. So:
//!
//! 1. A connection registers before it checks a window's residency and sends it
//!    ([`Senders::begin`]), and deregisters when that window is out
//!    ([`Sender::finish`]). Registering first means that no drop can come between
//!    its check and its send.
//! 2. A window is dropped only when its last sender is done, [`DROP_DELAY`] later,
//!    and only if nobody began sending it meanwhile (a generation number per
//!    window says so). The drop runs under the window's shard lock, so nobody can
//!    register between the "is anyone sending?" test and the eviction.
//! 3. Each dropped window remembers when it was dropped for [`TRUST_RESIDENT`], the
//!    time a worker trusts its own memo of a window found resident: a sender whose
//!    memo predates the drop checks the page cache again instead of trusting it.
//!
//! Pages the kernel reclaims by itself (memory pressure) are caught by the check
//! each window gets just before it is sent: at most one window's send, begun while
//! resident, can meet a page reclaimed halfway through it.
//!
//! The table is sharded by window so that workers sending different windows do not
//! meet on one lock; each send of a window takes its shard's lock twice, for a
//! hash-map update.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::residency::TRUST_RESIDENT;
use super::{lock, Window};

/// How long after the last sender of a window outside the kept set is done its
/// pages are dropped: the socket (plain `sendfile`, kernel TLS) still refers to
/// the pages it has not yet handed to the client, and the kernel does not drop a
/// page in use.
pub(super) const DROP_DELAY: Duration = Duration::from_millis(250);

const SHARDS: usize = 64;

fn shard_of(w: &Window) -> usize {
    let h = w.ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ w.index.wrapping_mul(0xC2B2_AE3D_27D4_EB4F) ^ w.dev;
    (h >> 32) as usize % SHARDS
}

#[derive(Default)]
struct Entry {
    senders: u32,
    /// Bumped by every sender that begins: a drop scheduled before it is void.
    generation: u64,
    /// The bytes sent since the last drop, to drop when the last sender is done.
    sent: Option<(u64, u64)>,
    /// The last sender to finish asked for a drop (its file is not kept).
    wants_drop: bool,
    dropped_at: Option<Instant>,
}

impl Entry {
    fn idle(&self, now: Instant) -> bool {
        self.senders == 0
            && !self.wants_drop
            && self.dropped_at.is_none_or(|t| now.saturating_duration_since(t) >= TRUST_RESIDENT)
    }
}

#[derive(Default)]
struct Shard {
    windows: HashMap<Window, Entry>,
    /// Idle entries are swept out when the map grows past this.
    sweep_at: usize,
}

/// The table, shared by every worker through the fill pool.
pub(super) struct Senders {
    shards: Box<[Mutex<Shard>]>,
}

impl Default for Senders {
    fn default() -> Senders {
        Senders { shards: (0..SHARDS).map(|_| Mutex::default()).collect() }
    }
}

/// A drop to run [`DROP_DELAY`] after the last sender of a window finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PendingDrop {
    pub window: Window,
    generation: u64,
}

impl Senders {
    /// Registers a sender of `window`, before its residency is checked. The
    /// answer says when the window was last dropped, if that was recent: a
    /// worker's memo of it from before then is out of date.
    pub(super) fn begin(&self, window: Window, now: Instant) -> Sender<'_> {
        let mut shard = lock(&self.shards[shard_of(&window)]);
        if shard.windows.len() >= shard.sweep_at {
            shard.windows.retain(|_, e| !e.idle(now));
            shard.sweep_at = (shard.windows.len() * 2).max(64);
        }
        let e = shard.windows.entry(window).or_default();
        e.senders += 1;
        e.generation += 1;
        let dropped_at = e.dropped_at.filter(|t| now.saturating_duration_since(*t) < TRUST_RESIDENT);
        Sender { table: self, window, dropped_at, done: false }
    }

    /// Runs `drop` on the window's bytes sent since its last drop, if it is still
    /// idle since `pending` was scheduled; the eviction happens under the shard's
    /// lock, so no sender can begin in between. Returns what `drop` returned.
    pub(super) fn drop_if_idle(&self, pending: PendingDrop, now: Instant, drop: impl FnOnce(u64, u64) -> u64) -> u64 {
        let mut shard = lock(&self.shards[shard_of(&pending.window)]);
        let Some(e) = shard.windows.get_mut(&pending.window) else { return 0 };
        if e.senders > 0 || e.generation != pending.generation || !e.wants_drop {
            return 0;
        }
        e.wants_drop = false;
        let Some((from, to)) = e.sent.take() else { return 0 };
        e.dropped_at = Some(now);
        drop(from, to - from)
    }

    fn end(&self, window: Window, sent: (u64, u64), keep: bool, now: Instant) -> Option<PendingDrop> {
        let mut shard = lock(&self.shards[shard_of(&window)]);
        let e = shard.windows.get_mut(&window)?;
        e.senders = e.senders.saturating_sub(1);
        e.sent = Some(e.sent.map_or(sent, |(a, b)| (a.min(sent.0), b.max(sent.1))));
        // The last sender's view of the kept set is the newest one.
        e.wants_drop = !keep;
        if e.senders > 0 || keep {
            if e.idle(now) {
                shard.windows.remove(&window);
            }
            return None;
        }
        Some(PendingDrop { window, generation: e.generation })
    }

    fn abandon(&self, window: Window) {
        let mut shard = lock(&self.shards[shard_of(&window)]);
        if let Some(e) = shard.windows.get_mut(&window) {
            e.senders = e.senders.saturating_sub(1);
        }
    }

    #[cfg(test)]
    fn sending(&self, window: Window) -> u32 {
        lock(&self.shards[shard_of(&window)]).windows.get(&window).map_or(0, |e| e.senders)
    }
}

/// One connection sending one window. [`Sender::finish`] once the window is out;
/// dropped without it (the send failed or the connection went away), it only
/// deregisters, and drops nothing.
pub(crate) struct Sender<'a> {
    table: &'a Senders,
    window: Window,
    dropped_at: Option<Instant>,
    done: bool,
}

impl Sender<'_> {
    /// When the window was dropped, if within [`TRUST_RESIDENT`] of the start.
    pub(crate) fn dropped_at(&self) -> Option<Instant> {
        self.dropped_at
    }

    /// The window's bytes `sent` (`from..to` in the file) are out. With `keep`
    /// false (the file is outside the kept set) and no other sender left, the
    /// answer is the drop to run [`DROP_DELAY`] from now.
    pub(crate) fn finish(mut self, sent: (u64, u64), keep: bool, now: Instant) -> Option<PendingDrop> {
        self.done = true;
        self.table.end(self.window, sent, keep, now)
    }
}

impl Drop for Sender<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.table.abandon(self.window);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Window = Window { dev: 1, ino: 2, index: 3 };

    fn dropper(log: &mut Vec<(u64, u64)>) -> impl FnOnce(u64, u64) -> u64 + '_ {
        move |from, len| {
            log.push((from, len));
            len
        }
    }

    #[test]
    fn the_last_sender_schedules_the_drop_and_an_earlier_one_does_not() {
        let t = Senders::default();
        let now = Instant::now();
        let (a, b) = (t.begin(W, now), t.begin(W, now));
        assert_eq!(t.sending(W), 2);
        assert_eq!(a.finish((100, 200), false, now), None, "B is still sending");
        let pending = b.finish((0, 150), false, now).expect("the last sender schedules a drop");
        let mut log = Vec::new();
        assert_eq!(t.drop_if_idle(pending, now + DROP_DELAY, dropper(&mut log)), 200);
        assert_eq!(log, [(0, 200)], "the union of what both sent");
        assert_eq!(t.drop_if_idle(pending, now + DROP_DELAY, dropper(&mut log)), 0, "dropped once");
    }

    #[test]
    fn a_sender_that_begins_before_the_drop_cancels_it() {
        let t = Senders::default();
        let now = Instant::now();
        let pending = t.begin(W, now).finish((0, 10), false, now).unwrap();
        let c = t.begin(W, now);
        let mut log = Vec::new();
        assert_eq!(t.drop_if_idle(pending, now, dropper(&mut log)), 0, "C is sending");
        // C is done and its file is now kept: nothing is dropped at all.
        assert_eq!(c.finish((0, 10), true, now), None);
        assert_eq!(t.drop_if_idle(pending, now, dropper(&mut log)), 0);
        assert!(log.is_empty());
    }

    #[test]
    fn a_drop_is_remembered_for_as_long_as_a_memo_is_trusted() {
        let t = Senders::default();
        let now = Instant::now();
        let pending = t.begin(W, now).finish((0, 10), false, now).unwrap();
        t.drop_if_idle(pending, now, |_, n| n);
        let later = now + Duration::from_millis(500);
        assert_eq!(t.begin(W, later).dropped_at(), Some(now));
        assert_eq!(t.begin(W, now + TRUST_RESIDENT).dropped_at(), None);
    }

    #[test]
    fn a_failed_send_deregisters_and_drops_nothing() {
        let t = Senders::default();
        let now = Instant::now();
        drop(t.begin(W, now));
        assert_eq!(t.sending(W), 0);
        let other = Window { index: 4, ..W };
        assert_eq!(t.begin(other, now).finish((0, 1), true, now), None);
        // Kept windows leave no entry behind; idle ones are swept as the map grows.
        for i in 0..1000 {
            let w = Window { index: i, ..W };
            t.begin(w, now).finish((0, 1), true, now);
        }
        let total: usize = t.shards.iter().map(|s| lock(s).windows.len()).sum();
        assert!(total < 200, "{total} entries left");
    }
}
