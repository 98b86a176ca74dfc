//! The viewer model: when a session asks for each segment, when it needs it, and what
//! the viewer sees when it arrives late.
//!
//! A *play* is one viewer watching one title from its first segment. All times are
//! offsets from the start of the run, so the model is pure and testable.
//!
//! - **Start-up.** The first `K` segments (`--startup-segments`, fewer if the title is
//!   shorter) are fetched back to back, as fast as the server delivers them.
//!   Playback starts at `P`, the moment the `K`-th segment has fully arrived.
//!   **Play delay** = `P` − the moment the play began (its first request, including
//!   connecting): the time a viewer looks at a black screen after pressing play. A
//!   play still in start-up when the run ends has waited at least until the end;
//!   that wait is its (censored) play delay.
//! - **Steady state.** Segment `i >= K` is requested at
//!   `P + (i − K)·D + S` (or as soon as segment `i − 1` has arrived, if that is later),
//!   where `D` is the segment duration (segment bytes × 8 / bitrate) and `S` the stall
//!   time so far. This is a player that keeps `K` segments of buffer: at that moment it
//!   holds segments up to `i − 1` and the playhead is `K·D` behind their end.
//! - **Deadline.** Segment `i` starts playing at `P + i·D + S`. If it arrives at `T`
//!   after that deadline, the viewer stalled: that is one **rebuffer** of
//!   `X = T − deadline`, `S` grows by `X`, and every later deadline and request time
//!   moves by `X`, as they would in a real player that pauses while it waits.
//! - **Watch time** of a play = wall time from `P` to the end of the play (the last
//!   segment has played out, or the run ended), stalls included. A stall in progress
//!   when the run ends counts up to the end.
//! - **Rebuffer ratio** (of a run) = Σ stall time / Σ watch time over all plays: the
//!   fraction of the time after start-up that viewers spent watching a spinner.
//!
//! In closed-loop mode (`--max-rate`) there is no pacing and no deadline: play delay
//! is still measured (the start-up segments), rebuffers are not.
//!
//! A live play (`--live`) is the same model with segments of their own durations
//! (`EXTINF`): [`Playback::arrived_lasting`] adds each one's, and segment `i` starts
//! playing at `P` + the durations of the segments before it + `S`. It has no last
//! segment: it ends with the run.

use std::time::Duration;

/// One play of one title.
#[derive(Clone, Debug)]
pub(crate) struct Playback {
    segment: Duration,
    startup_segments: u32,
    segments: u32,
    began: Duration,
    /// `P`: when the start-up buffer filled and playback began.
    playing_since: Option<Duration>,
    stall: Duration,
    rebuffers: u32,
    /// Segments `0..done` have arrived.
    done: u32,
    /// Their playback time.
    media: Duration,
}

/// What the end of a play adds to the run's QoE totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PlayOutcome {
    /// `Some` if playback started.
    pub play_delay: Option<Duration>,
    /// If playback had not started: how long the viewer had waited (a lower bound
    /// on its play delay).
    pub startup_wait: Duration,
    pub watch: Duration,
    pub stall: Duration,
    pub rebuffers: u32,
    /// When the viewer watched (`P` to the end of the play), for the timeline.
    pub watching: Option<(Duration, Duration)>,
    /// A stall still in progress at the end (it ends at `now`): the part of `stall`
    /// no `arrived` reported.
    pub open_stall: Duration,
}

impl Playback {
    /// A play of a title of `segments` segments (>= 1), each `segment` long in
    /// playback time, that begins at `began`.
    pub(crate) fn new(segment: Duration, startup_segments: u32, segments: u32, began: Duration) -> Playback {
        assert!(segments >= 1);
        Playback {
            segment,
            startup_segments: startup_segments.clamp(1, segments),
            segments,
            began,
            playing_since: None,
            stall: Duration::ZERO,
            rebuffers: 0,
            done: 0,
            media: Duration::ZERO,
        }
    }

    /// The next segment to fetch, or `None` when all have arrived.
    pub(crate) fn next_segment(&self) -> Option<u32> {
        (self.done < self.segments).then_some(self.done)
    }

    /// The play delay, once playback has started.
    #[cfg(test)]
    pub(crate) fn play_delay(&self) -> Option<Duration> {
        self.playing_since.map(|p| p - self.began)
    }

    /// When the player asks for segment `i`: `None` during start-up (at once).
    /// The caller also waits for segment `i − 1` (one request at a time).
    pub(crate) fn request_at(&self, i: u32) -> Option<Duration> {
        let p = self.playing_since?;
        Some(p + self.segment * (i - self.startup_segments) + self.stall)
    }

    /// When segment `i` starts playing, given the stalls so far: `None` before
    /// playback has started.
    pub(crate) fn deadline(&self, i: u32) -> Option<Duration> {
        let p = self.playing_since?;
        Some(p + self.segment * i + self.stall)
    }

    /// When the last segment will have played out (`None` before playback starts).
    pub(crate) fn ends_at(&self) -> Option<Duration> {
        self.deadline(self.segments)
    }

    /// When the next segment starts playing: `None` before playback has started.
    fn next_deadline(&self) -> Option<Duration> {
        Some(self.playing_since? + self.media + self.stall)
    }

    /// Records that the next segment arrived completely at `t`. Returns the rebuffer
    /// it caused, if it was late (paced mode).
    pub(crate) fn arrived(&mut self, t: Duration, paced: bool) -> Option<Duration> {
        self.arrived_lasting(t, paced, self.segment)
    }

    /// [`Playback::arrived`] for a segment that plays for `duration` (live).
    pub(crate) fn arrived_lasting(&mut self, t: Duration, paced: bool, duration: Duration) -> Option<Duration> {
        assert!(self.done < self.segments, "every segment of the title has already arrived");
        let deadline = self.next_deadline();
        self.done += 1;
        self.media += duration;
        if self.playing_since.is_none() {
            if self.done == self.startup_segments {
                self.playing_since = Some(t.max(self.began));
            }
            return None;
        }
        if !paced {
            return None;
        }
        let deadline = deadline.expect("playing");
        if t > deadline {
            let late = t - deadline;
            self.stall += late;
            self.rebuffers += 1;
            Some(late)
        } else {
            None
        }
    }

    /// Ends the play at `now` (the run's end, or after the last segment played out)
    /// and returns its totals. In paced mode a segment still missing past its
    /// deadline counts as a stall up to `now`.
    pub(crate) fn finish(mut self, now: Duration, paced: bool) -> PlayOutcome {
        let Some(p) = self.playing_since else {
            return PlayOutcome { startup_wait: now.saturating_sub(self.began), ..PlayOutcome::default() };
        };
        let mut open_stall = Duration::ZERO;
        if paced && self.next_segment().is_some() {
            let deadline = self.next_deadline().expect("playing");
            if now > deadline {
                open_stall = now - deadline;
                self.stall += open_stall;
                self.rebuffers += 1;
            }
        }
        let end = match self.ends_at() {
            Some(e) if paced && self.next_segment().is_none() => e.min(now),
            _ => now,
        };
        PlayOutcome {
            play_delay: Some(p - self.began),
            startup_wait: Duration::ZERO,
            watch: end.saturating_sub(p),
            stall: self.stall,
            rebuffers: self.rebuffers,
            watching: Some((p, end.max(p))),
            open_stall,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    #[test]
    fn startup_then_one_segment_per_duration() {
        // 4 s segments, 3 start-up segments, play begins at 10 s.
        let mut p = Playback::new(s(4.0), 3, 10, s(10.0));
        assert_eq!(p.request_at(0), None);
        assert_eq!(p.arrived(s(10.5), true), None);
        assert_eq!(p.arrived(s(11.0), true), None);
        assert_eq!(p.play_delay(), None);
        assert_eq!(p.arrived(s(11.5), true), None);
        assert_eq!(p.play_delay(), Some(s(1.5)));
        // Steady state: one request per segment duration, K segments ahead.
        assert_eq!(p.request_at(3), Some(s(11.5)));
        assert_eq!(p.request_at(4), Some(s(15.5)));
        assert_eq!(p.request_at(9), Some(s(35.5)));
        assert_eq!(p.deadline(3), Some(s(23.5)));
        assert_eq!(p.ends_at(), Some(s(51.5)));
    }

    #[test]
    fn a_segment_late_by_x_is_a_rebuffer_of_x_and_shifts_later_deadlines() {
        let mut p = Playback::new(s(4.0), 2, 6, s(0.0));
        p.arrived(s(1.0), true);
        p.arrived(s(2.0), true); // playing since 2 s
        assert_eq!(p.deadline(2), Some(s(10.0)));
        // Segment 2 arrives 1.25 s after its deadline.
        assert_eq!(p.arrived(s(11.25), true), Some(s(1.25)));
        // Everything later moves by 1.25 s.
        assert_eq!(p.deadline(3), Some(s(15.25)));
        assert_eq!(p.request_at(3), Some(s(7.25)));
        // On time: no rebuffer.
        assert_eq!(p.arrived(s(15.25), true), None);
        // Late again by 0.5 s.
        assert_eq!(p.arrived(s(19.75), true), Some(s(0.5)));
        assert_eq!(p.arrived(s(20.0), true), None);
        let out = p.finish(s(100.0), true);
        assert_eq!(out.rebuffers, 2);
        assert_eq!(out.stall, s(1.75));
        assert_eq!(out.play_delay, Some(s(2.0)));
        // Six segments of 4 s plus 1.75 s of stalls, from 2 s: ends at 27.75 s.
        assert_eq!(out.watch, s(25.75));
        assert_eq!(out.watching, Some((s(2.0), s(27.75))));
        // Both stalls were reported as their segments arrived.
        assert_eq!(out.open_stall, Duration::ZERO);
    }

    #[test]
    fn a_stall_in_progress_at_the_end_counts_up_to_the_end() {
        let mut p = Playback::new(s(2.0), 1, 100, s(0.0));
        p.arrived(s(0.5), true); // playing since 0.5 s; segment 1 due at 2.5 s
        let out = p.finish(s(4.0), true);
        assert_eq!(out.rebuffers, 1);
        assert_eq!(out.stall, s(1.5));
        assert_eq!(out.watch, s(3.5));
        // For the timeline: watched from 0.5 s to the end, the last 1.5 s stalled.
        assert_eq!(out.watching, Some((s(0.5), s(4.0))));
        assert_eq!(out.open_stall, s(1.5));
    }

    #[test]
    fn a_play_that_never_started_has_only_a_startup_wait() {
        let mut p = Playback::new(s(2.0), 3, 100, s(1.0));
        p.arrived(s(2.0), true);
        assert_eq!(p.finish(s(30.0), true), PlayOutcome { startup_wait: s(29.0), ..PlayOutcome::default() });
    }

    #[test]
    fn closed_loop_measures_play_delay_but_never_rebuffers() {
        let mut p = Playback::new(s(1.0), 2, 5, s(0.0));
        p.arrived(s(0.1), false);
        p.arrived(s(0.2), false);
        for t in [10.0, 20.0, 30.0] {
            assert_eq!(p.arrived(s(t), false), None);
        }
        let out = p.finish(s(31.0), false);
        assert_eq!(out.rebuffers, 0);
        assert_eq!(out.stall, Duration::ZERO);
        assert_eq!(out.play_delay, Some(s(0.2)));
    }

    #[test]
    fn live_segments_play_for_their_own_durations() {
        // Joined with three segments; no last one.
        let mut p = Playback::new(s(2.0), 3, u32::MAX, s(0.0));
        for (t, d) in [(0.2, 2.0), (0.4, 1.5), (0.6, 2.5)] {
            assert_eq!(p.arrived_lasting(s(t), true, s(d)), None);
        }
        assert_eq!(p.play_delay(), Some(s(0.6)));
        // Six seconds of media from 0.6 s: the fourth segment is due at 6.6 s.
        assert_eq!(p.arrived_lasting(s(6.6), true, s(1.0)), None);
        // The fifth at 7.6 s; it arrives at 8.0 s: a rebuffer of 0.4 s.
        assert_eq!(p.arrived_lasting(s(8.0), true, s(2.0)), Some(s(0.4)));
        // The run ends at 9 s with the sixth (due at 10 s) not in: no stall.
        let out = p.finish(s(9.0), true);
        assert_eq!((out.rebuffers, out.stall, out.watch), (1, s(0.4), s(8.4)));
    }

    #[test]
    fn short_titles_start_when_their_last_segment_arrives() {
        let mut p = Playback::new(s(4.0), 3, 2, s(0.0));
        p.arrived(s(0.3), true);
        assert_eq!(p.play_delay(), None);
        p.arrived(s(0.6), true);
        assert_eq!(p.play_delay(), Some(s(0.6)));
        assert_eq!(p.next_segment(), None);
        let out = p.finish(s(5.0), true);
        assert_eq!(out.watch, s(4.4));
        assert_eq!(out.rebuffers, 0);
    }
}
