//! Configuration: the TOML file, command-line overrides, and validation.
//!
//! Every key is documented in docs/CONFIG.md. Loading is all-or-nothing: an unknown
//! key, a value of the wrong type or out of range fails with an error that names the
//! file, the key and the problem, and the server does not start (or, on reload, keeps
//! running with its previous configuration).

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub mod signed;

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
}

/// Where plain HTTP listens when no address at all is configured.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// The largest integer any key accepts: TOML integers are signed 64-bit, and a
/// larger value (which the parser takes for an unsigned key) could not be printed
/// back (`--check-config`).
pub const MAX_INTEGER: u64 = i64::MAX as u64;

/// Most open files a worker's cache may keep: it allocates room for all of them.
pub const MAX_OPEN_FILE_CACHE_ENTRIES: usize = 1 << 20;

/// The longest duration any key accepts (timeouts, intervals): longer values are
/// mistakes, and far longer ones would overflow the clock they are added to.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

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
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    pub max_head_bytes: usize,
    pub max_uri_bytes: usize,
    pub max_headers: usize,
    /// Request bodies up to this size are read and discarded; larger ones get 413.
    pub max_request_body_bytes: u64,
    /// Range-specs per request; more are ignored (whole file). 0 disables ranges.
    pub max_ranges: usize,
    /// 0 = derived from the open-file limit.
    pub max_connections_per_worker: usize,
    /// 0 = unlimited.
    pub max_requests_per_connection: u64,
    pub listen_backlog: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_head_bytes: 16 * 1024,
            max_uri_bytes: 8 * 1024,
            max_headers: 100,
            max_request_body_bytes: 64 * 1024,
            max_ranges: 16,
            max_connections_per_worker: 0,
            max_requests_per_connection: 10_000,
            listen_backlog: 4096,
        }
    }
}

/// Limits per client: connections at once and new connections per second per
/// address or prefix, and the lowest average rate a response may be sent at.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClientLimits {
    /// Connections open at once per client prefix; 0 = no limit.
    pub max_connections: u32,
    /// Leading bits of an IPv4 address that name a client (32: each address).
    pub ipv4_prefix: u8,
    /// Leading bits of an IPv6 address that name a client (64: each /64).
    pub ipv6_prefix: u8,
    /// New connections per second per client prefix (token bucket); 0 = no limit.
    pub max_new_connections_per_second: u32,
    /// New connections a client may open at once before the rate applies.
    pub new_connections_burst: u32,
    /// Lowest average rate (bytes per second) a response may be sent at once
    /// `min_send_rate_after` has passed; 0 = no minimum.
    pub min_send_rate: u64,
    /// How long a response may take before its average rate is checked.
    #[serde(with = "humantime_serde")]
    pub min_send_rate_after: Duration,
}

impl Default for ClientLimits {
    fn default() -> Self {
        ClientLimits {
            max_connections: 256,
            ipv4_prefix: 32,
            ipv6_prefix: 64,
            max_new_connections_per_second: 100,
            new_connections_burst: 200,
            min_send_rate: 4096,
            min_send_rate_after: Duration::from_secs(20),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// From a request's first byte (or the connection's accept) to its complete head.
    #[serde(with = "humantime_serde")]
    pub header: Duration,
    /// Idle time allowed between requests on a keep-alive connection.
    #[serde(with = "humantime_serde")]
    pub keepalive: Duration,
    /// Longest wait for the client to accept more response bytes.
    #[serde(with = "humantime_serde")]
    pub send: Duration,
    /// On SIGTERM/SIGINT, how long in-flight responses may take to finish.
    #[serde(with = "humantime_serde")]
    pub drain: Duration,
    /// At a binary upgrade, how long the new process may take to start serving
    /// before it is stopped and the running one carries on.
    #[serde(with = "humantime_serde")]
    pub upgrade: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header: Duration::from_secs(10),
            keepalive: Duration::from_secs(60),
            send: Duration::from_secs(60),
            drain: Duration::from_secs(30),
            upgrade: Duration::from_secs(60),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OpenFileCache {
    /// Open files kept per worker (0 disables the cache).
    pub entries: usize,
    /// How long a cached file is trusted without checking its path again.
    #[serde(with = "humantime_serde")]
    pub valid: Duration,
}

impl Default for OpenFileCache {
    fn default() -> Self {
        OpenFileCache { entries: 1024, valid: Duration::ZERO }
    }
}

/// Whether to hand TLS sessions to the kernel.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum KernelTls {
    /// Use kernel TLS when the kernel offers it, user-space TLS otherwise.
    #[default]
    Auto,
    /// Always user-space TLS.
    Off,
}

/// The oldest TLS version accepted.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub enum TlsVersion {
    #[default]
    #[serde(rename = "1.2")]
    Tls12,
    #[serde(rename = "1.3")]
    Tls13,
}

/// A certificate chain and its private key, both PEM files.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CertKey {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Tls {
    /// The default certificate chain (PEM): for clients without SNI or with a name
    /// no other certificate covers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// The default certificate's private key (PEM).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// More certificates, chosen by SNI against their DNS names.
    pub certificates: Vec<CertKey>,
    pub kernel_tls: KernelTls,
    /// `TLS_TX_ZEROCOPY_RO`: kTLS sendfile without copying pages first. Only for
    /// content that never changes in place (see docs/CONFIG.md).
    pub zerocopy_sendfile: bool,
    pub min_version: TlsVersion,
}

impl Default for Tls {
    fn default() -> Self {
        Tls {
            cert: None,
            key: None,
            certificates: Vec::new(),
            kernel_tls: KernelTls::Auto,
            zerocopy_sendfile: false,
            min_version: TlsVersion::Tls12,
        }
    }
}

/// Socket settings applied to the listening sockets, which accepted connections
/// inherit (so they cost nothing per connection).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Tcp {
    /// Congestion control, e.g. `bbr`; empty keeps the kernel default.
    pub congestion_control: String,
    /// `SO_MAX_PACING_RATE` per connection in megabits per second; 0 = no cap.
    pub max_pacing_rate_mbps: u64,
    /// `SO_SNDBUF`; 0 leaves the kernel's autotuning on.
    pub send_buffer_bytes: u32,
    /// `TCP_NOTSENT_LOWAT`; 0 keeps the system default.
    pub notsent_lowat_bytes: u32,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Stats {
    /// Fraction of connections whose TCP_INFO is sampled (0 to 1).
    pub tcp_info_sample: f64,
    /// How often a sampled connection is read while a response is being sent.
    #[serde(with = "humantime_serde")]
    pub tcp_info_interval: Duration,
}

impl Default for Stats {
    fn default() -> Self {
        Stats { tcp_info_sample: 0.01, tcp_info_interval: Duration::from_secs(1) }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Admin {
    /// Serve /metrics, /status, /healthz and /load.
    pub enabled: bool,
    /// Where; keep it on a private address.
    pub listen: SocketAddr,
    /// Connections at which /load reports no spare capacity; 0 = all workers'
    /// connection limits together.
    pub capacity_connections: u64,
    /// Body throughput (Gb/s) at which /load reports no spare capacity; 0 = not used.
    pub capacity_gbps: f64,
    /// A `linerate capacity --json` output: /status reports served Gb/s as a share
    /// of the ceiling it predicts for the current transport mix, and /load uses
    /// that ceiling when `capacity_gbps` is 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_model: Option<PathBuf>,
    /// Which of the model's ceilings apply: clients over the NICs, or on this host.
    pub capacity_model_clients: ModelClients,
}

/// Where the clients the capacity model is applied to are.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ModelClients {
    #[default]
    Network,
    Loopback,
}

impl Default for Admin {
    fn default() -> Self {
        Admin {
            enabled: true,
            listen: "127.0.0.1:9090".parse().expect("valid default address"),
            capacity_connections: 0,
            capacity_gbps: 0.0,
            capacity_model: None,
            capacity_model_clients: ModelClients::Network,
        }
    }
}

/// How a new connection finds its worker.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Steering {
    /// A worker of the domain whose CPU received the SYN, by flow hash (a
    /// classic-BPF reuseport program).
    #[default]
    Domain,
    /// The worker on the CPU that received the SYN, else one in that CPU's domain:
    /// for NICs whose receive queues are spread one per CPU.
    Cpu,
    /// The kernel's reuseport hash over all workers.
    Hash,
}

/// Which CPUs a worker thread may run on.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Pin {
    /// `Cpu` under `steering = "cpu"` (whose promise is the worker on the very CPU
    /// that received the SYN), `Domain` otherwise.
    #[default]
    Auto,
    /// Its own CPU only.
    Cpu,
    /// Any CPU of its domain: when something else holds the worker's CPU, the
    /// scheduler runs it on an idle CPU of the same domain instead of making its
    /// viewers wait.
    Domain,
}

/// Where page-cache pages of served files are allocated.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// By the serving worker's reads: on the node of the NIC that received the client.
    #[default]
    Network,
    /// By a helper thread on the node of the disk that holds the file.
    Disk,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Numa {
    pub steering: Steering,
    pub pin: Pin,
    pub placement: Placement,
    /// Prefer each worker's own node for its memory (`set_mempolicy(MPOL_PREFERRED)`).
    pub bind_memory: bool,
    /// Fraction of file responses whose page-cache pages are checked for their node.
    pub page_sample: f64,
    /// Split each node into this many domains (for testing on small machines).
    pub split_domains: usize,
    /// Pretend a NIC is on another node (boards that report it wrongly or not at all).
    pub nic_nodes: BTreeMap<String, u32>,
    /// Pretend a block device is on another node.
    pub disk_nodes: BTreeMap<String, u32>,
}

impl Numa {
    /// `pin` with `auto` resolved: `Cpu` or `Domain`.
    pub fn resolved_pin(&self) -> Pin {
        match self.pin {
            Pin::Auto if self.steering == Steering::Cpu => Pin::Cpu,
            Pin::Auto => Pin::Domain,
            pin => pin,
        }
    }
}

impl Default for Numa {
    fn default() -> Self {
        Numa {
            steering: Steering::Domain,
            pin: Pin::Auto,
            placement: Placement::Network,
            bind_memory: false,
            page_sample: 0.01,
            split_domains: 1,
            nic_nodes: BTreeMap::new(),
            disk_nodes: BTreeMap::new(),
        }
    }
}

/// The cold path (`[fill]`): before a body range is sent, the worker asks the
/// page cache whether it is resident; if not, the connection waits while a fill
/// thread reads it from disk, and the worker serves everyone else meanwhile.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Fill {
    /// Check residency and fill off the worker. Off: bodies are sent as they are,
    /// and a cold page blocks the worker for the disk read.
    pub enabled: bool,
    /// Fill threads per NUMA domain: how many disk reads run at once there.
    pub threads: usize,
    /// The unit of a fill, aligned in the file: requests for the same window share
    /// one disk read.
    pub window_bytes: u64,
    /// How long a connection waits for a fill before it is closed.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Fills queued per disk at most; past it a demand fill fails (the connection
    /// closes) and read-ahead is skipped.
    pub queue_per_disk: usize,
    /// Windows read ahead past the end of a range that needed a fill, so a viewer
    /// reading a title in order finds its next segment resident.
    pub readahead_windows: u64,
    /// Popularity-aware page-cache admission (`server::fill::Admission`): only the
    /// most-demanded files that fit in `cache_bytes` stay cached; a range of any
    /// other file is dropped from the page cache once it is sent.
    pub admission: bool,
    /// The page cache the kept files may fill; 0 = auto: the memory limit of the
    /// server's own memory cgroup (or the machine's memory when none is set) times
    /// [`crate::server::fill::CACHE_HEADROOM`].
    pub cache_bytes: u64,
    /// Half-life of the demand estimate that ranks the files.
    #[serde(with = "humantime_serde")]
    pub admission_half_life: Duration,
}

impl Default for Fill {
    fn default() -> Self {
        Fill {
            enabled: true,
            threads: 4,
            window_bytes: 2 * 1024 * 1024,
            timeout: Duration::from_secs(10),
            queue_per_disk: 256,
            readahead_windows: 1,
            admission: true,
            cache_bytes: 0,
            admission_half_life: Duration::from_secs(60),
        }
    }
}

/// The `[dim]` section (dynamic interrupt moderation, docs/DIM.md): the NICs whose
/// interrupt coalescing the server drives while it runs (`tune::dim::spawn`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Dim {
    /// Interfaces to drive; empty = off.
    pub interfaces: Vec<String>,
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    pub max_writes_per_sec: f64,
    pub take_over: bool,
}

impl Default for Dim {
    fn default() -> Dim {
        Dim { interfaces: Vec::new(), interval: Duration::from_millis(100), max_writes_per_sec: 10.0, take_over: false }
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Log {
    /// A tracing filter: `info`, `debug`, `linerate=debug,warn`...
    pub level: String,
    pub format: LogFormat,
}

impl Default for Log {
    fn default() -> Self {
        Log { level: "info".into(), format: LogFormat::Text }
    }
}

/// How requests under a signed-URL rule's prefix are checked.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SignedMode {
    /// nginx `secure_link` compatible MD5 links.
    SecureLink,
    /// HMAC-SHA256 tokens with a path ACL.
    Token,
    /// No signature needed (a prefix opened inside a signed one).
    Open,
}

/// One `[[signed]]` rule. Keys that do not apply to its mode are refused; absent
/// ones take the defaults in docs/CONFIG.md.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SignedRule {
    /// The decoded path prefix the rule covers, on segment boundaries.
    pub prefix: String,
    pub mode: SignedMode,
    /// Keys valid at once (rotation); `secure_link` puts each in `$secret`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<SignedKey>,
    /// `secure_link`: the `secure_link_md5` expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expression: Option<String>,
    /// `secure_link`: the query argument holding the hash (`md5`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_arg: Option<String>,
    /// `secure_link`: the query argument holding the expiry (`expires`); empty: links
    /// never expire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_arg: Option<String>,
    /// `token`: the query argument carrying the token (`__token__`); empty: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_arg: Option<String>,
    /// `token`: the cookie carrying the token (`__token__`); empty: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<String>,
    /// `token`: refuse tokens that are not bound to a client address (`ip=`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind_client_address: Option<bool>,
    /// `token`: clock difference with the signers tolerated on `st` and `exp`.
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub leeway: Option<Duration>,
}

/// A signing key: an id and a secret, given inline or in a file of its own.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SignedKey {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<Secret>,
    /// A file whose contents (less one trailing newline) are the secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "SecretEncoding::is_text")]
    pub encoding: SecretEncoding,
}

/// How a secret's text becomes its bytes.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SecretEncoding {
    /// The bytes of the text.
    #[default]
    Text,
    /// Hex digits, two per byte (as EdgeAuth keys are written).
    Hex,
}

impl SecretEncoding {
    fn is_text(&self) -> bool {
        *self == SecretEncoding::Text
    }
}

/// A secret written in the configuration. Never shown: `Debug` and the printed
/// configuration (`--check-config`) say `<redacted>`.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(pub String);

/// What a [`Secret`] prints as.
pub const REDACTED: &str = "<redacted>";

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(REDACTED)
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AccessLogFormat {
    /// One JSON object per line.
    #[default]
    Json,
    /// nginx's `combined` format, so pipelines that parse it read it unchanged.
    Combined,
}

impl AccessLogFormat {
    /// Whether records print the response's duration and time to first byte (each
    /// costs a clock read per response).
    pub fn has_timings(self) -> bool {
        self == AccessLogFormat::Json
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AccessLog {
    /// The file records are appended to; unset or `"off"`: no access log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    pub format: AccessLogFormat,
    /// Log one response in this many (1: every response).
    pub sample: u64,
}

impl Default for AccessLog {
    fn default() -> Self {
        AccessLog { path: None, format: AccessLogFormat::Json, sample: 1 }
    }
}

impl AccessLog {
    /// The file to write, or None when logging is off.
    pub fn file(&self) -> Option<&Path> {
        self.path.as_deref().filter(|p| *p != Path::new("off"))
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

    /// Checks every value; returns the first bad key and why.
    pub fn validate(&self) -> Result<(), (String, String)> {
        fn bad<T>(key: &str, problem: impl Into<String>) -> Result<T, (String, String)> {
            Err((key.to_owned(), problem.into()))
        }
        fn range<T: PartialOrd + fmt::Display>(key: &str, v: T, lo: T, hi: T) -> Result<(), (String, String)> {
            if v < lo || v > hi {
                return bad(key, format!("{v} is out of range; must be between {lo} and {hi}"));
            }
            Ok(())
        }
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
        let all: Vec<&SocketAddr> = self.listen.iter().chain(&self.tls_listen).collect();
        for (i, a) in all.iter().enumerate() {
            // Port 0 asks for any free port: two of them never collide.
            if a.port() != 0 && all[..i].contains(a) {
                let key = if i < self.listen.len() { "listen" } else { "tls_listen" };
                return bad(key, format!("{a} is listed twice"));
            }
        }
        if !self.tls_listen.is_empty() {
            if self.tls.cert.is_none() {
                return bad("tls.cert", "`tls_listen` needs a certificate: set tls.cert or pass --cert FILE");
            }
            if self.tls.key.is_none() {
                return bad("tls.key", "`tls_listen` needs a private key: set tls.key or pass --key FILE");
            }
        }
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
                return bad(&key, "extensions are written without a dot, e.g. `mp4`");
            }
            if ty.is_empty() || !ty.contains('/') || !linerate_http::response::is_valid_field_value(ty) {
                return bad(&key, format!("{ty:?} is not a media type like `video/mp4`"));
            }
        }
        let l = &self.limits;
        range("limits.max_head_bytes", l.max_head_bytes, 1024, 1024 * 1024)?;
        range("limits.max_uri_bytes", l.max_uri_bytes, 64, l.max_head_bytes)?;
        range("limits.max_headers", l.max_headers, 1, linerate_http::request::MAX_HEADERS_CAP)?;
        range("limits.max_request_body_bytes", l.max_request_body_bytes, 0, MAX_INTEGER)?;
        range("limits.max_ranges", l.max_ranges, 0, 64)?;
        range("limits.max_connections_per_worker", l.max_connections_per_worker, 0, 1 << 20)?;
        range("limits.max_requests_per_connection", l.max_requests_per_connection, 0, MAX_INTEGER)?;
        range("limits.listen_backlog", l.listen_backlog, 1, 1 << 20)?;
        let c = &self.client_limits;
        range("client_limits.max_connections", c.max_connections, 0, 1 << 24)?;
        range("client_limits.ipv4_prefix", c.ipv4_prefix, 1, 32)?;
        range("client_limits.ipv6_prefix", c.ipv6_prefix, 1, 128)?;
        range("client_limits.max_new_connections_per_second", c.max_new_connections_per_second, 0, 1 << 24)?;
        if c.max_new_connections_per_second > 0 {
            range("client_limits.new_connections_burst", c.new_connections_burst, 1, 1 << 24)?;
        }
        range("client_limits.min_send_rate", c.min_send_rate, 0, 1 << 40)?;
        if c.min_send_rate > 0 && c.min_send_rate_after < Duration::from_millis(100) {
            return bad("client_limits.min_send_rate_after", "must be at least 100ms");
        }
        range("open_file_cache.entries", self.open_file_cache.entries, 0, MAX_OPEN_FILE_CACHE_ENTRIES)?;
        range("tcp.max_pacing_rate_mbps", self.tcp.max_pacing_rate_mbps, 0, MAX_INTEGER)?;
        range("admin.capacity_connections", self.admin.capacity_connections, 0, MAX_INTEGER)?;
        let t = &self.timeouts;
        for (key, d) in [
            ("timeouts.header", t.header),
            ("timeouts.keepalive", t.keepalive),
            ("timeouts.send", t.send),
            ("timeouts.upgrade", t.upgrade),
        ] {
            if d.is_zero() {
                return bad(key, "must be longer than 0s");
            }
        }
        // Durations are added to the clock: one that overflows it would panic a
        // worker mid-connection, so every one is capped at load.
        for (key, d) in [
            ("timeouts.header", t.header),
            ("timeouts.keepalive", t.keepalive),
            ("timeouts.send", t.send),
            ("timeouts.drain", t.drain),
            ("timeouts.upgrade", t.upgrade),
            ("client_limits.min_send_rate_after", c.min_send_rate_after),
            ("stats.tcp_info_interval", self.stats.tcp_info_interval),
            ("dim.interval", self.dim.interval),
        ] {
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
        }
        let cc = &self.tcp.congestion_control;
        if cc.len() > 15 || !cc.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return bad("tcp.congestion_control", format!("{cc:?} is not a congestion control name like `bbr`"));
        }
        if !(0.0..=1.0).contains(&self.stats.tcp_info_sample) {
            return bad(
                "stats.tcp_info_sample",
                format!("{} is not a fraction between 0 and 1", self.stats.tcp_info_sample),
            );
        }
        if self.stats.tcp_info_interval.is_zero() {
            return bad("stats.tcp_info_interval", "must be longer than 0s");
        }
        if !(0.0..=1.0).contains(&self.numa.page_sample) {
            return bad("numa.page_sample", format!("{} is not a fraction between 0 and 1", self.numa.page_sample));
        }
        range("numa.split_domains", self.numa.split_domains, 1, 64)?;
        if self.numa.pin == Pin::Domain && self.numa.steering == Steering::Cpu {
            return bad(
                "numa.pin",
                "\"domain\" cannot be combined with `numa.steering = \"cpu\"`, which hands each connection to the \
                 worker on the CPU that received it and so needs every worker on its own CPU (\"cpu\" or \"auto\")",
            );
        }
        let f = &self.fill;
        range("fill.threads", f.threads, 1, 256)?;
        range("fill.window_bytes", f.window_bytes, 64 * 1024, 64 * 1024 * 1024)?;
        if f.window_bytes % linerate_sys::pagecache::PAGE_BYTES != 0 {
            return bad("fill.window_bytes", "must be a multiple of 4096 (the page size)");
        }
        if f.timeout < Duration::from_millis(100) || f.timeout > Duration::from_secs(3600) {
            return bad("fill.timeout", "must be between 100ms and 1h");
        }
        range("fill.queue_per_disk", f.queue_per_disk, 1, 1 << 20)?;
        range("fill.readahead_windows", f.readahead_windows, 0, 64)?;
        if f.cache_bytes != 0 && f.cache_bytes < f.window_bytes {
            return bad("fill.cache_bytes", "must be 0 (auto) or at least fill.window_bytes");
        }
        if f.admission_half_life < Duration::from_secs(1) || f.admission_half_life > Duration::from_secs(86400) {
            return bad("fill.admission_half_life", "must be between 1s and 24h");
        }
        range("access_log.sample", self.access_log.sample, 1, 1 << 32)?;
        if let Some(path) = self.access_log.file() {
            if path.as_os_str().is_empty() || path.is_dir() {
                return bad("access_log.path", format!("{:?} is not a file path (or \"off\")", path.display()));
            }
        }
        if self.dim.interval < Duration::from_millis(10) {
            return bad("dim.interval", "must be at least 10ms");
        }
        if !(self.dim.max_writes_per_sec > 0.0 && self.dim.max_writes_per_sec.is_finite()) {
            return bad("dim.max_writes_per_sec", "must be more than 0");
        }
        if let Some(bad_name) = self.dim.interfaces.iter().find(|i| i.is_empty() || i.contains('/') || i.len() > 15) {
            return bad("dim.interfaces", format!("{bad_name:?} is not an interface name"));
        }
        if !(self.admin.capacity_gbps >= 0.0 && self.admin.capacity_gbps.is_finite()) {
            return bad("admin.capacity_gbps", "must be 0 or more");
        }
        if self.admin.capacity_model.as_ref().is_some_and(|p| p.as_os_str().is_empty() || p.file_name().is_none()) {
            return bad("admin.capacity_model", "must name a file");
        }
        if self.admin.enabled && all.contains(&&self.admin.listen) && self.admin.listen.port() != 0 {
            return bad("admin.listen", format!("{} is also a serving address", self.admin.listen));
        }
        if self.pid_file.as_ref().is_some_and(|p| p.as_os_str().is_empty() || p.file_name().is_none()) {
            return bad("pid_file", "must name a file");
        }
        // tracing-subscriber (0.3.20 and later) trims each comma-separated directive
        // but slices the untrimmed text, and panics on a directive that starts with
        // whitespace before a non-ASCII character; it never reads them right anyway.
        if self.log.level.split(',').any(|d| d.starts_with(char::is_whitespace)) {
            return bad("log.level", "directives are separated by commas without spaces, like `linerate=debug,warn`");
        }
        if tracing_subscriber::EnvFilter::builder().parse(&self.log.level).is_err() {
            return bad(
                "log.level",
                format!("{:?} is not a log filter like `info` or `linerate=debug`", self.log.level),
            );
        }
        signed::rules(&self.signed)?;
        Ok(())
    }

    /// The effective configuration as TOML (for `--check-config`).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot print configuration: {e}\n"))
    }
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
        ];
        for (c, key) in cases {
            let (k, problem) = c.validate().unwrap_err();
            assert_eq!(k, key, "{problem}");
            assert!(!problem.is_empty());
        }
    }

    #[test]
    fn huge_durations_are_refused_at_load() {
        let dir = std::env::temp_dir();
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
                let text = format!("root = {dir:?}\nlisten = [\"127.0.0.1:0\"]\n[{section}]\n{name} = \"{value}\"\n");
                let c = Config::from_toml(&text).unwrap_or_else(|e| panic!("{key} = {value}: {e:?}"));
                let (k, problem) = c.validate().unwrap_err();
                assert_eq!(k, key, "{problem}");
                assert!(problem.contains("at most 1day"), "{problem}");
            }
            let text = format!("root = {dir:?}\nlisten = [\"127.0.0.1:0\"]\n[{section}]\n{name} = \"1day\"\n");
            assert!(Config::from_toml(&text).unwrap().validate().is_ok(), "{key} = 1day");
        }
    }

    #[test]
    fn dim_section_parses() {
        let c: Dim = toml::from_str("interfaces = [\"eth0\"]\ninterval = \"250ms\"\n").unwrap();
        assert_eq!(c.interval, Duration::from_millis(250));
        assert_eq!(c.max_writes_per_sec, 10.0);
        assert!(toml::from_str::<Dim>("bogus = 1").is_err());
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

    #[test]
    fn workers_keep_to_their_domain_unless_steered_by_cpu() {
        let dir = std::env::temp_dir();
        let base = format!("root = {dir:?}\nlisten = [\"127.0.0.1:0\"]\n[numa]\n");
        let parsed = |extra: &str| Config::from_toml(&format!("{base}{extra}")).unwrap();
        let c = parsed("");
        assert_eq!(c.numa.pin, Pin::Auto);
        assert_eq!(c.numa.resolved_pin(), Pin::Domain, "domain steering: any CPU of the domain");
        assert_eq!(parsed("steering = \"cpu\"\n").numa.resolved_pin(), Pin::Cpu, "CPU steering: the worker's own CPU");
        assert_eq!(parsed("pin = \"cpu\"\n").numa.resolved_pin(), Pin::Cpu);
        let c = parsed("pin = \"domain\"\nsteering = \"hash\"\n");
        assert!(c.validate().is_ok());
        assert_eq!(c.numa.resolved_pin(), Pin::Domain);
        assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c);
        let (key, problem) = parsed("pin = \"domain\"\nsteering = \"cpu\"\n").validate().unwrap_err();
        assert_eq!(key, "numa.pin");
        assert!(problem.contains("steering"), "{problem}");
        assert!(Config::from_toml(&format!("{base}pin = \"node\"\n")).is_err());
    }

    #[test]
    fn capacity_model_names_a_file_and_clients_parse() {
        let dir = std::env::temp_dir();
        let base = format!("root = {dir:?}\nlisten = [\"127.0.0.1:0\"]\n[admin]\n");
        let c = Config::from_toml(&format!(
            "{base}capacity_model = \"/var/lib/linerate/capacity.json\"\ncapacity_model_clients = \"loopback\"\n"
        ))
        .unwrap();
        assert!(c.validate().is_ok());
        assert_eq!(c.admin.capacity_model_clients, ModelClients::Loopback);
        assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c);
        let c = Config::from_toml(&format!("{base}capacity_model = \"\"\n")).unwrap();
        assert_eq!(c.validate().unwrap_err().0, "admin.capacity_model");
        assert!(Config::from_toml(&format!("{base}capacity_model_clients = \"moon\"\n")).is_err());
    }

    /// The parser takes integers past i64::MAX for unsigned keys, but TOML cannot
    /// print them: `--check-config` printed a comment instead of the configuration.
    #[test]
    fn integers_past_toml_range_are_refused() {
        let dir = std::env::temp_dir();
        for key in [
            "limits.max_request_body_bytes",
            "limits.max_requests_per_connection",
            "tcp.max_pacing_rate_mbps",
            "admin.capacity_connections",
        ] {
            let (section, name) = key.split_once('.').unwrap();
            let text = format!("root = {dir:?}\nlisten = [\"127.0.0.1:0\"]\n[{section}]\n{name} = {MAX_INTEGER}\n");
            let c = Config::from_toml(&text).unwrap();
            assert!(c.validate().is_ok(), "{key}");
            assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c, "{key}");
            let text = text.replace(&MAX_INTEGER.to_string(), &(MAX_INTEGER + 1).to_string());
            let c = Config::from_toml(&text).unwrap_or_else(|e| panic!("{key}: {e:?}"));
            assert_eq!(c.validate().unwrap_err().0, key);
        }
    }

    /// Each worker's open-file cache allocates room for `entries` files at start:
    /// an unbounded value made that allocation fail (or `entries × workers` overflow).
    #[test]
    fn open_file_cache_entries_is_bounded() {
        let dir = std::env::temp_dir();
        let c = |entries: usize| Config {
            root: Some(dir.clone()),
            listen: vec![DEFAULT_LISTEN.parse().unwrap()],
            open_file_cache: OpenFileCache { entries, ..OpenFileCache::default() },
            ..Config::default()
        };
        assert!(c(MAX_OPEN_FILE_CACHE_ENTRIES).validate().is_ok());
        assert_eq!(c(MAX_OPEN_FILE_CACHE_ENTRIES + 1).validate().unwrap_err().0, "open_file_cache.entries");
        assert_eq!(c(usize::MAX).validate().unwrap_err().0, "open_file_cache.entries");
    }

    /// tracing-subscriber's directive parser trims a directive but slices the
    /// untrimmed text, so a directive after `, ` with a non-ASCII character panicked
    /// validation: at start, or on a reload, in the running server's supervisor.
    #[test]
    fn log_level_with_a_space_after_a_comma_is_refused_not_a_panic() {
        let dir = std::env::temp_dir();
        for level in [" é=info", "info, é=debug", "info,\u{a0}linerate=debug", "warn, linerate=debug", " "] {
            let c = Config {
                root: Some(dir.clone()),
                listen: vec![DEFAULT_LISTEN.parse().unwrap()],
                log: Log { level: level.into(), ..Log::default() },
                ..Config::default()
            };
            let (key, problem) = c.validate().unwrap_err();
            assert_eq!(key, "log.level", "{level:?}");
            assert!(problem.contains("without spaces"), "{problem}");
        }
        for level in ["info", "linerate=debug,warn", "info,é=debug", "", "debug "] {
            let c = Config {
                root: Some(dir.clone()),
                log: Log { level: level.into(), ..Log::default() },
                ..Config::default()
            };
            let c = Config { listen: vec![DEFAULT_LISTEN.parse().unwrap()], ..c };
            assert!(c.validate().is_ok(), "{level:?}");
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
