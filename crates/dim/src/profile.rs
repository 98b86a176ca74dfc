//! Coalescing profiles and the tables an instance steps through.

use std::fmt;

/// One interrupt-coalescing setting: the NIC raises an interrupt `usecs` after its
/// timer starts, or as soon as `max_frames` completions are pending, whichever comes
/// first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Profile {
    pub usecs: u32,
    pub max_frames: u32,
}

impl Profile {
    pub const fn new(usecs: u32, max_frames: u32) -> Profile {
        Profile { usecs, max_frames }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}us/{}", self.usecs, self.max_frames)
    }
}

/// Which way a queue moves data; each direction of each queue has its own instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    Rx,
    Tx,
}

/// When the hardware starts the coalescing timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimerMode {
    /// The timer starts with the first event after an interrupt (EQE based): the
    /// interrupt comes at most `usecs` after the first packet of a batch.
    FromFirstEvent,
    /// The timer restarts with every completion (CQE based): the interrupt comes
    /// `usecs` after the last packet of a burst, so shorter timers do the same job.
    FromLastEvent,
}

/// Profiles ordered from least moderation (index 0, "left") to most ("right").
///
/// Tables are plain data: a controller may pass its own, e.g. one adapted to a
/// driver that accepts only some timer values. A table holds 1..=[`ProfileTable::MAX_LEN`]
/// profiles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileTable {
    profiles: Vec<Profile>,
}

/// A table that cannot be used: empty or too long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadTableLen(pub usize);

impl fmt::Display for BadTableLen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a profile table needs 1 to {} profiles, this one has {}", ProfileTable::MAX_LEN, self.0)
    }
}

impl std::error::Error for BadTableLen {}

const RX_EQE: [Profile; 5] =
    [Profile::new(1, 256), Profile::new(8, 256), Profile::new(64, 256), Profile::new(128, 256), Profile::new(256, 256)];
const RX_CQE: [Profile; 5] =
    [Profile::new(2, 256), Profile::new(8, 128), Profile::new(16, 64), Profile::new(32, 64), Profile::new(64, 64)];
const TX_EQE: [Profile; 5] =
    [Profile::new(1, 128), Profile::new(8, 128), Profile::new(32, 128), Profile::new(64, 128), Profile::new(128, 128)];
const TX_CQE: [Profile; 5] =
    [Profile::new(5, 128), Profile::new(8, 64), Profile::new(16, 32), Profile::new(32, 32), Profile::new(64, 32)];

impl ProfileTable {
    /// Longest table accepted; keeps the "tired" limit (twice the length) small.
    pub const MAX_LEN: usize = 16;

    pub fn new(profiles: Vec<Profile>) -> Result<ProfileTable, BadTableLen> {
        if profiles.is_empty() || profiles.len() > Self::MAX_LEN {
            return Err(BadTableLen(profiles.len()));
        }
        Ok(ProfileTable { profiles })
    }

    /// The five-step default table for a direction and timer mode (the values Linux
    /// drivers use, so results are comparable with in-driver DIM).
    pub fn default_for(direction: Direction, mode: TimerMode) -> ProfileTable {
        let profiles = match (direction, mode) {
            (Direction::Rx, TimerMode::FromFirstEvent) => RX_EQE,
            (Direction::Rx, TimerMode::FromLastEvent) => RX_CQE,
            (Direction::Tx, TimerMode::FromFirstEvent) => TX_EQE,
            (Direction::Tx, TimerMode::FromLastEvent) => TX_CQE,
        };
        ProfileTable { profiles: profiles.to_vec() }
    }

    pub fn len(&self) -> usize {
        self.profiles.len()
    }

    /// Always false: a table has at least one profile.
    pub fn is_empty(&self) -> bool {
        self.profiles.is_empty()
    }

    /// The profile at `index`, clamped to the last one.
    pub fn profile(&self, index: usize) -> Profile {
        self.profiles[index.min(self.profiles.len() - 1)]
    }

    pub fn profiles(&self) -> &[Profile] {
        &self.profiles
    }

    /// The same table with every timer and frame cap passed through `f` (used by a
    /// controller to fit a driver's accepted range). Lengths do not change.
    pub fn map(&self, f: impl Fn(Profile) -> Profile) -> ProfileTable {
        ProfileTable { profiles: self.profiles.iter().copied().map(f).collect() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_tables_grow_to_the_right() {
        for dir in [Direction::Rx, Direction::Tx] {
            for mode in [TimerMode::FromFirstEvent, TimerMode::FromLastEvent] {
                let t = ProfileTable::default_for(dir, mode);
                assert_eq!(t.len(), 5);
                assert!(t.profiles().windows(2).all(|w| w[0].usecs < w[1].usecs), "{dir:?} {mode:?}");
            }
        }
        assert_eq!(
            ProfileTable::default_for(Direction::Rx, TimerMode::FromFirstEvent).profile(4),
            Profile::new(256, 256)
        );
    }

    #[test]
    fn tables_reject_bad_lengths_and_clamp_indexes() {
        assert_eq!(ProfileTable::new(vec![]), Err(BadTableLen(0)));
        assert_eq!(ProfileTable::new(vec![Profile::new(1, 1); 17]), Err(BadTableLen(17)));
        let t = ProfileTable::new(vec![Profile::new(3, 4)]).unwrap();
        assert_eq!(t.profile(99), Profile::new(3, 4));
    }
}
