//! Start-up: from a validated configuration to a serving process. Everything the
//! supervisor holds while it runs is built here, in this order: the listening
//! sockets (bound, or taken over from the previous process at an upgrade), the
//! steering program, the fill pool and the access log, the admin socket, the
//! workers (started, and waited for until each accepts), the admin endpoint, and
//! the DIM controllers (`[dim]`). Then the addresses are printed and the
//! service manager is told the process is ready.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use anyhow::Context;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};

use super::upgrade::{self, Handover, Role};
use super::{service, Dim, Event, Running, EXPIRY_CHECK_EVERY};
use crate::admin::{self, AdminState};
use crate::config::Config;
use crate::counters::WorkerCounters;
use crate::server::access_log::AccessLog;
use crate::server::cache::Cache;
use crate::server::listen::{self, steering};
use crate::server::pagecache::FillPool;
use crate::server::settings::Settings;
use crate::server::worker::client_limits::ClientTable;
use crate::server::worker::{self, Launch};
use crate::server::ServeOptions;
use crate::sysfs::Host;
use crate::tls::TlsRuntime;
use crate::topology::{Plan, Topology};

/// Builds the running process: binds, starts the workers and the admin endpoint,
/// and returns once every worker accepts.
pub(crate) fn start(config: Config, opts: ServeOptions) -> anyhow::Result<Running> {
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
    let groups = listen::bind_all(&settings.config.listen, workers, backlog, inherited.as_mut())?;
    let tls_groups = listen::bind_all(&settings.config.tls_listen, workers, backlog, inherited.as_mut())?;
    let mut handover = Handover::new(exe);
    for g in groups.iter().chain(&tls_groups) {
        handover.add(Role::Serve, g.configured, &g.sockets).context("cannot keep the listening sockets")?;
    }
    let bound: Vec<_> = groups.iter().map(|g| g.bound).collect();
    let tls_bound: Vec<_> = tls_groups.iter().map(|g| g.bound).collect();
    let listeners = listen::distribute(groups, workers);
    let tls_listeners = listen::distribute(tls_groups, workers);
    listen::apply_tcp_options(listeners.iter().chain(&tls_listeners).flatten(), &settings.config.tcp);
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
        true => Some(FillPool::start(&settings.config.fill, settings.config.numa.placement, &topology, &plan)?),
        false => None,
    };
    let cache = start_cache(&settings.config, fill.as_ref(), plan.domains.len())?;
    // The prefill job (a saved one resumes), beside the cache it fills.
    let prefill = match &cache {
        Some(c) => Some(crate::server::prefill::Prefiller::start(
            c.clone(),
            &settings.config.prefill,
            settings.config.cache.dirs[0].path.clone(),
        )?),
        None => None,
    };
    let access_log = match settings.config.access_log.file() {
        Some(path) => Some(
            AccessLog::start(path)
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

    let clients = Arc::new(ClientTable::default());
    let mut controls = Vec::with_capacity(workers);
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
            cache: cache.clone(),
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
        // The thread is not joined: a worker reports its end as an event.
        std::thread::Builder::new().name(format!("linerate-w{index}")).spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker::run(launch)));
            let result = match result {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(format!("{e:#}")),
                Err(_) => Err("panicked".to_string()),
            };
            let _ = done.send(Event::WorkerStopped(index, result));
        })?;
        controls.push(control_tx);
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
        workers: counters,
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
        fill,
        cache,
        prefill,
        access_log: access_log.clone(),
        certificates: std::sync::Mutex::new(super::certificates_of(&settings)),
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
    let mut early = VecDeque::new();
    let mut started = 0;
    while started < workers {
        match events.recv() {
            Ok(Event::WorkerStarted) => started += 1,
            Ok(Event::WorkerStopped(index, result)) => {
                let why = result.err().unwrap_or_else(|| "stopped".into());
                anyhow::bail!("worker {index} could not start: {why}");
            }
            Ok(e) => early.push_back(e),
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
    let dim = Dim::start(&settings.config.dim);

    let pid_file = service::PidFile::new(settings.config.pid_file.clone());
    pid_file.write();
    service::ready(&format!("serving with {workers} workers"));
    if let Some(channel) = ready_channel {
        upgrade::report_ready(channel);
        tracing::info!("upgrade: this process serves now; the previous one drains");
    }

    Ok(Running {
        opts,
        current: settings,
        workers,
        running: workers,
        nofile,
        tls_runtime,
        plan,
        steering,
        steering_fds,
        handover,
        access_log,
        events,
        events_tx,
        early,
        controls,
        admin_state,
        admin_stop,
        dim,
        pid_file,
        pending: None,
        next_expiry_check: Instant::now() + EXPIRY_CHECK_EVERY,
    })
}

/// The pull-through cache of the `[[origin]]` tables, if any: the slice store
/// opened (its index replayed) and the origin runtime started, with one thread per
/// NUMA domain and at least two. The store's eviction ranks slices by the
/// page-cache admission's demand estimate, when there is one.
fn start_cache(config: &Config, fill: Option<&Arc<FillPool>>, domains: usize) -> anyhow::Result<Option<Arc<Cache>>> {
    if config.origin.is_empty() {
        return Ok(None);
    }
    let admission = fill.filter(|f| f.admission.is_some()).cloned();
    let popularity: crate::store::Popularity = Box::new(move || match &admission {
        Some(pool) => pool.admission.as_ref().map(|a| a.densities(Instant::now())).unwrap_or_default(),
        None => Default::default(),
    });
    let opened = Instant::now();
    let store = crate::store::Store::open(&config.cache, popularity).context("cache")?;
    tracing::info!(
        took_ms = opened.elapsed().as_millis() as u64,
        slice_bytes = config.cache.slice_bytes,
        dirs = config.cache.dirs.len(),
        "cache store open"
    );
    let credentials = config.s3_credentials().map_err(|(key, problem)| anyhow::anyhow!("key `{key}`: {problem}"))?;
    let node = crate::origin::Node { name: config.cache.node_name(&config.listen), listen: config.listen.clone() };
    tracing::info!(node = %node.name, "cache node name (Via)");
    let origins = crate::origin::Origins::start_as(&config.origin, &credentials, domains.max(2), node)?;
    Ok(Some(Cache::new(origins, store)))
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
