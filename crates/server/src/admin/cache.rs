//! The pull-through cache's figures, as `/metrics` and `/status` show them: the
//! cache's own counters, the slice store per directory, and each origin URL.
//! Everything is read from atomics and the store's index size; no lock a worker
//! takes is held.

use serde::Serialize;

use super::AdminState;
use crate::origin::{ParentStats, PeerStats, UrlStats};
use crate::server::cache::Cache;
use crate::store::StoreStats;

#[derive(Serialize)]
pub(super) struct CacheView {
    pub requests: Requests,
    /// Requests that joined an origin request already under way.
    pub collapsed: u64,
    /// Background revalidations started by hits near their object's expiry.
    pub refreshed_ahead: u64,
    /// Slice fills started ahead of a viewer (`read_ahead_slices`).
    pub read_ahead: u64,
    /// Body bytes sent from stored slices, and from slices being filled.
    pub hit_bytes: u64,
    pub miss_bytes: u64,
    /// Body bytes received from origins.
    pub origin_bytes: u64,
    /// `hit_bytes / (hit_bytes + miss_bytes)`, once anything was served.
    pub byte_hit_ratio: Option<f64>,
    /// Origin bytes per body byte served from the cache.
    pub origin_bytes_per_served_byte: Option<f64>,
    pub fills: u64,
    pub fill_failures: u64,
    pub replaced: u64,
    pub store_errors: u64,
    pub store: StoreStats,
    pub origins: Vec<Origin>,
    /// The parent tier of each table: counters, and whether each is up.
    pub parents: Vec<ParentStats>,
    /// The peers of each table: counters, misses, and whether each is up.
    pub peers: Vec<PeerStats>,
    /// `only-if-cached` requests (peers') answered 504.
    pub only_if_cached_misses: u64,
    /// Requests refused with 508 because their `Via` named this node.
    pub loops: u64,
}

#[derive(Serialize)]
pub(super) struct Requests {
    pub hit: u64,
    pub miss: u64,
    pub stale: u64,
    pub revalidated: u64,
    pub pass: u64,
    /// Cached 404 and 410 answers served.
    pub negative: u64,
    /// Answers that could not be had from an origin (502/504, or its 4xx).
    pub origin_failures: u64,
}

/// An origin URL's counters, with its first-byte times as quantiles.
#[derive(Serialize)]
pub(super) struct Origin {
    #[serde(flatten)]
    pub stats: UrlStats,
    pub first_byte_p50_ms: Option<f64>,
    pub first_byte_p99_ms: Option<f64>,
}

/// The cache's figures, when `[[origin]]` tables are configured.
pub(super) fn snapshot(state: &AdminState) -> Option<CacheView> {
    let cache: &Cache = state.cache.as_deref()?;
    let s = &cache.stats;
    let (hit, miss) = (s.hit_bytes.get(), s.miss_bytes.get());
    let served = hit + miss;
    let origin_bytes = s.origin_bytes.get();
    Some(CacheView {
        requests: Requests {
            hit: s.hits.get(),
            miss: s.misses.get(),
            stale: s.stale.get(),
            revalidated: s.revalidated.get(),
            pass: s.passes.get(),
            negative: s.negative_hits.get(),
            origin_failures: s.origin_failures.get(),
        },
        collapsed: s.collapsed.get(),
        refreshed_ahead: s.refreshed_ahead.get(),
        read_ahead: s.read_ahead.get(),
        hit_bytes: hit,
        miss_bytes: miss,
        origin_bytes,
        byte_hit_ratio: (served > 0).then(|| hit as f64 / served as f64),
        origin_bytes_per_served_byte: (served > 0).then(|| origin_bytes as f64 / served as f64),
        fills: s.fills.get(),
        fill_failures: s.fill_failures.get(),
        replaced: s.replaced.get(),
        store_errors: s.store_errors.get(),
        store: cache.store.stats(),
        origins: cache
            .origins
            .stats()
            .into_iter()
            .map(|u| Origin {
                first_byte_p50_ms: quantile_ms(&u, 0.5),
                first_byte_p99_ms: quantile_ms(&u, 0.99),
                stats: u,
            })
            .collect(),
        parents: cache.origins.parent_stats(),
        peers: cache.origins.peer_stats(),
        only_if_cached_misses: s.only_if_cached_misses.get(),
        loops: cache.origins.loops(),
    })
}

/// The upper bound of the bucket holding quantile `q` of an origin's first-byte
/// times, in ms (infinite past the last bound).
fn quantile_ms(u: &UrlStats, q: f64) -> Option<f64> {
    if u.first_byte_count == 0 {
        return None;
    }
    let target = (u.first_byte_count as f64 * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for &(bound, n) in &u.first_byte_buckets {
        seen += n;
        if seen >= target {
            return Some(bound * 1000.0);
        }
    }
    None
}
