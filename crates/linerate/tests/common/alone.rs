//! Tests that measure run alone. The harness runs this binary's tests side by side
//! (one thread per CPU), and a test that times the server (a hot request while a
//! cold one is read, against the same request idle) or measures the machine
//! (loopback Gb/s, memory bandwidth) would measure its neighbours too: on two CPUs,
//! one Chromium start-up or TLS transfer beside it was enough to fail it. Such a
//! test takes [`alone`] first: it waits until no other test holds a [`Share`], and
//! new shares wait until it is done. Whatever puts load on the machine holds a
//! share while it lives: every [`Server`](super::Server), every
//! [`Guarded`](super::Guarded) helper process (downloads, nginx, Chromium, the bench).
//! Load from outside this binary is not held back.

use std::cell::Cell;
use std::sync::{Condvar, Mutex, MutexGuard};

struct Turns {
    /// Shares held, on any thread.
    shares: usize,
    /// Whether a test runs alone.
    alone: bool,
}

static TURNS: Mutex<Turns> = Mutex::new(Turns { shares: 0, alone: false });
static CHANGED: Condvar = Condvar::new();

thread_local! {
    /// Whether this thread's test runs alone: its own servers take no share.
    static ALONE_HERE: Cell<bool> = const { Cell::new(false) };
    /// Shares taken on this thread and not yet given back.
    static HELD_HERE: Cell<usize> = const { Cell::new(0) };
}

fn turns() -> MutexGuard<'static, Turns> {
    TURNS.lock().unwrap_or_else(|e| e.into_inner())
}

/// While it lives, no other test of this binary starts a server or a helper.
pub struct Alone(());

/// Waits until no other test has a server or helper running, and keeps them from
/// starting one until the returned guard is dropped. Take it first thing in the
/// test, and start the test's own servers and helpers on its own thread: one taken
/// before, or on another thread, would wait for the test itself.
pub fn alone() -> Alone {
    assert_eq!(HELD_HERE.get(), 0, "alone() must come before the test's own servers and helpers");
    let mut t = turns();
    while t.alone || t.shares > 0 {
        t = CHANGED.wait(t).unwrap_or_else(|e| e.into_inner());
    }
    t.alone = true;
    ALONE_HERE.set(true);
    Alone(())
}

impl Drop for Alone {
    fn drop(&mut self) {
        ALONE_HERE.set(false);
        turns().alone = false;
        CHANGED.notify_all();
    }
}

/// A server's or helper's place beside the other tests' (see the module's doc).
pub struct Share {
    counted: bool,
    thread: std::thread::ThreadId,
}

/// Waits while another test runs alone, then takes a place. A test that holds one
/// already gets another at once (no test can be alone meanwhile).
pub fn share() -> Share {
    let thread = std::thread::current().id();
    if ALONE_HERE.get() {
        return Share { counted: false, thread };
    }
    let mut t = turns();
    while t.alone {
        t = CHANGED.wait(t).unwrap_or_else(|e| e.into_inner());
    }
    t.shares += 1;
    HELD_HERE.set(HELD_HERE.get() + 1);
    Share { counted: true, thread }
}

impl Drop for Share {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        if std::thread::current().id() == self.thread {
            HELD_HERE.set(HELD_HERE.get() - 1);
        }
        turns().shares -= 1;
        CHANGED.notify_all();
    }
}
