//! HTTP/1.1 protocol logic for linerate, with no I/O.
//!
//! The server reads bytes and writes bytes; everything in between that is a matter of
//! the protocol lives here, so that it can be tested exhaustively without sockets:
//!
//! 1. [`request`] turns the bytes of a request head into a reusable [`Request`]
//!    (parsed by `httparse`), enforcing the head, URI and header-count limits and
//!    deciding keep-alive and how any request body is framed.
//! 2. [`body`] discards a request body (Content-Length or chunked) within a limit, so
//!    the next pipelined request starts exactly where the body ended.
//! 3. [`path`] maps the request target onto a relative, normalised path that cannot
//!    leave the content root (percent-decoding, `.`/`..`, encoded slashes, NUL).
//! 4. [`plan`] decides the response to a file request: preconditions
//!    ([`conditional`]), byte ranges ([`range`]), and the exact body layout, including
//!    `multipart/byteranges` parts, with the Content-Length known up front.
//! 5. [`response`] writes status lines and header fields into a reusable buffer;
//!    [`mime`] maps file extensions to media types; [`date`] formats and parses HTTP dates
//!    and the access log's timestamps (RFC 3339, nginx's CLF).
//! 6. [`freshness`] reads how long a shared cache may keep an origin's response.
//!
//! Nothing here allocates per request once the reusable buffers have grown (the
//! caller's, and a per-thread pool of multipart range lists); `tests/allocations.rs`
//! counts.
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]

pub mod body;
pub mod conditional;
pub mod date;
pub mod freshness;
pub mod mime;
pub mod path;
pub mod plan;
pub mod range;
pub mod request;
pub mod response;

pub use request::{Method, Request, RequestError, Version};
pub use response::Status;
