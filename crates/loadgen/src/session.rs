//! One viewer: picks titles by popularity and fetches them segment by segment as a
//! player would (paced), or back to back (`--max-rate`), on one kept-alive
//! connection, until the run ends.
//!
//! Every wait is bounded by the run's end: pacing sleeps, back-offs, connects (by
//! `--connect-timeout`) and requests (by `--timeout`). A request cut by the end of
//! the run is neither an error nor a completed request; the bytes it received count.

use std::cell::RefCell;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::time::{sleep_until, timeout_at};

use super::client::{Conn, ConnectError, TlsTarget};
use super::exchange::{exchange, Buffers, ExchangeError};
use super::plan::Plan;
use super::playback::Playback;
use super::response::{Expect, ResponseError, ResponseReader};
use super::stats::{ErrorKind, Live, WorkerStats};
use super::tls::with_resumption;

mod live;

/// A worker's state, shared by its sessions (all on the worker's thread).
pub(crate) struct WorkerCtx {
    pub plan: Arc<Plan>,
    pub bufs: RefCell<Buffers>,
    pub stats: RefCell<WorkerStats>,
    pub live: Arc<Live>,
    verify_files: RefCell<Vec<Option<File>>>,
}

impl WorkerCtx {
    pub(crate) fn new(plan: Arc<Plan>, live: Arc<Live>) -> WorkerCtx {
        let titles = plan.catalogue.titles.len();
        let seconds = plan.duration.as_secs_f64().ceil() as usize;
        WorkerCtx {
            plan,
            bufs: RefCell::new(Buffers::new()),
            stats: RefCell::new(WorkerStats::new(seconds)),
            live,
            verify_files: RefCell::new((0..titles).map(|_| None).collect()),
        }
    }

    fn error(&self, kind: ErrorKind, detail: impl FnOnce() -> String) {
        let mut stats = self.stats.borrow_mut();
        stats.errors[kind as usize] += 1;
        let since = self.plan.since_start(Instant::now());
        stats.bucket(since).errors += 1;
        if stats.first_failure.is_none() {
            stats.first_failure = Some(detail());
        }
        self.live.add_error();
    }

    /// Counts `n` body bytes of a segment.
    fn count_body(&self, n: u64) {
        let mut stats = self.stats.borrow_mut();
        stats.body_bytes += n;
        let since = self.plan.since_start(Instant::now());
        stats.bucket(since).bytes += n;
        self.live.add_bytes(n);
    }

    /// Counts body bytes and, under `--verify`, compares them with the file.
    /// Returns `false` if they differ (or the file cannot be read).
    fn take_body(&self, title: usize, offset: u64, body: &[u8], scratch: &mut [u8]) -> bool {
        let n = body.len() as u64;
        self.count_body(n);
        let Some(path) = &self.plan.catalogue.titles[title].local else { return true };
        let mut files = self.verify_files.borrow_mut();
        let file = match &mut files[title] {
            Some(f) => f,
            slot => match File::open(path) {
                Ok(f) => slot.insert(f),
                Err(_) => return false,
            },
        };
        let mut done = 0;
        while done < body.len() {
            let chunk = (body.len() - done).min(scratch.len());
            if file.read_exact_at(&mut scratch[..chunk], offset + done as u64).is_err()
                || scratch[..chunk] != body[done..done + chunk]
            {
                return false;
            }
            done += chunk;
        }
        self.stats.borrow_mut().verified_bytes += n;
        true
    }
}

/// What a request is for.
struct Request<'a> {
    origin: usize,
    expect: Expect,
    /// The URL (and range) it fetches, for error messages.
    label: &'a str,
    /// Offset in its file of the first body byte (for `--verify` messages).
    offset: u64,
}

/// When a request began (its connection included), its first response byte
/// arrived, and its last.
struct Timing {
    began: Instant,
    first_byte: Instant,
    done: Instant,
}

/// How a fetch ended, other than with the segment.
enum Stop {
    /// The run is over.
    Ended,
    Failed,
}

struct Session {
    ctx: Rc<WorkerCtx>,
    rng: fastrand::Rng,
    conn: Option<(usize, Conn)>,
    /// Each origin's TLS target with this viewer's own session store (see
    /// `tls::with_resumption`); `None` for plain HTTP.
    tls: Vec<Option<TlsTarget>>,
    reader: ResponseReader,
    request: Vec<u8>,
}

/// Runs session `id` until the end of the run.
pub(crate) async fn run(ctx: Rc<WorkerCtx>, id: u32) {
    let plan = ctx.plan.clone();
    if let Some(at) = plan.session_start(id) {
        sleep_until(at.min(plan.end).into()).await;
    }
    let mut s = Session {
        rng: fastrand::Rng::with_seed(plan.seed ^ (u64::from(id) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        tls: plan
            .catalogue
            .origins
            .iter()
            .map(|o| {
                o.tls.as_ref().map(|t| TlsTarget {
                    config: with_resumption(&t.config, plan.resume),
                    server_name: t.server_name.clone(),
                })
            })
            .collect(),
        ctx,
        conn: None,
        reader: ResponseReader::default(),
        request: Vec::with_capacity(256),
    };
    if plan.live.is_some() {
        s.watch_live().await;
        return;
    }
    while Instant::now() < plan.end {
        s.play().await;
    }
}

impl Session {
    /// One play: a title from its first segment until it has played out or the run
    /// ends. Records the play's QoE.
    async fn play(&mut self) {
        let plan = self.ctx.plan.clone();
        let title = plan.zipf.as_ref().expect("a run of titles has a popularity model").sample(&mut self.rng);
        let segments = plan.segments_of(title);
        let paced = plan.paced();
        let mut playback =
            Playback::new(plan.segment_duration, plan.startup_segments, segments, plan.since_start(Instant::now()));
        let mut failures = 0u32;
        while let Some(i) = playback.next_segment() {
            if let Some(at) = playback.request_at(i).filter(|_| paced) {
                sleep_until(plan.at(at).min(plan.end).into()).await;
            }
            if Instant::now() >= plan.end {
                break;
            }
            match self.fetch(title, i).await {
                Ok(arrived) => {
                    let at = plan.since_start(arrived);
                    let late = playback.arrived(at, paced);
                    self.segment_arrived(at, late, &mut failures);
                }
                Err(Stop::Ended) => break,
                Err(Stop::Failed) => self.back_off(&mut failures, plan.end).await,
            }
        }
        if failures > 0 {
            // The play ended (the run did) while its segment was still failing.
            self.ctx.stats.borrow_mut().unrecovered_segments += 1;
        }
        if paced && playback.next_segment().is_none() {
            // Watch the rest of the title before picking the next one.
            if let Some(end) = playback.ends_at() {
                sleep_until(plan.at(end).min(plan.end).into()).await;
            }
        }
        self.end_play(playback, paced);
    }

    /// Counts a segment that arrived at `at` (an offset into the run) after
    /// `failures` failed attempts (reset to 0), `late` if it caused a rebuffer.
    fn segment_arrived(&self, at: Duration, late: Option<Duration>, failures: &mut u32) {
        let mut stats = self.ctx.stats.borrow_mut();
        stats.retried_segments += u64::from(*failures > 0);
        stats.max_segment_attempts = stats.max_segment_attempts.max(u64::from(*failures) + 1);
        *failures = 0;
        if let Some(late) = late {
            stats.bucket(at).rebuffers += 1;
            stats.spread(at.saturating_sub(late), at, |b| &mut b.stalled_s);
        }
    }

    /// After a failed request: a player retries the same segment; back off so a
    /// refusing server is not hammered (100 ms doubling up to 2 s), not past `until`.
    async fn back_off(&mut self, failures: &mut u32, until: Instant) {
        self.conn = None;
        let wait = Duration::from_millis(100 << (*failures).min(5)).min(Duration::from_secs(2));
        *failures += 1;
        sleep_until((Instant::now() + wait).min(until).into()).await;
    }

    /// Ends a play now (at the latest at the run's end) and adds its QoE to the totals.
    fn end_play(&self, playback: Playback, paced: bool) {
        let plan = &self.ctx.plan;
        let now = plan.since_start(Instant::now().min(plan.end));
        let out = playback.finish(now, paced);
        let mut stats = self.ctx.stats.borrow_mut();
        match out.play_delay {
            Some(delay) => {
                stats.plays_started += 1;
                WorkerStats::record(&mut stats.play_delay_usecs, delay);
            }
            None => {
                // Still starting at the end: it waited at least this long, so it
                // counts in the play delay percentiles with that lower bound.
                stats.plays_not_started += 1;
                WorkerStats::record(&mut stats.play_delay_usecs, out.startup_wait);
            }
        }
        if let Some((from, to)) = out.watching {
            stats.spread(from, to, |b| &mut b.watching_s);
        }
        stats.spread(now.saturating_sub(out.open_stall), now, |b| &mut b.stalled_s);
        stats.rebuffers += u64::from(out.rebuffers);
        stats.stall += out.stall;
        stats.watch += out.watch;
    }

    /// Fetches segment `seg` of `title`; returns when its last byte arrived.
    async fn fetch(&mut self, title: usize, seg: u32) -> Result<Instant, Stop> {
        let ctx = self.ctx.clone();
        let plan = &ctx.plan;
        let t = &plan.catalogue.titles[title];
        let first = u64::from(seg) * plan.segment_bytes;
        let last = (first + plan.segment_bytes).min(t.size_bytes) - 1;
        self.request.clear();
        self.request.extend_from_slice(&t.request_prefix);
        self.request.extend_from_slice(format!("{first}-{last}\r\n\r\n").as_bytes());
        let what = Request {
            origin: t.origin,
            expect: Expect::Range { first, last },
            label: &format!("{} bytes {first}-{last}", t.url),
            offset: first,
        };
        let mut received = 0u64;
        let timing = self
            .request(what, &mut |body, scratch| {
                let ok = ctx.take_body(title, first + received, body, scratch);
                received += body.len() as u64;
                ok
            })
            .await?;
        self.record_segment(title < plan.hot_titles, &timing);
        Ok(timing.done)
    }

    /// Counts a segment that arrived.
    fn record_segment(&self, hot: bool, t: &Timing) {
        let plan = &self.ctx.plan;
        let mut stats = self.ctx.stats.borrow_mut();
        stats.requests += 1;
        stats.bucket(plan.since_start(t.done)).requests += 1;
        stats.record_ttfb(hot, t.first_byte - t.began, plan.since_start(t.done));
        WorkerStats::record(&mut stats.segment_usecs, t.done - t.began);
        self.ctx.live.add_request();
    }

    /// Sends `self.request` to origin `what.origin` on the session's connection
    /// (opened first if there is none to that origin) and reads the response, its
    /// body to `on_body`. A failure is counted as an error of its kind.
    async fn request(
        &mut self,
        what: Request<'_>,
        on_body: &mut dyn FnMut(&[u8], &mut [u8]) -> bool,
    ) -> Result<Timing, Stop> {
        let ctx = self.ctx.clone();
        let plan = &ctx.plan;
        let label = what.label;
        let began = Instant::now();
        let mut retried = false;
        loop {
            let reused = matches!(&self.conn, Some((o, _)) if *o == what.origin);
            if !reused {
                self.conn = None;
                let origin = &plan.catalogue.origins[what.origin];
                let limit = (Instant::now() + plan.connect_timeout).min(plan.end);
                ctx.stats.borrow_mut().connections += 1;
                match timeout_at(limit.into(), Conn::open(origin.addr, self.tls[what.origin].as_ref())).await {
                    Ok(Ok(c)) => {
                        let mut stats = ctx.stats.borrow_mut();
                        match c.resumed() {
                            Some(true) => stats.handshakes_resumed += 1,
                            Some(false) => stats.handshakes_full += 1,
                            None => {}
                        }
                        self.conn = Some((what.origin, c));
                    }
                    Ok(Err(e)) => {
                        if let ConnectError::Io(io) = &e {
                            count_reset(&ctx, io);
                        }
                        return Err(self.fail(ErrorKind::Connect, || connect_detail(&origin.label, &e)));
                    }
                    Err(_) if Instant::now() >= plan.end => return Err(Stop::Ended),
                    Err(_) => {
                        let l = &origin.label;
                        return Err(self.fail(ErrorKind::Connect, || format!("connect to {l}: timed out")));
                    }
                }
            }
            let (_, conn) = self.conn.as_mut().expect("connected above");
            let deadline = (began + plan.request_timeout).min(plan.end);
            self.reader.start(what.expect);
            let mut first_byte = None;
            let mut received = 0u64;
            let result = timeout_at(
                deadline.into(),
                exchange(conn, &self.request, &mut self.reader, &ctx.bufs, &mut first_byte, &mut |body, scratch| {
                    let ok = on_body(body, scratch);
                    received += u64::from(ok) * body.len() as u64;
                    ok
                }),
            )
            .await;
            let now = Instant::now();
            if let Ok(Err(ExchangeError::Io(e))) = &result {
                count_reset(&ctx, e);
            }
            let kind = match result {
                Ok(Ok(head)) => {
                    if head.close || plan.connection_per_request {
                        self.conn = None;
                    }
                    return Ok(Timing { began, first_byte: first_byte.unwrap_or(now), done: now });
                }
                Err(_) if now >= plan.end => return Err(Stop::Ended),
                Err(_) => {
                    let d = plan.request_timeout;
                    (ErrorKind::Timeout, format!("{label}: no complete response within {d:?}"))
                }
                // The server closed a kept-alive connection before our request
                // reached it (its idle timeout): a real client retries once.
                Ok(Err(ExchangeError::Closed { .. } | ExchangeError::Io(_)))
                    if reused && !retried && first_byte.is_none() =>
                {
                    retried = true;
                    self.conn = None;
                    ctx.stats.borrow_mut().reconnects += 1;
                    continue;
                }
                Ok(Err(e)) => {
                    let kind = match &e {
                        ExchangeError::Io(_) | ExchangeError::Closed { .. } if first_byte.is_some() => {
                            ErrorKind::ShortBody
                        }
                        ExchangeError::Io(_) | ExchangeError::Closed { .. } => ErrorKind::Closed,
                        ExchangeError::Response(ResponseError::Status(_)) => ErrorKind::Status,
                        ExchangeError::Response(ResponseError::Protocol(_)) => ErrorKind::Protocol,
                        ExchangeError::Rejected => ErrorKind::Verify,
                    };
                    let detail = match kind {
                        ErrorKind::Verify => {
                            format!("body differs from the file at or after offset {}", what.offset + received)
                        }
                        _ => e.to_string(),
                    };
                    (kind, format!("{label}: {detail}"))
                }
            };
            self.conn = None;
            return Err(self.fail(kind.0, || kind.1));
        }
    }

    fn fail(&self, kind: ErrorKind, detail: impl FnOnce() -> String) -> Stop {
        self.ctx.error(kind, detail);
        Stop::Failed
    }
}

/// Counts a connection the server reset or refused.
fn count_reset(ctx: &WorkerCtx, e: &std::io::Error) {
    use std::io::ErrorKind as K;
    if matches!(e.kind(), K::ConnectionReset | K::ConnectionAborted | K::ConnectionRefused) {
        ctx.stats.borrow_mut().resets += 1;
    }
}

fn connect_detail(label: &str, e: &ConnectError) -> String {
    format!("connect to {label}: {e}")
}
