//! The per-queue state machine: measure a window, compare it with the last one,
//! step the profile index left or right, park when stepping stops paying off.

use crate::profile::{Profile, ProfileTable};
use crate::stats::{compare, Sample, Verdict, WindowStats};

/// Where the search stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TuneState {
    /// Holding a profile that looked best; leaves as soon as traffic changes.
    ParkedOnTop,
    /// Holding a profile after too many steps without settling; leaves after a
    /// fixed number of windows whatever the traffic does.
    ParkedTired,
    /// Stepping toward more moderation.
    GoingRight,
    /// Stepping toward less moderation.
    GoingLeft,
}

/// Settings of one instance; the defaults match in-driver DIM plus the idle decay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TunerConfig {
    /// Interrupts a window must contain before a decision (64 in drivers).
    pub events_per_window: u64,
    /// A window that lasts this long without reaching `events_per_window` counts as
    /// idle: the profile moves one step left (toward low latency), so the first
    /// packets after a quiet spell are not held by a long timer. `None` keeps the
    /// driver behaviour (no decision at all without interrupts).
    pub idle_decay_usecs: Option<u64>,
    /// While stepping, a window that is neither better nor worse parks the instance
    /// where it is. Drivers turn around instead, which under traffic that does not
    /// react to the profile makes them bounce between two neighbours (a hardware
    /// write per window) until the "tired" limit parks them for a while. `false`
    /// keeps the driver behaviour.
    pub park_when_unchanged: bool,
}

impl TunerConfig {
    /// Exactly the rules drivers use: no idle decay, turn around on "same".
    pub const DRIVER: TunerConfig =
        TunerConfig { events_per_window: 64, idle_decay_usecs: None, park_when_unchanged: false };
}

impl Default for TunerConfig {
    fn default() -> TunerConfig {
        TunerConfig { events_per_window: 64, idle_decay_usecs: Some(1_000_000), park_when_unchanged: true }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The next sample starts a window.
    Start,
    /// A window runs since this sample.
    Measuring(Sample),
    /// A new profile was handed out; samples are ignored until it is in place.
    Applying { previous_index: usize },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Moved,
    OnEdge,
    TooTired,
}

/// One dynamic-interrupt-moderation instance (one queue, one direction).
///
/// Feed it cumulative [`Sample`]s (at the end of each poll in a driver, or on a
/// timer in a user-space controller). When it wants a different profile,
/// [`Tuner::feed`] returns it; program the hardware and call [`Tuner::applied`] (or
/// [`Tuner::apply_failed`]). No sample sequence can make it panic or leave the
/// table: the index is always `< table.len()`.
#[derive(Clone, Debug)]
pub struct Tuner {
    table: ProfileTable,
    config: TunerConfig,
    index: usize,
    state: TuneState,
    steps_left: u32,
    steps_right: u32,
    tired: u32,
    previous: WindowStats,
    phase: Phase,
}

impl Tuner {
    /// Starts at the least-moderated profile (index 0), parked, as drivers do.
    pub fn new(table: ProfileTable, config: TunerConfig) -> Tuner {
        Tuner::starting_at(table, config, 0)
    }

    /// Starts at `index` (clamped to the table), e.g. the profile nearest to what the
    /// hardware is programmed with now.
    pub fn starting_at(table: ProfileTable, config: TunerConfig, index: usize) -> Tuner {
        let index = index.min(table.len() - 1);
        let config = TunerConfig { events_per_window: config.events_per_window.max(1), ..config };
        Tuner {
            table,
            config,
            index,
            state: TuneState::ParkedOnTop,
            steps_left: 0,
            steps_right: 0,
            tired: 0,
            previous: WindowStats::default(),
            phase: Phase::Start,
        }
    }

    pub fn index(&self) -> usize {
        self.index
    }

    pub fn profile(&self) -> Profile {
        self.table.profile(self.index)
    }

    pub fn table(&self) -> &ProfileTable {
        &self.table
    }

    pub fn state(&self) -> TuneState {
        self.state
    }

    /// True between a returned profile and the matching `applied`/`apply_failed`.
    pub fn is_applying(&self) -> bool {
        matches!(self.phase, Phase::Applying { .. })
    }

    fn tired_limit(&self) -> u32 {
        2 * self.table.len() as u32
    }

    /// Takes one sample; returns the profile to program when the decision changed it.
    pub fn feed(&mut self, sample: Sample) -> Option<Profile> {
        let start = match self.phase {
            Phase::Applying { .. } => return None,
            Phase::Start => {
                self.phase = Phase::Measuring(sample);
                return None;
            }
            Phase::Measuring(start) => start,
        };
        if sample.went_back_from(&start) {
            // A counter reset (or a clock that jumped back): the delta means nothing.
            self.phase = Phase::Measuring(sample);
            return None;
        }
        let events = sample.events - start.events;
        if events < self.config.events_per_window {
            return self.decay_if_idle(&start, &sample);
        }
        let stats = WindowStats::between(&start, &sample)?;
        let before = self.index;
        self.decide(&stats);
        if self.index != before {
            self.phase = Phase::Applying { previous_index: before };
            Some(self.profile())
        } else {
            self.phase = Phase::Measuring(sample);
            None
        }
    }

    /// The profile returned by `feed` is now in the hardware: measure afresh under it.
    pub fn applied(&mut self) {
        if self.is_applying() {
            self.phase = Phase::Start;
        }
    }

    /// The profile could not be programmed: go back to the previous index and park
    /// there, so the instance keeps describing what the hardware really does.
    pub fn apply_failed(&mut self) {
        if let Phase::Applying { previous_index } = self.phase {
            self.index = previous_index;
            self.park_on_top();
            self.previous = WindowStats::default();
            self.phase = Phase::Start;
        }
    }

    fn decay_if_idle(&mut self, start: &Sample, sample: &Sample) -> Option<Profile> {
        let idle_usecs = self.config.idle_decay_usecs?;
        if sample.time_usecs - start.time_usecs < idle_usecs {
            return None;
        }
        // Forget the search: when traffic returns, the first window compares with
        // nothing and the search starts over from the decayed profile.
        self.park_on_top();
        self.previous = WindowStats::default();
        if self.index == 0 {
            self.phase = Phase::Measuring(*sample);
            return None;
        }
        let before = self.index;
        self.index -= 1;
        self.phase = Phase::Applying { previous_index: before };
        Some(self.profile())
    }

    fn decide(&mut self, now: &WindowStats) {
        let was = self.state;
        match self.state {
            TuneState::ParkedOnTop => {
                if compare(now, &self.previous) != Verdict::Same {
                    self.leave_parking();
                }
            }
            TuneState::ParkedTired => {
                self.tired = self.tired.saturating_sub(1);
                if self.tired == 0 {
                    self.leave_parking();
                }
            }
            TuneState::GoingRight | TuneState::GoingLeft => {
                let verdict = compare(now, &self.previous);
                if verdict == Verdict::Same && self.config.park_when_unchanged {
                    self.park_on_top();
                    self.previous = *now;
                    return;
                }
                if verdict != Verdict::Better {
                    self.turn();
                }
                if self.is_on_top() {
                    self.park_on_top();
                } else {
                    match self.step() {
                        Step::Moved => {}
                        Step::OnEdge => self.park_on_top(),
                        Step::TooTired => self.park_tired(),
                    }
                }
            }
        }
        // A parked instance keeps comparing with the window it parked on, so slow
        // drift cannot creep past the 10 % threshold one window at a time unnoticed.
        if !(was == TuneState::ParkedOnTop && self.state == TuneState::ParkedOnTop) {
            self.previous = *now;
        }
    }

    fn step(&mut self) -> Step {
        if self.tired >= self.tired_limit() {
            return Step::TooTired;
        }
        match self.state {
            TuneState::GoingRight => {
                if self.index + 1 >= self.table.len() {
                    return Step::OnEdge;
                }
                self.index += 1;
                self.steps_right += 1;
            }
            TuneState::GoingLeft => {
                if self.index == 0 {
                    return Step::OnEdge;
                }
                self.index -= 1;
                self.steps_left += 1;
            }
            TuneState::ParkedOnTop | TuneState::ParkedTired => return Step::OnEdge,
        }
        self.tired += 1;
        Step::Moved
    }

    fn leave_parking(&mut self) {
        self.state = if self.index > 0 { TuneState::GoingLeft } else { TuneState::GoingRight };
        // The outcome does not matter here: a step that cannot be taken leaves the
        // instance moving, and the next window decides again.
        let _ = self.step();
    }

    fn turn(&mut self) {
        match self.state {
            TuneState::GoingRight => {
                self.state = TuneState::GoingLeft;
                self.steps_left = 0;
            }
            TuneState::GoingLeft => {
                self.state = TuneState::GoingRight;
                self.steps_right = 0;
            }
            TuneState::ParkedOnTop | TuneState::ParkedTired => {}
        }
    }

    /// The first step back after a run of two or more in the other direction was an
    /// improvement: the best profile is where we are.
    fn is_on_top(&self) -> bool {
        match self.state {
            TuneState::ParkedOnTop | TuneState::ParkedTired => true,
            TuneState::GoingRight => self.steps_left > 1 && self.steps_right == 1,
            TuneState::GoingLeft => self.steps_right > 1 && self.steps_left == 1,
        }
    }

    fn park_on_top(&mut self) {
        self.state = TuneState::ParkedOnTop;
        self.steps_left = 0;
        self.steps_right = 0;
        self.tired = 0;
    }

    fn park_tired(&mut self) {
        self.state = TuneState::ParkedTired;
        self.steps_left = 0;
        self.steps_right = 0;
        self.tired = self.tired_limit();
    }
}
