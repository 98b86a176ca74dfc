//! `linerate bench`: a streaming load generator that measures what viewers feel.
//!
//! How the pieces fit:
//!
//! 1. `catalogue` turns `--url-list` or `--base-url`/`--files` into titles, resolves
//!    each origin once and sizes each title with a `HEAD` (or from the files under
//!    `--sizes-from`).
//! 2. A `plan::Plan` fixes everything the run shares, read-only: catalogue,
//!    `zipf` popularity, pacing, timeouts, start and end.
//! 3. One `worker` thread per CPU (like the server) runs a current-thread tokio
//!    runtime with its share of the sessions (session `i` on worker `i mod W`).
//! 4. A `session` is one viewer: it picks a title, fetches it segment by segment as
//!    the `playback` model says (or back to back with `--max-rate`), over one
//!    kept-alive connection (`client`: plain or rustls, TLS sessions resumed from
//!    the viewer's own store unless `--no-resume`; a new connection per request with
//!    `--connection-per-request`), one `exchange` at a time; responses are checked by `response` (heads parsed by httparse).
//!    With `--live URL` (`catalogue::live`, `plan::LiveStream`) a session is
//!    instead one viewer of an HLS live stream (`session::live`): it follows the
//!    media playlist (`m3u8`) as the `live` model says, on the same connection and
//!    through the same request routine, and plays it with the same `playback` model.
//! 5. Each worker keeps its own `stats`; the main thread shows progress from
//!    single-writer counters, merges the workers' results at the end, adds its own
//!    CPU time (`cpu`) and prints the `report`.
//!
//! Bounds: at most [`MAX_SESSIONS`] sessions, at most [`MAX_DURATION_SECS`] seconds,
//! every wait bounded by the end of the run or a timeout, and a backstop that drops
//! any session still running 5 s after the end.
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]

mod catalogue;
pub mod chart;
mod client;
mod cpu;
mod exchange;
mod live;
mod m3u8;
mod plan;
mod playback;
mod report;
/// Public for the fuzz target (`fuzz/fuzz_targets/response.rs`).
#[doc(hidden)]
pub mod response;
mod session;
mod stats;
mod tls;
mod worker;
mod zipf;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;

use report::{Setup, Summary};
use stats::{Live, WorkerStats};

/// Most sessions one bench process runs. Each holds a socket; the host's hard limit
/// on open files is 20,000 per process, and the server under test needs its own.
pub const MAX_SESSIONS: u32 = 10_000;
/// Longest run.
pub const MAX_DURATION_SECS: f64 = 3600.0;

/// Descriptors kept free for everything that is not a session's socket.
const SPARE_FDS: u64 = 64;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// File of URLs, one per line (`#` starts a comment), most popular first.
    #[arg(long, value_name = "FILE", required_unless_present_any = ["base_url", "live"], conflicts_with_all = ["base_url", "files"])]
    url_list: Option<PathBuf>,
    /// Base URL that `--files` are relative to, e.g. `http://127.0.0.1:8080/media/`.
    #[arg(long, value_name = "URL", requires = "files")]
    base_url: Option<String>,
    /// Comma-separated file names under `--base-url`, most popular first.
    #[arg(long, value_name = "a,b,c", value_delimiter = ',', requires = "base_url")]
    files: Vec<String>,
    /// Live mode: every session is a viewer of the HLS live stream whose media
    /// playlist is at URL. It joins three target durations behind the live edge,
    /// reloads the playlist as RFC 8216 says (a target duration after it changed,
    /// half of one when it had not) and fetches each new segment once, in order, on
    /// its one kept-alive connection, until the run ends. The options about titles,
    /// ranges and pacing do not apply.
    #[arg(
        long,
        value_name = "URL",
        conflicts_with_all = [
            "url_list", "base_url", "files", "max_rate", "verify", "hot_titles", "zipf",
            "bitrate_mbps", "segment_bytes", "startup_segments", "seed", "sizes_from",
        ]
    )]
    live: Option<String>,
    /// Concurrent sessions (viewers), each with one connection.
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=MAX_SESSIONS as i64))]
    sessions: u32,
    /// Length of the run, in seconds.
    #[arg(long, value_name = "S", default_value_t = 10.0)]
    duration: f64,
    /// Playback bitrate of every title, in Mb/s: a session asks for one segment per
    /// segment duration (segment bytes x 8 / bitrate) once its start-up buffer is full.
    /// Ignored with `--max-rate`.
    #[arg(long, value_name = "R", default_value_t = 5.0)]
    bitrate_mbps: f64,
    /// Bytes per segment (each request is one byte range of this size).
    #[arg(long, value_name = "B", default_value_t = 2 << 20)]
    segment_bytes: u64,
    /// Segments fetched as fast as possible before playback starts.
    #[arg(long, value_name = "K", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    startup_segments: u32,
    /// Closed loop: every session fetches segments back to back, with no pacing and
    /// no deadlines (maximum throughput, like wrk).
    #[arg(long)]
    max_rate: bool,
    /// Zipf exponent of title popularity (0 = uniform).
    #[arg(long, value_name = "S", default_value_t = 1.0)]
    zipf: f64,
    /// Start this many sessions per second instead of all at once.
    #[arg(long, value_name = "N")]
    ramp: Option<f64>,
    /// Worker threads (default: one per CPU the process may use).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    workers: Option<u32>,
    /// Longest time to connect (and finish a TLS handshake), in seconds.
    #[arg(long, value_name = "S", default_value_t = 5.0)]
    connect_timeout: f64,
    /// Longest time for one request, from issuing it (connecting first if needed) to
    /// its last byte, in seconds. A request still incomplete then is a `timeout`.
    #[arg(long, value_name = "S", default_value_t = 10.0)]
    timeout: f64,
    /// Compare every body byte with the file at the same offset under DIR (the URL
    /// path relative to the base URL, or to `/` for a URL list).
    #[arg(long, value_name = "DIR")]
    verify: Option<PathBuf>,
    /// Take each title's size from the file at the same path under DIR (as for
    /// `--verify`) instead of asking the server with a `HEAD` before the run: the
    /// server then sees the viewers' requests only. A cache answers a `HEAD` of a
    /// cold title by starting its fill (some fetch the whole title), so without
    /// this a "cold" crowd finds part of the title already on its way.
    #[arg(long, value_name = "DIR")]
    sizes_from: Option<PathBuf>,
    /// Trust the PEM certificates in FILE for HTTPS (instead of the system store).
    #[arg(long, value_name = "FILE", conflicts_with = "insecure")]
    cacert: Option<PathBuf>,
    /// Accept any server certificate for HTTPS (test servers only).
    #[arg(long)]
    insecure: bool,
    /// Seed for the title choices (runs with the same seed pick the same titles).
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,
    /// Also report the TTFB of requests for the N most popular titles (the first N
    /// listed) on their own (`hot_ttfb_ms`): how the hot content fares while the rest
    /// of the catalogue loads the server.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    hot_titles: Option<u32>,
    /// Do not resume TLS sessions: every connection makes a full handshake. By default
    /// a session's connections resume, as browsers and players do (TLS 1.3 tickets,
    /// TLS 1.2 tickets or session IDs), from a session store of that session's own.
    #[arg(long)]
    no_resume: bool,
    /// A new connection (and TLS handshake) for every request, closed once its
    /// response is in: with `--max-rate` and a small `--segment-bytes` this measures
    /// handshakes per second (`handshakes_per_s`).
    #[arg(long)]
    connection_per_request: bool,
    /// Print JSON on stdout instead of the table.
    #[arg(long)]
    json: bool,
}

fn check_seconds(name: &str, v: f64, max: f64) -> anyhow::Result<Duration> {
    anyhow::ensure!(v.is_finite() && v > 0.0 && v <= max, "--{name} must be more than 0 and at most {max} seconds");
    Ok(Duration::from_secs_f64(v))
}

/// Runs `linerate bench`.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let duration = check_seconds("duration", args.duration, MAX_DURATION_SECS)?;
    let connect_timeout = check_seconds("connect-timeout", args.connect_timeout, 600.0)?;
    let request_timeout = check_seconds("timeout", args.timeout, 3600.0)?;
    anyhow::ensure!(args.segment_bytes >= 1, "--segment-bytes must be at least 1");
    anyhow::ensure!(args.zipf.is_finite() && args.zipf >= 0.0, "--zipf must be a number >= 0");
    let bitrate_bps = if args.max_rate {
        None
    } else {
        anyhow::ensure!(args.bitrate_mbps.is_finite() && args.bitrate_mbps > 0.0, "--bitrate-mbps must be more than 0");
        Some(args.bitrate_mbps * 1e6)
    };
    if let Some(r) = args.ramp {
        anyhow::ensure!(r.is_finite() && r > 0.0, "--ramp must be more than 0 sessions per second");
    }
    if let Some(dir) = &args.verify {
        anyhow::ensure!(dir.is_dir(), "--verify: {} is not a directory", dir.display());
    }
    if let Some(dir) = &args.sizes_from {
        anyhow::ensure!(dir.is_dir(), "--sizes-from: {} is not a directory", dir.display());
    }

    let limit = linerate_sys::raise_nofile_limit().context("raising the open-file limit")?;
    let needed = u64::from(args.sessions) + SPARE_FDS;
    anyhow::ensure!(
        needed <= limit.soft,
        "{} sessions need about {needed} open files but this process may open {}; use fewer sessions",
        args.sessions,
        limit.soft
    );

    let urls: Vec<(String, Option<PathBuf>)> = match (&args.live, &args.url_list, &args.base_url) {
        (Some(url), ..) => vec![(url.clone(), None)],
        (None, Some(list), _) => catalogue::read_url_list(list)?.into_iter().map(|u| (u, None)).collect(),
        (None, None, Some(base)) => {
            catalogue::join_base(base, &args.files)?.into_iter().map(|(u, p)| (u, Some(p))).collect()
        }
        (None, None, None) => anyhow::bail!("give --url-list FILE, --base-url URL --files a,b,c or --live URL"),
    };
    let tls = if catalogue::any_https(&urls) {
        let trust = match (&args.cacert, args.insecure) {
            (Some(f), _) => tls::Trust::CaFile(f),
            (None, true) => tls::Trust::AnyCertificate,
            (None, false) => tls::Trust::System,
        };
        Some(tls::client_config(trust)?)
    } else {
        None
    };
    let discovery = catalogue::Discovery {
        tls,
        verify_dir: args.verify.as_deref(),
        sizes_dir: args.sizes_from.as_deref(),
        timeout: request_timeout,
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (catalogue, live) = match &args.live {
        Some(url) => {
            let (c, stream) = runtime.block_on(catalogue::live(url, &discovery))?;
            (c, Some(stream))
        }
        None => (runtime.block_on(catalogue::discover(urls, &discovery))?, None),
    };
    drop(runtime);

    let workers = match args.workers {
        Some(n) => n as usize,
        None => linerate_sys::allowed_cpus().map(|c| c.len()).unwrap_or(1).max(1),
    }
    .min(args.sessions as usize);
    let segment_duration = bitrate_bps.map(|b| plan::segment_duration(args.segment_bytes, b)).unwrap_or_default();
    let titles = catalogue.titles.len();
    let setup = Setup {
        mode: match (&live, args.max_rate) {
            (Some(_), _) => "live",
            (None, true) => "max-rate",
            (None, false) => "paced",
        },
        live_url: live.as_ref().map(|l| l.url.clone()),
        sessions: args.sessions,
        workers,
        duration_s: duration.as_secs_f64(),
        titles,
        segment_bytes: live.is_none().then_some(args.segment_bytes),
        bitrate_mbps: bitrate_bps.filter(|_| live.is_none()).map(|b| b / 1e6),
        segment_s: bitrate_bps.filter(|_| live.is_none()).map(|_| segment_duration.as_secs_f64()),
        startup_segments: if live.is_some() { live::HOLD_BACK_TARGETS } else { args.startup_segments },
        zipf_exponent: args.zipf,
        hot_titles: args.hot_titles.map(|n| (n as usize).min(titles)),
        resume: !args.no_resume,
        connection_per_request: args.connection_per_request,
    };

    let cpu_before = cpu::process_cpu_seconds()?;
    let start = Instant::now();
    let plan = Arc::new(plan::Plan {
        catalogue,
        zipf: (titles > 0).then(|| zipf::Zipf::new(titles, args.zipf)),
        live,
        bitrate_bps,
        segment_bytes: args.segment_bytes,
        segment_duration,
        startup_segments: args.startup_segments,
        start,
        duration,
        end: start + duration,
        ramp_per_second: args.ramp,
        connect_timeout,
        request_timeout,
        seed: args.seed,
        hot_titles: args.hot_titles.map_or(0, |n| n as usize),
        resume: !args.no_resume,
        connection_per_request: args.connection_per_request,
    });
    let lives: Vec<Arc<Live>> = (0..workers).map(|_| Arc::new(Live::default())).collect();
    let mut threads = Vec::with_capacity(workers);
    for (w, live) in lives.iter().enumerate() {
        let ids: Vec<u32> = (0..args.sessions).filter(|id| *id as usize % workers == w).collect();
        let (plan, live) = (plan.clone(), live.clone());
        let handle = std::thread::Builder::new()
            .name(format!("bench-{w}"))
            .spawn(move || worker::run(plan, ids, live))
            .context("starting a bench worker thread")?;
        threads.push(handle);
    }

    show_progress(&plan, &lives, &threads);
    let mut merged = WorkerStats::new(0);
    let mut dropped = 0;
    for t in threads {
        let (stats, stuck) = t.join().map_err(|_| anyhow::anyhow!("a bench worker panicked"))??;
        merged.merge(&stats);
        dropped += stuck;
    }
    let elapsed = Instant::now().min(plan.end).saturating_duration_since(start);
    let cpu_s = cpu::process_cpu_seconds()? - cpu_before;
    let summary = Summary::new(setup, &merged, elapsed.as_secs_f64(), cpu_s, dropped);
    if args.json {
        println!("{}", summary.to_json());
    } else {
        print!("{}", summary.to_table());
    }
    Ok(())
}

/// A progress bar on stderr while the workers run (only if stderr is a terminal).
fn show_progress(
    plan: &plan::Plan,
    lives: &[Arc<Live>],
    threads: &[std::thread::JoinHandle<std::io::Result<(WorkerStats, usize)>>],
) {
    let running = || threads.iter().any(|t| !t.is_finished());
    if !std::io::stderr().is_terminal() {
        while running() {
            std::thread::sleep(Duration::from_millis(50));
        }
        return;
    }
    let total_ms = plan.duration.as_millis() as u64;
    let bar = indicatif::ProgressBar::new(total_ms);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut last = (Instant::now(), 0u64);
    while running() {
        std::thread::sleep(Duration::from_millis(250));
        let now = Instant::now();
        let (mut bytes, mut requests, mut errors) = (0, 0, 0);
        for l in lives {
            let (b, r, e) = l.read();
            bytes += b;
            requests += r;
            errors += e;
        }
        let gbps = (bytes - last.1) as f64 * 8.0 / now.duration_since(last.0).as_secs_f64().max(1e-3) / 1e9;
        last = (now, bytes);
        bar.set_position((plan.since_start(now).as_millis() as u64).min(total_ms));
        let t = plan.since_start(now).min(plan.duration).as_secs();
        let d = plan.duration.as_secs();
        bar.set_message(format!("{t}/{d} s  {gbps:.2} Gb/s  {requests} requests  {errors} errors"));
    }
    bar.finish_and_clear();
}
