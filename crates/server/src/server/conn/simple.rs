//! Responses whose body comes from memory: error pages, the redirect of a
//! directory, `OPTIONS`; and the status line and fields every response starts
//! and ends its head with.

use linerate_http::path;
use linerate_http::response::HeadWriter;
use linerate_http::{Method, Status, Version};

use super::context::Context;
use super::{Conn, HEAD_BYTES};
use crate::server::pagecache::PageCache;
use crate::server::settings::Settings;
use crate::transport::{SendError, Transport};

impl<T: Transport, P: PageCache> Conn<'_, T, P> {
    /// 301 to the same path with a slash, so relative links in an index page work.
    pub(super) async fn send_redirect_to_directory(&mut self, keep_alive: bool) -> Result<(), SendError> {
        // Built from the normalised path, never from the raw target: `//host/..`
        // must not turn into a protocol-relative `Location`.
        let mut location = Vec::with_capacity(self.req.target().len() + 2);
        let query = path::resolve(self.req.target(), &mut self.scratch).ok().and_then(|t| t.query);
        path::directory_location(&self.path, query, &mut location);
        let body = simple_body(Status::MovedPermanently);
        let mut h = start_head(&mut self.head, self.worker, self.settings, Status::MovedPermanently);
        h.field("Location", &location)
            .field("Content-Type", b"text/plain; charset=utf-8")
            .field_u64("Content-Length", body.len() as u64);
        finish_head(h, keep_alive, self.req.version);
        self.send_small(Status::MovedPermanently, body.as_bytes()).await
    }

    pub(super) async fn send_options(&mut self, keep_alive: bool) -> Result<(), SendError> {
        let settings = self.settings;
        let preflight =
            !settings.cors_fields.is_empty() && self.req.origin().is_some() && self.req.cors_request_method().is_some();
        let mut h = start_head(&mut self.head, self.worker, settings, Status::NoContent);
        h.field("Allow", b"GET, HEAD, OPTIONS");
        if preflight {
            h.rendered(&settings.cors_fields)
                .field("Access-Control-Allow-Methods", b"GET, HEAD, OPTIONS")
                .field(
                    "Access-Control-Allow-Headers",
                    b"Range, If-Range, If-Match, If-None-Match, If-Modified-Since, If-Unmodified-Since",
                )
                .field("Access-Control-Max-Age", b"86400");
        }
        finish_head(h, keep_alive, self.req.version);
        self.send_small(Status::NoContent, b"").await
    }

    /// An error (or other short) response with a one-line text body.
    pub(super) async fn send_error(&mut self, status: Status, keep_alive: bool) -> Result<(), SendError> {
        let body = simple_body(status);
        let mut h = start_head(&mut self.head, self.worker, self.settings, status);
        match status {
            Status::MethodNotAllowed => {
                h.field("Allow", b"GET, HEAD, OPTIONS");
            }
            Status::ServiceUnavailable => {
                h.field("Retry-After", b"1");
            }
            _ => {}
        }
        h.field("Content-Type", b"text/plain; charset=utf-8").field_u64("Content-Length", body.len() as u64);
        finish_head(h, keep_alive, self.req.version);
        self.send_small(status, body.as_bytes()).await
    }

    async fn send_small(&mut self, status: Status, body: &[u8]) -> Result<(), SendError> {
        self.worker.counters.response(status);
        self.worker.counters.head_bytes.add(self.head.len() as u64);
        self.ex.status = Some(status);
        self.ex.head_bytes = self.head.len() as u64;
        let body = if self.req.method == Method::Head { &[][..] } else { body };
        self.head.extend_from_slice(body);
        self.mark_first_byte();
        self.io.write_all(&self.head, false).await?;
        self.count_memory_body(body.len());
        Ok(())
    }
}

fn simple_body(status: Status) -> String {
    format!("{} {}\n", status.code(), status.reason())
}

/// Status line, Date and the fields every response carries.
pub(super) fn start_head<'b, P>(
    head: &'b mut Vec<u8>,
    worker: &Context<P>,
    settings: &Settings,
    status: Status,
) -> HeadWriter<'b> {
    if head.capacity() == 0 {
        head.reserve(HEAD_BYTES);
    }
    let mut h = HeadWriter::new(head, status);
    h.field("Date", worker.date.borrow_mut().now());
    h.rendered(&settings.common_fields);
    if settings.config.debug_headers {
        h.rendered(&worker.debug_field);
    }
    h
}

/// The Connection field, then the empty line. HTTP/1.1 keeps alive by default, so
/// only a close is announced; an HTTP/1.0 client is told when it may keep going.
pub(super) fn finish_head(mut h: HeadWriter<'_>, keep_alive: bool, version: Version) {
    if !keep_alive {
        h.field("Connection", b"close");
    } else if version == Version::Http10 {
        h.field("Connection", b"keep-alive");
    }
    h.finish();
}
