//! Reading one HTTP/1.1 response: the head parsed by `httparse`, then a body of known
//! length handed to a sink chunk by chunk, exactly as the bytes arrive.
//!
//! The client sends one request at a time on a connection, so every byte that
//! arrives belongs to the current response; a byte past its end is a protocol error.
//! What counts as the right answer is fixed up front by `Expect`: `206` with the
//! exact `Content-Range` and `Content-Length` for a segment, `200` with a
//! `Content-Length` for a `HEAD` that discovers a title's size, `200` with a
//! `Content-Length` and its body for a whole resource (a live playlist or segment).

/// Longest response head accepted (status line and fields).
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Most header fields parsed in a response head.
const MAX_HEADERS: usize = 64;

/// What the response to a request must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// `206` for `bytes=first-last`, of a resource of any size.
    Range { first: u64, last: u64 },
    /// `200` to a `HEAD`: no body, and the size is in `Content-Length`.
    Head,
    /// `200` to a `GET` of a whole resource, its length in `Content-Length`.
    Whole,
}

/// Why a response was not what was expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResponseError {
    #[error("status {0}")]
    Status(u16),
    #[error("malformed response: {0}")]
    Protocol(&'static str),
}

/// The parts of a response head the client acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    pub content_length: u64,
    /// The server will close the connection after this response.
    pub close: bool,
}

/// Where a response stands after a chunk of bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    NeedMore,
    Done,
}

/// One response being read. Reusable: [`ResponseReader::start`] resets it and keeps
/// the head buffer's allocation.
#[derive(Debug, Default)]
pub struct ResponseReader {
    head_buf: Vec<u8>,
    expect: Option<Expect>,
    head: Option<Head>,
    body_left: u64,
    done: bool,
}

impl ResponseReader {
    pub fn start(&mut self, expect: Expect) {
        self.head_buf.clear();
        self.expect = Some(expect);
        self.head = None;
        self.body_left = 0;
        self.done = false;
    }

    /// The head, once it has been read.
    pub fn head(&self) -> Option<Head> {
        self.head
    }

    /// Body bytes still to come.
    #[cfg(test)]
    pub fn body_left(&self) -> u64 {
        self.body_left
    }

    /// Feeds the next bytes of the connection. Body bytes go to `body` in order.
    pub fn feed(&mut self, mut data: &[u8], body: &mut dyn FnMut(&[u8])) -> Result<Progress, ResponseError> {
        if self.done {
            return if data.is_empty() {
                Ok(Progress::Done)
            } else {
                Err(ResponseError::Protocol("bytes after the end of the response"))
            };
        }
        if self.head.is_none() {
            let consumed = self.read_head(data)?;
            match consumed {
                None => return Ok(Progress::NeedMore),
                Some(n) => data = &data[n..],
            }
        }
        let take = (data.len() as u64).min(self.body_left) as usize;
        if take > 0 {
            body(&data[..take]);
            self.body_left -= take as u64;
        }
        if self.body_left == 0 {
            self.done = true;
            if take < data.len() {
                return Err(ResponseError::Protocol("bytes after the end of the response"));
            }
            return Ok(Progress::Done);
        }
        Ok(Progress::NeedMore)
    }

    /// Parses the head once complete. Returns how many bytes of `data` it used, or
    /// `None` if the head is still incomplete (the bytes are kept).
    fn read_head(&mut self, data: &[u8]) -> Result<Option<usize>, ResponseError> {
        // At most one byte past the limit is parsed, however the head arrives, so
        // that the answer never depends on where the reads split it.
        let previously = self.head_buf.len();
        let data = &data[..data.len().min((MAX_HEAD_BYTES + 1).saturating_sub(previously))];
        // Avoid the copy in the usual case: the whole head is in this chunk.
        let buf = if previously == 0 {
            data
        } else {
            self.head_buf.extend_from_slice(data);
            &self.head_buf[..]
        };
        let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut fields);
        let len = match resp.parse(buf) {
            Ok(httparse::Status::Complete(len)) if len > MAX_HEAD_BYTES => {
                return Err(ResponseError::Protocol("response head too large"))
            }
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => {
                if buf.len() > MAX_HEAD_BYTES {
                    return Err(ResponseError::Protocol("response head too large"));
                }
                if previously == 0 {
                    self.head_buf.extend_from_slice(data);
                }
                return Ok(None);
            }
            Err(_) => return Err(ResponseError::Protocol("unparseable response head")),
        };
        let expect = self.expect.expect("start() was called");
        let head = interpret(&resp, expect)?;
        self.head = Some(head);
        self.body_left = match expect {
            Expect::Head => 0, // the size is announced; no body follows
            Expect::Range { .. } | Expect::Whole => head.content_length,
        };
        Ok(Some(len - previously))
    }
}

fn interpret(resp: &httparse::Response<'_, '_>, expect: Expect) -> Result<Head, ResponseError> {
    let status = resp.code.ok_or(ResponseError::Protocol("no status code"))?;
    let mut content_length = None;
    let mut close = resp.version == Some(0);
    for f in resp.headers.iter() {
        if f.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(f.value).ok().and_then(|v| digits(v.trim_ascii()));
            let v = v.ok_or(ResponseError::Protocol("bad Content-Length"))?;
            if content_length.is_some_and(|c| c != v) {
                return Err(ResponseError::Protocol("conflicting Content-Length fields"));
            }
            content_length = Some(v);
        } else if f.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(ResponseError::Protocol("Transfer-Encoding instead of Content-Length"));
        } else if f.name.eq_ignore_ascii_case("connection") {
            let v = String::from_utf8_lossy(f.value);
            if v.split(',').any(|t| t.trim_ascii().eq_ignore_ascii_case("close")) {
                close = true;
            }
        }
    }
    match expect {
        Expect::Head => {
            if status != 200 {
                return Err(ResponseError::Status(status));
            }
            let size = content_length.ok_or(ResponseError::Protocol("no Content-Length in the HEAD response"))?;
            // A HEAD response announces the size but carries no body.
            Ok(Head { status, content_length: size, close })
        }
        Expect::Whole => {
            if status != 200 {
                return Err(ResponseError::Status(status));
            }
            let len = content_length.ok_or(ResponseError::Protocol("no Content-Length"))?;
            Ok(Head { status, content_length: len, close })
        }
        Expect::Range { first, last } => {
            if status != 206 {
                return Err(ResponseError::Status(status));
            }
            let len = content_length.ok_or(ResponseError::Protocol("no Content-Length"))?;
            if len != last - first + 1 {
                return Err(ResponseError::Protocol("Content-Length differs from the requested range"));
            }
            // Every Content-Range field must state the range (a second one that
            // differs is not overruled by the first).
            let mut ranges = resp
                .headers
                .iter()
                .filter(|f| f.name.eq_ignore_ascii_case("content-range"))
                .map(|f| parse_content_range(f.value))
                .peekable();
            if ranges.peek().is_none() {
                return Err(ResponseError::Protocol("206 without Content-Range"));
            }
            if !ranges.all(|r| r == Some((first, last))) {
                return Err(ResponseError::Protocol("Content-Range differs from the requested range"));
            }
            Ok(Head { status, content_length: len, close })
        }
    }
}

/// `bytes FIRST-LAST/COMPLETE` (or `/*`) → (FIRST, LAST), if valid: RFC 9110
/// section 14.4 makes a range whose LAST is not below COMPLETE invalid, and its
/// content must not be used.
fn parse_content_range(v: &[u8]) -> Option<(u64, u64)> {
    let v = std::str::from_utf8(v).ok()?.trim_ascii();
    let (span, complete) = v.strip_prefix("bytes ")?.split_once('/')?;
    let (first, last) = span.split_once('-')?;
    let (first, last) = (digits(first)?, digits(last)?);
    let valid = first <= last && (complete == "*" || digits(complete)? > last);
    valid.then_some((first, last))
}

/// `1*DIGIT` as a number (`str::parse` would also take a sign).
fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &[u8] =
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 10-19/100\r\nContent-Length: 10\r\n\r\n0123456789";

    fn read_all(chunks: &[&[u8]], expect: Expect) -> (Result<Progress, ResponseError>, Vec<u8>) {
        let mut r = ResponseReader::default();
        r.start(expect);
        let mut body = Vec::new();
        let mut last = Ok(Progress::NeedMore);
        for c in chunks {
            last = r.feed(c, &mut |b| body.extend_from_slice(b));
            if last.is_err() {
                break;
            }
        }
        (last, body)
    }

    #[test]
    fn a_range_response_in_one_chunk_or_byte_by_byte() {
        let expect = Expect::Range { first: 10, last: 19 };
        assert_eq!(read_all(&[OK], expect), (Ok(Progress::Done), b"0123456789".to_vec()));
        let bytes: Vec<&[u8]> = OK.chunks(1).collect();
        assert_eq!(read_all(&bytes, expect), (Ok(Progress::Done), b"0123456789".to_vec()));
        let halves: Vec<&[u8]> = OK.chunks(40).collect();
        assert_eq!(read_all(&halves, expect), (Ok(Progress::Done), b"0123456789".to_vec()));
    }

    #[test]
    fn wrong_answers_are_errors() {
        let expect = Expect::Range { first: 10, last: 19 };
        let whole = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n";
        assert_eq!(read_all(&[whole], expect).0, Err(ResponseError::Status(200)));
        let other = b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-9/100\r\nContent-Length: 10\r\n\r\n";
        assert!(matches!(read_all(&[other], expect).0, Err(ResponseError::Protocol(_))));
        let chunked =
            b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 10-19/100\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(matches!(read_all(&[chunked], expect).0, Err(ResponseError::Protocol(_))));
        assert!(matches!(read_all(&[b"garbage\r\n\r\n"], expect).0, Err(ResponseError::Protocol(_))));
        let mut extra = OK.to_vec();
        extra.push(b'!');
        assert!(matches!(read_all(&[&extra], expect).0, Err(ResponseError::Protocol(_))));
    }

    #[test]
    fn a_partial_body_needs_more_and_reports_what_is_left() {
        let mut r = ResponseReader::default();
        r.start(Expect::Range { first: 10, last: 19 });
        let mut n = 0;
        assert_eq!(r.feed(&OK[..OK.len() - 4], &mut |b| n += b.len()), Ok(Progress::NeedMore));
        assert_eq!(n, 6);
        assert_eq!(r.body_left(), 4);
        assert!(!r.head().unwrap().close);
    }

    #[test]
    fn a_whole_resource_is_a_200_with_its_body() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
        let (r, body) = read_all(&[&ok[..20], &ok[20..]], Expect::Whole);
        assert_eq!((r, body.as_slice()), (Ok(Progress::Done), &b"hello"[..]));
        let partial = b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-4/9\r\nContent-Length: 5\r\n\r\nhello";
        assert_eq!(read_all(&[partial], Expect::Whole).0, Err(ResponseError::Status(206)));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
        assert!(matches!(read_all(&[chunked], Expect::Whole).0, Err(ResponseError::Protocol(_))));
    }

    #[test]
    fn head_responses_and_connection_close() {
        let h = b"HTTP/1.1 200 OK\r\nContent-Length: 12345\r\nConnection: close\r\n\r\n";
        let mut r = ResponseReader::default();
        r.start(Expect::Head);
        // The size is announced, the body is absent: a HEAD reader sets it to zero.
        let mut got = 0;
        let p = r.feed(h, &mut |b| got += b.len());
        let head = r.head().unwrap();
        assert_eq!(head.content_length, 12345);
        assert!(head.close);
        assert_eq!(got, 0);
        assert_eq!(p, Ok(Progress::Done));
        r.start(Expect::Head);
        assert_eq!(
            r.feed(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", &mut |_| {}),
            Err(ResponseError::Status(404))
        );
    }

    #[test]
    fn an_endless_head_is_refused() {
        let mut r = ResponseReader::default();
        r.start(Expect::Head);
        let mut res = r.feed(b"HTTP/1.1 200 OK\r\n", &mut |_| {});
        for _ in 0..2000 {
            res = r.feed(b"X-Filler: aaaaaaaaaaaaaaaa\r\n", &mut |_| {});
            if res.is_err() {
                break;
            }
        }
        assert!(matches!(res, Err(ResponseError::Protocol(_))));
    }

    fn range_head(fields: &str) -> Result<Progress, ResponseError> {
        let text = format!("HTTP/1.1 206 Partial Content\r\n{fields}\r\n0123456789");
        read_all(&[text.as_bytes()], Expect::Range { first: 10, last: 19 }).0
    }

    /// A head over the limit was refused when it arrived in pieces but accepted
    /// when it arrived in one read (and other heads got different errors).
    #[test]
    fn a_long_head_is_refused_however_it_arrives() {
        let expect = Expect::Range { first: 10, last: 19 };
        for extra in [0, 1, 2, 100] {
            // Heads of MAX_HEAD_BYTES - 1, MAX_HEAD_BYTES, + 1 and + 99 bytes.
            let pad = "a".repeat(MAX_HEAD_BYTES - (OK.len() - 10) - 10 + extra);
            let mut text = b"HTTP/1.1 206 Partial Content\r\nX-Pad: ".to_vec();
            text.extend_from_slice(pad.as_bytes());
            text.extend_from_slice(b"\r\n");
            text.extend_from_slice(&OK[30..]);
            let head_len = text.len() - 10;
            assert_eq!(head_len, MAX_HEAD_BYTES - 1 + extra);
            let whole = read_all(&[&text], expect);
            for cut in [1, 100, MAX_HEAD_BYTES, head_len - 1, head_len, text.len() - 1] {
                assert_eq!(read_all(&[&text[..cut], &text[cut..]], expect), whole, "cut at {cut}");
            }
            if head_len <= MAX_HEAD_BYTES {
                assert_eq!(whole, (Ok(Progress::Done), b"0123456789".to_vec()), "{head_len} bytes");
            } else {
                assert_eq!(whole.0, Err(ResponseError::Protocol("response head too large")), "{head_len} bytes");
            }
        }
    }

    /// RFC 9110 section 14.4: a Content-Range whose last position is not below the
    /// complete length is invalid.
    #[test]
    fn content_range_past_the_complete_length_is_refused() {
        for (range, ok) in
            [("10-19/100", true), ("10-19/20", true), ("10-19/*", true), ("10-19/19", false), ("10-19/5", false)]
        {
            let r = range_head(&format!("Content-Range: bytes {range}\r\nContent-Length: 10\r\n"));
            assert_eq!(r.is_ok(), ok, "{range}: {r:?}");
        }
    }

    /// The last of several Content-Range fields used to decide alone.
    #[test]
    fn a_second_content_range_must_agree() {
        let r =
            range_head("Content-Range: #bytes 10-19/100\r\nContent-Range: bytes 10-19/100\r\nContent-Length: 10\r\n");
        assert!(matches!(r, Err(ResponseError::Protocol(_))), "{r:?}");
        let r = range_head("Content-Range: bytes 10-19/100\r\nContent-Range: bytes 10-19/*\r\nContent-Length: 10\r\n");
        assert_eq!(r, Ok(Progress::Done));
    }

    /// Numbers are `1*DIGIT`, with only spaces and tabs around the field value:
    /// `str::parse` took `+10`, and `str::trim` took away a no-break space.
    #[test]
    fn content_length_and_range_are_digits_only() {
        for fields in [
            "Content-Range: bytes 10-19/100\r\nContent-Length: +10\r\n",
            "Content-Range: bytes +10-19/100\r\nContent-Length: 10\r\n",
            "Content-Range: bytes 10- 19/100\r\nContent-Length: 10\r\n",
            "Content-Range: bytes 10-19/+100\r\nContent-Length: 10\r\n",
            "Content-Range: bytes 10-19/100\r\nContent-Length: \u{a0}10\r\n",
        ] {
            assert!(matches!(range_head(fields), Err(ResponseError::Protocol(_))), "{fields:?}");
        }
        assert_eq!(range_head("Content-Range:\tbytes 10-19/0100 \r\nContent-Length: 010\t\r\n"), Ok(Progress::Done));
    }
}
