//! What can go wrong with an origin request, as the cache and the metrics see it.

use std::fmt;

/// Why an origin request or its body failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OriginError {
    /// No connection: the address did not resolve, the connection was refused,
    /// or the TLS handshake failed (an untrusted certificate among others).
    #[error("cannot connect: {0}")]
    Connect(String),
    /// Nothing came in time in this phase.
    #[error("timed out {0}")]
    Timeout(Phase),
    /// The last URL answered with this 5xx status.
    #[error("the origin answered {0}")]
    Status(u16),
    /// The connection broke: reset, or closed before a response head came.
    #[error("connection broken: {0}")]
    Reset(String),
    /// An S3 origin refused linerate's signed request (401 or 403): wrong or
    /// expired credentials, a clock too far off, or a key without the right to
    /// read the bucket. The status and S3's error code, when its body had one.
    #[error("the S3 origin refused the signed request: {0}{code}", code = .1.as_deref().map(|c| format!(" {c}")).unwrap_or_default())]
    Denied(u16, Option<String>),
    /// A parent answered 508: the request went round a loop of parents (its
    /// `Via` named a node twice). Not failed over: the loop is a configuration
    /// error to see, not a failure to hide.
    #[error("a parent answered 508 Loop Detected: the parents form a loop")]
    Loop,
    /// The origin broke HTTP: a head over the size limit or unparsable, a bad
    /// `Content-Range`, a body shorter or longer than its `Content-Length`.
    #[error("bad response: {0}")]
    BadResponse(String),
}

/// Which timeout ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// `connect_timeout`: the TCP connection and the TLS handshake.
    Connect,
    /// `first_byte_timeout`: sending the request and receiving the response head.
    FirstByte,
    /// `idle_timeout`: between two pieces of the body.
    Idle,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Connect => "connecting",
            Phase::FirstByte => "waiting for the response head",
            Phase::Idle => "waiting for more of the body",
        })
    }
}

/// Every [`OriginError::kind`], in the order [`super::UrlStats::errors`] lists them.
pub(super) const KINDS: [&str; 7] = ["connect", "timeout", "status", "reset", "bad_response", "denied", "loop"];

impl OriginError {
    /// The metric label: one of [`KINDS`].
    pub(crate) fn kind(&self) -> &'static str {
        KINDS[self.kind_index()]
    }

    pub(super) fn kind_index(&self) -> usize {
        match self {
            OriginError::Connect(_) => 0,
            OriginError::Timeout(_) => 1,
            OriginError::Status(_) => 2,
            OriginError::Reset(_) => 3,
            OriginError::BadResponse(_) => 4,
            OriginError::Denied(..) => 5,
            OriginError::Loop => 6,
        }
    }

    /// Whether the next URL of the table is tried after this error, one that
    /// says the origin is down or overloaded rather than that the object is
    /// wrong: no connection, a timeout before the head, a connection broken
    /// before the head (a crashed process behind a load balancer: nginx's
    /// `proxy_next_upstream error`), a 5xx. A malformed response is not retried:
    /// another copy of the same origin would most likely answer the same, and so
    /// would another endpoint of the same bucket to the same signature.
    pub(crate) fn fails_over(&self) -> bool {
        match self {
            OriginError::Connect(_) | OriginError::Reset(_) | OriginError::Status(_) => true,
            OriginError::Timeout(phase) => *phase != Phase::Idle,
            OriginError::BadResponse(_) | OriginError::Denied(..) | OriginError::Loop => false,
        }
    }
}
