//! `/prefill`: `POST` a manifest to start (or replace) the prefill job, `GET` its
//! progress as JSON (the same object `/status` has under `prefill`).

use linerate_http::request::BodyFraming;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{AdminState, Reply, REQUEST_TIMEOUT};

/// The largest manifest taken.
pub(super) const MAX_MANIFEST_BYTES: u64 = 64 * 1024 * 1024;

const NO_CACHE: &str = "prefill needs [[origin]] tables (and their [cache]) in the configuration\n";

/// `GET /prefill`.
pub(super) fn get(state: &AdminState) -> Reply {
    match &state.prefill {
        Some(p) => Reply::new("200 OK", "application/json", json(&p.progress())),
        None => Reply::text("404 Not Found", NO_CACHE),
    }
}

/// `POST /prefill` with the manifest `body`.
pub(super) fn post(state: &AdminState, body: &[u8]) -> Reply {
    let Some(p) = &state.prefill else { return Reply::text("404 Not Found", NO_CACHE) };
    let Ok(text) = std::str::from_utf8(body) else {
        return Reply::text("400 Bad Request", "manifest: not UTF-8 text\n");
    };
    match p.submit(text) {
        Ok(progress) => Reply::new("202 Accepted", "application/json", json(&progress)),
        Err(e) => Reply::text("400 Bad Request", format!("manifest: {e}\n")),
    }
}

fn json(p: &crate::server::prefill::Progress) -> String {
    serde_json::to_string(p).unwrap_or_else(|_| "{}".into())
}

/// Reads the request body that follows a head of `head` bytes in `buf`, or the
/// answer to give instead (too large, chunked, too slow).
pub(super) async fn read_body(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    head: usize,
    framing: BodyFraming,
    expect_continue: bool,
) -> std::io::Result<Result<Vec<u8>, Reply>> {
    let len = match framing {
        BodyFraming::None => 0,
        BodyFraming::Length(n) if n <= MAX_MANIFEST_BYTES => n as usize,
        BodyFraming::Length(_) => return Ok(Err(Reply::text("413 Content Too Large", "manifest: over 64 MiB\n"))),
        BodyFraming::Chunked => {
            return Ok(Err(Reply::text("411 Length Required", "send the manifest with Content-Length\n")))
        }
    };
    if expect_continue {
        stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
    }
    let read = tokio::time::timeout(REQUEST_TIMEOUT * 6, async {
        while buf.len() < head + len {
            if stream.read_buf(buf).await? == 0 {
                return Ok::<bool, std::io::Error>(false);
            }
        }
        Ok(true)
    })
    .await;
    match read {
        Ok(Ok(true)) => Ok(Ok(buf[head..head + len].to_vec())),
        Ok(Ok(false)) | Err(_) => Ok(Err(Reply::text("400 Bad Request", "manifest: the body ended early\n"))),
        Ok(Err(e)) => Err(e),
    }
}
