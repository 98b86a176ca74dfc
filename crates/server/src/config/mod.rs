//! Configuration: the TOML file, command-line overrides, and validation.
//!
//! Every key is documented in docs/CONFIG.md. Loading is all-or-nothing: an unknown
//! key, a value of the wrong type or out of range fails with an error that names the
//! file, the key and the problem, and the server does not start (or, on reload, keeps
//! running with its previous configuration).
//!
//! This file holds [`Config`] with its top-level keys, loading and the checks every
//! section uses; each section has a file of its own with its types, defaults and
//! validation, called in turn by [`Config::validate`].

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use linerate_urlauth::Rules;
use serde::{Deserialize, Serialize};

mod admin;
mod client_limits;
mod dim;
mod fill;
mod limits;
mod log;
mod numa;
mod open_file_cache;
mod origin;
mod prefill;
mod s3;
mod signed;
mod tcp;
mod timeouts;
mod tls;

pub use admin::{Admin, ModelClients};
pub use client_limits::ClientLimits;
pub use dim::Dim;
pub use fill::Fill;
pub use limits::Limits;
pub use log::{AccessLog, AccessLogFormat, Log, LogFormat};
pub use numa::{Numa, Pin, Placement, Steering};
pub use open_file_cache::{OpenFileCache, MAX_OPEN_FILE_CACHE_ENTRIES};
pub use origin::{parse_base_url, BaseUrl, Cache, CacheDir, Origin};
pub use prefill::{Prefill, Rate, Window};
pub use s3::{is_s3_path_byte, Addressing, S3Credentials, S3};
pub use signed::{Secret, SecretEncoding, SignedKey, SignedMode, SignedRule, REDACTED};
pub use tcp::{Stats, Tcp};
pub use timeouts::Timeouts;
pub use tls::{CertKey, KernelTls, Tls, TlsVersion};

/// An invalid configuration: where, which key, what is wrong.
#[derive(Debug)]
pub struct ConfigError {
    /// The file, or None for the command line.
    pub file: Option<PathBuf>,
    pub key: String,
    pub problem: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.file {
            Some(file) if self.key.is_empty() => write!(f, "config file {}: {}", file.display(), self.problem),
            Some(file) => write!(f, "config file {}: key `{}`: {}", file.display(), self.key, self.problem),
            None => write!(f, "command line: {}: {}", self.key, self.problem),
        }
    }
}

impl std::error::Error for ConfigError {}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The directory whose files are served.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root: Option<PathBuf>,
    /// Addresses to listen on (plain HTTP). When neither this nor `tls_listen` is
    /// set, [`DEFAULT_LISTEN`] is used.
    pub listen: Vec<SocketAddr>,
    /// Addresses to listen on for HTTPS (needs `tls.cert` and `tls.key`).
    pub tls_listen: Vec<SocketAddr>,
    /// Worker threads; 0 means one per CPU the process may run on.
    pub workers: usize,
    /// File names tried, in order, when a directory is requested.
    pub index: Vec<String>,
    /// Follow symlinks whose target lies outside the root.
    pub follow_symlinks_outside_root: bool,
    /// Value of the Server field; empty to omit it.
    pub server_header: String,
    /// Value of Cache-Control on file responses; empty to omit it.
    pub cache_control: String,
    /// Access-Control-Allow-Origin: empty (no CORS), `*`, or one origin.
    pub cors_allow_origin: String,
    /// Add `X-Linerate-Worker: <worker> cpu=<cpu> node=<node>` to every response.
    pub debug_headers: bool,
    /// File the server writes its pid to once it serves (and a new binary after an
    /// upgrade); none by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid_file: Option<PathBuf>,
    pub limits: Limits,
    /// Limits per client address or prefix (`[client_limits]`).
    pub client_limits: ClientLimits,
    pub timeouts: Timeouts,
    pub open_file_cache: OpenFileCache,
    pub tls: Tls,
    pub tcp: Tcp,
    pub stats: Stats,
    pub admin: Admin,
    pub numa: Numa,
    /// Disk reads off the workers: residency checks and the fill pool.
    pub fill: Fill,
    /// Interrupt moderation controller for NICs (`[dim]`, see docs/DIM.md).
    pub dim: Dim,
    pub log: Log,
    /// One record per response, written off the workers (`[access_log]`).
    pub access_log: AccessLog,
    /// Extra or overriding media types by file extension.
    pub mime: BTreeMap<String, String>,
    /// Signed-URL rules by path prefix (`[[signed]]`, see docs/SIGNED-URLS.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub signed: Vec<SignedRule>,
    /// Path prefixes filled from origins (`[[origin]]`, see docs/CACHE.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub origin: Vec<Origin>,
    /// The slice store the origins fill (`[cache]`).
    pub cache: Cache,
    /// Pre-positioning titles from a manifest (`[prefill]`, see docs/PREFILL.md).
    pub prefill: Prefill,
    /// What validation built from the keys above, for the server to take
    /// ([`Config::signed_rules`]); not part of the file.
    #[serde(skip)]
    pub built: Built,
}

/// What validating a configuration builds, kept so that the server takes it rather
/// than build it again: the signed-URL rules, whose secret files are read and decoded
/// once per loaded configuration, and the S3 origins' credentials, read once per
/// loaded configuration too.
#[derive(Clone, Default)]
pub struct Built {
    /// The `[[signed]]` tables the rules were built from, and the rules.
    signed: OnceLock<(Vec<SignedRule>, Arc<Rules>)>,
    /// The `[[origin]]` tables the credentials were read for, and the
    /// credentials of each (`None` for a table that is not S3).
    s3: OnceLock<(Vec<Origin>, S3CredentialsByTable)>,
}

/// The credentials of each `[[origin]]` table, `None` for one that is not S3.
pub type S3CredentialsByTable = Vec<Option<Arc<S3Credentials>>>;

/// Always equal: what is built follows from the configuration's keys, which is what
/// configurations are compared by (a reload compares sections, the fuzz target
/// printed and parsed copies).
impl PartialEq for Built {
    fn eq(&self, _: &Built) -> bool {
        true
    }
}

/// Shows nothing: the rules hold secrets, and follow from the keys anyway.
impl fmt::Debug for Built {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Built").finish_non_exhaustive()
    }
}

/// Where plain HTTP listens when no address at all is configured.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// The largest integer any key accepts: TOML integers are signed 64-bit, and a
/// larger value (which the parser takes for an unsigned key) could not be printed
/// back (`--check-config`).
pub const MAX_INTEGER: u64 = i64::MAX as u64;

/// The longest duration any key accepts (timeouts, intervals): longer values are
/// mistakes, and far longer ones would overflow the clock they are added to.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// A key validation refuses and why: the key's path (`limits.max_ranges`) and the
/// problem.
type Bad = (String, String);

fn bad<T>(key: impl Into<String>, problem: impl Into<String>) -> Result<T, Bad> {
    Err((key.into(), problem.into()))
}

/// Checks that `v` lies between `lo` and `hi`, both included.
fn range<T: PartialOrd + fmt::Display>(key: &str, v: T, lo: T, hi: T) -> Result<(), Bad> {
    if v < lo || v > hi {
        return bad(key, format!("{v} is out of range; must be between {lo} and {hi}"));
    }
    Ok(())
}

/// Checks that a sampled share lies between 0 and 1 (NaN does not).
fn fraction(key: &str, v: f64) -> Result<(), Bad> {
    if !(0.0..=1.0).contains(&v) {
        return bad(key, format!("{v} is not a fraction between 0 and 1"));
    }
    Ok(())
}

/// Checks a duration against [`MAX_DURATION`]. Durations are added to the clock: one
/// that overflows it would panic a worker mid-connection, so every one is capped at
/// load.
fn duration(key: &str, d: Duration) -> Result<(), Bad> {
    if d > MAX_DURATION {
        return bad(
            key,
            format!(
                "{} is too long; at most {}",
                humantime::format_duration(d),
                humantime::format_duration(MAX_DURATION)
            ),
        );
    }
    Ok(())
}

/// Checks that a path names a file, not a directory (`/var/run/`) or nothing.
fn file_name(key: &str, path: &Path) -> Result<(), Bad> {
    if path.as_os_str().is_empty() || path.file_name().is_none() {
        return bad(key, "must name a file");
    }
    Ok(())
}

impl Default for Config {
    fn default() -> Self {
        Config {
            root: None,
            listen: Vec::new(),
            tls_listen: Vec::new(),
            workers: 0,
            index: vec!["index.html".into()],
            follow_symlinks_outside_root: false,
            server_header: "linerate".into(),
            cache_control: String::new(),
            cors_allow_origin: String::new(),
            debug_headers: false,
            pid_file: None,
            limits: Limits::default(),
            client_limits: ClientLimits::default(),
            timeouts: Timeouts::default(),
            open_file_cache: OpenFileCache::default(),
            tls: Tls::default(),
            tcp: Tcp::default(),
            stats: Stats::default(),
            admin: Admin::default(),
            numa: Numa::default(),
            fill: Fill::default(),
            dim: Default::default(),
            log: Log::default(),
            access_log: AccessLog::default(),
            mime: BTreeMap::new(),
            signed: Vec::new(),
            origin: Vec::new(),
            cache: Cache::default(),
            prefill: Prefill::default(),
            built: Built::default(),
        }
    }
}

/// Values given on the command line; each replaces the file's value.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub root: Option<PathBuf>,
    pub listen: Vec<SocketAddr>,
    pub tls_listen: Vec<SocketAddr>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub workers: Option<usize>,
    pub log_level: Option<String>,
    pub admin: Option<SocketAddr>,
    pub no_admin: bool,
    pub debug_headers: bool,
    pub access_log: Option<PathBuf>,
    pub max_client_connections: Option<u32>,
    pub max_client_connection_rate: Option<u32>,
}

impl Config {
    /// Reads and parses a config file.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: Some(path.to_owned()),
            key: String::new(),
            problem: format!("cannot read: {e}"),
        })?;
        Config::from_toml(&text).map_err(|(key, problem)| ConfigError { file: Some(path.to_owned()), key, problem })
    }

    /// Parses TOML text; the error gives the key path and the problem.
    pub fn from_toml(text: &str) -> Result<Config, (String, String)> {
        let de = toml::Deserializer::parse(text).map_err(|e| (String::new(), one_line(&e.to_string())))?;
        serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            let key = if key == "." { String::new() } else { key };
            (key, one_line(&e.into_inner().to_string()))
        })
    }

    /// Loads the file (if any), applies command-line overrides and validates the result.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
        let mut config = match file {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        if let Some(root) = &overrides.root {
            config.root = Some(root.clone());
        }
        if !overrides.listen.is_empty() {
            config.listen = overrides.listen.clone();
        }
        if !overrides.tls_listen.is_empty() {
            config.tls_listen = overrides.tls_listen.clone();
        }
        if let Some(cert) = &overrides.cert {
            config.tls.cert = Some(cert.clone());
        }
        if let Some(key) = &overrides.key {
            config.tls.key = Some(key.clone());
        }
        if let Some(workers) = overrides.workers {
            config.workers = workers;
        }
        if let Some(level) = &overrides.log_level {
            config.log.level = level.clone();
        }
        if let Some(admin) = overrides.admin {
            config.admin.listen = admin;
            config.admin.enabled = true;
        }
        if overrides.no_admin {
            config.admin.enabled = false;
        }
        if overrides.debug_headers {
            config.debug_headers = true;
        }
        if let Some(path) = &overrides.access_log {
            config.access_log.path = Some(path.clone());
        }
        if let Some(n) = overrides.max_client_connections {
            config.client_limits.max_connections = n;
        }
        if let Some(n) = overrides.max_client_connection_rate {
            config.client_limits.max_new_connections_per_second = n;
        }
        if config.listen.is_empty() && config.tls_listen.is_empty() {
            config.listen = vec![DEFAULT_LISTEN.parse().expect("valid default address")];
        }
        config.validate().map_err(|(key, problem)| ConfigError { file: file.map(Path::to_owned), key, problem })?;
        Ok(config)
    }

    /// Checks every value; returns the first bad key and why. The top-level keys are
    /// checked here, each section by its own `validate`, and `[[signed]]` by building
    /// its rules, which are kept for [`Config::signed_rules`].
    pub fn validate(&self) -> Result<(), (String, String)> {
        match &self.root {
            None => {
                return bad("root", "no content root: set `root` in the config file or pass --root DIR (or --demo)")
            }
            Some(root) if !root.is_dir() => {
                // Quoted: the path may hold a newline or control characters.
                return bad("root", format!("{root:?} is not a readable directory"));
            }
            Some(_) => {}
        }
        if self.listen.is_empty() && self.tls_listen.is_empty() {
            return bad("listen", "at least one address is needed (in `listen` or `tls_listen`)");
        }
        let serving: Vec<&SocketAddr> = self.listen.iter().chain(&self.tls_listen).collect();
        for (i, a) in serving.iter().enumerate() {
            // Port 0 asks for any free port: two of them never collide.
            if a.port() != 0 && serving[..i].contains(a) {
                let key = if i < self.listen.len() { "listen" } else { "tls_listen" };
                return bad(key, format!("{a} is listed twice"));
            }
        }
        self.tls.validate(!self.tls_listen.is_empty())?;
        range("workers", self.workers, 0, 1024)?;
        if self.index.iter().any(|n| n.is_empty() || n.contains('/') || n == "." || n == "..") {
            return bad("index", "entries must be plain file names");
        }
        for (key, value) in [
            ("server_header", &self.server_header),
            ("cache_control", &self.cache_control),
            ("cors_allow_origin", &self.cors_allow_origin),
        ] {
            if !linerate_http::response::is_valid_field_value(value) {
                return bad(key, "contains control characters (CR, LF...)");
            }
        }
        for (ext, ty) in &self.mime {
            let key = format!("mime.{ext}");
            if ext.is_empty() || ext.contains(['.', '/']) {
                return bad(key, "extensions are written without a dot, e.g. `mp4`");
            }
            if ty.is_empty() || !ty.contains('/') || !linerate_http::response::is_valid_field_value(ty) {
                return bad(key, format!("{ty:?} is not a media type like `video/mp4`"));
            }
        }
        self.limits.validate()?;
        self.client_limits.validate()?;
        self.open_file_cache.validate()?;
        self.tcp.validate()?;
        self.admin.validate(&serving)?;
        self.timeouts.validate()?;
        self.stats.validate()?;
        self.numa.validate()?;
        self.fill.validate()?;
        self.access_log.validate()?;
        self.dim.validate()?;
        if let Some(pid_file) = &self.pid_file {
            file_name("pid_file", pid_file)?;
        }
        self.log.validate()?;
        origin::validate_origins(&self.origin)?;
        self.cache.validate(&self.origin)?;
        self.prefill.validate()?;
        self.signed_rules()?;
        self.s3_credentials()?;
        Ok(())
    }

    /// The credentials of each `[[origin]]` table with an `[origin.s3]`, as
    /// validation read them (from `credentials_file`, or the environment): read
    /// once per loaded configuration, so at start and at every reload. Read now
    /// when validation has not run, or when `origin` has changed since.
    pub fn s3_credentials(&self) -> Result<S3CredentialsByTable, (String, String)> {
        if let Some((tables, credentials)) = self.built.s3.get() {
            if *tables == self.origin {
                return Ok(credentials.clone());
            }
        }
        let env = |name: &str| std::env::var(name).ok();
        let credentials = self
            .origin
            .iter()
            .enumerate()
            .map(|(i, o)| o.s3.as_ref().map(|s3| s3.credentials(i, &env).map(Arc::new)).transpose())
            .collect::<Result<S3CredentialsByTable, Bad>>()?;
        let _ = self.built.s3.set((self.origin.clone(), credentials.clone()));
        Ok(credentials)
    }

    /// The signed-URL rules of `signed`, as validation built them: loading reads the
    /// secret files once, and a reload loads a new configuration, so it reads them
    /// again (that is how keys rotate). Built now when validation has not run, or
    /// when `signed` has changed since.
    pub fn signed_rules(&self) -> Result<Arc<Rules>, (String, String)> {
        if let Some((tables, rules)) = self.built.signed.get() {
            if *tables == self.signed {
                return Ok(rules.clone());
            }
        }
        let rules = Arc::new(signed::rules(&self.signed)?);
        // Already set only when `signed` changed after a validation: those rules
        // stay, for the tables they were built from.
        let _ = self.built.signed.set((self.signed.clone(), rules.clone()));
        Ok(rules)
    }

    /// The effective configuration as TOML (for `--check-config`).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot print configuration: {e}\n"))
    }
}

/// The TOML of a valid configuration (the temporary directory as its root, one
/// address) with `lines` under `[section]`: for tests of a section's keys.
#[cfg(test)]
fn toml_with_section(section: &str, lines: &str) -> String {
    format!("root = {:?}\nlisten = [\"127.0.0.1:0\"]\n[{section}]\n{lines}", std::env::temp_dir())
}

/// toml's messages carry a multi-line source excerpt; keep the first line, which
/// states the problem (the key is reported separately).
fn one_line(msg: &str) -> String {
    let lines: Vec<&str> = msg.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    // "TOML parse error at line 3, column 1" followed by the excerpt and the message.
    match lines.as_slice() {
        [first, .., last] if first.starts_with("TOML parse error") => {
            format!("{last} ({})", first.trim_start_matches("TOML parse error "))
        }
        _ => lines.join(" "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err_of(toml: &str) -> (String, String) {
        Config::from_toml(toml).unwrap_err()
    }

    #[test]
    fn prefill_rates_are_read_as_text_or_bits() {
        let c = Config::from_toml("[prefill]\nrate = \"200Mb/s\"\nwindow = \"22:00-06:00\"").unwrap();
        assert_eq!(c.prefill.rate, Rate(200_000_000));
        assert_eq!(c.prefill.window(), Some(Window { start: 22 * 60, end: 6 * 60 }));
        assert_eq!(Config::from_toml("[prefill]\nrate = 5000000").unwrap().prefill.rate, Rate(5_000_000));
        let (key, problem) = err_of("[prefill]\nrate = \"200MB/s\"");
        assert_eq!(key, "prefill.rate");
        assert!(problem.contains("bits"), "{problem}");
        let (key, _) = err_of("[prefill]\nspeed = 1");
        assert!(key.starts_with("prefill"), "{key}");
    }

    #[test]
    fn defaults_round_trip_through_toml() {
        let c = Config { root: Some("/srv".into()), ..Config::default() };
        let text = c.to_toml();
        assert_eq!(Config::from_toml(&text).unwrap(), c, "{text}");
    }

    #[test]
    fn full_file_parses() {
        let c = Config::from_toml(
            r#"
            root = "/srv/media"
            listen = ["0.0.0.0:80", "[::]:80"]
            workers = 4
            cache_control = "public, max-age=86400"
            cors_allow_origin = "*"
            [limits]
            max_ranges = 4
            [timeouts]
            send = "2m"
            [mime]
            mp4 = "video/mp4"
            "#,
        )
        .unwrap();
        assert_eq!(c.listen.len(), 2);
        assert_eq!(c.timeouts.send, Duration::from_secs(120));
        assert_eq!(c.limits.max_ranges, 4);
        assert_eq!(c.limits.max_head_bytes, 16 * 1024);
    }

    #[test]
    fn unknown_keys_are_named() {
        let (key, problem) = err_of("rot = \"/srv\"");
        assert!(problem.contains("unknown field `rot`"), "{key} {problem}");
        let (key, problem) = err_of("[limits]\nmax_head = 5");
        assert!(key.starts_with("limits"), "{key}");
        assert!(problem.contains("max_head"), "{problem}");
    }

    #[test]
    fn bad_values_are_named() {
        let (key, problem) = err_of("[limits]\nmax_head_bytes = \"big\"");
        assert_eq!(key, "limits.max_head_bytes");
        assert!(problem.contains("invalid type"), "{problem}");
        let (key, _) = err_of("[timeouts]\nsend = \"soon\"");
        assert_eq!(key, "timeouts.send");
        let (key, _) = err_of("listen = [\"localhost\"]");
        assert!(key.starts_with("listen"), "{key}");
        let (_, problem) = err_of("root = ");
        assert!(problem.contains("line 1"), "{problem}");
    }

    #[test]
    fn validation_names_key_and_problem() {
        let dir = std::env::temp_dir();
        let base =
            Config { root: Some(dir.clone()), listen: vec![DEFAULT_LISTEN.parse().unwrap()], ..Config::default() };
        assert!(base.validate().is_ok());
        let cases: Vec<(Config, &str)> = vec![
            (Config { root: None, ..base.clone() }, "root"),
            (Config { root: Some("/nonexistent/x".into()), ..base.clone() }, "root"),
            (Config { listen: vec![], ..base.clone() }, "listen"),
            (Config { cache_control: "a\r\nb".into(), ..base.clone() }, "cache_control"),
            (Config { index: vec!["a/b".into()], ..base.clone() }, "index"),
            (
                Config { limits: Limits { max_head_bytes: 10, ..Limits::default() }, ..base.clone() },
                "limits.max_head_bytes",
            ),
            (Config { limits: Limits { max_ranges: 65, ..Limits::default() }, ..base.clone() }, "limits.max_ranges"),
            (Config { fill: Fill { cache_bytes: 4096, ..Fill::default() }, ..base.clone() }, "fill.cache_bytes"),
            (
                Config { fill: Fill { admission_half_life: Duration::ZERO, ..Fill::default() }, ..base.clone() },
                "fill.admission_half_life",
            ),
            (
                Config { timeouts: Timeouts { send: Duration::ZERO, ..Timeouts::default() }, ..base.clone() },
                "timeouts.send",
            ),
            (
                Config { client_limits: ClientLimits { ipv4_prefix: 33, ..ClientLimits::default() }, ..base.clone() },
                "client_limits.ipv4_prefix",
            ),
            (
                Config { client_limits: ClientLimits { ipv6_prefix: 0, ..ClientLimits::default() }, ..base.clone() },
                "client_limits.ipv6_prefix",
            ),
            (
                Config {
                    client_limits: ClientLimits { new_connections_burst: 0, ..ClientLimits::default() },
                    ..base.clone()
                },
                "client_limits.new_connections_burst",
            ),
            (
                Config {
                    client_limits: ClientLimits { min_send_rate_after: Duration::ZERO, ..ClientLimits::default() },
                    ..base.clone()
                },
                "client_limits.min_send_rate_after",
            ),
            (Config { log: Log { level: "[[[".into(), ..Log::default() }, ..base.clone() }, "log.level"),
            (Config { mime: [(".mp4".to_string(), "video/mp4".to_string())].into(), ..base.clone() }, "mime..mp4"),
            (
                Config { prefill: Prefill { window: "2-14".into(), ..Prefill::default() }, ..base.clone() },
                "prefill.window",
            ),
            (Config { prefill: Prefill { rate: Rate(10), ..Prefill::default() }, ..base.clone() }, "prefill.rate"),
            (Config { prefill: Prefill { busy_fills: 0, ..Prefill::default() }, ..base.clone() }, "prefill.busy_fills"),
            (
                Config { prefill: Prefill { state_dir: Some("rel".into()), ..Prefill::default() }, ..base.clone() },
                "prefill.state_dir",
            ),
        ];
        for (c, key) in cases {
            let (k, problem) = c.validate().unwrap_err();
            assert_eq!(k, key, "{problem}");
            assert!(!problem.is_empty());
        }
    }

    #[test]
    fn huge_durations_are_refused_at_load() {
        for key in [
            "timeouts.header",
            "timeouts.keepalive",
            "timeouts.send",
            "timeouts.drain",
            "timeouts.upgrade",
            "client_limits.min_send_rate_after",
            "stats.tcp_info_interval",
            "dim.interval",
        ] {
            let (section, name) = key.split_once('.').unwrap();
            for value in ["1000000000y", "2days"] {
                let text = toml_with_section(section, &format!("{name} = \"{value}\"\n"));
                let c = Config::from_toml(&text).unwrap_or_else(|e| panic!("{key} = {value}: {e:?}"));
                let (k, problem) = c.validate().unwrap_err();
                assert_eq!(k, key, "{problem}");
                assert!(problem.contains("at most 1day"), "{problem}");
            }
            let text = toml_with_section(section, &format!("{name} = \"1day\"\n"));
            assert!(Config::from_toml(&text).unwrap().validate().is_ok(), "{key} = 1day");
        }
    }

    #[test]
    fn default_listen_only_without_any_address() {
        let dir = std::env::temp_dir();
        let o = Overrides { root: Some(dir.clone()), ..Overrides::default() };
        assert_eq!(Config::load(None, &o).unwrap().listen, vec![DEFAULT_LISTEN.parse().unwrap()]);
        let o = Overrides {
            root: Some(dir),
            tls_listen: vec!["127.0.0.1:8443".parse().unwrap()],
            cert: Some("c.pem".into()),
            key: Some("k.pem".into()),
            ..Overrides::default()
        };
        assert!(Config::load(None, &o).unwrap().listen.is_empty(), "HTTPS only");
    }

    #[test]
    fn overrides_replace_file_values() {
        let dir = std::env::temp_dir().join(format!("linerate-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(&file, format!("root = {:?}\nworkers = 3\nlisten = [\"127.0.0.1:1\"]\n", dir)).unwrap();
        let o = Overrides { workers: Some(1), listen: vec!["127.0.0.1:2".parse().unwrap()], ..Overrides::default() };
        let c = Config::load(Some(&file), &o).unwrap();
        assert_eq!(c.workers, 1);
        assert_eq!(c.listen, vec!["127.0.0.1:2".parse().unwrap()]);
        std::fs::write(&file, "workers = -1\n").unwrap();
        let e = Config::load(Some(&file), &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains(&file.display().to_string()) && e.contains("`workers`"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The parser takes integers past i64::MAX for unsigned keys, but TOML cannot
    /// print them: `--check-config` printed a comment instead of the configuration.
    #[test]
    fn integers_past_toml_range_are_refused() {
        for key in [
            "limits.max_request_body_bytes",
            "limits.max_requests_per_connection",
            "tcp.max_pacing_rate_mbps",
            "admin.capacity_connections",
        ] {
            let (section, name) = key.split_once('.').unwrap();
            let text = toml_with_section(section, &format!("{name} = {MAX_INTEGER}\n"));
            let c = Config::from_toml(&text).unwrap();
            assert!(c.validate().is_ok(), "{key}");
            assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c, "{key}");
            let text = text.replace(&MAX_INTEGER.to_string(), &(MAX_INTEGER + 1).to_string());
            let c = Config::from_toml(&text).unwrap_or_else(|e| panic!("{key}: {e:?}"));
            assert_eq!(c.validate().unwrap_err().0, key);
        }
    }

    /// The error for a missing root printed the path as it was, so a path with a
    /// newline split the message (a log line) in two.
    #[test]
    fn a_bad_root_is_reported_on_one_line() {
        let c = Config { root: Some("/no\nsuch\r\u{1b}[2J".into()), ..Config::default() };
        let (key, problem) = c.validate().unwrap_err();
        assert_eq!(key, "root");
        assert!(!problem.contains(|c: char| c.is_control()), "{problem:?}");
        assert!(problem.contains("no\\nsuch"), "{problem}");
    }
}
