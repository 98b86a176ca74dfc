//! `[[origin]]` and `[cache]`: the pull-through cache. An `[[origin]]` table maps a
//! path prefix to one or more origin base URLs; requests under it are answered
//! from the slice store under `[cache]`, which fills itself from the origin on a
//! miss (see docs/CACHE.md).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, duration, range, Bad, S3};

/// One origin: a path prefix of this server and the base URLs it maps to.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Origin {
    /// The path prefix served from this origin, starting and ending with `/`
    /// (`/vod/`). The longest matching prefix wins.
    pub prefix: String,
    /// Base URLs, tried in order (failover on connect errors, timeouts and 5xx):
    /// `http://host[:port]/path/` or `https://...`. A request for `prefix` + `rest`
    /// goes to `url` + `rest`.
    pub urls: Vec<String>,
    /// PEM file of the certificate authorities trusted for `https` origins instead
    /// of the system's (`/etc/ssl/certs`). Verification is always on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// From the request sent to the response head received.
    #[serde(default = "default_first_byte_timeout", with = "humantime_serde")]
    pub first_byte_timeout: Duration,
    /// The first-byte timeout of a blocking playlist request (LL-HLS: one whose
    /// cache key carries `_HLS_msn` or `_HLS_part`), which the origin holds until
    /// the playlist has that segment or part. Past it the viewer gets 504.
    #[serde(default = "default_hold_timeout", with = "humantime_serde")]
    pub hold_timeout: Duration,
    /// Between two reads of a response body: a stalled origin ends the fill.
    #[serde(default = "default_idle_timeout", with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Idle keep-alive connections kept per origin URL.
    #[serde(default = "default_max_idle")]
    pub max_idle_connections: usize,
    /// Request header fields of the viewer copied to the origin request (none by
    /// default: the origin sees only what linerate sends).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forward_headers: Vec<String>,
    /// Query arguments that are part of the cache key and sent to the origin (none
    /// by default: signed-URL tokens and the like do not split the cache).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key_args: Vec<String>,
    /// How long a response stays fresh when the origin's fields do not say.
    #[serde(default = "default_ttl", with = "humantime_serde")]
    pub default_ttl: Duration,
    /// How long a 404 or 410 of the origin is kept.
    #[serde(default = "default_negative_ttl", with = "humantime_serde")]
    pub negative_ttl: Duration,
    /// How long past its freshness a response may be served while the origin
    /// fails, when the origin's fields do not say (`stale-if-error`).
    #[serde(default, with = "humantime_serde")]
    pub stale_if_error: Duration,
    /// How long past its freshness a response may be served while it is
    /// revalidated in the background, when the origin's fields do not say
    /// (`stale-while-revalidate`).
    #[serde(default, with = "humantime_serde")]
    pub stale_while_revalidate: Duration,
    /// The last part of a fresh object's lifetime, in percent, in which a hit
    /// also revalidates it in the background (one request at a time): under
    /// steady demand a short-lived object, such as a live playlist, is replaced
    /// before it expires, no viewer waits for it, and none gets it stale. 0: off.
    #[serde(default)]
    pub refresh_ahead_percent: u32,
    /// Slices fetched ahead of a viewer: when a viewer's request reaches slice
    /// N of an object, slices N+1 to N+this that are neither stored nor being
    /// filled are fetched too, one request each, so a viewer playing in order
    /// finds its next slice on the way. 0: off (only the slices asked for).
    #[serde(default)]
    pub read_ahead_slices: u32,
    /// The origin is an S3 bucket (`[origin.s3]`): `urls` name the S3 endpoint,
    /// and every request is signed (docs/CACHE.md, "S3 origins").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3>,
    /// Other linerate nodes serving the same prefix from their own cache
    /// (`http://host:port`, their plain-HTTP listen address), asked before
    /// `urls`: each object goes to the parent its key hashes to (rendezvous
    /// hashing), then along its order, then to `urls` (docs/CACHE.md, "Parent
    /// tier").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<String>,
    /// How long a parent or peer that failed (no connection, a timeout, a
    /// broken connection) is skipped before it is probed again.
    #[serde(default = "default_parent_down_for", with = "humantime_serde")]
    pub parent_down_for: Duration,
    /// The other edges of this node's group (`http://host:port`, their
    /// plain-HTTP listen address; this node may be listed, and is left out):
    /// asked first, with `Cache-Control: only-if-cached`, for what they have
    /// stored; then the parents, then `urls` (docs/CACHE.md, "Peers").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<String>,
    /// How many peers one request asks at most, in the order its key hashes
    /// them to (rendezvous), skipping those marked down.
    #[serde(default = "default_peer_tries")]
    pub peer_tries: usize,
}

fn default_peer_tries() -> usize {
    2
}

fn default_parent_down_for() -> Duration {
    Duration::from_secs(10)
}

fn default_connect_timeout() -> Duration {
    Duration::from_secs(3)
}
fn default_first_byte_timeout() -> Duration {
    Duration::from_secs(15)
}
fn default_hold_timeout() -> Duration {
    Duration::from_secs(12)
}
fn default_idle_timeout() -> Duration {
    Duration::from_secs(15)
}
fn default_max_idle() -> usize {
    64
}
fn default_ttl() -> Duration {
    Duration::from_secs(600)
}
fn default_negative_ttl() -> Duration {
    Duration::from_secs(2)
}

impl Origin {
    pub(super) fn validate(&self, i: usize) -> Result<(), Bad> {
        let key = |k: &str| format!("origin[{i}].{k}");
        if !self.prefix.starts_with('/') || !self.prefix.ends_with('/') || self.prefix.contains(['?', '#', '%']) {
            return bad(key("prefix"), "must start and end with `/` (`/vod/`), with no `?`, `#` or `%`");
        }
        if self.urls.is_empty() {
            return bad(key("urls"), "at least one origin URL is needed");
        }
        let mut urls = Vec::with_capacity(self.urls.len());
        for (j, url) in self.urls.iter().enumerate() {
            match parse_base_url(url) {
                Ok(base) => urls.push((url.clone(), base)),
                Err(problem) => return bad(format!("origin[{i}].urls[{j}]"), problem),
            }
        }
        if let Some(s3) = &self.s3 {
            s3.validate(i, &urls, &self.key_args)?;
        }
        for (name, list) in [("parents", &self.parents), ("peers", &self.peers)] {
            let mut seen: Vec<BaseUrl> = Vec::with_capacity(list.len());
            for (j, url) in list.iter().enumerate() {
                let k = format!("origin[{i}].{name}[{j}]");
                let what = if name == "parents" { "a parent" } else { "a peer" };
                let base = match parse_base_url(url) {
                    Ok(base) => base,
                    Err(problem) => return bad(k, problem),
                };
                if base.https {
                    return bad(k, format!("{url:?}: {what} is a linerate node's plain-HTTP listen address; https {name} are not supported"));
                }
                if base.path != "/" {
                    return bad(
                        k,
                        format!("{url:?}: {what} is `http://host:port`, without a path (it serves the same prefix)"),
                    );
                }
                if seen.iter().any(|p| p.host.eq_ignore_ascii_case(&base.host) && p.port == base.port) {
                    return bad(k, format!("{url:?} is listed twice"));
                }
                seen.push(base);
            }
        }
        range(&key("peer_tries"), self.peer_tries, 1, 64)?;
        range(&key("refresh_ahead_percent"), self.refresh_ahead_percent, 0, 90)?;
        range(&key("read_ahead_slices"), self.read_ahead_slices, 0, 16)?;
        if let Some(ca) = &self.ca_file {
            if !ca.is_file() {
                return bad(key("ca_file"), format!("{ca:?} is not a readable file"));
            }
        }
        for (k, d, lo) in [
            ("connect_timeout", self.connect_timeout, Duration::from_millis(10)),
            ("first_byte_timeout", self.first_byte_timeout, Duration::from_millis(10)),
            ("hold_timeout", self.hold_timeout, Duration::from_millis(100)),
            ("idle_timeout", self.idle_timeout, Duration::from_millis(10)),
            ("default_ttl", self.default_ttl, Duration::ZERO),
            ("negative_ttl", self.negative_ttl, Duration::ZERO),
            ("stale_if_error", self.stale_if_error, Duration::ZERO),
            ("stale_while_revalidate", self.stale_while_revalidate, Duration::ZERO),
            ("parent_down_for", self.parent_down_for, Duration::from_millis(100)),
        ] {
            duration(&key(k), d)?;
            if d < lo {
                return bad(key(k), format!("must be at least {}", humantime::format_duration(lo)));
            }
        }
        range(&key("max_idle_connections"), self.max_idle_connections, 0, 100_000)?;
        for h in &self.forward_headers {
            let lower = h.to_ascii_lowercase();
            if h.is_empty() || !h.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b)) {
                return bad(key("forward_headers"), format!("{h:?} is not a header field name"));
            }
            if ["host", "range", "if-range", "connection", "content-length", "transfer-encoding", "te", "upgrade"]
                .contains(&lower.as_str())
            {
                return bad(key("forward_headers"), format!("{h} is set by linerate itself and cannot be forwarded"));
            }
        }
        for a in &self.key_args {
            if a.is_empty() || a.contains(['&', '=', '#']) {
                return bad(key("key_args"), format!("{a:?} is not a query argument name"));
            }
        }
        Ok(())
    }
}

/// An origin base URL, split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseUrl {
    pub https: bool,
    /// Host as written (a name, an IPv4 address, or an IPv6 address in brackets).
    pub host: String,
    pub port: u16,
    /// The path, starting and ending with `/`.
    pub path: String,
}

/// Reads `scheme://host[:port]/path/`: http or https, no user info, query or
/// fragment, the path ending with `/` (a request's rest is appended to it).
pub fn parse_base_url(url: &str) -> Result<BaseUrl, String> {
    let (https, rest) = if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else {
        return Err(format!("{url:?}: only http:// and https:// origins are supported"));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err(format!("{url:?}: needs a host, and no user name or password"));
    }
    if path.contains(['?', '#']) || !path.ends_with('/') {
        return Err(format!("{url:?}: the path must end with `/` and have no query or fragment"));
    }
    let default_port = if https { 443 } else { 80 };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let end = v6.find(']').ok_or_else(|| format!("{url:?}: unclosed `[` in the host"))?;
        let host = &authority[..end + 2];
        match &authority[end + 2..] {
            "" => (host, default_port),
            p => (host, parse_port(url, p.strip_prefix(':').unwrap_or(p))?),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, parse_port(url, p)?),
            None => (authority, default_port),
        }
    };
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c.is_control()) {
        return Err(format!("{url:?}: bad host"));
    }
    Ok(BaseUrl { https, host: host.to_string(), port, path: path.to_string() })
}

fn parse_port(url: &str, p: &str) -> Result<u16, String> {
    p.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(|| format!("{url:?}: bad port {p:?}"))
}

/// The slice store of the pull-through cache (`[cache]`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Cache {
    /// The unit an object is fetched and stored in, aligned in the object.
    pub slice_bytes: u64,
    /// Where slices are kept: one or more directories, each best on a disk of its
    /// own.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dirs: Vec<CacheDir>,
    /// `fsync` each slice before it becomes visible, and the index after: slices
    /// then survive a power loss too, not only a crash of the server.
    pub fsync: bool,
    /// This node's name in the `Via` field of its origin and parent requests, by
    /// which a request that comes back to it is refused. Default: the host name
    /// and the first listen port (`edge1:80`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
}

impl Default for Cache {
    fn default() -> Self {
        Cache { slice_bytes: 4 * 1024 * 1024, dirs: Vec::new(), fsync: false, node_name: None }
    }
}

/// One directory of the slice store.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CacheDir {
    pub path: PathBuf,
    /// The most the slices in it may take; past it the least popular go.
    pub max_size_bytes: u64,
    /// Free space kept on its file system; below it the least popular slices go.
    #[serde(default)]
    pub min_free_bytes: u64,
}

impl Cache {
    pub(super) fn validate(&self, origins: &[Origin]) -> Result<(), Bad> {
        range("cache.slice_bytes", self.slice_bytes, 64 * 1024, 1 << 30)?;
        if self.slice_bytes % linerate_sys::pagecache::PAGE_BYTES != 0 {
            return bad("cache.slice_bytes", "must be a multiple of 4096 (the page size)");
        }
        if let Some(name) = &self.node_name {
            if !is_node_name(name) {
                return bad(
                    "cache.node_name",
                    format!("{name:?}: 1 to 100 visible ASCII characters, no `,`, `(` or `)`"),
                );
            }
        }
        if !origins.is_empty() && self.dirs.is_empty() {
            return bad("cache.dirs", "an [[origin]] needs at least one cache directory ([[cache.dirs]] with a path)");
        }
        for (i, d) in self.dirs.iter().enumerate() {
            if !d.path.is_absolute() {
                return bad(format!("cache.dirs[{i}].path"), format!("{:?} must be an absolute path", d.path));
            }
            if self.dirs[..i].iter().any(|o| o.path == d.path) {
                return bad(format!("cache.dirs[{i}].path"), format!("{:?} is listed twice", d.path));
            }
            if d.max_size_bytes < self.slice_bytes {
                return bad(format!("cache.dirs[{i}].max_size_bytes"), "must hold at least one slice");
            }
            range(&format!("cache.dirs[{i}].max_size_bytes"), d.max_size_bytes, 0, super::MAX_INTEGER)?;
            range(&format!("cache.dirs[{i}].min_free_bytes"), d.min_free_bytes, 0, super::MAX_INTEGER)?;
        }
        Ok(())
    }
}

/// Whether `name` can stand as a `Via` field's received-by name.
fn is_node_name(name: &str) -> bool {
    (1..=100).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_graphic() && !b",()".contains(&b))
}

impl Cache {
    /// The node name of `Via` fields: `node_name`, else the host name and the
    /// first of `listen`'s ports (two nodes of one host listen on different
    /// ports), else (no plain-HTTP listener, or port 0) the host name and the
    /// process id.
    pub fn node_name(&self, listen: &[std::net::SocketAddr]) -> String {
        if let Some(name) = &self.node_name {
            return name.clone();
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| is_node_name(h) && h.len() < 90)
            .unwrap_or_else(|| "linerate".into());
        match listen.first().map(|a| a.port()) {
            Some(port) if port != 0 => format!("{host}:{port}"),
            // No port yet (`:0` takes any): the process id tells nodes apart.
            _ => format!("{host}.{}", std::process::id()),
        }
    }
}

/// Checks the `[[origin]]` tables: each valid, no prefix twice.
pub(super) fn validate_origins(origins: &[Origin]) -> Result<(), Bad> {
    for (i, o) in origins.iter().enumerate() {
        o.validate(i)?;
        if origins[..i].iter().any(|p| p.prefix == o.prefix) {
            return bad(format!("origin[{i}].prefix"), format!("{} is listed twice", o.prefix));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_split_and_bad_ones_named() {
        let u = parse_base_url("http://10.0.0.1:8080/media/").unwrap();
        assert_eq!((u.https, u.host.as_str(), u.port, u.path.as_str()), (false, "10.0.0.1", 8080, "/media/"));
        let u = parse_base_url("https://origin.example").unwrap();
        assert_eq!((u.https, u.host.as_str(), u.port, u.path.as_str()), (true, "origin.example", 443, "/"));
        let u = parse_base_url("http://[::1]:81/").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("[::1]", 81));
        for bad in [
            "ftp://x/",
            "http:///",
            "http://u:p@x/",
            "http://x/a",
            "http://x/?q",
            "http://x:0/",
            "http://x:99999/",
            "http://[::1/",
        ] {
            assert!(parse_base_url(bad).is_err(), "{bad} accepted");
        }
    }

    fn origin(prefix: &str) -> Origin {
        toml::from_str(&format!("prefix = {prefix:?}\nurls = [\"http://127.0.0.1:1/\"]")).unwrap()
    }

    #[test]
    fn origin_tables_are_checked_key_by_key() {
        assert_eq!(origin("/vod/").validate(0), Ok(()));
        assert_eq!(origin("/vod").validate(3).unwrap_err().0, "origin[3].prefix");
        let mut o = origin("/a/");
        o.forward_headers = vec!["Range".into()];
        assert_eq!(o.validate(0).unwrap_err().0, "origin[0].forward_headers");
        o.forward_headers = vec!["X-Request-Id".into()];
        o.idle_timeout = Duration::ZERO;
        assert_eq!(o.validate(0).unwrap_err().0, "origin[0].idle_timeout");
        let mut o = origin("/a/");
        assert_eq!(o.hold_timeout, Duration::from_secs(12));
        o.hold_timeout = Duration::from_millis(50);
        assert_eq!(o.validate(0).unwrap_err(), ("origin[0].hold_timeout".into(), "must be at least 100ms".into()));
        assert_eq!(validate_origins(&[origin("/a/"), origin("/a/")]).unwrap_err().0, "origin[1].prefix");
    }

    #[test]
    fn parents_are_plain_http_addresses_listed_once() {
        let mut o = origin("/a/");
        o.parents = vec!["http://10.0.0.1:8080".into(), "http://10.0.0.2".into()];
        assert_eq!(o.validate(0), Ok(()));
        for (parents, at) in [
            (vec!["https://10.0.0.1/"], "origin[2].parents[0]"),
            (vec!["http://10.0.0.1:80/", "http://10.0.0.2/vod/"], "origin[2].parents[1]"),
            (vec!["http://p:81", "http://P:81/"], "origin[2].parents[1]"),
            (vec!["p:81"], "origin[2].parents[0]"),
        ] {
            o.parents = parents.iter().map(|p| p.to_string()).collect();
            assert_eq!(o.validate(2).unwrap_err().0, at, "{parents:?}");
        }
        o.parents.clear();
        o.parent_down_for = Duration::from_millis(10);
        assert_eq!(o.validate(0).unwrap_err().0, "origin[0].parent_down_for");
    }

    #[test]
    fn peers_are_checked_as_parents_are() {
        let mut o: Origin = toml::from_str(
            "prefix = \"/a/\"\nurls = [\"http://127.0.0.1:1/\"]\npeers = [\"http://10.0.0.2:80\", \"http://10.0.0.3\"]",
        )
        .unwrap();
        assert_eq!((o.validate(0), o.peer_tries), (Ok(()), 2));
        for (peers, at) in [
            (vec!["https://10.0.0.1/"], "origin[1].peers[0]"),
            (vec!["http://10.0.0.1:80/", "http://10.0.0.2/vod/"], "origin[1].peers[1]"),
            (vec!["http://p:81", "http://P:81/"], "origin[1].peers[1]"),
        ] {
            o.peers = peers.iter().map(|p| p.to_string()).collect();
            assert_eq!(o.validate(1).unwrap_err().0, at, "{peers:?}");
        }
        o.peers.clear();
        o.peer_tries = 0;
        assert_eq!(o.validate(0).unwrap_err().0, "origin[0].peer_tries");
    }

    #[test]
    fn node_names_are_checked_and_defaulted() {
        let c = Cache { node_name: Some("edge 1".into()), ..Cache::default() };
        assert_eq!(c.validate(&[]).unwrap_err().0, "cache.node_name");
        let c = Cache { node_name: Some("edge-1".into()), ..Cache::default() };
        assert_eq!(c.node_name(&[]), "edge-1");
        let c = Cache::default();
        let a = c.node_name(&["127.0.0.1:8081".parse().unwrap()]);
        let b = c.node_name(&["127.0.0.1:8082".parse().unwrap()]);
        assert!(a.ends_with(":8081") && b.ends_with(":8082") && is_node_name(&a), "{a} {b}");
        let any = c.node_name(&["127.0.0.1:0".parse().unwrap()]);
        assert!(any.ends_with(&format!(".{}", std::process::id())), "{any}");
    }

    #[test]
    fn an_origin_needs_a_cache_directory() {
        let c = Cache::default();
        assert_eq!(c.validate(&[]), Ok(()));
        assert_eq!(c.validate(&[origin("/a/")]).unwrap_err().0, "cache.dirs");
        let c = Cache { slice_bytes: 1000, ..Cache::default() };
        assert_eq!(c.validate(&[]).unwrap_err().0, "cache.slice_bytes");
    }
}
