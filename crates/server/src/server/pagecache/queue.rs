//! The fill threads' work: one queue per NUMA domain, demand fills before
//! read-ahead.

use std::collections::VecDeque;
use std::fs::File;
use std::sync::{Condvar, Mutex};

use super::Window;

/// A window to read into the page cache.
pub(super) struct Job {
    pub key: Window,
    pub file: File,
    pub offset: u64,
    pub len: u64,
}

#[derive(Default)]
pub(super) struct Queue {
    /// Windows a viewer waits for.
    pub demand: VecDeque<Job>,
    /// Windows read ahead for viewers reading on.
    pub ahead: VecDeque<Job>,
}

impl Queue {
    /// Moves the read-ahead of `key`, if it is still waiting, to the back of the
    /// demand queue: a viewer now waits for it. Left among the read-aheads, it would
    /// be taken only once no demand fill is queued, which on a saturated disk can be
    /// never (until the viewer's `fill.timeout`). Returns whether it was moved.
    pub(super) fn promote(&mut self, key: Window) -> bool {
        match self.ahead.iter().position(|job| job.key == key) {
            Some(i) => {
                let job = self.ahead.remove(i).expect("position is in range");
                self.demand.push_back(job);
                true
            }
            None => false,
        }
    }
}

/// A domain's queue and the condition its fill threads sleep on.
pub(super) struct DomainQueue {
    pub jobs: Mutex<Queue>,
    pub ready: Condvar,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_ahead_someone_waits_for_moves_to_the_demand_queue() {
        let file = || File::open("/proc/self/stat").unwrap();
        let key = |index| Window { dev: 1, ino: 2, index };
        let job = |window| Job { key: key(window), file: file(), offset: 0, len: 1 };
        let mut q = Queue::default();
        q.demand.push_back(job(0));
        q.ahead.extend([job(1), job(2), job(3)]);
        assert!(q.promote(key(2)));
        let windows = |d: &VecDeque<Job>| d.iter().map(|j| j.key.index).collect::<Vec<_>>();
        assert_eq!(windows(&q.demand), [0, 2]);
        assert_eq!(windows(&q.ahead), [1, 3]);
        // Already taken by a fill thread, or never queued here: nothing to move.
        assert!(!q.promote(key(2)));
        assert!(!q.promote(key(9)));
    }
}
