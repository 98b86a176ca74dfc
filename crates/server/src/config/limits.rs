//! `[limits]`: what one request may hold (head, URI, header count, body, ranges)
//! and what one worker and one connection may take on.

use serde::{Deserialize, Serialize};

use super::{range, Bad, MAX_INTEGER};

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    pub max_head_bytes: usize,
    pub max_uri_bytes: usize,
    pub max_headers: usize,
    /// Request bodies up to this size are read and discarded; larger ones get 413.
    pub max_request_body_bytes: u64,
    /// Range-specs per request; more are ignored (whole file). 0 disables ranges.
    pub max_ranges: usize,
    /// 0 = derived from the open-file limit.
    pub max_connections_per_worker: usize,
    /// 0 = unlimited.
    pub max_requests_per_connection: u64,
    pub listen_backlog: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_head_bytes: 16 * 1024,
            max_uri_bytes: 8 * 1024,
            max_headers: 100,
            max_request_body_bytes: 64 * 1024,
            max_ranges: 16,
            max_connections_per_worker: 0,
            max_requests_per_connection: 10_000,
            listen_backlog: 4096,
        }
    }
}

impl Limits {
    pub(super) fn validate(&self) -> Result<(), Bad> {
        range("limits.max_head_bytes", self.max_head_bytes, 1024, 1024 * 1024)?;
        range("limits.max_uri_bytes", self.max_uri_bytes, 64, self.max_head_bytes)?;
        range("limits.max_headers", self.max_headers, 1, linerate_http::request::MAX_HEADERS_CAP)?;
        range("limits.max_request_body_bytes", self.max_request_body_bytes, 0, MAX_INTEGER)?;
        range("limits.max_ranges", self.max_ranges, 0, 64)?;
        range("limits.max_connections_per_worker", self.max_connections_per_worker, 0, 1 << 20)?;
        range("limits.max_requests_per_connection", self.max_requests_per_connection, 0, MAX_INTEGER)?;
        range("limits.listen_backlog", self.listen_backlog, 1, 1 << 20)?;
        Ok(())
    }
}
