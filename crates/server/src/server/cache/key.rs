//! The cache key of a request under an `[[origin]]` prefix, and the path and query
//! the origin is asked for.
//!
//! The key is the normalised path as served (`/vod/a/b.mp4`) and, when the table
//! names `key_args`, those query arguments in the table's order (`?bitrate=3000`).
//! Every other argument, such as a signed-URL token already checked at the edge,
//! is neither in the key nor sent to the origin, so it does not split the cache.
//!
//! A key carrying LL-HLS's `_HLS_msn` or `_HLS_part` (the table names them in
//! `key_args`) is a blocking playlist request: the origin holds it until the
//! playlist has that segment or part ([`Key::hold`]).

use super::Kind;
use crate::store::{key_hash, KeyHash};

/// A request's cache key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    /// The key itself: path, and `?` and the named arguments if any.
    pub text: Vec<u8>,
    pub hash: KeyHash,
    /// What follows the origin URL: the path after the prefix (decoded; the
    /// origin client encodes it).
    pub origin_path: Vec<u8>,
    /// The named arguments, sent to the origin as its query.
    pub origin_query: Option<Vec<u8>>,
    /// The viewer request's `Via` field: the origin or parent requests it
    /// causes carry it on, this node's entry appended (not part of the key).
    pub via: Option<Vec<u8>>,
    /// A blocking playlist request (LL-HLS, RFC 8216bis section 6.2.5.2): its
    /// key carries `_HLS_msn` or `_HLS_part`, so the origin may hold it up to
    /// the table's `hold_timeout`.
    pub hold: bool,
    /// Playlist, segment or other, by the path's extension (the per-table
    /// counts).
    pub kind: Kind,
}

/// The LL-HLS delivery directives that make a playlist request blocking.
const BLOCKING_ARGS: [&[u8]; 2] = [b"_HLS_msn", b"_HLS_part"];

impl Key {
    /// The key of `path` (normalised, absolute, decoded) whose part after the
    /// table's prefix is `rest`, with the request's raw `query`.
    pub(crate) fn new(path: &[u8], rest: &[u8], query: Option<&[u8]>, args: &[String]) -> Key {
        let mut selected = Vec::new();
        for name in args {
            if let Some(pair) = find_arg(query.unwrap_or_default(), name.as_bytes()) {
                if !selected.is_empty() {
                    selected.push(b'&');
                }
                selected.extend_from_slice(pair);
            }
        }
        let mut text = path.to_vec();
        if !selected.is_empty() {
            text.push(b'?');
            text.extend_from_slice(&selected);
        }
        let hold = BLOCKING_ARGS.iter().any(|name| find_arg(&selected, name).is_some());
        let origin_query = (!selected.is_empty()).then_some(selected);
        let kind = Kind::of(rest);
        Key { hash: key_hash(&text), text, origin_path: rest.to_vec(), origin_query, via: None, hold, kind }
    }
}

/// The first `name` or `name=value` member of a raw query, as written.
fn find_arg<'q>(query: &'q [u8], name: &[u8]) -> Option<&'q [u8]> {
    query.split(|&b| b == b'&').find(|pair| {
        let n = pair.iter().position(|&b| b == b'=').map_or(*pair, |i| &pair[..i]);
        n == name
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_arguments_are_in_the_key_and_go_to_the_origin() {
        let args = vec!["bitrate".to_string(), "lang".to_string()];
        let k = Key::new(b"/vod/a.mp4", b"a.mp4", Some(b"token=abc&lang=fr&bitrate=3000&lang=de"), &args);
        assert_eq!(k.text, b"/vod/a.mp4?bitrate=3000&lang=fr");
        assert_eq!(
            (k.origin_path.as_slice(), k.origin_query.as_deref()),
            (&b"a.mp4"[..], Some(&b"bitrate=3000&lang=fr"[..]))
        );
        let unsigned = Key::new(b"/vod/a.mp4", b"a.mp4", Some(b"lang=fr&bitrate=3000"), &args);
        assert_eq!(unsigned.hash, k.hash, "a token does not split the cache");
        let plain = Key::new(b"/vod/a.mp4", b"a.mp4", Some(b"token=abc"), &[]);
        assert_eq!((plain.text.as_slice(), plain.origin_query), (&b"/vod/a.mp4"[..], None));
        assert_ne!(plain.hash, k.hash);
    }

    #[test]
    fn a_key_carrying_hls_msn_or_part_is_a_hold_and_other_arguments_do_not_split_it() {
        let args: Vec<String> = ["_HLS_msn", "_HLS_part", "_HLS_skip"].map(String::from).to_vec();
        let k = Key::new(b"/live/p.m3u8", b"p.m3u8", Some(b"token=1&_HLS_part=2&_HLS_msn=41"), &args);
        assert_eq!(k.text, b"/live/p.m3u8?_HLS_msn=41&_HLS_part=2");
        assert!(k.hold);
        let other = Key::new(b"/live/p.m3u8", b"p.m3u8", Some(b"_HLS_msn=41&_HLS_part=2&session=9"), &args);
        assert_eq!(other.hash, k.hash, "an argument not named does not split the key");
        let next = Key::new(b"/live/p.m3u8", b"p.m3u8", Some(b"_HLS_msn=42"), &args);
        assert!(next.hold);
        assert_ne!(next.hash, k.hash, "the next msn is another key");
        let skip = Key::new(b"/live/p.m3u8", b"p.m3u8", Some(b"_HLS_skip=YES"), &args);
        assert!(!skip.hold, "a delta update alone is not held");
        let plain = Key::new(b"/live/p.m3u8", b"p.m3u8", Some(b"_HLS_msn=41"), &[]);
        assert!(!plain.hold, "not in the key: not sent, not held");
        assert!(!Key::new(b"/live/p.m3u8", b"p.m3u8", Some(b"_HLS_msnx=1"), &args).hold);
    }

    #[test]
    fn arguments_are_matched_by_whole_name() {
        assert_eq!(find_arg(b"a&b=1", b"a"), Some(&b"a"[..]));
        assert_eq!(find_arg(b"ab=1", b"a"), None);
    }
}
