//! The cache tier of a table: other linerate nodes asked before its origin,
//! its parents and its peers ([`Member`]).
//!
//! **Which one.** Each object goes to one parent, chosen by rendezvous
//! (highest-random-weight) hashing: every parent gets a score, a stable 64-bit
//! hash of the object's cache key and the parent's `host:port`, and the parents
//! are tried from the highest score down ([`order`]). All slices of an object
//! share its key, so they go to the same parent; removing a parent moves only
//! the objects whose first choice it was, and every node with the same parents
//! makes the same choice (the hash is FNV-1a with a SplitMix64 finish, the same
//! in every build). Peers are ordered the same way, among themselves.
//!
//! **Health.** A member that fails at the transport (no connection, a timeout
//! before the head, a connection broken before the head) is marked down and
//! skipped for the table's `parent_down_for`; then a probe (a TCP connection to
//! it, under `connect_timeout`) runs every [`PROBE_INTERVAL`] until one
//! succeeds, which brings it back. A 5xx moves the request on to the next
//! member without marking it down: it says the parent's own origin failed, not
//! that the parent did. The state is atomics shared by every origin thread.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::connect::Url;
use crate::config::BaseUrl;

/// How often a parent marked down, and past its `parent_down_for`, is probed.
pub(super) const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// One parent or peer of one table.
pub(super) struct Member {
    /// Its base path is the member's path followed by the table's prefix: it is
    /// asked for the path the viewer asked this node for.
    pub(super) url: Arc<Url>,
    /// "parent" or "peer", for the log.
    role: &'static str,
    /// `host:port`, lowercase: what its score hashes.
    id: String,
    down: AtomicBool,
    /// When a down member may be probed, in ms since [`super::Origins::started`].
    probe_at: AtomicU64,
    /// Times it was marked down.
    pub(super) marked_down: AtomicU64,
    /// A peer's 504s (and other 3xx or 4xx) to `only-if-cached`: it did not have what was asked.
    pub(super) misses: AtomicU64,
}

impl Member {
    pub(super) fn new(url: Arc<Url>, role: &'static str) -> Member {
        let id = format!("{}:{}", url.base.host, url.base.port).to_ascii_lowercase();
        Member {
            url,
            role,
            id,
            down: AtomicBool::new(false),
            probe_at: AtomicU64::new(0),
            marked_down: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    pub(super) fn is_up(&self) -> bool {
        !self.down.load(Relaxed)
    }

    /// Marks it down after `why`, until a probe after `down_for` succeeds;
    /// logged when it goes down, not while it stays down.
    pub(super) fn mark_down(&self, now_ms: u64, down_for: Duration, table: usize, why: &str) {
        self.probe_at.store(now_ms + down_for.as_millis() as u64, Relaxed);
        if !self.down.swap(true, Relaxed) {
            self.marked_down.fetch_add(1, Relaxed);
            tracing::warn!(
                "origin[{table}]: {} {} is down ({why}); skipped for {} s, then probed",
                self.role,
                self.url.text,
                down_for.as_secs_f64()
            );
        }
    }

    /// Probes it if it is down and due: a TCP connection brings it back, a
    /// failure keeps it down another `down_for`.
    pub(super) async fn probe(&self, now_ms: u64, connect_timeout: Duration, down_for: Duration, table: usize) {
        if self.is_up() || now_ms < self.probe_at.load(Relaxed) {
            return;
        }
        let addr = (super::connect::bare_host(&self.url.base.host).to_string(), self.url.base.port);
        let ok = matches!(tokio::time::timeout(connect_timeout, tokio::net::TcpStream::connect(addr)).await, Ok(Ok(_)));
        if ok {
            self.down.store(false, Relaxed);
            tracing::info!("origin[{table}]: {} {} is back up (probe connected)", self.role, self.url.text);
        } else {
            self.probe_at.store(now_ms + down_for.as_millis() as u64, Relaxed);
        }
    }
}

/// The indexes of `parents` (or peers) in the order an object of cache key
/// `key` tries them: highest score first.
pub(super) fn order(key: &[u8], parents: &[Member]) -> Vec<usize> {
    let mut scored: Vec<(u64, usize)> = parents.iter().enumerate().map(|(i, p)| (score(key, &p.id), i)).collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.into_iter().map(|(_, i)| i).collect()
}

/// The rendezvous score of (`key`, parent `id`).
pub(super) fn score(key: &[u8], id: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key.iter().chain([0u8].iter()).chain(id.as_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // SplitMix64's finish: FNV's low bits mix poorly on their own.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Whether a parent or peer address is this node: an IP address (or
/// `localhost`) on a port it listens on, at that address, or at the unspecified
/// one when the address is a loopback one or one of this host's own (one a
/// socket can be bound to: `10.0.0.2:80` in the peers of the node at 10.0.0.2
/// listening on `0.0.0.0:80`). A name that resolves to this node is not
/// recognised here; the `Via` check refuses what it sends to itself as a
/// parent, and what it asks itself as a peer is answered from its own store.
pub(super) fn is_self(base: &BaseUrl, listen: &[SocketAddr]) -> bool {
    let host = super::connect::bare_host(&base.host);
    let ip: Option<IpAddr> =
        if host.eq_ignore_ascii_case("localhost") { Some(IpAddr::from([127, 0, 0, 1])) } else { host.parse().ok() };
    let Some(ip) = ip else { return false };
    let local = || ip.is_loopback() || ip.is_unspecified() || std::net::UdpSocket::bind((ip, 0)).is_ok();
    listen
        .iter()
        .any(|l| l.port() == base.port && (l.ip() == ip || ip.is_unspecified() || (l.ip().is_unspecified() && local())))
}

/// Milliseconds since `started`.
pub(super) fn millis_since(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("10.0.0.{i}:8080")).collect()
    }

    fn first(key: &[u8], ids: &[String]) -> String {
        ids.iter().max_by_key(|id| score(key, id)).unwrap().clone()
    }

    #[test]
    fn the_score_is_stable_across_builds() {
        const FIXED: u64 = 1_696_325_765_573_954_840;
        // Fixed values: every node, whatever its build, must choose alike.
        assert_eq!(score(b"/vod/a.mp4", "10.0.0.1:8080"), score(b"/vod/a.mp4", "10.0.0.1:8080"));
        assert_ne!(score(b"/vod/a.mp4", "10.0.0.1:8080"), score(b"/vod/a.mp4", "10.0.0.2:8080"));
        assert_eq!(score(b"/vod/a.mp4", "10.0.0.1:8080"), FIXED);
        assert_ne!(score(b"ab", "c"), score(b"a", "bc"), "key and id are separated");
    }

    #[test]
    fn keys_spread_over_the_parents() {
        let parents = ids(3);
        let mut counts = [0usize; 3];
        for t in 0..3000 {
            let f = first(format!("/vod/title-{t}/seg.m4s").as_bytes(), &parents);
            counts[parents.iter().position(|p| *p == f).unwrap()] += 1;
        }
        assert!(counts.iter().all(|&c| (800..1200).contains(&c)), "{counts:?}");
    }

    #[test]
    fn removing_a_parent_moves_only_its_keys() {
        let all = ids(4);
        let fewer: Vec<String> = all.iter().filter(|p| !p.starts_with("10.0.0.2:")).cloned().collect();
        let mut moved = 0;
        for t in 0..2000 {
            let key = format!("/vod/{t}.mp4");
            let (before, after) = (first(key.as_bytes(), &all), first(key.as_bytes(), &fewer));
            if before != after {
                assert!(before.starts_with("10.0.0.2:"), "{key} moved from {before} to {after}");
                moved += 1;
            }
        }
        assert!(moved > 300, "{moved}");
    }

    #[test]
    fn self_is_recognised_by_address_and_port() {
        let url = |s: &str| crate::config::parse_base_url(s).unwrap();
        let any: Vec<SocketAddr> = vec!["0.0.0.0:8081".parse().unwrap()];
        let lo: Vec<SocketAddr> = vec!["127.0.0.2:8081".parse().unwrap()];
        assert!(is_self(&url("http://127.0.0.1:8081/"), &any));
        assert!(is_self(&url("http://localhost:8081/"), &any));
        assert!(!is_self(&url("http://127.0.0.1:8082/"), &any));
        assert!(is_self(&url("http://127.0.0.2:8081/"), &lo));
        assert!(!is_self(&url("http://127.0.0.1:8081/"), &lo));
        assert!(!is_self(&url("http://parent.example:8081/"), &any));
        // An address of this host's own, with a wildcard listener on its port.
        assert!(is_self(&url("http://127.0.0.5:8081/"), &any));
        assert!(!is_self(&url("http://192.0.2.1:8081/"), &any), "TEST-NET-1 is no address of this host");
    }
}
