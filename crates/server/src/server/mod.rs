//! `linerate serve`: the supervisor and its workers.
//!
//! The supervisor (the main thread) owns everything that is not serving: it loads
//! the configuration, binds the listening sockets, starts one worker thread per CPU
//! ([`worker`]), and then waits for signals and for workers that stop:
//!
//! - SIGHUP: reload the configuration file (and re-read the certificates); on
//!   success every worker gets the new [`Settings`] for the connections it accepts
//!   from then on; established connections finish under the settings they started
//!   with. Listen addresses,
//!   the worker count and connection limits need a restart (a reload that changes
//!   them says so and keeps the running values). A bad file is reported and ignored.
//! - SIGUSR1: reopen the access log (after logrotate renamed it).
//! - SIGTERM / SIGINT: graceful shutdown (see [`worker`] for the steps), exit 0.
//! - A worker that stops on its own is a bug: the others are shut down and the
//!   process exits non-zero, so a service manager restarts it.

pub mod access_log;
pub mod client_limits;
mod conn;
mod files;
pub mod fill;
mod listener;
mod residency;
pub mod settings;
pub mod steering;
mod worker;

use std::io::Write;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::Context;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};

use crate::admin::{self, AdminState};
use crate::config::{Config, Overrides};
use crate::counters::WorkerCounters;
use crate::sysfs::Host;
use crate::tls::TlsRuntime;
use crate::topology::{Plan, Topology};
use settings::Settings;
use worker::{Control, Launch};

/// What `serve` needs besides the configuration.
pub struct ServeOptions {
    pub config_file: Option<PathBuf>,
    pub overrides: Overrides,
}

enum Event {
    Signal(i32),
    WorkerStopped(usize, Result<(), String>),
}

pub fn run(config: Config, opts: ServeOptions) -> anyhow::Result<()> {
    let nofile = match linerate_sys::raise_nofile_limit() {
        Ok(l) => l.soft,
        Err(e) => {
            tracing::warn!("cannot read or raise the open-file limit: {e}");
            1024
        }
    };
    let allowed: Vec<u32> = linerate_sys::allowed_cpus()
        .context("cannot read the CPU affinity mask")?
        .into_iter()
        .map(|c| c as u32)
        .collect();
    let topology = Topology::discover(&Host::new("/"), &allowed, &config.numa);
    let plan = Plan::new(&topology, config.workers, &config.numa);
    for w in &plan.warnings {
        tracing::warn!("topology: {w}");
    }
    let workers = plan.workers.len();
    let tls_runtime = if config.tls_listen.is_empty() {
        None
    } else {
        let runtime = TlsRuntime::new(config.tls.kernel_tls)?;
        runtime.kernel.log();
        Some(runtime)
    };
    let settings = Arc::new(Settings::new(config, workers, nofile, tls_runtime.as_ref())?);
    let backlog = settings.config.limits.listen_backlog;
    let (listeners, bound) = listener::bind_all(&settings.config.listen, workers, backlog)?;
    let (tls_listeners, tls_bound) = listener::bind_all(&settings.config.tls_listen, workers, backlog)?;
    listener::apply_tcp_options(listeners.iter().chain(&tls_listeners).flatten(), &settings.config.tcp);
    // Worker 0's listeners are the first member of every group.
    let leaders = listeners.first().into_iter().chain(tls_listeners.first()).flatten();
    let steering = attach_steering(&plan, leaders);
    tracing::info!(
        steering,
        domains = plan.domains.len(),
        placement = ?settings.config.numa.placement,
        "NUMA: {} worker(s) in {} domain(s)",
        workers,
        plan.domains.len()
    );
    let cpu_domains = Arc::new(plan.cpu_domains());
    let fill = match settings.config.fill.enabled {
        true => Some(fill::FillPool::start(&settings.config.fill, settings.config.numa.placement, &topology, &plan)?),
        false => None,
    };
    let access_log = match settings.config.access_log.file() {
        Some(path) => Some(
            access_log::AccessLog::start(path)
                .with_context(|| format!("access_log.path: cannot open {} for appending", path.display()))?,
        ),
        None => None,
    };
    let admin_listener = match settings.config.admin.enabled {
        true => Some(admin::bind(settings.config.admin.listen)?),
        false => None,
    };

    let (events_tx, events) = mpsc::channel::<Event>();
    let signals_tx = events_tx.clone();
    let mut signals = signal_hook::iterator::Signals::new([SIGHUP, SIGINT, SIGTERM, SIGUSR1])?;
    std::thread::Builder::new().name("linerate-signals".into()).spawn(move || {
        for sig in signals.forever() {
            if signals_tx.send(Event::Signal(sig)).is_err() {
                break;
            }
        }
    })?;

    let clients = Arc::new(client_limits::ClientTable::default());
    let mut controls = Vec::with_capacity(workers);
    let mut threads = Vec::with_capacity(workers);
    let mut counters = Vec::with_capacity(workers);
    for (index, (listeners, tls_listeners)) in listeners.into_iter().zip(tls_listeners).enumerate() {
        let (control_tx, control) = tokio::sync::mpsc::unbounded_channel();
        let slot = plan.workers[index];
        let worker_counters =
            Arc::new(WorkerCounters::new(index, Some(slot.cpu as usize), Some(slot.node as usize), slot.domain));
        let launch = Launch {
            index,
            cpu: Some(slot.cpu as usize),
            cpu_domains: cpu_domains.clone(),
            fill: fill.clone(),
            access_log: access_log.clone(),
            clients: clients.clone(),
            listeners,
            tls_listeners,
            settings: settings.clone(),
            counters: worker_counters.clone(),
            control,
        };
        let done = events_tx.clone();
        let thread = std::thread::Builder::new().name(format!("linerate-w{index}")).spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker::run(launch)));
            let result = match result {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(format!("{e:#}")),
                Err(_) => Err("panicked".to_string()),
            };
            let _ = done.send(Event::WorkerStopped(index, result));
        })?;
        controls.push(control_tx);
        threads.push(thread);
        counters.push(worker_counters);
    }
    drop(events_tx);

    let admin_state = Arc::new(AdminState {
        workers: counters.clone(),
        shutting_down: std::sync::atomic::AtomicBool::new(false),
        started: std::time::Instant::now(),
        tls_mode: tls_runtime.as_ref().map(|t| t.kernel.mode()),
        steering,
        capacity_connections: match settings.config.admin.capacity_connections {
            0 => (settings.max_connections_per_worker * workers) as u64,
            n => n,
        },
        capacity_gbps: settings.config.admin.capacity_gbps,
        fill: fill.clone(),
        access_log: access_log.clone(),
    });
    let admin_bound = match admin_listener {
        Some(l) => {
            let addr = l.local_addr()?;
            admin::start(l, admin_state.clone())?;
            Some(addr)
        }
        None => None,
    };

    tracing::info!(
        workers,
        root = %settings.root_path.display(),
        max_connections_per_worker = settings.max_connections_per_worker,
        open_file_limit = nofile,
        "linerate {} serving",
        env!("CARGO_PKG_VERSION")
    );
    // One write, so a reader sees all addresses at once.
    let lines: String = bound
        .iter()
        .map(|a| format!("listening http://{a}\n"))
        .chain(tls_bound.iter().map(|a| format!("listening https://{a}\n")))
        .chain(admin_bound.iter().map(|a| format!("listening admin http://{a}\n")))
        .collect();
    let mut out = std::io::stdout().lock();
    out.write_all(lines.as_bytes())?;
    out.flush()?;
    drop(out);

    // Interrupt moderation, when configured: one controller thread per NIC, each
    // restoring the NIC's settings when told to stop.
    let dim_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dim_threads = crate::tune::moderation::spawn(&settings.config.dim, dim_stop.clone());

    let mut current = settings;
    let mut exit_error = None;
    let mut running = workers;
    loop {
        match events.recv() {
            Ok(Event::Signal(SIGHUP)) => match reload(&current, &opts, workers, nofile, tls_runtime.as_ref()) {
                Ok(new) => {
                    let (applied, acks) = mpsc::channel();
                    for c in &controls {
                        let _ = c.send(Control::Reload(new.clone(), applied.clone()));
                    }
                    drop(applied);
                    // Wait for every worker to take it, so that from this log line on
                    // every request sees the new signed-URL keys (a key rotation's
                    // next step may start once it is printed).
                    let deadline = std::time::Instant::now() + Duration::from_secs(2);
                    for _ in &controls {
                        if acks.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())).is_err() {
                            break;
                        }
                    }
                    current = new;
                    tracing::info!("configuration reloaded; new connections use it");
                }
                Err(e) => tracing::error!("reload failed, keeping the running configuration: {e:#}"),
            },
            Ok(Event::Signal(SIGUSR1)) => match &access_log {
                Some(log) => log.reopen(),
                None => tracing::info!("SIGUSR1: no access log to reopen"),
            },
            Ok(Event::Signal(sig)) => {
                tracing::info!(signal = sig, drain = ?current.config.timeouts.drain, "shutting down: no new connections, draining transfers");
                break;
            }
            Ok(Event::WorkerStopped(index, result)) => {
                running -= 1;
                let why = match result {
                    Ok(()) => "stopped unexpectedly".to_string(),
                    Err(e) => e,
                };
                tracing::error!(worker = index, "worker {why}; shutting down");
                exit_error = Some(anyhow::anyhow!("worker {index} {why}"));
                break;
            }
            Err(_) => break,
        }
    }

    admin_state.shutting_down.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in &controls {
        let _ = c.send(Control::Shutdown);
    }
    // Workers end by themselves after the drain timeout; allow a little more.
    let deadline = std::time::Instant::now() + current.config.timeouts.drain + Duration::from_secs(2);
    while running > 0 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match events.recv_timeout(left) {
            Ok(Event::WorkerStopped(index, Err(e))) => {
                running -= 1;
                tracing::error!(worker = index, "worker failed while stopping: {e}");
            }
            Ok(Event::WorkerStopped(..)) => running -= 1,
            Ok(Event::Signal(_)) => {}
            Err(_) => {
                tracing::error!(workers = running, "workers did not stop in time; exiting anyway");
                break;
            }
        }
    }
    if let Some(log) = &access_log {
        log.finish(Duration::from_secs(5));
    }
    dim_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in dim_threads {
        match t.join() {
            Ok(Ok(summary)) => tracing::debug!(?summary, "interrupt moderation stopped"),
            Ok(Err(_)) => {} // logged by the thread when it stopped
            Err(_) => tracing::error!("interrupt moderation thread panicked"),
        }
    }
    let served = admin_state.total(WorkerCounters::requests);
    let bytes = admin_state.body_bytes();
    tracing::info!(responses = served, body_bytes = bytes, "stopped");
    match exit_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Attaches the steering program to each listener group (through one member of
/// each, `leaders`) when the plan steers by domain or CPU. Returns the mechanism in
/// force; a kernel that refuses the program leaves the reuseport hash.
fn attach_steering<'a>(plan: &Plan, leaders: impl Iterator<Item = &'a std::net::TcpListener>) -> &'static str {
    if plan.steering == "reuseport-hash" {
        return plan.steering;
    }
    let program = steering::program(&steering::targets(plan));
    for l in leaders {
        if let Err(e) = linerate_sys::reuseport::attach_reuseport_cbpf(std::os::fd::AsFd::as_fd(l), &program) {
            tracing::warn!("cannot attach the steering program ({e}); connections are spread by the kernel's hash");
            return "reuseport-hash";
        }
    }
    plan.steering
}

/// Loads the configuration again for SIGHUP. Keys that need a restart keep their
/// running values, with a warning.
fn reload(
    current: &Settings,
    opts: &ServeOptions,
    workers: usize,
    nofile: u64,
    tls: Option<&TlsRuntime>,
) -> anyhow::Result<Arc<Settings>> {
    let mut config = Config::load(opts.config_file.as_deref(), &opts.overrides)?;
    let running = &current.config;
    if config.listen != running.listen || config.tls_listen != running.tls_listen {
        tracing::warn!("`listen` and `tls_listen` changes take effect at restart");
        config.listen = running.listen.clone();
        config.tls_listen = running.tls_listen.clone();
    }
    if config.tls.kernel_tls != running.tls.kernel_tls {
        tracing::warn!("`tls.kernel_tls` changes take effect at restart");
        config.tls.kernel_tls = running.tls.kernel_tls;
    }
    if config.workers != running.workers {
        tracing::warn!("`workers` changed: takes effect at restart");
        config.workers = running.workers;
    }
    if config.limits.max_connections_per_worker != running.limits.max_connections_per_worker
        || config.limits.listen_backlog != running.limits.listen_backlog
        || config.open_file_cache.entries != running.open_file_cache.entries
    {
        tracing::warn!("connection, backlog and open-file-cache sizes take effect at restart");
        config.limits.max_connections_per_worker = running.limits.max_connections_per_worker;
        config.limits.listen_backlog = running.limits.listen_backlog;
        config.open_file_cache.entries = running.open_file_cache.entries;
    }
    if config.tcp != running.tcp
        || config.admin != running.admin
        || config.numa != running.numa
        || config.dim != running.dim
    {
        tracing::warn!("`tcp`, `admin`, `numa` and `dim` settings take effect at restart");
        config.tcp = running.tcp.clone();
        config.admin = running.admin.clone();
        config.numa = running.numa.clone();
        config.dim = running.dim.clone();
    }
    if config.fill != running.fill {
        // The pool's threads, window and queues are built at start; the files'
        // read-ahead advice (files.rs) follows `fill.enabled` too.
        tracing::warn!("`fill` settings take effect at restart");
        config.fill = running.fill.clone();
    }
    if config.access_log.file() != running.access_log.file() {
        // The writer thread and its file are set up at start; format and sampling
        // apply at once.
        tracing::warn!("`access_log.path` takes effect at restart (SIGUSR1 reopens the running one)");
        config.access_log.path = running.access_log.path.clone();
    }
    if config.log != running.log {
        tracing::warn!("`log` settings take effect at restart");
        config.log = running.log.clone();
    }
    Ok(Arc::new(Settings::new(config, workers, nofile, tls)?))
}
