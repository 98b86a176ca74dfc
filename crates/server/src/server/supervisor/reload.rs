//! SIGHUP: the configuration file and the certificates read again, and the new
//! settings handed to every worker for the connections it accepts from then on.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::{certificates_of, service, Running};
use crate::config::Config;
use crate::server::settings::Settings;
use crate::server::worker::Control;
use crate::server::ServeOptions;
use crate::tls::TlsRuntime;

impl Running {
    /// Reloads; a bad file is reported (log, service manager, counter) and the
    /// running configuration kept.
    pub(super) fn reload(&mut self) {
        service::reloading();
        match load(&self.current, &self.opts, self.workers, self.nofile, self.tls_runtime.as_ref()) {
            Ok(new) => {
                let (applied, acks) = mpsc::channel();
                for c in &self.controls {
                    let _ = c.send(Control::Reload(new.clone(), applied.clone()));
                }
                drop(applied);
                // Wait for every worker to take it, so that from this log line on
                // every request sees the new signed-URL keys (a key rotation's
                // next step may start once it is printed).
                let deadline = Instant::now() + Duration::from_secs(2);
                for _ in &self.controls {
                    if acks.recv_timeout(deadline.saturating_duration_since(Instant::now())).is_err() {
                        break;
                    }
                }
                if let (Some(cache), Ok(credentials)) = (&self.admin_state.cache, new.config.s3_credentials()) {
                    // Read by `load` (from the running tables' files, or the
                    // environment): a rotated key is used from now on.
                    cache.origins.set_credentials(&credentials);
                }
                *self.admin_state.certificates.lock().unwrap_or_else(|e| e.into_inner()) = certificates_of(&new);
                self.current = new;
                self.admin_state.reloads.fetch_add(1, Ordering::Relaxed);
                tracing::info!("configuration reloaded; new connections use it");
                service::reloaded("configuration reloaded");
            }
            Err(e) => {
                self.admin_state.reload_failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!("reload failed, keeping the running configuration: {e:#}");
                service::reloaded(&format!("reload failed, running configuration kept: {e:#}"));
            }
        }
    }
}

/// Loads the configuration again for SIGHUP. Keys that need a restart keep their
/// running values, with a warning.
fn load(
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
    if config.origin != running.origin || config.cache != running.cache {
        // The origin clients, their runtime and the slice store are built at start.
        tracing::warn!("`[[origin]]` and `[cache]` changes take effect at restart");
        config.origin = running.origin.clone();
        config.cache = running.cache.clone();
    }
    // The S3 origins' credentials are read again at every reload, from the files
    // (or the environment) of the tables that run.
    config.s3_credentials().map_err(|(key, problem)| anyhow::anyhow!("key `{key}`: {problem}"))?;
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
