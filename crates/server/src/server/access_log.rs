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
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

pub use crate::config::AccessLogFormat as Format;
use crate::counters::tcp_info::TcpFigures;

/// A batch is handed to the writer once it holds this many bytes...
const BATCH_BYTES: usize = 32 * 1024;
/// ...or once its oldest record has waited this long.
const BATCH_AGE: Duration = Duration::from_secs(1);
/// Batches queued for the writer before new ones are dropped (with `BATCH_BYTES`,
/// about 8 MiB of records: several seconds of a very busy box).
const QUEUE_BATCHES: usize = 256;

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

    fn submit(&self, bytes: Vec<u8>, records: u64) {
        let sent = match lock(&self.tx).as_ref() {
            Some(tx) => tx.try_send(Batch { bytes, records }).is_ok(),
            None => false,
        };
        if !sent {
            self.counters.dropped.fetch_add(records, Ordering::Relaxed);
        }
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
            match self.file.write_all(&batch.bytes) {
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
}

impl WorkerLog {
    pub fn new(log: Arc<AccessLog>) -> WorkerLog {
        WorkerLog {
            log,
            seen: Cell::new(0),
            buf: RefCell::new(Vec::new()),
            records: Cell::new(0),
            oldest: Cell::new(None),
        }
    }

    /// Whether this response is to be logged: one in `sample`, counted per worker.
    pub fn wants_next(&self, sample: u64) -> bool {
        let n = self.seen.get();
        self.seen.set(n.wrapping_add(1));
        n % sample.max(1) == 0
    }

    pub fn write(&self, rec: &Record<'_>, format: Format, now: Instant) {
        {
            let mut buf = self.buf.borrow_mut();
            if buf.capacity() == 0 {
                buf.reserve(BATCH_BYTES + 1024);
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

/// The client's address as `Display` writes it, without `core::fmt` for IPv4 (most
/// clients): the formatter cost more than the rest of a `combined` line.
fn client_ip(ip: std::net::IpAddr, out: &mut Vec<u8>) {
    match ip {
        std::net::IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                num(out, octet.into());
            }
        }
        std::net::IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
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

thread_local! {
    /// The last second formatted for records on this thread, and its text
    /// (`YYYY-MM-DDTHH:MM:SS`): the date is formatted once a second, not per record.
    static SECOND: RefCell<(u64, Vec<u8>)> = const { RefCell::new((u64::MAX, Vec::new())) };
}

/// `2026-11-23T22:30:00.123Z`.
fn rfc3339_millis(t: SystemTime, out: &mut Vec<u8>) {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    SECOND.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != since.as_secs() {
            let text = humantime::format_rfc3339_seconds(SystemTime::UNIX_EPOCH + Duration::from_secs(since.as_secs()));
            cached.1.clear();
            let _ = write!(cached.1, "{text}");
            cached.1.pop(); // the trailing `Z`
            cached.0 = since.as_secs();
        }
        out.extend_from_slice(&cached.1);
    });
    let ms = since.subsec_millis();
    out.extend_from_slice(&[b'.', b'0' + (ms / 100) as u8, b'0' + (ms / 10 % 10) as u8, b'0' + (ms % 10) as u8, b'Z']);
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
    for &b in bytes {
        if (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\' {
            out.push(b);
        } else {
            out.extend_from_slice(if json { b"\\\\x" } else { b"\\x" });
            out.push(HEX[(b >> 4) as usize]);
            out.push(HEX[(b & 15) as usize]);
        }
    }
}

fn escape(bytes: &[u8], out: &mut Vec<u8>) {
    escape_to(bytes, out, true);
}

fn escape_clf(bytes: &[u8], out: &mut Vec<u8>) {
    escape_to(bytes, out, false);
}

/// `23/Nov/2026:22:30:00 +0000`.
fn clf_time(t: SystemTime, out: &mut Vec<u8>) {
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    // RFC 3339 "YYYY-MM-DDTHH:MM:SSZ", reordered.
    let s = humantime::format_rfc3339_seconds(t).to_string();
    let b = s.as_bytes();
    let month = s.get(5..7).and_then(|m| m.parse::<usize>().ok()).unwrap_or(1).clamp(1, 12);
    if b.len() < 19 {
        out.extend_from_slice(s.as_bytes());
        return;
    }
    out.extend_from_slice(&b[8..10]);
    out.push(b'/');
    out.extend_from_slice(MONTHS[month - 1].as_bytes());
    out.push(b'/');
    out.extend_from_slice(&b[0..4]);
    out.push(b':');
    out.extend_from_slice(&b[11..19]);
    out.extend_from_slice(b" +0000");
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
}
