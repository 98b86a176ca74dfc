//! Request heads: parsing with `httparse` into a reusable [`Request`].
//!
//! The parser keeps only what the server acts on (method, target, version, the
//! framing and connection fields, and the validators and range fields), copied into
//! one reusable byte arena so that a connection parses every request without
//! allocating once its buffers have grown.
//!
//! Framing follows RFC 9112 section 6 strictly, because a proxy in front of the
//! server may frame differently and every disagreement is a smuggling opportunity:
//! Transfer-Encoding together with Content-Length, a Transfer-Encoding whose last
//! coding is not `chunked` or that applies `chunked` twice, Transfer-Encoding in
//! HTTP/1.0, or conflicting Content-Length values are all rejected with 400 and
//! the connection is closed.

use std::fmt;

/// The largest header count the parser will ever accept, whatever the limit says
/// (the header array lives on the stack).
pub const MAX_HEADERS_CAP: usize = 256;

/// Limits applied while parsing a request head.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A head (request line plus fields) longer than this gets 431 (or 414 when the
    /// request line alone does not fit).
    pub max_head_bytes: usize,
    /// A request target longer than this gets 414.
    pub max_uri_bytes: usize,
    /// More header fields than this get 431.
    pub max_headers: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_head_bytes: 16 * 1024, max_uri_bytes: 8 * 1024, max_headers: 100 }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Method {
    #[default]
    Get,
    Head,
    Options,
    /// Any other method; answered with 405 and `Allow`.
    Other,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Version {
    Http10,
    #[default]
    Http11,
}

/// How the request's own body (if any) is delimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BodyFraming {
    #[default]
    None,
    Length(u64),
    Chunked,
}

/// Why a request head was refused. Each kind maps to one status code; every one of
/// them closes the connection after the response, because the server can no longer
/// be sure where the next request starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestError {
    /// Syntax error in the request line or a header field; or a missing Host in HTTP/1.1,
    /// duplicate Host, a Host that is not `host[:port]`, or ambiguous body framing (400).
    BadRequest(&'static str),
    /// The request line is longer than the URI limit (414).
    UriTooLong,
    /// The head is larger than the head limit or has too many fields (431).
    HeadTooLarge,
    /// HTTP/2 or another major version spoken on an HTTP/1 port (505).
    VersionNotSupported,
    /// An `Expect` field with an expectation other than `100-continue` (417).
    ExpectationFailed,
}

impl RequestError {
    pub fn status(self) -> crate::Status {
        use crate::Status;
        match self {
            RequestError::BadRequest(_) => Status::BadRequest,
            RequestError::UriTooLong => Status::UriTooLong,
            RequestError::HeadTooLarge => Status::HeaderFieldsTooLarge,
            RequestError::VersionNotSupported => Status::VersionNotSupported,
            RequestError::ExpectationFailed => Status::ExpectationFailed,
        }
    }
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::BadRequest(why) => write!(f, "bad request: {why}"),
            RequestError::UriTooLong => f.write_str("request target too long"),
            RequestError::HeadTooLarge => f.write_str("request head too large"),
            RequestError::VersionNotSupported => f.write_str("HTTP version not supported"),
            RequestError::ExpectationFailed => f.write_str("unsupported expectation"),
        }
    }
}

impl std::error::Error for RequestError {}

/// A span of the request's value arena.
type Span = Option<(u32, u32)>;

/// The parts of a request head the server uses. Reused across requests: call
/// [`Request::parse`] again on the next head.
#[derive(Debug, Default)]
pub struct Request {
    pub method: Method,
    pub version: Version,
    /// Whether the connection may stay open after the response, by the request's
    /// version and `Connection` field.
    pub keep_alive: bool,
    pub body: BodyFraming,
    /// The client sent `Expect: 100-continue` (HTTP/1.1 only; RFC 9110 section
    /// 10.1.1 has a server ignore it in HTTP/1.0) and waits for a `100 Continue`
    /// before sending its body.
    pub expect_continue: bool,
    arena: Vec<u8>,
    method_name: Span,
    target: Span,
    range: Span,
    /// Set when more than one Range field was sent: such a request's ranges are ignored.
    range_repeated: bool,
    if_range: Span,
    if_match: Span,
    if_none_match: Span,
    if_modified_since: Span,
    if_unmodified_since: Span,
    origin: Span,
    cors_request_method: Span,
    /// For access logs.
    user_agent: Span,
    referer: Span,
    cookie: Span,
}

/// Result of feeding bytes to [`Request::parse`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A whole head was parsed; it occupied this many bytes of the input.
    Complete(usize),
    /// More bytes are needed.
    Partial,
}

impl Request {
    /// Parses the head at the start of `buf` into `self`, replacing what was there.
    pub fn parse(&mut self, buf: &[u8], limits: &Limits) -> Result<Parsed, RequestError> {
        // Left uninitialised: httparse writes the fields it finds, so a typical
        // request does not pay for clearing 256 slots (8 KiB) it never uses.
        let mut storage = [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS_CAP];
        let max_headers = limits.max_headers.clamp(1, MAX_HEADERS_CAP);
        let mut req = httparse::Request::new(&mut []);
        let status = match req.parse_with_uninit_headers(buf, &mut storage[..max_headers]) {
            Ok(s) => s,
            Err(httparse::Error::TooManyHeaders) => return Err(RequestError::HeadTooLarge),
            Err(httparse::Error::Version) => return Err(version_error(buf)),
            Err(httparse::Error::Token) => return Err(RequestError::BadRequest("invalid method or target")),
            Err(httparse::Error::HeaderName) => return Err(RequestError::BadRequest("invalid header name")),
            Err(httparse::Error::HeaderValue) => return Err(RequestError::BadRequest("invalid header value")),
            Err(_) => return Err(RequestError::BadRequest("malformed request head")),
        };
        let head_len = match status {
            httparse::Status::Complete(n) => n,
            httparse::Status::Partial => {
                if buf.len() >= limits.max_head_bytes {
                    return Err(oversized(buf, limits));
                }
                // A request line that is already longer than a target may be is 414
                // before the rest arrives; this also bounds a line that never ends.
                let line = buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len());
                if line > limits.max_uri_bytes + 64 {
                    return Err(RequestError::UriTooLong);
                }
                return Ok(Parsed::Partial);
            }
        };
        if head_len > limits.max_head_bytes {
            return Err(oversized(buf, limits));
        }
        let target = req.path.unwrap_or("");
        // The same bound on the request line as while it arrives, so that the answer
        // does not depend on how the bytes were split across reads.
        let line = buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len());
        if target.len() > limits.max_uri_bytes || line > limits.max_uri_bytes + 64 {
            return Err(RequestError::UriTooLong);
        }
        self.clear();
        let method = req.method.unwrap_or("");
        self.method = match method {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "OPTIONS" => Method::Options,
            _ => Method::Other,
        };
        self.method_name = self.push(method.as_bytes());
        self.target = self.push(target.as_bytes());
        self.version = if req.version == Some(0) { Version::Http10 } else { Version::Http11 };

        let mut host_seen = false;
        let mut close = false;
        let mut keep_alive_token = false;
        let mut content_length: Option<u64> = None;
        let mut transfer_encoding = false;
        let mut chunked_last = false;
        let mut expect_continue = false;
        for h in req.headers.iter() {
            let name = h.name;
            let value = trim(h.value);
            if name.eq_ignore_ascii_case("host") {
                if host_seen {
                    return Err(RequestError::BadRequest("more than one Host field"));
                }
                host_seen = true;
                if !is_valid_host(value) {
                    return Err(RequestError::BadRequest("invalid Host"));
                }
            } else if name.eq_ignore_ascii_case("connection") {
                for token in value.split(|&b| b == b',').map(trim) {
                    if token.eq_ignore_ascii_case(b"close") {
                        close = true;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        keep_alive_token = true;
                    }
                }
            } else if name.eq_ignore_ascii_case("content-length") {
                let n = parse_content_length(value)?;
                if content_length.is_some_and(|m| m != n) {
                    return Err(RequestError::BadRequest("conflicting Content-Length fields"));
                }
                content_length = Some(n);
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                transfer_encoding = true;
                // Codings accumulate over repeated fields: chunked must be the last
                // one, and applied once only (RFC 9112 section 6.1).
                for coding in value.split(|&b| b == b',').map(trim).filter(|t| !t.is_empty()) {
                    if chunked_last {
                        return Err(RequestError::BadRequest("chunked is not the last transfer coding"));
                    }
                    chunked_last = coding.eq_ignore_ascii_case(b"chunked");
                }
            } else if name.eq_ignore_ascii_case("expect") {
                // `100-continue` is the only expectation defined (RFC 9110 section 10.1.1).
                for token in value.split(|&b| b == b',').map(trim).filter(|t| !t.is_empty()) {
                    if !token.eq_ignore_ascii_case(b"100-continue") {
                        return Err(RequestError::ExpectationFailed);
                    }
                    expect_continue = true;
                }
            } else if name.eq_ignore_ascii_case("range") {
                if self.range.is_some() {
                    self.range_repeated = true;
                }
                self.range = self.push(value);
            } else if name.eq_ignore_ascii_case("if-range") {
                self.if_range = self.push(value);
            } else if name.eq_ignore_ascii_case("if-match") {
                self.if_match = self.push_list(self.if_match, value);
            } else if name.eq_ignore_ascii_case("if-none-match") {
                self.if_none_match = self.push_list(self.if_none_match, value);
            } else if name.eq_ignore_ascii_case("if-modified-since") {
                self.if_modified_since = self.push(value);
            } else if name.eq_ignore_ascii_case("if-unmodified-since") {
                self.if_unmodified_since = self.push(value);
            } else if name.eq_ignore_ascii_case("origin") {
                self.origin = self.push(value);
            } else if name.eq_ignore_ascii_case("access-control-request-method") {
                self.cors_request_method = self.push(value);
            } else if name.eq_ignore_ascii_case("user-agent") {
                self.user_agent = self.push(value);
            } else if name.eq_ignore_ascii_case("referer") {
                self.referer = self.push(value);
            } else if name.eq_ignore_ascii_case("cookie") {
                // Several Cookie fields (an HTTP/2 hop splits them) are one list joined
                // by "; " (RFC 9113 section 8.2.3).
                self.cookie = self.push_joined(self.cookie, value, b"; ");
            }
        }
        if self.version == Version::Http11 && !host_seen {
            return Err(RequestError::BadRequest("HTTP/1.1 request without Host"));
        }
        self.body = match (transfer_encoding, content_length) {
            (true, Some(_)) => return Err(RequestError::BadRequest("both Transfer-Encoding and Content-Length")),
            (true, None) if self.version == Version::Http10 => {
                return Err(RequestError::BadRequest("Transfer-Encoding in an HTTP/1.0 request"))
            }
            (true, None) if !chunked_last => {
                return Err(RequestError::BadRequest("Transfer-Encoding without final chunked"))
            }
            (true, None) => BodyFraming::Chunked,
            (false, Some(0)) | (false, None) => BodyFraming::None,
            (false, Some(n)) => BodyFraming::Length(n),
        };
        self.expect_continue = expect_continue && self.version == Version::Http11;
        self.keep_alive = match self.version {
            Version::Http11 => !close,
            Version::Http10 => keep_alive_token && !close,
        };
        Ok(Parsed::Complete(head_len))
    }

    /// Forgets the previous request, keeping the arena's allocation: what is left
    /// is a GET in HTTP/1.1 with no target and no fields. A connection clears its request before
    /// reading the next head, so that an error answer to a head that cannot be parsed
    /// (400, 408, 414, 431, 505) is built as for a GET, not with the method of the
    /// request before it (after a HEAD, the error would lose its body).
    pub fn clear(&mut self) {
        let arena = std::mem::take(&mut self.arena);
        *self = Request { arena, ..Request::default() };
        self.arena.clear();
    }

    fn push(&mut self, bytes: &[u8]) -> Span {
        let start = self.arena.len();
        self.arena.extend_from_slice(bytes);
        Some((start as u32, self.arena.len() as u32))
    }

    /// Appends a list-valued field, joining it to an earlier occurrence with ", ".
    fn push_list(&mut self, earlier: Span, value: &[u8]) -> Span {
        self.push_joined(earlier, value, b", ")
    }

    /// Appends a field value, joining it to an earlier occurrence with `separator`.
    fn push_joined(&mut self, earlier: Span, value: &[u8], separator: &[u8]) -> Span {
        match earlier {
            None => self.push(value),
            Some((s, e)) => {
                let start = self.arena.len();
                self.arena.extend_from_within(s as usize..e as usize);
                self.arena.extend_from_slice(separator);
                self.arena.extend_from_slice(value);
                Some((start as u32, self.arena.len() as u32))
            }
        }
    }

    fn get(&self, span: Span) -> Option<&[u8]> {
        span.map(|(s, e)| &self.arena[s as usize..e as usize])
    }

    /// The method as sent (for logs).
    pub fn method_name(&self) -> &[u8] {
        self.get(self.method_name).unwrap_or_default()
    }
    /// The request target as sent.
    pub fn target(&self) -> &[u8] {
        self.get(self.target).unwrap_or_default()
    }
    /// The Range field, unless absent or repeated (a repeated Range is ignored).
    pub fn range(&self) -> Option<&[u8]> {
        if self.range_repeated {
            None
        } else {
            self.get(self.range)
        }
    }
    pub fn if_range(&self) -> Option<&[u8]> {
        self.get(self.if_range)
    }
    pub fn if_match(&self) -> Option<&[u8]> {
        self.get(self.if_match)
    }
    pub fn if_none_match(&self) -> Option<&[u8]> {
        self.get(self.if_none_match)
    }
    pub fn if_modified_since(&self) -> Option<&[u8]> {
        self.get(self.if_modified_since)
    }
    pub fn if_unmodified_since(&self) -> Option<&[u8]> {
        self.get(self.if_unmodified_since)
    }
    pub fn origin(&self) -> Option<&[u8]> {
        self.get(self.origin)
    }
    /// `Access-Control-Request-Method`, present on CORS preflight requests.
    pub fn cors_request_method(&self) -> Option<&[u8]> {
        self.get(self.cors_request_method)
    }
    /// The `Cookie` field (several are joined with "; "), for signed-URL tokens.
    pub fn cookie(&self) -> Option<&[u8]> {
        self.get(self.cookie)
    }
    /// The User-Agent field (the last one sent), for access logs.
    pub fn user_agent(&self) -> Option<&[u8]> {
        self.get(self.user_agent)
    }
    /// The Referer field (the last one sent), for access logs.
    pub fn referer(&self) -> Option<&[u8]> {
        self.get(self.referer)
    }
}

/// Whether `buf` may hold a complete head, looking only at bytes from `from` on
/// (minus the few a terminator can straddle). Lets a connection that receives a
/// head in many small pieces scan each byte once, instead of re-parsing the whole
/// buffer after every read (which a trickling client could turn into quadratic work).
pub fn may_be_complete(buf: &[u8], from: usize) -> bool {
    let start = from.saturating_sub(3);
    buf[start.min(buf.len())..].windows(2).any(|w| w == b"\n\n" || w == b"\n\r")
}

fn oversized(buf: &[u8], limits: &Limits) -> RequestError {
    let line_end = buf.iter().position(|&b| b == b'\n');
    match line_end {
        None => RequestError::UriTooLong,
        Some(n) if n > limits.max_uri_bytes => RequestError::UriTooLong,
        Some(_) => RequestError::HeadTooLarge,
    }
}

/// httparse only speaks HTTP/1.0 and 1.1; tell a different well-formed version
/// (505) from garbage (400).
fn version_error(buf: &[u8]) -> RequestError {
    let line = buf.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = trim(line.strip_suffix(b"\r").unwrap_or(line));
    let version = line.rsplit(|&b| b == b' ').next().unwrap_or_default();
    match version {
        [b'H', b'T', b'T', b'P', b'/', major, b'.', minor] if major.is_ascii_digit() && minor.is_ascii_digit() => {
            RequestError::VersionNotSupported
        }
        [b'H', b'T', b'T', b'P', b'/', major] if major.is_ascii_digit() => RequestError::VersionNotSupported,
        _ => RequestError::BadRequest("malformed HTTP version"),
    }
}

/// `Host = uri-host [ ":" port ]` (RFC 9112 section 3.2, RFC 3986 section 3.2.2):
/// a reg-name (which covers IPv4 addresses) or a bracketed IPv6 address, then
/// optional port digits. The empty value is valid (a target without authority).
fn is_valid_host(value: &[u8]) -> bool {
    let (host, port) = if let Some(rest) = value.strip_prefix(b"[") {
        let Some(close) = rest.iter().position(|&b| b == b']') else {
            return false;
        };
        let literal = std::str::from_utf8(&rest[..close]).ok();
        if literal.and_then(|l| l.parse::<std::net::Ipv6Addr>().ok()).is_none() {
            return false;
        }
        (&b""[..], &rest[close + 1..])
    } else {
        let end = value.iter().position(|&b| b == b':').unwrap_or(value.len());
        (&value[..end], &value[end..])
    };
    let port_ok = match port {
        [] => true,
        [b':', digits @ ..] => digits.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    port_ok && is_reg_name(host)
}

/// `reg-name = *( unreserved / pct-encoded / sub-delims )`.
fn is_reg_name(s: &[u8]) -> bool {
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'%' => {
                if !(s.get(i + 1).is_some_and(u8::is_ascii_hexdigit) && s.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
                {
                    return false;
                }
                i += 3;
                continue;
            }
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {}
            b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' => {}
            _ => return false,
        }
        i += 1;
    }
    true
}

/// `Content-Length = 1*DIGIT`, also accepting a list of identical values
/// ("42, 42"), which RFC 9112 section 6.3 allows a recipient to treat as one.
fn parse_content_length(value: &[u8]) -> Result<u64, RequestError> {
    let mut result: Option<u64> = None;
    for part in value.split(|&b| b == b',').map(trim) {
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return Err(RequestError::BadRequest("invalid Content-Length"));
        }
        let n = std::str::from_utf8(part)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or(RequestError::BadRequest("Content-Length out of range"))?;
        if result.is_some_and(|m| m != n) {
            return Err(RequestError::BadRequest("conflicting Content-Length values"));
        }
        result = Some(n);
    }
    result.ok_or(RequestError::BadRequest("empty Content-Length"))
}

/// Strips optional whitespace (SP / HTAB) at both ends.
pub(crate) fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &str) -> Result<(Request, Parsed), RequestError> {
        let mut r = Request::default();
        let p = r.parse(raw.as_bytes(), &Limits::default())?;
        Ok((r, p))
    }

    #[test]
    fn simple_get() {
        let raw = "GET /a/b.mp4?x=1 HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\n\r\nGET /next";
        let (r, p) = parse(raw).unwrap();
        assert_eq!(p, Parsed::Complete(raw.len() - "GET /next".len()));
        assert_eq!(r.method, Method::Get);
        assert_eq!(r.version, Version::Http11);
        assert_eq!(r.target(), b"/a/b.mp4?x=1");
        assert_eq!(r.range(), Some(&b"bytes=0-9"[..]));
        assert!(r.keep_alive);
        assert_eq!(r.body, BodyFraming::None);
    }

    #[test]
    fn partial_heads_wait_for_more() {
        assert_eq!(parse("GET / HTTP/1.1\r\nHost: h\r\n").unwrap().1, Parsed::Partial);
        assert_eq!(parse("GE").unwrap().1, Parsed::Partial);
    }

    #[test]
    fn keep_alive_rules() {
        assert!(!parse("GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").unwrap().0.keep_alive);
        assert!(!parse("GET / HTTP/1.0\r\n\r\n").unwrap().0.keep_alive);
        assert!(parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").unwrap().0.keep_alive);
        assert!(!parse("GET / HTTP/1.1\r\nHost: h\r\nConnection: upgrade, close\r\n\r\n").unwrap().0.keep_alive);
    }

    #[test]
    fn methods() {
        assert_eq!(parse("HEAD / HTTP/1.1\r\nHost: h\r\n\r\n").unwrap().0.method, Method::Head);
        assert_eq!(parse("OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n").unwrap().0.method, Method::Options);
        let (r, _) = parse("DELETE / HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
        assert_eq!(r.method, Method::Other);
        assert_eq!(r.method_name(), b"DELETE");
    }

    #[test]
    fn host_is_required_in_1_1_and_unique() {
        assert!(matches!(parse("GET / HTTP/1.1\r\n\r\n"), Err(RequestError::BadRequest(_))));
        assert!(parse("GET / HTTP/1.0\r\n\r\n").is_ok());
        assert!(matches!(parse("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), Err(RequestError::BadRequest(_))));
    }

    #[test]
    fn host_must_be_host_and_port() {
        for good in [
            "example.com",
            "example.com:8080",
            "EXAMPLE.com.",
            "127.0.0.1",
            "127.0.0.1:80",
            "[::1]",
            "[2001:db8::1]:443",
            "xn--bcher-kva.example",
            "a%41b",
            "host:",
            "",
        ] {
            let raw = format!("GET / HTTP/1.1\r\nHost: {good}\r\n\r\n");
            assert!(parse(&raw).is_ok(), "{good:?}");
        }
        for bad in [
            "a b",
            "evil.example/path",
            "user@example.com",
            "example.com:80:80",
            "example.com:8x",
            "[::1",
            "[not-v6]",
            "[::1]x",
            "::1",
            "a%zz",
            "a\\b",
            "a?b",
            "a#b",
            "\"quoted\"",
            "h\x7f",
        ] {
            let raw = format!("GET / HTTP/1.1\r\nHost: {bad}\r\n\r\n");
            assert!(matches!(parse(&raw), Err(RequestError::BadRequest(_))), "{bad:?}");
        }
        // HTTP/1.0 has no Host requirement, but a Host it sends must be valid too.
        assert!(matches!(parse("GET / HTTP/1.0\r\nHost: a/b\r\n\r\n"), Err(RequestError::BadRequest(_))));
    }

    #[test]
    fn malformed_heads_are_400() {
        for raw in [
            "GET / HTTP/1.1\r\nHo st: h\r\n\r\n",
            "GET  HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n",
            "\x01GET / HTTP/1.1\r\n\r\n",
            "GET / HTTX/1.1\r\nHost: h\r\n\r\n",
        ] {
            assert!(matches!(parse(raw), Err(RequestError::BadRequest(_))), "{raw:?}");
        }
    }

    #[test]
    fn other_versions_are_505() {
        assert_eq!(parse("GET / HTTP/2.0\r\n\r\n").unwrap_err(), RequestError::VersionNotSupported);
        assert_eq!(parse("GET / HTTP/3\r\n\r\n").unwrap_err(), RequestError::VersionNotSupported);
    }

    #[test]
    fn size_limits() {
        let limits = Limits { max_head_bytes: 1024, max_uri_bytes: 100, max_headers: 4 };
        let mut r = Request::default();
        let long_uri = format!("GET /{} HTTP/1.1\r\nHost: h\r\n\r\n", "a".repeat(200));
        assert_eq!(r.parse(long_uri.as_bytes(), &limits), Err(RequestError::UriTooLong));
        // A request line that never ends is refused as soon as it passes the URI limit.
        let endless = format!("GET /{}", "a".repeat(300));
        assert_eq!(r.parse(endless.as_bytes(), &limits), Err(RequestError::UriTooLong));
        let big_head = format!("GET / HTTP/1.1\r\nHost: h\r\nX: {}\r\n", "b".repeat(2000));
        assert_eq!(r.parse(big_head.as_bytes(), &limits), Err(RequestError::HeadTooLarge));
        let many = "GET / HTTP/1.1\r\nHost: h\r\na: 1\r\nb: 1\r\nc: 1\r\nd: 1\r\n\r\n";
        assert_eq!(r.parse(many.as_bytes(), &limits), Err(RequestError::HeadTooLarge));
    }

    #[test]
    fn long_request_line_is_414_however_it_arrives() {
        // A request line far longer than the URI limit is refused while it is still
        // arriving; the same line read in one piece must get the same answer, even
        // when the length is in the method rather than the target.
        let limits = Limits { max_head_bytes: 1024, max_uri_bytes: 100, max_headers: 4 };
        let raw = format!("{} / HTTP/1.1\r\nHost: h\r\n\r\n", "A".repeat(300));
        let mut r = Request::default();
        assert_eq!(r.parse(&raw.as_bytes()[..200], &limits), Err(RequestError::UriTooLong));
        assert_eq!(r.parse(raw.as_bytes(), &limits), Err(RequestError::UriTooLong));
    }

    #[test]
    fn body_framing() {
        let (r, _) = parse("GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n").unwrap();
        assert_eq!(r.body, BodyFraming::Length(5));
        let (r, _) = parse("GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 5\r\n\r\n").unwrap();
        assert_eq!(r.body, BodyFraming::Length(5));
        let (r, _) = parse("GET / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").unwrap();
        assert_eq!(r.body, BodyFraming::Chunked);
        for bad in [
            "GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 6\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nContent-Length: -5\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nContent-Length: +5\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999999\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: \r\n\r\n",
            "GET / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert!(matches!(parse(bad), Err(RequestError::BadRequest(_))), "{bad:?}");
        }
    }

    #[test]
    fn expect_100_continue_is_recognised() {
        let (r, _) = parse("POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-Continue\r\nContent-Length: 5\r\n\r\n").unwrap();
        assert!(r.expect_continue);
        assert!(!parse("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n").unwrap().0.expect_continue);
        // HTTP/1.0 clients may not expect 100 (RFC 9110 section 10.1.1).
        assert!(
            !parse("POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n").unwrap().0.expect_continue
        );
        for bad in ["Expect: 200-ok", "Expect: 100-continue, foo=bar", "Expect: 100-continue\r\nExpect: x"] {
            let raw = format!("GET / HTTP/1.1\r\nHost: h\r\n{bad}\r\n\r\n");
            assert_eq!(parse(&raw).unwrap_err(), RequestError::ExpectationFailed, "{bad}");
            assert_eq!(RequestError::ExpectationFailed.status().code(), 417);
        }
    }

    #[test]
    fn chunked_applied_twice_is_400() {
        for bad in [
            "GET / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip, chunked\r\n\r\n",
        ] {
            assert!(matches!(parse(bad), Err(RequestError::BadRequest(_))), "{bad:?}");
        }
    }

    #[test]
    fn list_fields_are_joined_and_repeated_range_ignored() {
        let (r, _) = parse(
            "GET / HTTP/1.1\r\nHost: h\r\nIf-None-Match: \"a\"\r\nRange: bytes=0-1\r\nIf-None-Match: \"b\"\r\nRange: bytes=2-3\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.if_none_match(), Some(&b"\"a\", \"b\""[..]));
        assert_eq!(r.range(), None);
    }

    #[test]
    fn cookie_fields_are_joined_with_semicolons() {
        let (r, _) = parse("GET / HTTP/1.1\r\nHost: h\r\nCookie: a=1; b=2\r\ncookie:  c=3 \r\n\r\n").unwrap();
        assert_eq!(r.cookie(), Some(&b"a=1; b=2; c=3"[..]));
        let (r, _) = parse("GET / HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
        assert_eq!(r.cookie(), None);
    }

    #[test]
    fn completeness_hint() {
        let head = b"GET / HTTP/1.1\r\nHost: h\r\n\r\n";
        assert!(may_be_complete(head, 0));
        assert!(may_be_complete(head, head.len() - 1));
        assert!(!may_be_complete(b"GET / HTTP/1.1\r\nHost: h\r\n", 0));
        assert!(may_be_complete(b"GET / HTTP/1.0\n\n", 14));
    }

    #[test]
    fn clear_forgets_the_previous_method() {
        let mut r = Request::default();
        let l = Limits::default();
        r.parse(b"HEAD / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &l).unwrap();
        r.clear();
        assert_eq!(
            (r.method, r.version, r.keep_alive, r.body),
            (Method::Get, Version::Http11, false, BodyFraming::None)
        );
        assert_eq!(r.target(), b"");
    }

    #[test]
    fn reuse_clears_previous_fields() {
        let mut r = Request::default();
        let l = Limits::default();
        r.parse(
            b"GET / HTTP/1.1\r\nHost: h\r\nRange: bytes=1-2\r\nOrigin: x\r\nUser-Agent: p/1\r\nreferer: r\r\n\r\n",
            &l,
        )
        .unwrap();
        assert_eq!((r.user_agent(), r.referer()), (Some(&b"p/1"[..]), Some(&b"r"[..])));
        r.parse(b"GET /b HTTP/1.1\r\nHost: h\r\n\r\n", &l).unwrap();
        assert_eq!(r.range(), None);
        assert_eq!(r.origin(), None);
        assert_eq!(r.user_agent(), None);
        assert_eq!(r.target(), b"/b");
    }
}
