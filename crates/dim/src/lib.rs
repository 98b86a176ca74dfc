//! Dynamic interrupt moderation (DIM): choose a NIC's interrupt-coalescing profile
//! per queue from what the queue is doing, with no hand tuning.
//!
//! How the pieces fit:
//! - a [`ProfileTable`] lists coalescing settings ([`Profile`]: timer in µs and a
//!   frame cap) from least moderation (index 0, lowest latency) to most (fewest
//!   interrupts, least CPU per packet);
//! - a [`Tuner`] is one instance for one queue and one direction. It is fed
//!   cumulative [`Sample`]s (time, packets, bytes, interrupts). Once a window holds
//!   enough interrupts it turns the window into rates ([`WindowStats`]), compares them
//!   with the previous window ([`compare`]: more bytes, then more packets, then fewer
//!   interrupts is better), and takes one step: keep going if things improved, turn
//!   around if not, park when the last turn found the top;
//! - when the index changes, `feed` returns the new profile; the caller programs the
//!   hardware and calls [`Tuner::applied`], and a clean window starts under it.
//!
//! Beyond the algorithm drivers run: counters are 64-bit; a counter that goes down
//! (queue reset) starts a new window; a window that stays idle decays the profile
//! toward low latency ([`TunerConfig::idle_decay_usecs`]); a step that changed
//! nothing parks instead of bouncing ([`TunerConfig::park_when_unchanged`]); and the
//! interrupt rate is computed from the real count, so windows closed by a timer
//! (a user-space controller) measure it as well as windows closed at 64 interrupts.
//!
//! The crate does no I/O: the simulator and the NIC controller in the `linerate`
//! binary drive it.
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]

mod profile;
mod stats;
mod tuner;

pub use profile::{BadTableLen, Direction, Profile, ProfileTable, TimerMode};
pub use stats::{compare, Sample, Verdict, WindowStats};
pub use tuner::{TuneState, Tuner, TunerConfig};
