//! Access logs: one record per response, never written by a worker.
//!
//! A worker formats each record (JSON lines or nginx's `combined` format) into its
//! own buffer ([`WorkerLog`]); a full buffer, or one that has waited a second, is
//! handed as one batch to the writer thread ([`AccessLog`]), which owns the file and
//! appends batches to it. The hand-over never blocks: when the writer is behind (a
//! slow or full disk) and its queue is full, the batch is dropped and its records
//! are counted in `linerate_access_log_dropped_records_total`, so a bad disk costs
//! log lines, not viewers. `SIGUSR1` makes the writer reopen the file (the logrotate
//! convention): rotate by renaming the file, then send the signal.
//!
//! What is logged about the target: its path without the query (whether there was
//! one is a field of its own), with control bytes, non-ASCII bytes, quotes and
//! backslashes escaped as `\xHH`. Query strings carry signed-URL tokens and are never
//! written, the Referer's neither (a segment's Referer can be its manifest's signed
//! URL); the signed-URL verdict is a field of its own.

use std::cell::{Cell, RefCell};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

pub use crate::config::AccessLogFormat as Format;
use crate::counters::tcp_info::TcpFigures;

/// A batch is handed to the writer once it holds this many bytes (a few thousand
/// records: each hand-over wakes the writer thread, so the writer's cost is mostly
/// per batch, not per record)...
const BATCH_BYTES: usize = 256 * 1024;
/// ...or once its oldest record has waited this long.
const BATCH_AGE: Duration = Duration::from_secs(1);
/// Batches queued for the writer before new ones are dropped (with `BATCH_BYTES`,
/// about 8 MiB of records: several seconds of a very busy box).
const QUEUE_BATCHES: usize = 32;
/// Written batches' buffers kept for the workers to fill again, so that a batch
/// costs no allocation (a buffer of `BATCH_BYTES` is past malloc's mmap threshold).
const SPARE_BUFFERS: usize = 8;
/// Room left in a fresh buffer past `BATCH_BYTES`, so the record that fills it
/// rarely makes it grow.
const MAX_RECORD_GUESS: usize = 4096;
/// How often a worker reads the wall clock afresh to date its records (between
/// readings, a record's time is that reading moved by the monotonic clock).
const WALL_CLOCK_EVERY: Duration = Duration::from_secs(1);

/// The counters of the access log, shared by the writer and the workers.
#[derive(Debug, Default)]
pub struct LogCounters {
    /// Records written to the file.
    pub written: AtomicU64,
    /// Records lost: the writer's queue was full, or the write failed.
    pub dropped: AtomicU64,
    /// Times the file was reopened (`SIGUSR1`).
    pub reopened: AtomicU64,
}

/// A batch of formatted records.
struct Batch {
    bytes: Vec<u8>,
    records: u64,
}

/// The writer thread's side: the process has one.
pub struct AccessLog {
    /// None once [`AccessLog::finish`] has run.
    tx: Mutex<Option<SyncSender<Batch>>>,
    reopen: AtomicBool,
    pub counters: LogCounters,
    /// Tells `finish` that the writer has written everything and stopped.
    done: Mutex<Receiver<()>>,
    /// Emptied buffers of written batches, for the workers' next batches.
    spare: Mutex<Vec<Vec<u8>>>,
}

impl AccessLog {
    /// Opens (creating if needed, appending) `path` and starts the writer thread.
    /// Fails if the file cannot be opened, so a bad path stops start-up.
    pub fn start(path: &Path) -> std::io::Result<Arc<AccessLog>> {
        let file = open(path)?;
        let (tx, rx) = mpsc::sync_channel(QUEUE_BATCHES);
        let (done_tx, done_rx) = mpsc::channel();
        let log = Arc::new(AccessLog {
            tx: Mutex::new(Some(tx)),
            reopen: AtomicBool::new(false),
            counters: LogCounters::default(),
            done: Mutex::new(done_rx),
            spare: Mutex::new(Vec::new()),
        });
        let writer = Writer { path: path.to_path_buf(), file, rx, log: log.clone() };
        std::thread::Builder::new().name("access-log".into()).spawn(move || {
            writer.run();
            let _ = done_tx.send(());
        })?;
        Ok(log)
    }

    /// Asks the writer to reopen the file (after a rotation): it does within half a
    /// second, before writing its next batch.
    pub fn reopen(&self) {
        self.reopen.store(true, Ordering::Release);
    }

    /// An empty buffer for a worker's next batch: a written batch's, when there is one.
    fn buffer(&self) -> Vec<u8> {
        lock(&self.spare).pop().unwrap_or_else(|| Vec::with_capacity(BATCH_BYTES + MAX_RECORD_GUESS))
    }

    /// Keeps a written batch's buffer for a next batch.
    fn recycle(&self, mut bytes: Vec<u8>) {
        bytes.clear();
        let mut spare = lock(&self.spare);
        if spare.len() < SPARE_BUFFERS {
            spare.push(bytes);
        }
    }

    fn submit(&self, bytes: Vec<u8>, records: u64) {
        let unsent = match lock(&self.tx).as_ref() {
            Some(tx) => match tx.try_send(Batch { bytes, records }) {
                Ok(()) => return,
                Err(TrySendError::Full(b) | TrySendError::Disconnected(b)) => b.bytes,
            },
            None => bytes,
        };
        self.counters.dropped.fetch_add(records, Ordering::Relaxed);
        self.recycle(unsent);
    }

    /// Closes the queue and waits (up to `wait`) for the writer to write what is in
    /// it; call it after the workers have flushed.
    pub fn finish(&self, wait: Duration) {
        lock(&self.tx).take();
        if lock(&self.done).recv_timeout(wait).is_err() {
            tracing::warn!("access log: the writer did not finish within {wait:?}; records still queued are lost");
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn open(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

struct Writer {
    path: PathBuf,
    file: File,
    rx: Receiver<Batch>,
    log: Arc<AccessLog>,
}

impl Writer {
    fn run(mut self) {
        let mut failing = false;
        loop {
            let batch = match self.rx.recv_timeout(Duration::from_millis(500)) {
                Ok(b) => Some(b),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            if self.log.reopen.swap(false, Ordering::AcqRel) {
                match open(&self.path) {
                    Ok(f) => {
                        self.file = f;
                        self.log.counters.reopened.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(path = %self.path.display(), "access log reopened");
                    }
                    Err(e) => {
                        tracing::error!(path = %self.path.display(), "access log not reopened, still writing the old file: {e}")
                    }
                }
            }
            let Some(batch) = batch else { continue };
            let counters = &self.log.counters;
            let written = self.file.write_all(&batch.bytes);
            self.log.recycle(batch.bytes);
            match written {
                Ok(()) => {
                    counters.written.fetch_add(batch.records, Ordering::Relaxed);
                    if failing {
                        tracing::info!(path = %self.path.display(), "access log writable again");
                        failing = false;
                    }
                }
                Err(e) => {
                    counters.dropped.fetch_add(batch.records, Ordering::Relaxed);
                    if !failing {
                        tracing::error!(path = %self.path.display(), "access log write failed, dropping records until it works: {e}");
                        failing = true;
                    }
                }
            }
        }
    }
}

/// A worker's buffer of formatted records.
pub struct WorkerLog {
    log: Arc<AccessLog>,
    seen: Cell<u64>,
    buf: RefCell<Vec<u8>>,
    records: Cell<u64>,
    oldest: Cell<Option<Instant>>,
    /// A reading of both clocks, taken together: records are dated from it.
    clocks: Cell<Option<(Instant, SystemTime)>>,
}

impl WorkerLog {
    pub fn new(log: Arc<AccessLog>) -> WorkerLog {
        WorkerLog {
            log,
            seen: Cell::new(0),
            buf: RefCell::new(Vec::new()),
            records: Cell::new(0),
            oldest: Cell::new(None),
            clocks: Cell::new(None),
        }
    }

    /// Whether this response is to be logged: one in `sample`, counted per worker.
    pub fn wants_next(&self, sample: u64) -> bool {
        let n = self.seen.get();
        self.seen.set(n.wrapping_add(1));
        n % sample.max(1) == 0
    }

    /// The wall-clock time of the monotonic instant `at` (`now` being the present):
    /// a reading of the wall clock at most `WALL_CLOCK_EVERY` old, moved by the
    /// monotonic clock. Saves a clock read per record; the two clocks run at the same
    /// rate (NTP slews both), so the time is the one `SystemTime::now()` would have
    /// given at `at`, to well under a millisecond, except in the second after the
    /// wall clock is stepped, when records keep the old time base until the next
    /// reading.
    pub fn wall_time(&self, at: Instant, now: Instant) -> SystemTime {
        let (base, wall) = match self.clocks.get() {
            Some((base, wall)) if now.saturating_duration_since(base) < WALL_CLOCK_EVERY => (base, wall),
            _ => {
                let fresh = (Instant::now(), SystemTime::now());
                self.clocks.set(Some(fresh));
                fresh
            }
        };
        let moved = match at.checked_duration_since(base) {
            Some(after) => wall.checked_add(after),
            None => wall.checked_sub(base.duration_since(at)),
        };
        moved.unwrap_or(wall)
    }

    pub fn write(&self, rec: &Record<'_>, format: Format, now: Instant) {
        {
            let mut buf = self.buf.borrow_mut();
            if buf.capacity() == 0 {
                *buf = self.log.buffer();
            }
            match format {
                Format::Json => rec.write_json(&mut buf),
                Format::Combined => rec.write_combined(&mut buf),
            }
        }
        self.records.set(self.records.get() + 1);
        let oldest = *self.oldest.get().get_or_insert(now);
        self.oldest.set(Some(oldest));
        if self.buf.borrow().len() >= BATCH_BYTES || now.duration_since(oldest) >= BATCH_AGE {
            self.flush();
        }
    }

    /// Hands the buffered records to the writer (also called every second by the
    /// worker, and when it stops).
    pub fn flush(&self) {
        let records = self.records.replace(0);
        self.oldest.set(None);
        if records == 0 {
            return;
        }
        let full = std::mem::take(&mut *self.buf.borrow_mut());
        self.log.submit(full, records);
    }

    /// Flushes if the oldest record has waited a second.
    pub fn flush_if_old(&self, now: Instant) {
        if self.oldest.get().is_some_and(|t| now.duration_since(t) >= BATCH_AGE) {
            self.flush();
        }
    }
}

/// Everything a record says about one response.
pub struct Record<'a> {
    /// When the request head had arrived.
    pub time: SystemTime,
    pub client: SocketAddr,
    pub method: &'a [u8],
    /// The request target as sent; the query is cut off here, never written.
    pub target: &'a [u8],
    pub version: &'a str,
    pub status: u16,
    pub range: Option<&'a [u8]>,
    pub body_bytes: u64,
    pub bytes: u64,
    pub duration: Duration,
    pub ttfb: Option<Duration>,
    pub transport: &'a str,
    pub tls_version: Option<&'a str>,
    pub cipher: Option<&'a str>,
    pub sni: Option<&'a str>,
    pub worker: usize,
    pub cross_domain: bool,
    pub filled: bool,
    /// The signed-URL verdict (`Verdict::label`), for paths under a signed prefix.
    pub signed: Option<&'static str>,
    pub user_agent: Option<&'a [u8]>,
    /// The Referer field as sent; its query is cut off here, never written.
    pub referer: Option<&'a [u8]>,
    pub tcp: Option<TcpFigures>,
}

impl Record<'_> {
    /// The path part of the target (no query, no fragment).
    fn path(&self) -> &[u8] {
        let end = self.target.iter().position(|&b| b == b'?' || b == b'#').unwrap_or(self.target.len());
        &self.target[..end]
    }

    fn has_query(&self) -> bool {
        self.target.contains(&b'?')
    }

    /// The Referer without its query and fragment.
    fn referer(&self) -> Option<&[u8]> {
        self.referer.map(|r| &r[..r.iter().position(|&b| b == b'?' || b == b'#').unwrap_or(r.len())])
    }

    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"time\":\"");
        rfc3339_millis(self.time, out);
        out.extend_from_slice(b"\",\"client\":\"");
        client_ip(self.client.ip(), out);
        out.extend_from_slice(b"\",\"port\":");
        num(out, u64::from(self.client.port()));
        out.extend_from_slice(b",\"method\":\"");
        escape(self.method, out);
        out.extend_from_slice(b"\",\"path\":\"");
        escape(self.path(), out);
        out.extend_from_slice(if self.has_query() { b"\",\"query\":true" } else { b"\",\"query\":false" });
        out.extend_from_slice(b",\"version\":\"");
        out.extend_from_slice(self.version.as_bytes());
        out.extend_from_slice(b"\",\"status\":");
        num(out, u64::from(self.status));
        out.extend_from_slice(b",\"range\":");
        opt_bytes(self.range, out);
        out.extend_from_slice(b",\"body_bytes\":");
        num(out, self.body_bytes);
        out.extend_from_slice(b",\"bytes\":");
        num(out, self.bytes);
        out.extend_from_slice(b",\"duration_ms\":");
        millis(out, self.duration.as_micros());
        out.extend_from_slice(b",\"ttfb_ms\":");
        match self.ttfb {
            Some(t) => millis(out, t.as_micros()),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"transport\":\"");
        out.extend_from_slice(self.transport.as_bytes());
        out.extend_from_slice(b"\",\"tls_version\":");
        opt_bytes(self.tls_version.map(str::as_bytes), out);
        out.extend_from_slice(b",\"cipher\":");
        opt_bytes(self.cipher.map(str::as_bytes), out);
        out.extend_from_slice(b",\"sni\":");
        opt_bytes(self.sni.map(str::as_bytes), out);
        out.extend_from_slice(b",\"worker\":");
        num(out, self.worker as u64);
        out.extend_from_slice(if self.cross_domain { b",\"cross_domain\":true" } else { b",\"cross_domain\":false" });
        out.extend_from_slice(if self.filled { b",\"fill\":true" } else { b",\"fill\":false" });
        out.extend_from_slice(b",\"signed\":");
        opt_bytes(self.signed.map(str::as_bytes), out);
        out.extend_from_slice(b",\"user_agent\":");
        opt_bytes(self.user_agent, out);
        out.extend_from_slice(b",\"referer\":");
        opt_bytes(self.referer(), out);
        if let Some(t) = self.tcp {
            out.extend_from_slice(b",\"rtt_ms\":");
            millis(out, u128::from(t.rtt_us));
            out.extend_from_slice(b",\"retransmits\":");
            num(out, u64::from(t.total_retransmits));
            out.extend_from_slice(b",\"delivery_rate_bps\":");
            num(out, t.delivery_rate_bps);
        }
        out.extend_from_slice(b"}\n");
    }

    /// `$remote_addr - - [$time_local] "$request" $status $body_bytes_sent
    /// "$http_referer" "$http_user_agent"`, as nginx writes it (times in UTC), with
    /// the query left out of `$request` and `$http_referer`.
    pub fn write_combined(&self, out: &mut Vec<u8>) {
        client_ip(self.client.ip(), out);
        out.extend_from_slice(b" - - [");
        clf_time(self.time, out);
        out.extend_from_slice(b"] \"");
        escape_clf(self.method, out);
        out.push(b' ');
        escape_clf(self.path(), out);
        out.push(b' ');
        out.extend_from_slice(self.version.as_bytes());
        out.extend_from_slice(b"\" ");
        num(out, self.status.into());
        out.push(b' ');
        num(out, self.body_bytes);
        out.extend_from_slice(b" \"");
        escape_clf(self.referer().unwrap_or(b"-"), out);
        out.extend_from_slice(b"\" \"");
        escape_clf(self.user_agent.unwrap_or(b"-"), out);
        out.extend_from_slice(b"\"\n");
    }
}

/// The client's address as `Display` writes it, without `core::fmt`: the formatter
/// cost more than the rest of a `combined` line.
fn client_ip(ip: std::net::IpAddr, out: &mut Vec<u8>) {
    match ip {
        std::net::IpAddr::V4(v4) => ipv4(v4.octets(), out),
        std::net::IpAddr::V6(v6) => ipv6(v6, out),
    }
}

/// Dotted decimal, `192.0.2.1`.
fn ipv4(octets: [u8; 4], out: &mut Vec<u8>) {
    for (i, octet) in octets.into_iter().enumerate() {
        if i > 0 {
            out.push(b'.');
        }
        if octet >= 100 {
            out.push(b'0' + octet / 100);
        }
        if octet >= 10 {
            out.push(b'0' + octet / 10 % 10);
        }
        out.push(b'0' + octet % 10);
    }
}

/// RFC 5952's text form, as std's `Display` writes it: lowercase hex without leading
/// zeros; the longest run of two or more zero groups (the first of equal runs) as
/// `::`; an IPv4-mapped address as `::ffff:a.b.c.d`.
fn ipv6(ip: std::net::Ipv6Addr, out: &mut Vec<u8>) {
    if let Some(v4) = ip.to_ipv4_mapped() {
        out.extend_from_slice(b"::ffff:");
        return ipv4(v4.octets(), out);
    }
    let groups = ip.segments();
    let (mut best, mut best_len, mut run, mut run_len) = (0, 0, 0, 0);
    for (i, &g) in groups.iter().enumerate() {
        if g == 0 {
            if run_len == 0 {
                run = i;
            }
            run_len += 1;
            if run_len > best_len {
                (best, best_len) = (run, run_len);
            }
        } else {
            run_len = 0;
        }
    }
    let hex_groups = |groups: &[u16], out: &mut Vec<u8>| {
        for (i, &g) in groups.iter().enumerate() {
            if i > 0 {
                out.push(b':');
            }
            hex16(g, out);
        }
    };
    if best_len > 1 {
        hex_groups(&groups[..best], out);
        out.extend_from_slice(b"::");
        hex_groups(&groups[best + best_len..], out);
    } else {
        hex_groups(&groups, out);
    }
}

/// A group in lowercase hex without leading zeros.
fn hex16(g: u16, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digits = (16 - g.leading_zeros()).div_ceil(4).max(1);
    for k in (0..digits).rev() {
        out.push(HEX[usize::from(g >> (4 * k)) & 15]);
    }
}

fn num(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Microseconds as milliseconds with three decimals (`1.500`), without floats.
fn millis(out: &mut Vec<u8>, micros: u128) {
    let micros = u64::try_from(micros).unwrap_or(u64::MAX);
    num(out, micros / 1000);
    let frac = micros % 1000;
    out.extend_from_slice(&[b'.', b'0' + (frac / 100) as u8, b'0' + (frac / 10 % 10) as u8, b'0' + (frac % 10) as u8]);
}

/// A second of UTC, rendered for both formats.
struct Second {
    /// Seconds since the epoch; `u64::MAX` before the first record.
    secs: u64,
    /// `2026-11-23T22:30:00`.
    rfc3339: Vec<u8>,
    /// `23/Nov/2026:22:30:00 +0000`.
    clf: Vec<u8>,
}

thread_local! {
    /// The last second formatted for records on this thread: the date is worked out
    /// once a second, not per record.
    static SECOND: RefCell<Second> = const { RefCell::new(Second { secs: u64::MAX, rfc3339: Vec::new(), clf: Vec::new() }) };
}

/// Calls `f` with the rendering of the second holding `t` (times before the epoch
/// are written as the epoch).
fn with_second<R>(t: SystemTime, f: impl FnOnce(&Second, Duration) -> R) -> R {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    SECOND.with(|cell| {
        let mut second = cell.borrow_mut();
        if second.secs != since.as_secs() {
            render_second(since.as_secs(), &mut second);
        }
        f(&second, since)
    })
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn render_second(secs: u64, second: &mut Second) {
    const MONTHS: [&[u8; 3]; 12] =
        [b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec"];
    let two = |n: u64| [b'0' + (n / 10 % 10) as u8, b'0' + (n % 10) as u8];
    let (year, month, day) = civil_from_days(i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2));
    let in_day = secs % 86_400;
    let (h, m, s) = (two(in_day / 3600), two(in_day / 60 % 60), two(in_day % 60));
    let mut y = [b'0'; 4];
    let year_text = itoa::Buffer::new().format(year).as_bytes().to_vec();
    let year_text: &[u8] = if year_text.len() < 4 {
        y[4 - year_text.len()..].copy_from_slice(&year_text);
        &y
    } else {
        &year_text
    };
    let (mo, d) = (two(month.into()), two(day.into()));
    let r = &mut second.rfc3339;
    r.clear();
    for part in [year_text, b"-", &mo, b"-", &d, b"T", &h, b":", &m, b":", &s] {
        r.extend_from_slice(part);
    }
    let c = &mut second.clf;
    c.clear();
    for part in [&d[..], b"/", MONTHS[month as usize - 1], b"/", year_text, b":", &h, b":", &m, b":", &s, b" +0000"] {
        c.extend_from_slice(part);
    }
    second.secs = secs;
}

/// `2026-11-23T22:30:00.123Z`.
fn rfc3339_millis(t: SystemTime, out: &mut Vec<u8>) {
    with_second(t, |second, since| {
        out.extend_from_slice(&second.rfc3339);
        let ms = since.subsec_millis();
        out.extend_from_slice(&[
            b'.',
            b'0' + (ms / 100) as u8,
            b'0' + (ms / 10 % 10) as u8,
            b'0' + (ms % 10) as u8,
            b'Z',
        ]);
    });
}

/// `23/Nov/2026:22:30:00 +0000`.
fn clf_time(t: SystemTime, out: &mut Vec<u8>) {
    with_second(t, |second, _| out.extend_from_slice(&second.clf));
}

fn opt_bytes(v: Option<&[u8]>, out: &mut Vec<u8>) {
    match v {
        Some(v) => {
            out.push(b'"');
            escape(v, out);
            out.push(b'"');
        }
        None => out.extend_from_slice(b"null"),
    }
}

/// Printable ASCII as is; `"`, `\`, control bytes and bytes above 0x7e as the four
/// characters `\xHH` (nginx's escaping). In JSON the backslash is itself escaped, so
/// a JSON reader gets the same four characters.
fn escape_to(bytes: &[u8], out: &mut Vec<u8>, json: bool) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let plain = |b: u8| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\';
    let mut rest = bytes;
    // Runs of bytes written as they are go in one copy: most fields are all one run.
    while !rest.is_empty() {
        let run = rest.iter().position(|&b| !plain(b)).unwrap_or(rest.len());
        out.extend_from_slice(&rest[..run]);
        let Some((&b, tail)) = rest[run..].split_first() else { break };
        out.extend_from_slice(if json { b"\\\\x" } else { b"\\x" });
        out.extend_from_slice(&[HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]);
        rest = tail;
    }
}

fn escape(bytes: &[u8], out: &mut Vec<u8>) {
    escape_to(bytes, out, true);
}

fn escape_clf(bytes: &[u8], out: &mut Vec<u8>) {
    escape_to(bytes, out, false);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record<'a>(target: &'a [u8], ua: Option<&'a [u8]>) -> Record<'a> {
        Record {
            // 2026-11-23T22:30:00.123Z
            time: SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_473_000_123),
            client: "[2001:db8::7]:51000".parse().unwrap(),
            method: b"GET",
            target,
            version: "HTTP/1.1",
            status: 206,
            range: Some(b"bytes=0-99"),
            body_bytes: 100,
            bytes: 350,
            duration: Duration::from_micros(1500),
            ttfb: Some(Duration::from_micros(250)),
            transport: "usertls",
            tls_version: Some("TLSv1.3"),
            cipher: Some("TLS13_AES_128_GCM_SHA256"),
            sni: Some("cdn.example"),
            worker: 1,
            cross_domain: false,
            filled: true,
            signed: Some("allowed"),
            user_agent: ua,
            referer: None,
            tcp: Some(TcpFigures { rtt_us: 1234, total_retransmits: 2, delivery_rate_bps: 8_000_000 }),
        }
    }

    #[test]
    fn json_record_has_every_field_and_no_query() {
        let mut out = Vec::new();
        record(b"/v/a.mp4?token=SECRET&exp=1", Some(b"player/1.0")).write_json(&mut out);
        assert_eq!(out.last(), Some(&b'\n'));
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains("SECRET") && !text.contains("exp="), "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["time"], "2026-11-23T22:30:00.123Z");
        assert_eq!(v["client"], "2001:db8::7");
        assert_eq!(v["port"], 51000);
        assert_eq!(v["path"], "/v/a.mp4");
        assert_eq!(v["query"], true);
        assert_eq!(v["status"], 206);
        assert_eq!(v["range"], "bytes=0-99");
        assert_eq!((v["body_bytes"].as_u64(), v["bytes"].as_u64()), (Some(100), Some(350)));
        assert_eq!((v["duration_ms"].as_f64(), v["ttfb_ms"].as_f64()), (Some(1.5), Some(0.25)));
        assert_eq!(
            (&v["transport"], &v["tls_version"], &v["sni"]),
            (&"usertls".into(), &"TLSv1.3".into(), &"cdn.example".into())
        );
        assert_eq!(v["cipher"], "TLS13_AES_128_GCM_SHA256");
        assert_eq!((&v["worker"], &v["cross_domain"], &v["fill"]), (&1.into(), &false.into(), &true.into()));
        assert_eq!((&v["user_agent"], &v["referer"]), (&"player/1.0".into(), &serde_json::Value::Null));
        assert_eq!(v["signed"], "allowed");
        assert_eq!((v["rtt_ms"].as_f64(), v["retransmits"].as_u64()), (Some(1.234), Some(2)));
        assert_eq!(v["delivery_rate_bps"], 8_000_000);
    }

    #[test]
    fn a_referer_query_is_never_written() {
        let referer = b"https://cdn.example/premium/t1/master.m3u8?__token__=SECRET#frag";
        let r = Record { referer: Some(referer), ..record(b"/premium/t1/seg-1.m4s", None) };
        let (mut json, mut combined) = (Vec::new(), Vec::new());
        r.write_json(&mut json);
        r.write_combined(&mut combined);
        for out in [json, combined] {
            let text = String::from_utf8(out).unwrap();
            assert!(!text.contains("SECRET") && !text.contains("__token__"), "{text}");
            assert!(text.contains("https://cdn.example/premium/t1/master.m3u8\""), "{text}");
        }
    }

    #[test]
    fn combined_lines_match_nginx_for_both_address_families() {
        for (client, shown) in [("192.0.2.250:40000", "192.0.2.250"), ("[2001:db8::7]:51000", "2001:db8::7")] {
            let r = Record { client: client.parse().unwrap(), ..record(b"/t/seg-1.m4s", Some(b"player/1.0")) };
            let mut line = Vec::new();
            r.write_combined(&mut line);
            let text = String::from_utf8(line).unwrap();
            let (addr, rest) = text.split_once(" - - [").unwrap();
            assert_eq!(addr, shown);
            let rest = rest.split_once("] ").unwrap().1;
            assert_eq!(rest, "\"GET /t/seg-1.m4s HTTP/1.1\" 206 100 \"-\" \"player/1.0\"\n");
        }
    }

    #[test]
    fn times_and_durations_are_exact_across_seconds() {
        let mut r = record(b"/a", None);
        let mut out = Vec::new();
        for (ms, want) in
            [(123, "22:30:00.123Z"), (999, "22:30:00.999Z"), (1000, "22:30:01.000Z"), (61_007, "22:31:01.007Z")]
        {
            r.time = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_473_000_000 + ms);
            r.duration = Duration::from_micros(ms * 1000 + 7);
            out.clear();
            r.write_json(&mut out);
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v["time"], format!("2026-11-23T{want}"));
            assert_eq!(v["duration_ms"].as_f64(), Some(ms as f64 + 0.007));
        }
    }

    #[test]
    fn hostile_bytes_are_escaped_in_both_formats() {
        let target = b"/a\"b\\c\x01\n\xff\xc3\xa9?q";
        let ua = b"x\"}\r\ninjected";
        let mut json = Vec::new();
        record(target, Some(ua)).write_json(&mut json);
        let text = String::from_utf8(json).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["path"], r#"/a\x22b\x5Cc\x01\x0A\xFF\xC3\xA9"#);
        assert_eq!(v["user_agent"], r#"x\x22}\x0D\x0Ainjected"#);
        let mut clf = Vec::new();
        record(target, Some(ua)).write_combined(&mut clf);
        let line = String::from_utf8(clf).unwrap();
        assert_eq!(
            line,
            "2001:db8::7 - - [23/Nov/2026:22:30:00 +0000] \"GET /a\\x22b\\x5Cc\\x01\\x0A\\xFF\\xC3\\xA9 HTTP/1.1\" 206 100 \"-\" \"x\\x22}\\x0D\\x0Ainjected\"\n"
        );
    }

    #[test]
    fn writer_appends_batches_counts_drops_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let log = AccessLog::start(&path).unwrap();
        let w = WorkerLog::new(log.clone());
        let now = Instant::now();
        for _ in 0..3 {
            assert!(w.wants_next(1));
            w.write(&record(b"/a", None), Format::Combined, now);
        }
        w.flush();
        // Rotation: rename, then reopen; the next records go to a new file.
        let rotated = dir.path().join("access.log.1");
        let deadline = Instant::now() + Duration::from_secs(5);
        while log.counters.written.load(Ordering::Relaxed) < 3 {
            assert!(Instant::now() < deadline, "records not written");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::fs::rename(&path, &rotated).unwrap();
        log.reopen();
        while log.counters.reopened.load(Ordering::Relaxed) == 0 {
            assert!(Instant::now() < deadline, "not reopened");
            // The writer reopens before its next batch, or within half a second.
            std::thread::sleep(Duration::from_millis(10));
        }
        w.write(&record(b"/b", None), Format::Json, now);
        w.flush();
        log.finish(Duration::from_secs(5));
        assert_eq!(std::fs::read_to_string(&rotated).unwrap().lines().count(), 3);
        let new = std::fs::read_to_string(&path).unwrap();
        assert_eq!(new.lines().count(), 1);
        assert!(new.contains("\"path\":\"/b\""), "{new}");
        // After finish, records are dropped and counted, never blocking.
        w.write(&record(b"/c", None), Format::Json, now);
        w.flush();
        assert_eq!(log.counters.dropped.load(Ordering::Relaxed), 1);
        assert_eq!(log.counters.written.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn failed_writes_are_counted_as_dropped() {
        // /dev/full accepts the open and fails every write with ENOSPC: a full disk.
        let log = AccessLog::start(Path::new("/dev/full")).unwrap();
        let w = WorkerLog::new(log.clone());
        w.write(&record(b"/a", None), Format::Json, Instant::now());
        w.write(&record(b"/a", None), Format::Json, Instant::now());
        w.flush();
        log.finish(Duration::from_secs(5));
        assert_eq!(log.counters.dropped.load(Ordering::Relaxed), 2);
        assert_eq!(log.counters.written.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn sampling_keeps_one_in_n() {
        let log = AccessLog::start(Path::new("/dev/null")).unwrap();
        let w = WorkerLog::new(log);
        assert_eq!((0..100).filter(|_| w.wants_next(10)).count(), 10);
        assert_eq!((0..100).filter(|_| w.wants_next(1)).count(), 100);
    }

    /// xorshift64*: reproducible inputs for the property tests below.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }

    fn shown(ip: std::net::IpAddr) -> String {
        let mut out = Vec::new();
        client_ip(ip, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn addresses_are_written_as_std_displays_them() {
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for n in 0..200_000u32 {
            let r = rng.next();
            let v4 = Ipv4Addr::from(if n < 256 { u32::from_be_bytes([n as u8, 10, 100, 255]) } else { r as u32 });
            assert_eq!(shown(IpAddr::V4(v4)), v4.to_string());
            // Groups are zero half the time, so that every shape of zero runs (none,
            // one group, ties, leading, trailing, all) comes up often.
            let mut groups = [0u16; 8];
            let (mask, values) = (rng.next(), rng.next());
            for (k, g) in groups.iter_mut().enumerate() {
                if mask >> k & 1 == 1 {
                    // Any width: 1 to 4 hex digits.
                    *g = (values >> (8 * k)) as u16 >> (4 * ((mask >> (8 + 2 * k)) & 3));
                }
            }
            let v6 = Ipv6Addr::from(groups);
            assert_eq!(shown(IpAddr::V6(v6)), v6.to_string(), "{groups:x?}");
            let mapped = v4.to_ipv6_mapped();
            assert_eq!(shown(IpAddr::V6(mapped)), mapped.to_string());
            let compatible = v4.to_ipv6_compatible();
            assert_eq!(shown(IpAddr::V6(compatible)), compatible.to_string());
        }
        for text in ["::", "::1", "1::", "1:0:0:1:0:0:0:1", "1:0:0:0:1:0:0:1", "0:1:0:1:0:1:0:1", "ffff::ffff:0:0"] {
            let v6: Ipv6Addr = text.parse().unwrap();
            assert_eq!(shown(IpAddr::V6(v6)), v6.to_string());
        }
    }

    #[test]
    fn dates_match_humantime_in_both_formats() {
        const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
        let mut rng = Rng(42);
        // Every day boundary around leap days and years, and random seconds up to 9999.
        let edges = [0u64, 951_782_399, 951_782_400, 951_868_799, 951_868_800, 4_107_542_399, 4_107_542_400];
        let random = (0..100_000).map(|_| rng.next() % 253_402_300_800);
        for secs in edges.into_iter().chain(random) {
            let t = SystemTime::UNIX_EPOCH + Duration::from_millis(secs * 1000 + secs % 1000);
            let want = humantime::format_rfc3339_millis(t).to_string();
            let mut got = Vec::new();
            rfc3339_millis(t, &mut got);
            assert_eq!(String::from_utf8(got).unwrap(), want);
            let (y, mo, d, hms) = (&want[0..4], &want[5..7], &want[8..10], &want[11..19]);
            let mut clf = Vec::new();
            clf_time(t, &mut clf);
            let month = MONTHS[mo.parse::<usize>().unwrap() - 1];
            assert_eq!(String::from_utf8(clf).unwrap(), format!("{d}/{month}/{y}:{hms} +0000"));
        }
    }

    #[test]
    fn escaping_matches_a_byte_by_byte_reference() {
        fn reference(bytes: &[u8], json: bool) -> Vec<u8> {
            let mut out = Vec::new();
            for &b in bytes {
                if (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\' {
                    out.push(b);
                } else {
                    out.extend_from_slice(format!("{}x{b:02X}", if json { "\\\\" } else { "\\" }).as_bytes());
                }
            }
            out
        }
        let mut rng = Rng(7);
        for _ in 0..20_000 {
            let len = (rng.next() % 40) as usize;
            // Mostly printable, as real fields are, with escapes anywhere.
            let bytes: Vec<u8> = (0..len)
                .map(|_| match rng.next() % 8 {
                    0 => rng.next() as u8,
                    1 => b"\"\\"[(rng.next() % 2) as usize],
                    _ => b' ' + (rng.next() % 95) as u8,
                })
                .collect();
            for json in [true, false] {
                let mut out = b"prefix".to_vec();
                escape_to(&bytes, &mut out, json);
                assert_eq!(&out[6..], reference(&bytes, json), "{bytes:?}");
            }
        }
    }

    #[test]
    fn record_times_follow_the_wall_clock() {
        let log = AccessLog::start(Path::new("/dev/null")).unwrap();
        let w = WorkerLog::new(log);
        let since = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        for _ in 0..3 {
            let at = Instant::now();
            let wall = SystemTime::now();
            std::thread::sleep(Duration::from_millis(20));
            let (now, wall_now) = (Instant::now(), SystemTime::now());
            let got = since(w.wall_time(at, now));
            let want = since(wall);
            assert!(got.abs_diff(want) < Duration::from_millis(1), "{got:?} vs {want:?}");
            // The present, too, and an instant after the reading it is dated from.
            assert!(since(w.wall_time(now, now)).abs_diff(since(wall_now)) < Duration::from_millis(1));
            let later = Instant::now() + Duration::from_millis(5);
            let got_later = since(w.wall_time(later, now));
            assert!(got_later.abs_diff(since(wall_now) + Duration::from_millis(5)) < Duration::from_millis(1));
        }
        // Past WALL_CLOCK_EVERY the wall clock is read again.
        let old = w.clocks.get().unwrap().0;
        let now = old + WALL_CLOCK_EVERY + Duration::from_millis(1);
        w.wall_time(now, now);
        assert!(w.clocks.get().unwrap().0 > old);
    }

    #[test]
    fn written_batches_buffers_are_used_again() {
        let dir = tempfile::tempdir().unwrap();
        let log = AccessLog::start(&dir.path().join("access.log")).unwrap();
        let w = WorkerLog::new(log.clone());
        w.write(&record(b"/a", None), Format::Json, Instant::now());
        let first = w.buf.borrow().as_ptr();
        w.flush();
        let deadline = Instant::now() + Duration::from_secs(5);
        while lock(&log.spare).is_empty() {
            assert!(Instant::now() < deadline, "buffer not given back");
            std::thread::sleep(Duration::from_millis(5));
        }
        w.write(&record(b"/b", None), Format::Json, Instant::now());
        assert_eq!(w.buf.borrow().as_ptr(), first);
        assert!(lock(&log.spare).is_empty());
        w.flush();
        log.finish(Duration::from_secs(5));
        assert_eq!(log.counters.written.load(Ordering::Relaxed), 2);
    }
}
