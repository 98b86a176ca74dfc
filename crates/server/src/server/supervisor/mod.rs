//! The supervisor: the main thread of `linerate serve`, which owns everything that
//! is not serving. Like nginx's cycle set-up and master loop, it comes in three
//! parts:
//!
//! 1. **Start-up** ([`startup`]): the configuration resolved into [`Settings`],
//!    the listening sockets, the workers, the admin endpoint; the result is the
//!    running state, [`Running`].
//! 2. **The loop** ([`Running::supervise`]): one event at a time, each handled by a
//!    function of its own:
//!    - SIGHUP: reload the configuration file and the certificates ([`reload`]);
//!      on success every worker gets the new [`Settings`] for the connections it
//!      accepts from then on; established connections finish under the settings
//!      they started with. Listen addresses, the worker count and connection
//!      limits need a restart (a reload that changes them says so and keeps the
//!      running values). A bad file is reported and ignored.
//!    - SIGUSR1: reopen the access log (after logrotate renamed it).
//!    - SIGUSR2: binary upgrade: start the binary again with the listening sockets
//!      inherited ([`upgrade`]); its outcome is an event too: once the new process
//!      serves, this one stops accepting and drains; if it does not start, keep
//!      serving.
//!    - SIGTERM / SIGINT: graceful shutdown.
//!    - A worker that stops on its own is a bug: the others are shut down and the
//!      process exits non-zero, so a service manager restarts it.
//!    - Once a day, certificates near their end are warned about.
//! 3. **Shutdown** ([`Running::shut_down`]): workers told to drain (see
//!    `server::worker` for their steps), waited for up to `timeouts.drain`, the
//!    access log flushed, the NICs' moderation restored, the exit status.
//!
//! A service manager is told about each step ([`service`]: `READY`, `RELOADING`,
//! `STOPPING`, `MAINPID` after an upgrade).

mod reload;
pub(super) mod service;
mod startup;
pub mod upgrade;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGHUP, SIGUSR1, SIGUSR2};

pub(super) use startup::start;
use upgrade::{Handover, Outcome};

use crate::admin::{self, AdminState};
use crate::counters::WorkerCounters;
use crate::server::access_log::AccessLog;
use crate::server::listen::steering;
use crate::server::settings::Settings;
use crate::server::worker::Control;
use crate::server::ServeOptions;
use crate::tls::TlsRuntime;
use crate::topology::Plan;

/// What the supervisor waits for.
enum Event {
    Signal(i32),
    WorkerStarted,
    WorkerStopped(usize, Result<(), String>),
    Upgrade(Outcome),
}

/// How often running certificates are checked for their expiry.
const EXPIRY_CHECK_EVERY: Duration = Duration::from_secs(24 * 60 * 60);

/// Why the loop ended.
pub(super) enum Stop {
    /// SIGTERM or SIGINT.
    Signal,
    /// A new process serves on the listening sockets; this one drains.
    HandedOver,
    /// A worker stopped on its own.
    WorkerFailed(anyhow::Error),
    /// Every event source is gone (cannot happen while the signal thread lives).
    NoEvents,
}

/// The running process, as the supervisor holds it.
pub(super) struct Running {
    opts: ServeOptions,
    /// The settings of the last successful load or reload.
    current: Arc<Settings>,
    workers: usize,
    /// Workers not yet reported stopped.
    running: usize,
    nofile: u64,
    tls_runtime: Option<TlsRuntime>,
    plan: Plan,
    /// The steering mechanism in force, and this process's copies of the groups'
    /// leading sockets, to attach the program again after a failed upgrade.
    steering: &'static str,
    steering_fds: Vec<std::os::fd::OwnedFd>,
    handover: Handover,
    access_log: Option<Arc<AccessLog>>,
    events: mpsc::Receiver<Event>,
    events_tx: mpsc::Sender<Event>,
    /// Events that came while the workers were starting.
    early: VecDeque<Event>,
    controls: Vec<tokio::sync::mpsc::UnboundedSender<Control>>,
    admin_state: Arc<AdminState>,
    admin_stop: Option<admin::Stop>,
    dim: Dim,
    pid_file: service::PidFile,
    /// An upgrade under way.
    pending: Option<upgrade::Pending>,
    next_expiry_check: Instant,
}

impl Running {
    /// Handles events until one ends the serving.
    pub(super) fn supervise(&mut self) -> Stop {
        loop {
            let Some(event) = self.next_event() else { return Stop::NoEvents };
            let stop = match event {
                Event::Signal(SIGHUP) => {
                    self.reload();
                    None
                }
                Event::Signal(SIGUSR1) => {
                    self.reopen_access_log();
                    None
                }
                Event::Signal(SIGUSR2) => {
                    self.start_upgrade();
                    None
                }
                Event::Upgrade(Outcome::Ready(pid)) => Some(self.upgrade_served(pid)),
                Event::Upgrade(Outcome::Failed(why)) => {
                    self.upgrade_failed(&why);
                    None
                }
                Event::Signal(sig) => Some(self.stop_signal(sig)),
                Event::WorkerStarted => None,
                Event::WorkerStopped(index, result) => Some(self.worker_stopped(index, result)),
            };
            if let Some(stop) = stop {
                return stop;
            }
        }
    }

    /// The next event: those that came during start-up first; certificates are
    /// checked for their expiry whenever a day has passed.
    fn next_event(&mut self) -> Option<Event> {
        if let Some(e) = self.early.pop_front() {
            return Some(e);
        }
        loop {
            match self.events.recv_timeout(self.next_expiry_check.saturating_duration_since(Instant::now())) {
                Ok(e) => return Some(e),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let now = crate::tls::certs::unix_now();
                    for c in self.admin_state.certificates.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                        c.warn_if_expiring(now);
                    }
                    self.next_expiry_check = Instant::now() + EXPIRY_CHECK_EVERY;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// SIGUSR1.
    fn reopen_access_log(&self) {
        match &self.access_log {
            Some(log) => log.reopen(),
            None => tracing::info!("SIGUSR1: no access log to reopen"),
        }
    }

    /// SIGUSR2: starts the binary now at this one's path with the listening sockets.
    fn start_upgrade(&mut self) {
        if self.pending.is_some() {
            tracing::warn!("upgrade: one is already under way; SIGUSR2 ignored");
            return;
        }
        tracing::info!(binary = %self.handover.exe().display(), "upgrade: starting the new binary with the listening sockets");
        self.dim.stop();
        let tx = self.events_tx.clone();
        match self.handover.start(self.current.config.timeouts.upgrade, move |o| {
            let _ = tx.send(Event::Upgrade(o));
        }) {
            Ok(p) => {
                service::status(&format!("upgrading: new process {} starting", p.pid));
                self.pending = Some(p);
            }
            Err(e) => {
                upgrade_failed(&self.admin_state, &self.pid_file, &format!("{e:#}"));
                self.dim = Dim::start(&self.current.config.dim);
            }
        }
    }

    /// The new process of an upgrade accepts: this one stops accepting and drains.
    fn upgrade_served(&mut self, pid: u32) -> Stop {
        let took_ms = self.pending.take().map_or(0, |p| p.started.elapsed().as_millis() as u64);
        tracing::info!(new_pid = pid, took_ms, drain = ?self.current.config.timeouts.drain, "upgrade: the new process serves; this one stops accepting and drains its transfers");
        service::handed_over(pid);
        Stop::HandedOver
    }

    /// The new process of an upgrade did not start: serve on.
    fn upgrade_failed(&mut self, why: &str) {
        self.pending = None;
        upgrade_failed(&self.admin_state, &self.pid_file, why);
        // The child may have attached its own steering program to the groups.
        if self.steering != "reuseport-hash" {
            let program = steering::program(&steering::targets(&self.plan));
            for fd in &self.steering_fds {
                if let Err(e) = linerate_sys::reuseport::attach_reuseport_cbpf(std::os::fd::AsFd::as_fd(fd), &program) {
                    tracing::warn!("cannot attach the steering program again: {e}");
                }
            }
        }
        self.dim = Dim::start(&self.current.config.dim);
    }

    /// SIGTERM or SIGINT.
    fn stop_signal(&mut self, sig: i32) -> Stop {
        tracing::info!(signal = sig, drain = ?self.current.config.timeouts.drain, "shutting down: no new connections, draining transfers");
        if let Some(p) = self.pending.take() {
            tracing::warn!(new_pid = p.pid, "upgrade: stopping the new process that was starting");
            let _ = linerate_sys::inherit::signal(p.pid, linerate_sys::inherit::Signal::Term);
        }
        Stop::Signal
    }

    /// A worker ended while serving.
    fn worker_stopped(&mut self, index: usize, result: Result<(), String>) -> Stop {
        self.running -= 1;
        let why = match result {
            Ok(()) => "stopped unexpectedly".to_string(),
            Err(e) => e,
        };
        tracing::error!(worker = index, "worker {why}; shutting down");
        Stop::WorkerFailed(anyhow::anyhow!("worker {index} {why}"))
    }

    /// Drains the workers and stops; the exit status says whether a worker failed.
    pub(super) fn shut_down(mut self, stop: Stop) -> anyhow::Result<()> {
        let handed_over = matches!(stop, Stop::HandedOver);
        if !handed_over {
            service::stopping();
        }
        // This process's copies of the listening sockets go with the workers' ones.
        drop(self.handover);
        drop(self.steering_fds);
        self.admin_state.shutting_down.store(true, Ordering::Relaxed);
        if let (true, Some(stop)) = (handed_over, &self.admin_stop) {
            stop.stop();
        }
        // The new process owns the slice store now: this one only reads it while it
        // drains (two writers would interleave two indexes in one journal).
        if let (true, Some(cache)) = (handed_over, &self.admin_state.cache) {
            cache.store.freeze();
        }
        for c in &self.controls {
            let _ = c.send(Control::Shutdown);
        }
        // Workers end by themselves after the drain timeout; allow a little more.
        let deadline = Instant::now() + self.current.config.timeouts.drain + Duration::from_secs(2);
        while self.running > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Event::WorkerStopped(index, Err(e))) => {
                    self.running -= 1;
                    tracing::error!(worker = index, "worker failed while stopping: {e}");
                }
                Ok(Event::WorkerStopped(..)) => self.running -= 1,
                Ok(_) => {}
                Err(_) => {
                    tracing::error!(workers = self.running, "workers did not stop in time; exiting anyway");
                    break;
                }
            }
        }
        // The journals rewritten with their shard maps: the next start serves at once.
        if let (false, Some(cache)) = (handed_over, &self.admin_state.cache) {
            cache.store.close();
        }
        if let Some(log) = &self.access_log {
            log.finish(Duration::from_secs(5));
        }
        self.dim.stop();
        if !handed_over {
            self.pid_file.remove();
        }
        let served = self.admin_state.total(WorkerCounters::requests);
        let bytes = self.admin_state.body_bytes();
        tracing::info!(responses = served, body_bytes = bytes, "stopped");
        match stop {
            Stop::WorkerFailed(e) => Err(e),
            Stop::Signal | Stop::HandedOver | Stop::NoEvents => Ok(()),
        }
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

/// The DIM controllers, stopped (NICs restored) around an upgrade.
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
