//! The cache key of a request under an `[[origin]]` prefix, and the path and query
//! the origin is asked for.
//!
//! The key is the normalised path as served (`/vod/a/b.mp4`) and, when the table
//! names `key_args`, those query arguments in the table's order (`?bitrate=3000`).
//! Every other argument, such as a signed-URL token already checked at the edge,
//! is neither in the key nor sent to the origin, so it does not split the cache.

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
}

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
        let origin_query = (!selected.is_empty()).then_some(selected);
        Key { hash: key_hash(&text), text, origin_path: rest.to_vec(), origin_query, via: None }
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
    fn arguments_are_matched_by_whole_name() {
        assert_eq!(find_arg(b"a&b=1", b"a"), Some(&b"a"[..]));
        assert_eq!(find_arg(b"ab=1", b"a"), None);
    }
}
