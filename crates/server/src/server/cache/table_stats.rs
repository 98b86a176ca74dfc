//! What each `[[origin]]` table's viewers and origin did, playlists and
//! segments apart: what an operator watches on a live channel. Collapsed
//! requests, origin requests against the objects they brought (origin requests
//! per segment: 1 when every herd was collapsed), and how old the newest object
//! served is (on a live prefix, how far behind the encoder the viewers are; a
//! number that grows when the packager stops). Kinds by the path's extension.

use std::sync::atomic::{AtomicI64, Ordering};

use super::Tally;

/// What a key names, by its path's extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Playlist,
    Segment,
    Other,
}

impl Kind {
    pub(crate) const ALL: [Kind; 3] = [Kind::Playlist, Kind::Segment, Kind::Other];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::Playlist => "playlist",
            Kind::Segment => "segment",
            Kind::Other => "other",
        }
    }

    /// HLS and DASH manifests are playlists; the media containers players fetch
    /// in pieces (MPEG-TS, fragmented MP4 and CMAF, AAC, WebVTT) are segments.
    pub(crate) fn of(path: &[u8]) -> Kind {
        let name = path.rsplit(|&b| b == b'/').next().unwrap_or_default();
        let Some(dot) = name.iter().rposition(|&b| b == b'.') else { return Kind::Other };
        let ext = &name[dot + 1..];
        let is = |list: &[&[u8]]| list.iter().any(|e| ext.eq_ignore_ascii_case(e));
        if is(&[b"m3u8", b"m3u", b"mpd"]) {
            Kind::Playlist
        } else if is(&[b"ts", b"m4s", b"mp4", b"m4v", b"m4a", b"cmfv", b"cmfa", b"aac", b"vtt", b"webm"]) {
            Kind::Segment
        } else {
            Kind::Other
        }
    }
}

/// One table's counts, by [`Kind`] where it says so.
#[derive(Default)]
pub(crate) struct TableStats {
    /// Requests that joined an origin request already under way.
    pub collapsed: Tally,
    /// Origin requests made: heads (first fetches and revalidations) and slice
    /// fills.
    pub origin_requests: [Tally; 3],
    /// New objects (or new versions) the origin sent.
    pub new_objects: [Tally; 3],
    /// The origin date (Unix ms) of the newest object served; 0 before any.
    pub newest_ms: [AtomicI64; 3],
}

impl TableStats {
    pub(crate) fn origin_request(&self, kind: Kind) {
        self.origin_requests[kind as usize].add(1);
    }

    pub(crate) fn new_object(&self, kind: Kind) {
        self.new_objects[kind as usize].add(1);
    }

    /// An object dated `dated_at_ms` (its age zero) is being served.
    pub(crate) fn served(&self, kind: Kind, dated_at_ms: i64) {
        self.newest_ms[kind as usize].fetch_max(dated_at_ms, Ordering::Relaxed);
    }

    /// Seconds from the newest object of `kind` served to `now_ms`; `None` before
    /// any was.
    pub(crate) fn newest_age_secs(&self, kind: Kind, now_ms: i64) -> Option<f64> {
        let newest = self.newest_ms[kind as usize].load(Ordering::Relaxed);
        (newest > 0).then(|| (now_ms - newest).max(0) as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_the_extension() {
        assert_eq!(Kind::of(b"/live/stream.m3u8"), Kind::Playlist);
        assert_eq!(Kind::of(b"/ld/manifest.MPD"), Kind::Playlist);
        assert_eq!(Kind::of(b"/live/seg00012.ts"), Kind::Segment);
        assert_eq!(Kind::of(b"/ld/chunk-stream0-00007.m4s"), Kind::Segment);
        assert_eq!(Kind::of(b"/vod/title.bin"), Kind::Other);
        assert_eq!(Kind::of(b"/a.dir/noext"), Kind::Other);
    }

    #[test]
    fn the_newest_served_sets_the_age() {
        let s = TableStats::default();
        assert_eq!(s.newest_age_secs(Kind::Segment, 10_000), None);
        s.served(Kind::Segment, 4_000);
        s.served(Kind::Segment, 6_000);
        s.served(Kind::Segment, 5_000);
        assert_eq!(s.newest_age_secs(Kind::Segment, 10_000), Some(4.0));
        assert_eq!(s.newest_age_secs(Kind::Playlist, 10_000), None);
    }
}
