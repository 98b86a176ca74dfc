//! The request linerate sends to an origin: built from what the cache asks for,
//! never copied from the viewer's.

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http_body_util::Empty;

use crate::config::BaseUrl;

/// What linerate says it is.
const USER_AGENT: &str = concat!("linerate/", env!("CARGO_PKG_VERSION"));

/// Fields linerate sets itself; a viewer's field of one of these names is never
/// forwarded, even when `forward_headers` names it (the configuration refuses the
/// framing ones; these would change what is cached).
const OWN_FIELDS: [HeaderName; 6] = [
    header::USER_AGENT,
    header::ACCEPT_ENCODING,
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::HOST,
    header::VIA,
];

/// Sets the `Via` field of a request: the viewer's `incoming` entries, if any,
/// then this node's (`mine`, `1.1 <node name>`). A node that finds its own name
/// in a request's `Via` refuses it: a loop of parents ends at its second turn.
pub(super) fn add_via<B>(request: &mut http::Request<B>, incoming: Option<&[u8]>, mine: &HeaderValue) {
    let value = incoming.filter(|v| !v.trim_ascii().is_empty()).and_then(|v| {
        let mut joined = v.trim_ascii().to_vec();
        joined.extend_from_slice(b", ");
        joined.extend_from_slice(mine.as_bytes());
        HeaderValue::from_bytes(&joined).ok()
    });
    request.headers_mut().insert(header::VIA, value.unwrap_or_else(|| mine.clone()));
}

/// A request built by linerate (never a copy of the viewer's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct OriginRequest {
    /// HEAD rather than GET.
    pub head: bool,
    /// What follows the URL's path: the rest of the viewer's path, normalised and
    /// decoded as `linerate_http::path::resolve` leaves it. It is percent-encoded
    /// here (all but RFC 3986's `pchar` and `/`, so a literal `%` is sent as `%25`
    /// and a decoded `?` as `%3F`).
    pub path: Vec<u8>,
    /// The query, raw: it keeps its escapes, and only bytes a URI cannot hold are
    /// encoded.
    pub query: Option<Vec<u8>>,
    /// `Range: bytes=first-last`, inclusive.
    pub range: Option<(u64, u64)>,
    pub if_none_match: Option<Vec<u8>>,
    /// An HTTP-date.
    pub if_modified_since: Option<Vec<u8>>,
    /// Viewer fields named in the table's `forward_headers` (name, value). Names
    /// the table does not list, and the fields linerate sets itself, are dropped.
    pub forwarded: Vec<(String, Vec<u8>)>,
    /// The `Via` field of the viewer request that caused this one, if it had
    /// one: this node's entry is appended to it ([`add_via`]).
    pub via: Option<Vec<u8>>,
    /// For a stored object (its head or a slice), not a passed-through answer:
    /// the table's peers may have it, and are asked first.
    pub peers: bool,
    /// `Cache-Control: only-if-cached` (RFC 9111 section 5.2.1.7): a peer answers
    /// from its store or with 504, never by asking onwards.
    pub only_if_cached: bool,
    /// A blocking request (LL-HLS `_HLS_msn`, `_HLS_part`), which the origin
    /// holds until it can answer: the table's `hold_timeout` replaces its
    /// `first_byte_timeout`, and a timeout does not move on to the next URL (the
    /// next would hold it as long).
    pub hold: bool,
}

/// How the path of a request is percent-encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PathEncoding {
    /// All but RFC 3986's `pchar` and `/`.
    Http,
    /// All but `A-Za-z0-9-._~` and `/`: how S3 encodes a key in the request it
    /// signs, so the path is sent as it is signed.
    S3,
}

/// The `Host` field for a base URL: its host, with `:port` unless the port is
/// the scheme's default.
pub(super) fn host_field(base: &BaseUrl) -> String {
    let default = if base.https { 443 } else { 80 };
    if base.port == default {
        base.host.clone()
    } else {
        format!("{}:{}", base.host, base.port)
    }
}

impl OriginRequest {
    /// The `http` request for one URL: `base_path` (the URL's path, ending in
    /// `/`) followed by [`OriginRequest::path`], `host` from [`host_field`], and
    /// the viewer fields `forward` (the table's `forward_headers`) allows; the
    /// path encoded as `encoding` says.
    pub(super) fn build(
        &self,
        base_path: &str,
        host: &HeaderValue,
        forward: &[String],
        encoding: PathEncoding,
    ) -> Result<http::Request<Empty<Bytes>>, String> {
        let mut target = Vec::with_capacity(base_path.len() + self.path.len() + 16);
        target.extend_from_slice(base_path.as_bytes());
        match encoding {
            PathEncoding::Http => encode_target(&self.path, self.query.as_deref(), &mut target),
            PathEncoding::S3 => {
                for &b in &self.path {
                    push_encoded(b, crate::config::is_s3_path_byte(b), &mut target);
                }
                // An S3 table has no key_args: no query to send (configuration).
            }
        }
        let uri = http::Uri::from_maybe_shared(Bytes::from(target))
            .map_err(|e| format!("cannot build a request target from {:?}: {e}", self.path.escape_ascii()))?;
        let method = if self.head { http::Method::HEAD } else { http::Method::GET };
        let mut req = http::Request::new(Empty::new());
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        let h = req.headers_mut();
        h.insert(header::HOST, host.clone());
        h.insert(header::USER_AGENT, HeaderValue::from_static(USER_AGENT));
        // Bytes are cached as the origin stores them: a compressed copy would
        // need its own key and its own ranges.
        h.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        if let Some((first, last)) = self.range {
            let value = format!("bytes={first}-{last}");
            h.insert(header::RANGE, HeaderValue::from_str(&value).map_err(|e| e.to_string())?);
        }
        for (name, value) in
            [(header::IF_NONE_MATCH, &self.if_none_match), (header::IF_MODIFIED_SINCE, &self.if_modified_since)]
        {
            if let Some(v) = value {
                match HeaderValue::from_bytes(v) {
                    Ok(v) => {
                        h.insert(name, v);
                    }
                    // A validator with a control byte: the request goes
                    // unconditional, which costs a full answer, not a wrong one.
                    Err(_) => tracing::debug!(field = %name, "validator not sendable, dropped"),
                }
            }
        }
        for (name, value) in &self.forwarded {
            if !forward.iter().any(|f| f.eq_ignore_ascii_case(name)) {
                continue;
            }
            let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_bytes(value))
            else {
                continue;
            };
            if !OWN_FIELDS.contains(&name) {
                h.append(name, value);
            }
        }
        if self.only_if_cached {
            // In place of any forwarded Cache-Control: a peer must never fill.
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("only-if-cached"));
        }
        Ok(req)
    }
}

/// Appends a decoded `path` and a raw `query` in URI form.
fn encode_target(path: &[u8], query: Option<&[u8]>, out: &mut Vec<u8>) {
    for &b in path {
        push_encoded(b, is_path_byte(b), out);
    }
    if let Some(query) = query {
        out.push(b'?');
        for &b in query {
            push_encoded(b, is_query_byte(b), out);
        }
    }
}

fn push_encoded(b: u8, keep: bool, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    if keep {
        out.push(b);
    } else {
        out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
    }
}

/// RFC 3986 `pchar` (unreserved, sub-delims, `:`, `@`) and the `/` separator:
/// everything else of a decoded path, `%` included, is encoded.
fn is_path_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/".contains(&b)
}

/// A raw query keeps its escapes (`%`) and its separators; spaces, controls,
/// non-ASCII bytes and the characters RFC 3986 leaves out of URIs are encoded.
fn is_query_byte(b: u8) -> bool {
    b.is_ascii_graphic() && !b"\"#<>\\^`{|}".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(path_and_query: &[u8]) -> String {
        let mut out = Vec::new();
        let (path, query) = match path_and_query.iter().position(|&b| b == b'?') {
            Some(i) => (&path_and_query[..i], Some(&path_and_query[i + 1..])),
            None => (path_and_query, None),
        };
        encode_target(path, query, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn paths_are_encoded_and_queries_kept() {
        assert_eq!(target(b"a/b.mp4"), "a/b.mp4");
        assert_eq!(target("a b/é 100%.mp4".as_bytes()), "a%20b/%C3%A9%20100%25.mp4");
        assert_eq!(target(b"a#b"), "a%23b");
        assert_eq!(target(b"x.ts?token=a%20b&t=1"), "x.ts?token=a%20b&t=1");
        assert_eq!(target(b"x.ts?a b\x01{}?"), "x.ts?a%20b%01%7B%7D?");
        assert_eq!(target(b"x.ts?"), "x.ts?");
        let mut out = Vec::new();
        encode_target(b"what?.mp4", Some(b"a=1"), &mut out);
        assert_eq!(out, b"what%3F.mp4?a=1", "a decoded ? in the path is not the query");
    }

    #[test]
    fn s3_paths_encode_all_but_unreserved_bytes() {
        let req =
            OriginRequest { path: "a(1)/b c+d=é~_.-!*'@:,$&;.mp4".as_bytes().to_vec(), ..OriginRequest::default() };
        let built = req.build("/bucket/", &HeaderValue::from_static("h"), &[], PathEncoding::S3).unwrap();
        assert_eq!(built.uri(), "/bucket/a%281%29/b%20c%2Bd%3D%C3%A9~_.-%21%2A%27%40%3A%2C%24%26%3B.mp4");
    }

    #[test]
    fn every_byte_makes_a_valid_target() {
        for b in 0..=255u8 {
            for (path, query) in [(vec![b], None), (b"a".to_vec(), Some(vec![b]))] {
                let req = OriginRequest { path, query, ..OriginRequest::default() };
                let host = HeaderValue::from_static("h");
                for encoding in [PathEncoding::Http, PathEncoding::S3] {
                    assert!(req.build("/base/", &host, &[], encoding).is_ok(), "byte {b:#x}");
                }
            }
        }
    }

    #[test]
    fn via_appends_this_node_to_the_viewers_entries() {
        let mine = HeaderValue::from_static("1.1 edge:8080");
        let mut req = http::Request::new(());
        add_via(&mut req, None, &mine);
        assert_eq!(req.headers()["via"], "1.1 edge:8080");
        add_via(&mut req, Some(b" 1.1 a, 1.0 b (x) "), &mine);
        assert_eq!(req.headers()["via"], "1.1 a, 1.0 b (x), 1.1 edge:8080");
        add_via(&mut req, Some(b"bad\x01"), &mine);
        assert_eq!(req.headers()["via"], "1.1 edge:8080", "an unsendable value is replaced");
    }

    #[test]
    fn host_has_a_port_unless_it_is_the_default() {
        let url = |s: &str| crate::config::parse_base_url(s).unwrap();
        assert_eq!(host_field(&url("http://origin.example/")), "origin.example");
        assert_eq!(host_field(&url("http://origin.example:8080/")), "origin.example:8080");
        assert_eq!(host_field(&url("https://origin.example/")), "origin.example");
        assert_eq!(host_field(&url("https://origin.example:80/")), "origin.example:80");
        assert_eq!(host_field(&url("http://[::1]:81/")), "[::1]:81");
    }

    #[test]
    fn only_listed_viewer_fields_are_forwarded() {
        let req = OriginRequest {
            path: b"a".to_vec(),
            forwarded: vec![
                ("x-request-id".into(), b"1".to_vec()),
                ("Cookie".into(), b"secret".to_vec()),
                ("User-Agent".into(), b"viewer".to_vec()),
                ("X-Bad".into(), b"a\nb".to_vec()),
            ],
            ..OriginRequest::default()
        };
        let allowed = ["X-Request-Id".to_string(), "User-Agent".to_string(), "X-Bad".to_string()];
        let built = req.build("/", &HeaderValue::from_static("h"), &allowed, PathEncoding::Http).unwrap();
        let h = built.headers();
        assert_eq!(h["x-request-id"], "1");
        assert!(h.get("cookie").is_none());
        assert_eq!(h["user-agent"], USER_AGENT, "linerate's own field wins");
        assert!(h.get("x-bad").is_none(), "a value with a newline is not sendable");
        assert!(h.get("cache-control").is_none());
    }

    #[test]
    fn a_peer_is_asked_only_if_cached() {
        let req = OriginRequest {
            path: b"a".to_vec(),
            only_if_cached: true,
            forwarded: vec![("Cache-Control".into(), b"no-cache".to_vec())],
            ..OriginRequest::default()
        };
        let allowed = ["Cache-Control".to_string()];
        let built = req.build("/", &HeaderValue::from_static("h"), &allowed, PathEncoding::Http).unwrap();
        let all: Vec<_> = built.headers().get_all("cache-control").iter().collect();
        assert_eq!(all, ["only-if-cached"], "the viewer's Cache-Control is replaced");
    }
}
