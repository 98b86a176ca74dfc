//! Discarding request bodies.
//!
//! A media server has no use for a request body, but a client may send one (a GET
//! with Content-Length, a chunked OPTIONS, a POST that gets 405). Its bytes must be
//! consumed exactly, or they would be read as the next pipelined request: that is how
//! request smuggling starts. [`Discard`] consumes a body of either framing within a
//! byte limit; past the limit the server answers 413 and closes. Chunked framing
//! is read strictly: every line (chunk size, the end of chunk data, trailers) must
//! end in CRLF, since a bare LF is where a proxy and a server may disagree.

use crate::request::BodyFraming;

/// A chunk-size line or trailer line longer than this is malformed.
const MAX_LINE_BYTES: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiscardError {
    /// The body is larger than the configured limit (413).
    TooLarge,
    /// Broken chunked framing (400).
    Malformed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Bytes of a Content-Length body, or of the current chunk's data, still to skip.
    Data {
        remaining: u64,
        chunked: bool,
    },
    /// After a chunk's data: its CRLF.
    DataEnd,
    ChunkSize,
    Trailers,
    Done,
}

/// Consumes one request body. Feed it the bytes after the head, then the bytes of
/// later reads, until [`Discard::is_done`].
#[derive(Debug)]
pub struct Discard {
    state: State,
    budget: u64,
}

impl Discard {
    /// Starts discarding a body of the given framing, allowing at most `limit` bytes
    /// on the wire (chunk framing included). A Content-Length over the limit fails at once.
    pub fn new(framing: BodyFraming, limit: u64) -> Result<Discard, DiscardError> {
        let state = match framing {
            BodyFraming::None => State::Done,
            BodyFraming::Length(n) if n > limit => return Err(DiscardError::TooLarge),
            BodyFraming::Length(n) => State::Data { remaining: n, chunked: false },
            BodyFraming::Chunked => State::ChunkSize,
        };
        Ok(Discard { state, budget: limit })
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Consumes as much of `buf` as belongs to the body; returns how many bytes that
    /// was. Stops at the end of the body, leaving the rest (a pipelined request).
    pub fn feed(&mut self, buf: &[u8]) -> Result<usize, DiscardError> {
        let mut used = 0;
        while used < buf.len() {
            let rest = &buf[used..];
            let step = match self.state {
                State::Done => break,
                State::Data { remaining, chunked } => {
                    let n = remaining.min(rest.len() as u64);
                    let left = remaining - n;
                    self.state = match (left, chunked) {
                        (0, true) => State::DataEnd,
                        (0, false) => State::Done,
                        _ => State::Data { remaining: left, chunked },
                    };
                    n as usize
                }
                State::DataEnd => match rest {
                    [b'\r', b'\n', ..] => {
                        self.state = State::ChunkSize;
                        2
                    }
                    [b'\r'] => break,
                    _ => return Err(DiscardError::Malformed),
                },
                State::ChunkSize => match httparse::parse_chunk_size(rest) {
                    Ok(httparse::Status::Complete((n, 0))) => {
                        self.state = State::Trailers;
                        n
                    }
                    Ok(httparse::Status::Complete((n, size))) => {
                        if size > self.budget {
                            return Err(DiscardError::TooLarge);
                        }
                        self.state = State::Data { remaining: size, chunked: true };
                        n
                    }
                    Ok(httparse::Status::Partial) if rest.len() > MAX_LINE_BYTES => {
                        return Err(DiscardError::Malformed)
                    }
                    Ok(httparse::Status::Partial) => break,
                    Err(_) => return Err(DiscardError::Malformed),
                },
                State::Trailers => match rest.iter().position(|&b| b == b'\n') {
                    Some(end) if end > MAX_LINE_BYTES => return Err(DiscardError::Malformed),
                    Some(end) => {
                        let Some(line) = rest[..end].strip_suffix(b"\r") else {
                            return Err(DiscardError::Malformed);
                        };
                        if line.is_empty() {
                            self.state = State::Done;
                        }
                        end + 1
                    }
                    None if rest.len() > MAX_LINE_BYTES => return Err(DiscardError::Malformed),
                    None => break,
                },
            };
            if step as u64 > self.budget {
                return Err(DiscardError::TooLarge);
            }
            self.budget -= step as u64;
            used += step;
        }
        Ok(used)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn discard_all(framing: BodyFraming, limit: u64, input: &[u8], step: usize) -> Result<usize, DiscardError> {
        let mut d = Discard::new(framing, limit)?;
        let mut pos = 0;
        let mut avail = 0;
        while !d.is_done() {
            avail = (avail + step).min(input.len());
            let n = d.feed(&input[pos..avail])?;
            pos += n;
            if avail == input.len() && n == 0 && !d.is_done() {
                panic!("stuck at {pos}");
            }
        }
        Ok(pos)
    }

    #[test]
    fn content_length_body_stops_at_its_end() {
        let input = b"helloGET / HTTP/1.1\r\n";
        for step in [1, 3, 100] {
            assert_eq!(discard_all(BodyFraming::Length(5), 100, input, step), Ok(5));
        }
        assert_eq!(Discard::new(BodyFraming::Length(101), 100).unwrap_err(), DiscardError::TooLarge);
    }

    #[test]
    fn chunked_body_with_extensions_and_trailers() {
        let body = b"5;ext=1\r\nhello\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\nGET /next";
        let end = body.len() - b"GET /next".len();
        for step in [1, 2, 7, 1000] {
            assert_eq!(discard_all(BodyFraming::Chunked, 1000, body, step), Ok(end), "step {step}");
        }
    }

    #[test]
    fn chunked_body_limits_and_errors() {
        assert_eq!(
            discard_all(BodyFraming::Chunked, 10, b"20\r\n0123456789012345678901234567890\r\n0\r\n\r\n", 100),
            Err(DiscardError::TooLarge)
        );
        assert_eq!(discard_all(BodyFraming::Chunked, 100, b"zz\r\n", 100), Err(DiscardError::Malformed));
        assert_eq!(discard_all(BodyFraming::Chunked, 100, b"3\r\nabcXX", 100), Err(DiscardError::Malformed));
        // Framing bytes count toward the limit too: endless empty trailer-like lines.
        let many = b"0\r\nA: b\r\nA: b\r\nA: b\r\nA: b\r\n\r\n";
        assert_eq!(discard_all(BodyFraming::Chunked, 12, many, 100), Err(DiscardError::TooLarge));
    }

    #[test]
    fn chunked_bare_lf_is_rejected() {
        for body in
            [&b"5\r\nhello\n0\r\n\r\n"[..], b"5\r\nhello\r\n0\r\n\n", b"0\r\nX-T: 1\n\r\n", b"5\nhello\r\n0\r\n\r\n"]
        {
            for step in [1, 1000] {
                assert_eq!(
                    discard_all(BodyFraming::Chunked, 1000, body, step),
                    Err(DiscardError::Malformed),
                    "{:?} step {step}",
                    String::from_utf8_lossy(body)
                );
            }
        }
    }

    #[test]
    fn no_body_is_done_at_once() {
        let mut d = Discard::new(BodyFraming::None, 0).unwrap();
        assert!(d.is_done());
        assert_eq!(d.feed(b"GET"), Ok(0));
    }
}
