//! Status codes and the response head writer.

/// The statuses the server sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    Ok,
    NoContent,
    PartialContent,
    MovedPermanently,
    NotModified,
    BadRequest,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    RequestTimeout,
    Gone,
    PreconditionFailed,
    ContentTooLarge,
    UriTooLong,
    RangeNotSatisfiable,
    ExpectationFailed,
    HeaderFieldsTooLarge,
    InternalServerError,
    BadGateway,
    ServiceUnavailable,
    GatewayTimeout,
    VersionNotSupported,
    LoopDetected,
}

impl Status {
    /// Every status, in a fixed order (see [`Status::index`]).
    pub const ALL: [Status; 23] = [
        Status::Ok,
        Status::NoContent,
        Status::PartialContent,
        Status::MovedPermanently,
        Status::NotModified,
        Status::BadRequest,
        Status::Forbidden,
        Status::NotFound,
        Status::MethodNotAllowed,
        Status::RequestTimeout,
        Status::Gone,
        Status::PreconditionFailed,
        Status::ContentTooLarge,
        Status::UriTooLong,
        Status::RangeNotSatisfiable,
        Status::ExpectationFailed,
        Status::HeaderFieldsTooLarge,
        Status::InternalServerError,
        Status::BadGateway,
        Status::ServiceUnavailable,
        Status::GatewayTimeout,
        Status::VersionNotSupported,
        Status::LoopDetected,
    ];

    /// This status's position in [`Status::ALL`], for per-status counters.
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn code(self) -> u16 {
        match self {
            Status::Ok => 200,
            Status::NoContent => 204,
            Status::PartialContent => 206,
            Status::MovedPermanently => 301,
            Status::NotModified => 304,
            Status::BadRequest => 400,
            Status::Forbidden => 403,
            Status::NotFound => 404,
            Status::MethodNotAllowed => 405,
            Status::RequestTimeout => 408,
            Status::Gone => 410,
            Status::PreconditionFailed => 412,
            Status::ContentTooLarge => 413,
            Status::UriTooLong => 414,
            Status::RangeNotSatisfiable => 416,
            Status::ExpectationFailed => 417,
            Status::HeaderFieldsTooLarge => 431,
            Status::InternalServerError => 500,
            Status::BadGateway => 502,
            Status::ServiceUnavailable => 503,
            Status::GatewayTimeout => 504,
            Status::VersionNotSupported => 505,
            Status::LoopDetected => 508,
        }
    }

    pub fn reason(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::NoContent => "No Content",
            Status::PartialContent => "Partial Content",
            Status::MovedPermanently => "Moved Permanently",
            Status::NotModified => "Not Modified",
            Status::BadRequest => "Bad Request",
            Status::Forbidden => "Forbidden",
            Status::NotFound => "Not Found",
            Status::MethodNotAllowed => "Method Not Allowed",
            Status::RequestTimeout => "Request Timeout",
            Status::Gone => "Gone",
            Status::PreconditionFailed => "Precondition Failed",
            Status::ContentTooLarge => "Content Too Large",
            Status::UriTooLong => "URI Too Long",
            Status::RangeNotSatisfiable => "Range Not Satisfiable",
            Status::ExpectationFailed => "Expectation Failed",
            Status::HeaderFieldsTooLarge => "Request Header Fields Too Large",
            Status::InternalServerError => "Internal Server Error",
            Status::BadGateway => "Bad Gateway",
            Status::ServiceUnavailable => "Service Unavailable",
            Status::GatewayTimeout => "Gateway Timeout",
            Status::VersionNotSupported => "HTTP Version Not Supported",
            Status::LoopDetected => "Loop Detected",
        }
    }

    /// The status with code `code`, if it is one of these.
    pub fn from_code(code: u16) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.code() == code)
    }

    /// Whether a response with this status never has a body (RFC 9110 section 6.4.1).
    pub fn is_bodiless(self) -> bool {
        matches!(self, Status::NoContent | Status::NotModified)
    }
}

/// Writes a response head into a reusable buffer. The server always answers as
/// HTTP/1.1, which RFC 9110 section 6.2 asks of a 1.1 server talking to 1.0 clients too.
pub struct HeadWriter<'a> {
    buf: &'a mut Vec<u8>,
}

impl<'a> HeadWriter<'a> {
    /// Clears `buf` and writes the status line.
    pub fn new(buf: &'a mut Vec<u8>, status: Status) -> Self {
        buf.clear();
        buf.extend_from_slice(b"HTTP/1.1 ");
        let mut code = itoa::Buffer::new();
        buf.extend_from_slice(code.format(status.code()).as_bytes());
        buf.push(b' ');
        buf.extend_from_slice(status.reason().as_bytes());
        buf.extend_from_slice(b"\r\n");
        HeadWriter { buf }
    }

    /// Adds a field. Values come from the server and its configuration, which were
    /// checked not to contain CR or LF.
    pub fn field(&mut self, name: &str, value: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.extend_from_slice(b": ");
        self.buf.extend_from_slice(value);
        self.buf.extend_from_slice(b"\r\n");
        self
    }

    pub fn field_u64(&mut self, name: &str, value: u64) -> &mut Self {
        let mut n = itoa::Buffer::new();
        self.field(name, n.format(value).as_bytes())
    }

    /// `Content-Range: bytes first-last/len`.
    pub fn content_range(&mut self, first: u64, last: u64, len: u64) -> &mut Self {
        self.buf.extend_from_slice(b"Content-Range: ");
        write_range_value(self.buf, first, last, len);
        self.buf.extend_from_slice(b"\r\n");
        self
    }

    /// `Content-Range: bytes */len`, a 416's.
    pub fn unsatisfied_range(&mut self, len: u64) -> &mut Self {
        self.buf.extend_from_slice(b"Content-Range: bytes */");
        self.buf.extend_from_slice(itoa::Buffer::new().format(len).as_bytes());
        self.buf.extend_from_slice(b"\r\n");
        self
    }

    /// Appends fields that were rendered ahead of time (`Name: value\r\n` lines).
    pub fn rendered(&mut self, fields: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(fields);
        self
    }

    /// Ends the head with the empty line.
    pub fn finish(&mut self) {
        self.buf.extend_from_slice(b"\r\n");
    }
}

const RANGE_UNIT: &[u8] = b"bytes ";

/// `bytes first-last/len`, the value of Content-Range.
pub(crate) fn write_range_value(buf: &mut Vec<u8>, first: u64, last: u64, len: u64) {
    let mut n = itoa::Buffer::new();
    buf.extend_from_slice(RANGE_UNIT);
    buf.extend_from_slice(n.format(first).as_bytes());
    buf.push(b'-');
    buf.extend_from_slice(n.format(last).as_bytes());
    buf.push(b'/');
    buf.extend_from_slice(n.format(len).as_bytes());
}

/// The length of what [`write_range_value`] writes.
pub(crate) fn range_value_len(first: u64, last: u64, len: u64) -> usize {
    let mut n = itoa::Buffer::new();
    RANGE_UNIT.len() + n.format(first).len() + 1 + n.format(last).len() + 1 + n.format(len).len()
}

/// Whether a configured field value is safe to send (no CR, LF or other controls
/// except HTAB).
pub fn is_valid_field_value(v: &str) -> bool {
    v.bytes().all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_head() {
        let mut buf = Vec::new();
        HeadWriter::new(&mut buf, Status::PartialContent)
            .field("Content-Type", b"video/mp4")
            .field_u64("Content-Length", 10)
            .content_range(0, 9, 100)
            .finish();
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "HTTP/1.1 206 Partial Content\r\nContent-Type: video/mp4\r\nContent-Length: 10\r\nContent-Range: bytes 0-9/100\r\n\r\n"
        );
    }

    #[test]
    fn all_is_in_index_order() {
        for (i, s) in Status::ALL.iter().enumerate() {
            assert_eq!(s.index(), i);
        }
    }

    #[test]
    fn field_values() {
        assert!(is_valid_field_value("public, max-age=60"));
        assert!(!is_valid_field_value("a\r\nSet-Cookie: x"));
    }
}
