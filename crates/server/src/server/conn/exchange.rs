//! The access-log record of each response: what is tracked while it is sent,
//! and the record written once it is out (or cut short).

use std::time::Instant;

use linerate_http::{Status, Version};
use linerate_urlauth::Verdict;

use super::Conn;
use crate::server::access_log::Record;
use crate::server::cache::CacheStatus;
use crate::server::pagecache::{PageCache, Progress};
use crate::transport::Transport;

/// The response in progress, for its access-log record. Tracked only when the
/// worker has an access log and this response is in the sample.
#[derive(Default)]
pub(super) struct Exchange {
    /// When the request head was complete (the record's wall-clock time is worked
    /// out from it: one clock read, not two).
    pub started: Option<Instant>,
    pub status: Option<Status>,
    pub head_bytes: u64,
    /// Body bytes sent from memory: multipart part heads, error pages.
    pub memory_body_bytes: u64,
    /// `body_bytes_sent()` of the transport when the response started.
    pub file_bytes_before: u64,
    /// When the first bytes went, and whether a body range waited for a disk
    /// fill (the format prints timings when `progress.timed`).
    pub progress: Progress,
    /// Under an `[[origin]]` prefix: what the object came from.
    pub cache: Option<CacheStatus>,
    /// How long the origin took to give the object's head, in microseconds (not
    /// on a hit; kept small: every connection's future carries it).
    pub origin_us: Option<u32>,
    /// The signed-URL verdict, when the path is under a signed prefix.
    pub signed: Option<Verdict>,
}

impl<T: Transport, P: PageCache> Conn<'_, T, P> {
    /// Counts response bytes after the head that left from memory (multipart part
    /// headers, error pages): with the file bytes the transport counts, the body
    /// total is exactly what clients received after the heads.
    pub(super) fn count_memory_body(&mut self, n: usize) {
        self.worker.counters.body_bytes[T::KIND as usize].add(n as u64);
        self.ex.memory_body_bytes += n as u64;
    }

    /// Starts tracking a response for the access log.
    pub(super) fn begin_exchange(&mut self) {
        self.io.begin_response();
        let Some(log) = self.worker.log.as_ref() else { return };
        let config = &self.settings.config.access_log;
        self.ex = if log.wants_next(config.sample) {
            Exchange {
                started: Some(Instant::now()),
                progress: Progress { timed: config.format.has_timings(), ..Progress::default() },
                file_bytes_before: self.io.body_bytes_sent(),
                ..Exchange::default()
            }
        } else {
            Exchange::default()
        };
    }

    /// Bytes of the response are about to be handed to the kernel.
    pub(super) fn mark_first_byte(&mut self) {
        self.ex.progress.mark_first_byte();
    }

    /// Writes the access-log record of the response just sent (or cut short), if
    /// there was one and it is in the sample.
    pub(super) fn log_exchange(&mut self) {
        let Some(log) = self.worker.log.as_ref() else { return };
        let ex = std::mem::take(&mut self.ex);
        let (Some(started), Some(status)) = (ex.started, ex.status) else { return };
        let config = &self.settings.config.access_log;
        // A format without timings is dated from the start alone: no clock read here.
        let now = if ex.progress.timed { Instant::now() } else { started };
        let body_bytes = self.io.body_bytes_sent() - ex.file_bytes_before + ex.memory_body_bytes;
        let method = self.req.method_name();
        let tls = self.tls.as_ref();
        let record = Record {
            time: log.wall_time(started, now),
            client: self.peer,
            method: if method.is_empty() { b"-" } else { method },
            target: self.req.target(),
            version: match self.req.version {
                Version::Http10 => "HTTP/1.0",
                Version::Http11 => "HTTP/1.1",
            },
            status: status.code(),
            range: self.req.range(),
            body_bytes,
            bytes: body_bytes + ex.head_bytes,
            duration: now - started,
            ttfb: ex.progress.first_byte.map(|t| t - started),
            transport: T::KIND.label(),
            tls_version: tls.map(|t| t.version),
            cipher: tls.map(|t| t.cipher),
            sni: tls.and_then(|t| t.sni.as_deref()),
            worker: self.worker.index,
            cross_domain: self.cross_domain,
            filled: ex.progress.filled,
            cache: ex.cache.map(CacheStatus::label),
            origin: ex.origin_us.map(|us| std::time::Duration::from_micros(u64::from(us))),
            signed: ex.signed.map(Verdict::label),
            user_agent: self.req.user_agent(),
            referer: self.req.referer(),
            tcp: self.tcp,
        };
        log.write(&record, config.format, now);
    }

    pub(super) fn count_body_bytes(&mut self) {
        let sent = self.io.body_bytes_sent();
        self.worker.counters.body_bytes[T::KIND as usize].add(sent - self.body_bytes_counted);
        self.body_bytes_counted = sent;
    }
}
