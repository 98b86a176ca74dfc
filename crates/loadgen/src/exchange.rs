//! One request and its response over a [`Conn`], reading into a worker's shared
//! buffers without holding them across an `await`.

use std::cell::RefCell;
use std::io;
use std::time::Instant;

use super::client::{Conn, Received};
use super::response::{Head, Progress, ResponseError, ResponseReader};

/// Read size of the bench: one `recv` moves up to this much (the issue asks for at
/// least 256 KiB, so a 2 MiB segment takes about 8 system calls on plain HTTP).
pub(crate) const READ_BYTES: usize = 256 * 1024;

/// A worker's reusable buffers: socket reads, decrypted plaintext (TLS), and the
/// expected bytes read from a file for `--verify`.
pub(crate) struct Buffers {
    pub net: Vec<u8>,
    pub plain: Vec<u8>,
    pub scratch: Vec<u8>,
}

impl Buffers {
    pub(crate) fn new() -> Buffers {
        Buffers { net: vec![0; READ_BYTES], plain: vec![0; READ_BYTES], scratch: vec![0; READ_BYTES] }
    }
}

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExchangeError {
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The peer closed the connection before the response was complete.
    #[error("connection closed {}", if *.response_started { "in the middle of the response" } else { "before the response" })]
    Closed { response_started: bool },
    #[error("{0}")]
    Response(#[from] ResponseError),
    /// The body sink refused the bytes (they differ from the file).
    #[error("body differs from the expected bytes")]
    Rejected,
}

/// Sends `request` and reads the response `reader` was started for. `first_byte` is
/// set when the first response byte arrives. Body bytes go to `on_body` with the
/// scratch buffer; it returns `false` to reject them.
pub(crate) async fn exchange(
    conn: &mut Conn,
    request: &[u8],
    reader: &mut ResponseReader,
    bufs: &RefCell<Buffers>,
    first_byte: &mut Option<Instant>,
    on_body: &mut dyn FnMut(&[u8], &mut [u8]) -> bool,
) -> Result<Head, ExchangeError> {
    conn.send(request).await?;
    loop {
        conn.readable().await?;
        let mut outcome: Option<Result<Progress, ResponseError>> = None;
        let mut rejected = false;
        let got = {
            let mut guard = bufs.borrow_mut();
            let Buffers { net, plain, scratch } = &mut *guard;
            conn.receive(net, plain, &mut |data| {
                if first_byte.is_none() {
                    *first_byte = Some(Instant::now());
                }
                let r = reader.feed(data, &mut |body| {
                    if !rejected && !on_body(body, scratch) {
                        rejected = true;
                    }
                });
                let go_on = r.is_ok() && !rejected;
                outcome = Some(r);
                go_on
            })?
        };
        if rejected {
            return Err(ExchangeError::Rejected);
        }
        match outcome {
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(Progress::Done)) => return Ok(reader.head().expect("a finished response has a head")),
            _ => {}
        }
        if got == Received::Closed {
            return Err(ExchangeError::Closed { response_started: first_byte.is_some() });
        }
    }
}
