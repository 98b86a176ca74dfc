//! The live viewer's bookkeeping (`--live`), pure and clocked by the caller: where
//! it joins a stream, which segments it still has to fetch, which it lost, and when
//! it reloads the playlist.
//!
//! - **Join.** The first segment fetched is the last one that starts at least the
//!   hold-back (three target durations, RFC 8216 section 6.3.3) before the end of
//!   the playlist: with segments of a target duration, three segments back from the
//!   live edge. The segments from there to the edge are the start-up buffer.
//! - **New segments.** Every segment listed after those, in media sequence order, is
//!   fetched once.
//! - **Skipped.** A segment the viewer had still to fetch that is no longer in the
//!   playlist it reloaded (the playlist's first sequence number has passed it) is
//!   skipped: the viewer goes on from the playlist's first segment.
//! - **Reload** (RFC 8216 section 6.3.4): one target duration after the viewer began
//!   loading a playlist that had changed (the first one counts as changed), half a
//!   target duration after one that had not.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use super::m3u8::MediaPlaylist;

/// Multiple of the target duration a viewer stays behind the end of the playlist.
pub(crate) const HOLD_BACK_TARGETS: u32 = 3;

/// A segment listed and not yet fetched.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Pending {
    pub seq: u64,
    pub uri: String,
    pub duration: Duration,
    pub program_date_time: Option<SystemTime>,
    /// When a playlist that listed it first arrived (an offset into the run).
    pub listed_at: Duration,
}

/// One viewer's position in a live stream.
#[derive(Debug, Default)]
pub(crate) struct Follower {
    /// Listed, not yet fetched, in order.
    pending: VecDeque<Pending>,
    /// The sequence number after the last one ever queued (`None` before joining).
    next_listed: Option<u64>,
}

impl Follower {
    /// Takes in a playlist that arrived at `now`. Returns how many segments were
    /// skipped (see the module's documentation). The first playlist joins the
    /// stream; the segments queued by it are the start-up buffer ([`Follower::len`]).
    pub(crate) fn update(&mut self, playlist: &MediaPlaylist, now: Duration) -> u64 {
        let segs = &playlist.segments;
        let from = match (self.next_listed, segs.get(join_index(playlist))) {
            (Some(next), _) => next,
            (None, Some(first)) => first.seq,
            // Nothing listed yet: the viewer joins with the first playlist that has.
            (None, None) => return 0,
        };
        let mut skipped = 0;
        if let Some(first) = segs.first() {
            // Queued ones that have left the playlist, and never-seen ones between.
            while self.pending.front().is_some_and(|p| p.seq < first.seq) {
                self.pending.pop_front();
                skipped += 1;
            }
            if self.next_listed.is_some() && from < first.seq {
                skipped += first.seq - from;
            }
        }
        let mut next = from;
        for s in segs.iter().filter(|s| s.seq >= from) {
            self.pending.push_back(Pending {
                seq: s.seq,
                uri: s.uri.clone(),
                duration: s.duration,
                program_date_time: s.program_date_time,
                listed_at: now,
            });
            next = s.seq + 1;
        }
        self.next_listed = Some(next);
        skipped
    }

    /// The next segment to fetch.
    pub(crate) fn next(&self) -> Option<&Pending> {
        self.pending.front()
    }

    /// The next segment has been fetched.
    pub(crate) fn fetched(&mut self) -> Option<Pending> {
        self.pending.pop_front()
    }

    /// Segments still to fetch.
    pub(crate) fn len(&self) -> usize {
        self.pending.len()
    }
}

/// Index of the segment a viewer joining with this playlist fetches first.
pub(crate) fn join_index(playlist: &MediaPlaylist) -> usize {
    let hold_back = playlist.target_duration * HOLD_BACK_TARGETS;
    let mut behind = Duration::ZERO;
    for (i, s) in playlist.segments.iter().enumerate().rev() {
        behind += s.duration;
        if behind >= hold_back {
            return i;
        }
    }
    0
}

/// When to reload, given when the last load began and whether that playlist differed
/// from the one before it.
pub(crate) fn next_reload(load_began: Duration, changed: bool, target: Duration) -> Duration {
    load_began + if changed { target } else { target / 2 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::m3u8::Segment;

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    /// A playlist of `n` segments of `d` s from sequence number `first`.
    fn playlist(first: u64, n: u64, d: f64) -> MediaPlaylist {
        MediaPlaylist {
            target_duration: Duration::from_secs(2),
            segments: (first..first + n)
                .map(|seq| Segment { seq, uri: format!("seg{seq}.ts"), duration: s(d), program_date_time: None })
                .collect(),
            ended: false,
        }
    }

    fn seqs(f: &Follower) -> Vec<u64> {
        f.pending.iter().map(|p| p.seq).collect()
    }

    #[test]
    fn a_viewer_joins_three_target_durations_behind_the_edge() {
        assert_eq!(join_index(&playlist(10, 6, 2.0)), 3);
        // Shorter segments: more of them make up the hold-back.
        assert_eq!(join_index(&playlist(10, 6, 1.5)), 2);
        // Slightly longer ones: still three.
        assert_eq!(join_index(&playlist(10, 6, 2.04)), 3);
        // Fewer than three target durations listed: from the first.
        assert_eq!(join_index(&playlist(10, 2, 2.0)), 0);
        assert_eq!(join_index(&playlist(10, 0, 2.0)), 0);
        let mut f = Follower::default();
        assert_eq!(f.update(&playlist(10, 6, 2.0), s(1.0)), 0);
        assert_eq!(seqs(&f), [13, 14, 15]);
        assert_eq!(f.len(), 3);
        assert_eq!(f.next().map(|p| (p.uri.as_str(), p.listed_at)), Some(("seg13.ts", s(1.0))));
    }

    #[test]
    fn a_viewer_joins_with_the_first_playlist_that_lists_a_segment() {
        let mut f = Follower::default();
        assert_eq!(f.update(&playlist(0, 0, 2.0), s(0.0)), 0);
        assert_eq!(f.len(), 0);
        // The stream starts at 500: nothing before it is skipped or queued.
        assert_eq!(f.update(&playlist(500, 1, 2.0), s(1.0)), 0);
        assert_eq!(seqs(&f), [500]);
    }

    #[test]
    fn each_new_segment_is_queued_once_in_order() {
        let mut f = Follower::default();
        f.update(&playlist(10, 6, 2.0), s(0.0));
        assert_eq!(f.fetched().map(|p| p.seq), Some(13));
        // The same playlist again: nothing new.
        assert_eq!(f.update(&playlist(10, 6, 2.0), s(1.0)), 0);
        assert_eq!(seqs(&f), [14, 15]);
        // One more segment (the window slid by one).
        assert_eq!(f.update(&playlist(11, 6, 2.0), s(2.0)), 0);
        assert_eq!(seqs(&f), [14, 15, 16]);
        assert_eq!(f.pending.back().map(|p| p.listed_at), Some(s(2.0)));
        // Two at once, and one already queued is not queued again.
        f.fetched();
        f.fetched();
        f.fetched();
        assert_eq!(f.update(&playlist(13, 6, 2.0), s(6.0)), 0);
        assert_eq!(seqs(&f), [17, 18]);
    }

    #[test]
    fn segments_that_left_the_playlist_before_they_were_fetched_are_skipped() {
        let mut f = Follower::default();
        f.update(&playlist(10, 6, 2.0), s(0.0)); // queued 13, 14, 15
        f.fetched(); // 13
                     // The playlist moved on to 16..=21: 14 and 15 were queued and left, 16.. new.
        assert_eq!(f.update(&playlist(16, 6, 2.0), s(20.0)), 2);
        assert_eq!(seqs(&f), [16, 17, 18, 19, 20, 21]);
        for _ in 0..6 {
            f.fetched();
        }
        // 22..=24 were never seen: the next playlist starts at 25.
        assert_eq!(f.update(&playlist(25, 6, 2.0), s(40.0)), 3);
        assert_eq!(seqs(&f), [25, 26, 27, 28, 29, 30]);
    }

    #[test]
    fn reloads_wait_a_target_duration_after_a_change_and_half_of_one_otherwise() {
        let t = Duration::from_secs(2);
        assert_eq!(next_reload(s(10.0), true, t), s(12.0));
        assert_eq!(next_reload(s(10.0), false, t), s(11.0));
        assert_eq!(next_reload(s(10.0), false, Duration::from_secs(5)), s(12.5));
    }
}
