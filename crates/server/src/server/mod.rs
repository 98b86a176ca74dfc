//! `linerate serve`: the supervisor and its workers.
//!
//! The supervisor (the main thread) owns everything that is not serving: it loads
//! the configuration, binds the listening sockets (or takes over those a previous
//! process handed over, [`upgrade`]), starts one worker thread per CPU
//! ([`worker`]), and then waits for signals and for workers that stop:
//!
//! - SIGHUP: reload the configuration file (and re-read the certificates); on
//!   success every worker gets the new [`Settings`] for the connections it accepts
//!   from then on; established connections finish under the settings they started
//!   with. Listen addresses,
//!   the worker count and connection limits need a restart (a reload that changes
//!   them says so and keeps the running values). A bad file is reported and ignored.
//! - SIGUSR2: binary upgrade: start the binary again with the listening sockets
//!   inherited, and once it serves, stop accepting and drain ([`upgrade`]). If it
//!   does not start, keep serving.
//! - SIGUSR1: reopen the access log (after logrotate renamed it).
//! - SIGTERM / SIGINT: graceful shutdown (see [`worker`] for the steps), exit 0.
//! - A worker that stops on its own is a bug: the others are shut down and the
//!   process exits non-zero, so a service manager restarts it.
//!
//! A service manager is told about each step ([`service`]: `READY`, `RELOADING`,
//! `STOPPING`, `MAINPID` after an upgrade).

pub mod access_log;
pub mod client_limits;
mod conn;
mod files;
pub mod fill;
mod listener;
mod residency;
mod senders;
pub mod service;
pub mod settings;
pub mod steering;
pub mod upgrade;
mod worker;

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::Context;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};

use crate::admin::{self, AdminState};
use crate::config::{Config, Overrides};
use crate::counters::WorkerCounters;
use crate::sysfs::Host;
use crate::tls::TlsRuntime;
use crate::topology::{Plan, Topology};
use settings::Settings;
use upgrade::{Handover, Outcome, Role};
use worker::{Control, Launch};

/// What `serve` needs besides the configuration.
pub struct ServeOptions {
    pub config_file: Option<PathBuf>,
    pub overrides: Overrides,
}

enum Event {
    Signal(i32),
    WorkerStarted,
    WorkerStopped(usize, Result<(), String>),
    Upgrade(Outcome),
}

/// How often running certificates are checked for their expiry.
const EXPIRY_CHECK_EVERY: Duration = Duration::from_secs(24 * 60 * 60);

pub fn run(config: Config, opts: ServeOptions) -> anyhow::Result<()> {
    // The binary to start at an upgrade: resolved now, since once a package
    // upgrade has replaced the file, /proc/self/exe names the deleted old one.
    let exe = std::env::current_exe().context("cannot find this program's path")?;
    let mut inherited = upgrade::Inherited::from_env()?;
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
    let groups = listener::bind_all(&settings.config.listen, workers, backlog, inherited.as_mut())?;
    let tls_groups = listener::bind_all(&settings.config.tls_listen, workers, backlog, inherited.as_mut())?;
    let mut handover = Handover::new(exe);
    for g in groups.iter().chain(&tls_groups) {
        handover.add(Role::Serve, g.configured, &g.sockets).context("cannot keep the listening sockets")?;
    }
    let bound: Vec<_> = groups.iter().map(|g| g.bound).collect();
    let tls_bound: Vec<_> = tls_groups.iter().map(|g| g.bound).collect();
    let listeners = listener::distribute(groups, workers);
    let tls_listeners = listener::distribute(tls_groups, workers);
    listener::apply_tcp_options(listeners.iter().chain(&tls_listeners).flatten(), &settings.config.tcp);
    // Worker 0's listeners are the first member of every group.
    let leaders: Vec<&std::net::TcpListener> =
        listeners.first().into_iter().chain(tls_listeners.first()).flatten().collect();
    let steering = attach_steering(&plan, leaders.iter().copied());
    let steering_fds: Vec<std::os::fd::OwnedFd> =
        leaders.iter().filter_map(|l| std::os::fd::AsFd::as_fd(*l).try_clone_to_owned().ok()).collect();
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
        true => {
            let addr = settings.config.admin.listen;
            let l = match inherited.as_mut().and_then(|i| i.take(Role::Admin, addr)) {
                Some(mut sockets) => sockets.remove(0),
                None => admin::bind(addr)?,
            };
            handover.add(Role::Admin, addr, std::slice::from_ref(&l)).context("cannot keep the admin socket")?;
            Some(l)
        }
        false => None,
    };
    let ready_channel = inherited.map(upgrade::Inherited::finish);

    let (events_tx, events) = mpsc::channel::<Event>();
    let signals_tx = events_tx.clone();
    let mut signals = signal_hook::iterator::Signals::new([SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2])?;
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
        let started_tx = events_tx.clone();
        let launch = Launch {
            index,
            cpu: slot.cpu as usize,
            cpus: plan.worker_cpus(index),
            cpu_domains: cpu_domains.clone(),
            fill: fill.clone(),
            access_log: access_log.clone(),
            clients: clients.clone(),
            listeners,
            tls_listeners,
            settings: settings.clone(),
            counters: worker_counters.clone(),
            control,
            started: Box::new(move || {
                let _ = started_tx.send(Event::WorkerStarted);
            }),
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

    let capacity_model = match &settings.config.admin.capacity_model {
        Some(file) => Some((
            crate::capacity::load_inputs(file).context("admin.capacity_model")?,
            match settings.config.admin.capacity_model_clients {
                crate::config::ModelClients::Network => crate::capacity::Path::Network,
                crate::config::ModelClients::Loopback => crate::capacity::Path::Loopback,
            },
        )),
        None => None,
    };
    let admin_state = Arc::new(AdminState {
        workers: counters.clone(),
        shutting_down: AtomicBool::new(false),
        started: std::time::Instant::now(),
        tls_mode: tls_runtime.as_ref().map(|t| t.kernel.mode()),
        steering,
        capacity_connections: match settings.config.admin.capacity_connections {
            0 => (settings.max_connections_per_worker * workers) as u64,
            n => n,
        },
        capacity_gbps: settings.config.admin.capacity_gbps,
        capacity_model,
        model_ceiling_gbps: Default::default(),
        fill: fill.clone(),
        access_log: access_log.clone(),
        certificates: std::sync::Mutex::new(certificates_of(&settings)),
        reloads: Default::default(),
        reload_failures: Default::default(),
        upgrade_failures: Default::default(),
    });
    let (admin_bound, admin_stop) = match admin_listener {
        Some(l) => {
            let addr = l.local_addr()?;
            (Some(addr), Some(admin::start(l, admin_state.clone())?))
        }
        None => (None, None),
    };

    // Ready means every worker has its listeners in its event loop. Signals that
    // come meanwhile are handled after.
    let mut early = Vec::new();
    let mut started = 0;
    while started < workers {
        match events.recv() {
            Ok(Event::WorkerStarted) => started += 1,
            Ok(Event::WorkerStopped(index, result)) => {
                let why = result.err().unwrap_or_else(|| "stopped".into());
                anyhow::bail!("worker {index} could not start: {why}");
            }
            Ok(e) => early.push(e),
            Err(_) => anyhow::bail!("workers could not start"),
        }
    }

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
    let mut dim = Dim::start(&settings.config.dim);

    let pid_file = service::PidFile::new(settings.config.pid_file.clone());
    pid_file.write();
    service::ready(&format!("serving with {workers} workers"));
    if let Some(channel) = ready_channel {
        upgrade::report_ready(channel);
        tracing::info!("upgrade: this process serves now; the previous one drains");
    }

    let mut current = settings;
    let mut exit_error = None;
    let mut running = workers;
    let mut pending: Option<upgrade::Pending> = None;
    let mut handed_over = false;
    let mut next_expiry_check = Instant::now() + EXPIRY_CHECK_EVERY;
    let mut early = early.into_iter();
    loop {
        let event = match early.next() {
            Some(e) => Ok(e),
            None => match events.recv_timeout(next_expiry_check.saturating_duration_since(Instant::now())) {
                Ok(e) => Ok(e),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let now = crate::tls::certs::unix_now();
                    for c in admin_state.certificates.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                        c.warn_if_expiring(now);
                    }
                    next_expiry_check = Instant::now() + EXPIRY_CHECK_EVERY;
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => Err(()),
            },
        };
        match event {
            Ok(Event::Signal(SIGHUP)) => {
                service::reloading();
                match reload(&current, &opts, workers, nofile, tls_runtime.as_ref()) {
                    Ok(new) => {
                        let (applied, acks) = mpsc::channel();
                        for c in &controls {
                            let _ = c.send(Control::Reload(new.clone(), applied.clone()));
                        }
                        drop(applied);
                        // Wait for every worker to take it, so that from this log line on
                        // every request sees the new signed-URL keys (a key rotation's
                        // next step may start once it is printed).
                        let deadline = Instant::now() + Duration::from_secs(2);
                        for _ in &controls {
                            if acks.recv_timeout(deadline.saturating_duration_since(Instant::now())).is_err() {
                                break;
                            }
                        }
                        *admin_state.certificates.lock().unwrap_or_else(|e| e.into_inner()) = certificates_of(&new);
                        current = new;
                        admin_state.reloads.fetch_add(1, Ordering::Relaxed);
                        tracing::info!("configuration reloaded; new connections use it");
                        service::reloaded("configuration reloaded");
                    }
                    Err(e) => {
                        admin_state.reload_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::error!("reload failed, keeping the running configuration: {e:#}");
                        service::reloaded(&format!("reload failed, running configuration kept: {e:#}"));
                    }
                }
            }
            Ok(Event::Signal(SIGUSR1)) => match &access_log {
                Some(log) => log.reopen(),
                None => tracing::info!("SIGUSR1: no access log to reopen"),
            },
            Ok(Event::Signal(SIGUSR2)) => {
                if pending.is_some() {
                    tracing::warn!("upgrade: one is already under way; SIGUSR2 ignored");
                    continue;
                }
                tracing::info!(binary = %handover.exe().display(), "upgrade: starting the new binary with the listening sockets");
                dim.stop();
                let tx = events_tx.clone();
                match handover.start(current.config.timeouts.upgrade, move |o| {
                    let _ = tx.send(Event::Upgrade(o));
                }) {
                    Ok(p) => {
                        service::status(&format!("upgrading: new process {} starting", p.pid));
                        pending = Some(p);
                    }
                    Err(e) => {
                        upgrade_failed(&admin_state, &pid_file, &format!("{e:#}"));
                        dim = Dim::start(&current.config.dim);
                    }
                }
            }
            Ok(Event::Upgrade(Outcome::Ready(pid))) => {
                let took_ms = pending.take().map_or(0, |p| p.started.elapsed().as_millis() as u64);
                tracing::info!(new_pid = pid, took_ms, drain = ?current.config.timeouts.drain, "upgrade: the new process serves; this one stops accepting and drains its transfers");
                service::handed_over(pid);
                handed_over = true;
                break;
            }
            Ok(Event::Upgrade(Outcome::Failed(why))) => {
                pending = None;
                upgrade_failed(&admin_state, &pid_file, &why);
                // The child may have attached its own steering program to the groups.
                if steering != "reuseport-hash" {
                    let program = steering::program(&steering::targets(&plan));
                    for fd in &steering_fds {
                        if let Err(e) =
                            linerate_sys::reuseport::attach_reuseport_cbpf(std::os::fd::AsFd::as_fd(fd), &program)
                        {
                            tracing::warn!("cannot attach the steering program again: {e}");
                        }
                    }
                }
                dim = Dim::start(&current.config.dim);
            }
            Ok(Event::Signal(sig)) => {
                tracing::info!(signal = sig, drain = ?current.config.timeouts.drain, "shutting down: no new connections, draining transfers");
                if let Some(p) = pending.take() {
                    tracing::warn!(new_pid = p.pid, "upgrade: stopping the new process that was starting");
                    let _ = linerate_sys::inherit::signal(p.pid, linerate_sys::inherit::Signal::Term);
                }
                break;
            }
            Ok(Event::WorkerStarted) => {}
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
            Err(()) => break,
        }
    }

    if !handed_over {
        service::stopping();
    }
    // This process's copies of the listening sockets go with the workers' ones.
    drop(handover);
    drop(steering_fds);
    admin_state.shutting_down.store(true, Ordering::Relaxed);
    if let (true, Some(stop)) = (handed_over, &admin_stop) {
        stop.stop();
    }
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
            Ok(_) => {}
            Err(_) => {
                tracing::error!(workers = running, "workers did not stop in time; exiting anyway");
                break;
            }
        }
    }
    if let Some(log) = &access_log {
        log.finish(Duration::from_secs(5));
    }
    dim.stop();
    if !handed_over {
        pid_file.remove();
    }
    let served = admin_state.total(WorkerCounters::requests);
    let bytes = admin_state.body_bytes();
    tracing::info!(responses = served, body_bytes = bytes, "stopped");
    match exit_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The old process's side of a failed upgrade: say so everywhere an operator looks.
fn upgrade_failed(admin: &AdminState, pid_file: &service::PidFile, why: &str) {
    admin.upgrade_failures.fetch_add(1, Ordering::Relaxed);
    tracing::error!("upgrade failed: {why}; still serving with the running binary");
    service::status(&format!("upgrade failed ({why}); still serving with the running binary"));
    // Rewritten (same pid, new file): `linerate upgrade` takes that as the answer.
    pid_file.write();
}

fn certificates_of(settings: &Settings) -> Vec<crate::tls::certs::CertExpiry> {
    settings.tls.as_ref().map(|t| t.expiry.clone()).unwrap_or_default()
}

/// The interrupt-moderation controllers, stopped (NICs restored) around an upgrade.
struct Dim {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<anyhow::Result<crate::tune::dim::Summary>>>,
}

impl Dim {
    fn start(config: &crate::config::Dim) -> Dim {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = crate::tune::dim::spawn(config, stop.clone());
        Dim { stop, threads }
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            match t.join() {
                Ok(Ok(summary)) => tracing::debug!(?summary, "interrupt moderation stopped"),
                Ok(Err(_)) => {} // logged by the thread when it stopped
                Err(_) => tracing::error!("interrupt moderation thread panicked"),
            }
        }
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
    if config.pid_file != running.pid_file {
        tracing::warn!("`pid_file` changes take effect at restart");
        config.pid_file = running.pid_file.clone();
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
