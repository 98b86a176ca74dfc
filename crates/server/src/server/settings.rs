//! A validated configuration turned into what the workers use on the hot path.
//!
//! The supervisor builds one [`Settings`] at start-up and one per reload, then hands
//! the same `Arc` to every worker: it is immutable, so sharing it is free of
//! contention. A connection keeps the `Settings` it was accepted under until it
//! closes, which is what lets a reload take effect without disturbing transfers.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context;
use linerate_http::request::Limits;

use crate::config::Config;
use crate::tls::{TlsRuntime, TlsSettings};

pub(crate) struct Settings {
    pub config: Config,
    /// The content root, opened once; files are opened relative to it.
    pub root: File,
    pub root_path: PathBuf,
    /// Open files with `RESOLVE_BENEATH` (false when symlinks may leave the root, or
    /// the kernel has no `openat2`, in which case paths are checked after opening).
    pub confine_with_openat2: bool,
    pub request_limits: Limits,
    /// Lower-cased extension -> media type, from the configuration.
    pub mime_overrides: HashMap<Vec<u8>, String>,
    /// Header fields every response carries (Server), pre-rendered.
    pub common_fields: Vec<u8>,
    /// CORS fields for responses when an origin is configured, pre-rendered.
    pub cors_fields: Vec<u8>,
    pub max_connections_per_worker: usize,
    /// Present when HTTPS is configured.
    pub tls: Option<TlsSettings>,
    /// Signed-URL rules. Workers apply the newest to every request, on connections
    /// accepted before a reload too (see `conn::Context::signed`).
    pub signed: Arc<linerate_urlauth::Rules>,
    /// Differs for every `Settings` of the process: what a worker's open-file cache
    /// keys its entries by besides the path, since the root and the confinement rules
    /// can change at a reload while older connections still serve under the old ones.
    pub generation: u64,
}

static OPENAT2_MISSING_LOGGED: AtomicBool = AtomicBool::new(false);
static GENERATIONS: AtomicU64 = AtomicU64::new(0);

impl Settings {
    /// Resolves a validated configuration. `workers` is the final worker count and
    /// `nofile` the open-file limit in force, used to size connection limits; `tls`
    /// is needed when the configuration has HTTPS listeners.
    pub(crate) fn new(
        config: Config,
        workers: usize,
        nofile: u64,
        tls: Option<&TlsRuntime>,
    ) -> anyhow::Result<Settings> {
        let root_path = config.root.clone().context("no content root")?;
        let root =
            File::open(&root_path).with_context(|| format!("cannot open content root {}", root_path.display()))?;
        let root_path = root_path.canonicalize().with_context(|| format!("cannot resolve {}", root_path.display()))?;
        let confine_with_openat2 = !config.follow_symlinks_outside_root && openat2_available(&root);
        let request_limits = Limits {
            max_head_bytes: config.limits.max_head_bytes,
            max_uri_bytes: config.limits.max_uri_bytes,
            max_headers: config.limits.max_headers,
        };
        let mime_overrides =
            config.mime.iter().map(|(ext, ty)| (ext.to_ascii_lowercase().into_bytes(), ty.clone())).collect();
        let mut common_fields = Vec::new();
        if !config.server_header.is_empty() {
            push_field(&mut common_fields, "Server", &config.server_header);
        }
        let mut cors_fields = Vec::new();
        if !config.cors_allow_origin.is_empty() {
            push_field(&mut cors_fields, "Access-Control-Allow-Origin", &config.cors_allow_origin);
            push_field(
                &mut cors_fields,
                "Access-Control-Expose-Headers",
                "Content-Length, Content-Range, Accept-Ranges, ETag, Last-Modified",
            );
            if config.cors_allow_origin != "*" {
                push_field(&mut cors_fields, "Vary", "Origin");
            }
        }
        let max_connections_per_worker = match config.limits.max_connections_per_worker {
            0 => auto_connections_per_worker(nofile, workers, config.open_file_cache.entries),
            n => n,
        };
        let tls = match (config.tls_listen.is_empty(), tls) {
            (true, _) => None,
            (false, Some(runtime)) => Some(TlsSettings::new(&config.tls, runtime)?),
            (false, None) => anyhow::bail!("HTTPS listeners without TLS start-up state"),
        };
        let signed = config.signed_rules().map_err(|(key, problem)| anyhow::anyhow!("key `{key}`: {problem}"))?;
        Ok(Settings {
            config,
            root,
            root_path,
            confine_with_openat2,
            request_limits,
            mime_overrides,
            common_fields,
            cors_fields,
            max_connections_per_worker,
            tls,
            signed,
            generation: GENERATIONS.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// The media type for a path, configuration first, then the built-in table.
    pub(crate) fn content_type(&self, path: &[u8]) -> &str {
        let Some(ext) = linerate_http::mime::extension(path) else {
            return linerate_http::mime::DEFAULT_TYPE;
        };
        if !self.mime_overrides.is_empty() {
            if let Some(t) = self.mime_overrides.get(&ext.to_ascii_lowercase()) {
                return t;
            }
        }
        linerate_http::mime::builtin_type(ext).unwrap_or(linerate_http::mime::DEFAULT_TYPE)
    }
}

/// Each connection holds a socket and, while a response is in flight, possibly a
/// file that the open-file cache does not hold; keep a reserve for the cache,
/// listeners and the process itself.
fn auto_connections_per_worker(nofile: u64, workers: usize, cache_entries: usize) -> usize {
    let reserve = 64 + (cache_entries * workers) as u64;
    let per_worker = nofile.saturating_sub(reserve) / workers.max(1) as u64;
    per_worker.clamp(16, 1 << 20) as usize
}

fn push_field(buf: &mut Vec<u8>, name: &str, value: &str) {
    buf.extend_from_slice(name.as_bytes());
    buf.extend_from_slice(b": ");
    buf.extend_from_slice(value.as_bytes());
    buf.extend_from_slice(b"\r\n");
}

/// Probes `openat2` once; logs the fallback the first time it is missing.
fn openat2_available(root: &File) -> bool {
    match linerate_sys::open_beneath(root.as_fd(), std::path::Path::new(".")) {
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
            if !OPENAT2_MISSING_LOGGED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "kernel has no openat2 (Linux < 5.6): confining paths to the root by checking each opened file's real path instead"
                );
            }
            false
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_limit_is_derived_from_the_file_limit() {
        // 20000 files, 2 workers, 1024 cached files each: (20000 - 64 - 2048) / 2.
        assert_eq!(auto_connections_per_worker(20_000, 2, 1024), 8944);
        assert_eq!(auto_connections_per_worker(100, 2, 1024), 16);
    }

    #[test]
    fn media_types_prefer_configuration() {
        let dir = std::env::temp_dir();
        let mut config = Config { root: Some(dir), ..Config::default() };
        config.mime.insert("MP4".into(), "video/x-custom".into());
        let s = Settings::new(config, 1, 1024, None).unwrap();
        assert_eq!(s.content_type(b"a/b.mp4"), "video/x-custom");
        assert_eq!(s.content_type(b"a/b.m3u8"), "application/vnd.apple.mpegurl");
        assert_eq!(s.content_type(b"noext"), "application/octet-stream");
    }
}
