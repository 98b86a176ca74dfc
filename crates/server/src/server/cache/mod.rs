//! The pull-through cache: requests under an `[[origin]]` prefix are answered from
//! the slice store ([`crate::store`]), which fills itself from the origin
//! ([`crate::origin`]) on a miss.
//!
//! A miss's life (docs/CACHE.md has the whole model):
//!
//! 1. **Key** (`key`): the normalised path and the query arguments the table
//!    names; nothing else splits the cache.
//! 2. **Head** ([`Cache::open`]): the object's metadata (size, validators, media
//!    type, freshness) from the store's index; fresh, it is a hit. Missing, one
//!    origin request for the slice holding the viewer's first byte brings it in,
//!    however many viewers ask at once (they wait on the same request, and the
//!    head and first bytes reach each as soon as they arrive). Stale, it is
//!    revalidated (`If-None-Match` / `If-Modified-Since`; a 304 refreshes it
//!    without a refetch), in the background within `stale-while-revalidate`, or
//!    served stale within `stale-if-error` when the origin fails. 404 and 410 are
//!    kept for `negative_ttl`. Deadlines are in milliseconds (live playlists live
//!    for a second or less). A 200 without a length (a live segment still being
//!    encoded) is streamed to every viewer as it arrives and stored once whole
//!    (`live`). A response that may not be stored for every viewer (`no-store`,
//!    `private`, `Set-Cookie`, `Vary` on a forwarded field or `*`, a 206 without
//!    the object's size) is passed through to each viewer by a request of its own
//!    (`pass`).
//! 3. **Slices** (`fill`, `serve`): the viewer's ranges map onto aligned slices of
//!    `cache.slice_bytes`. A stored slice is a file, sent exactly as local content
//!    is: `sendfile` or kernel TLS, through the page-cache path (residency check and
//!    fill pool). A missing one is fetched with a `Range` request, once for all its
//!    viewers, who receive its bytes as they arrive; it becomes visible in the store
//!    only once complete and consistent.
//!
//! Origin requests and fills run on the origin runtime; workers only wait on
//! channels, so a worker never waits on the network to an origin.

mod fill;
pub(crate) mod gzip;
pub(crate) mod hold;
mod key;
pub(crate) mod live;
mod meta;
mod pace;
mod pass;
pub(crate) mod serve;
mod table_stats;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use fill::refuse;
pub(crate) use fill::{Failure, FillState};
pub(crate) use key::Key;
pub(crate) use live::Live;
pub(crate) use meta::Uncacheable;
pub(crate) use pace::Pace;
pub(crate) use serve::{ServeError, SliceFiles};

use crate::origin::{OriginError, OriginRequest, Origins, Phase};
use crate::store::{KeyHash, ObjectMeta, Store};
use fill::slice_bounds;
use hold::HoldStats;
use meta::{object_meta, refreshed, same_version, storable};
pub(crate) use table_stats::{Kind, TableStats};

/// How long a key whose answer could not be stored is passed through without
/// asking whether it could be now (Varnish's "hit-for-pass").
const PASS_MEMO: Duration = Duration::from_secs(10);

static LOG_ONCE_STORE: AtomicBool = AtomicBool::new(false);

/// What a response's object came from, for the access log and the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CacheStatus {
    /// Fresh in the store, and every byte sent was stored.
    Hit,
    /// Fetched from the origin for this request (or one it joined): the object's
    /// head, or a slice of the body when the head was stored.
    Miss,
    /// Served past its freshness (revalidating in the background, or the origin
    /// failing within `stale-if-error`).
    Stale,
    /// Stale, and confirmed by the origin (a 304, or the same version).
    Revalidated,
    /// Not storable: passed through from the origin.
    Pass,
}

impl CacheStatus {
    pub(crate) fn label(self) -> &'static str {
        match self {
            CacheStatus::Hit => "HIT",
            CacheStatus::Miss => "MISS",
            CacheStatus::Stale => "STALE",
            CacheStatus::Revalidated => "REVALIDATED",
            CacheStatus::Pass => "PASS",
        }
    }
}

/// The answer to "what is this object?".
#[derive(Clone, Debug)]
pub(crate) enum Opened {
    Object {
        meta: Arc<ObjectMeta>,
        status: CacheStatus,
    },
    /// An answer of unknown length (a live segment still being made), streamed
    /// to every viewer as it arrives, stored once whole (`live`).
    Live(Arc<Live>),
    /// Not storable: ask the origin for this viewer alone.
    Pass(Uncacheable),
    /// The origin answered a status that is passed on uncached (403, 400...).
    Status(u16),
    /// No answer could be had, and nothing stale may be served.
    Failed(Failure),
}

/// A counter several threads add to (one atomic add).
#[derive(Debug, Default)]
pub(crate) struct Tally(AtomicU64);

impl Tally {
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The cache's counters, shared by the workers and the origin runtime: one atomic
/// add per cached response and per fill event, read by the admin endpoint.
#[derive(Default)]
pub(crate) struct CacheStats {
    pub hits: Tally,
    pub misses: Tally,
    /// Requests that joined an origin request already under way (heads and slices).
    pub collapsed: Tally,
    pub stale: Tally,
    pub revalidated: Tally,
    /// Background revalidations a hit started near the end of its object's
    /// lifetime (`refresh_ahead_percent`).
    pub refreshed_ahead: Tally,
    /// Slice fills started ahead of a viewer (`read_ahead_slices`).
    pub read_ahead: Tally,
    pub passes: Tally,
    pub negative_hits: Tally,
    pub origin_failures: Tally,
    /// Body bytes sent from stored slices, and from slices being filled.
    pub hit_bytes: Tally,
    pub miss_bytes: Tally,
    /// Body bytes received from origins for slices and passed-through responses.
    pub origin_bytes: Tally,
    pub fills: Tally,
    pub fill_failures: Tally,
    pub stored_slices: Tally,
    pub unstored_slices: Tally,
    pub replaced: Tally,
    pub store_errors: Tally,
    /// `only-if-cached` requests (peers') answered 504: not all stored and fresh.
    pub only_if_cached_misses: Tally,
}

/// Slice fills under way, by object and slice, with the version each fills and
/// whether a viewer waits on it (a paced fill then reads at full speed).
type Fills = HashMap<(KeyHash, u64), (Arc<ObjectMeta>, watch::Receiver<FillState>, Arc<AtomicBool>)>;

/// The cache, shared by every worker.
pub(crate) struct Cache {
    pub origins: Arc<Origins>,
    pub store: Arc<Store>,
    slice_bytes: u64,
    fills: Mutex<Fills>,
    /// Head requests (first fetches and revalidations) under way, by object.
    opening: Mutex<HashMap<KeyHash, watch::Receiver<Option<Opened>>>>,
    /// Keys passed through lately, and until when.
    passing: Mutex<HashMap<KeyHash, (Instant, Uncacheable)>>,
    /// Answers of unknown length under way or being stored, by object.
    live: Mutex<HashMap<KeyHash, Arc<Live>>>,
    /// Entries in `live`: while it is 0, as it nearly always is, a request does
    /// not take its lock.
    live_count: AtomicUsize,
    pub stats: CacheStats,
    /// Blocking playlist requests (LL-HLS), by table.
    pub holds: Vec<HoldStats>,
    /// Collapsed and origin requests and the newest object served, by table.
    pub tables: Vec<TableStats>,
    /// Playlists compressed for viewers that accept gzip (`gzip`).
    gzipped: gzip::GzipTable,
    /// Short-lived objects under `refresh_ahead_percent` kept fresh by a task of
    /// their own (`keep_fresh`), with the time of their last hit.
    kept_fresh: Mutex<HashMap<KeyHash, i64>>,
}

/// `refresh_ahead_percent` keeps objects fresh on a timer only up to this
/// lifetime (playlists); longer-lived ones are refreshed ahead by their hits.
const KEEP_FRESH_MAX_LIFETIME_MS: i64 = 60_000;

impl Cache {
    pub(crate) fn new(origins: Arc<Origins>, store: Arc<Store>) -> Arc<Cache> {
        Arc::new(Cache {
            slice_bytes: store.slice_bytes(),
            holds: (0..origins.table_count()).map(|_| HoldStats::default()).collect(),
            tables: (0..origins.table_count()).map(|_| TableStats::default()).collect(),
            origins,
            store,
            fills: Mutex::default(),
            opening: Mutex::default(),
            kept_fresh: Mutex::default(),
            passing: Mutex::default(),
            live: Mutex::default(),
            live_count: AtomicUsize::new(0),
            stats: CacheStats::default(),
            gzipped: gzip::GzipTable::default(),
        })
    }

    /// The object `key` names: from the store when fresh, else from the origin
    /// (one request for every viewer asking at once). `want` is the first byte the
    /// viewer asks for: on a miss, the slice holding it comes with the head.
    pub(crate) async fn open(self: &Arc<Cache>, table: usize, key: &Arc<Key>, want: u64) -> Opened {
        self.open_with(table, key, want, None).await
    }

    /// [`Cache::open`] for a background fill (the prefill's): its first slice,
    /// when the head brings it, is read under `pace`.
    pub(crate) async fn open_paced(self: &Arc<Cache>, table: usize, key: &Arc<Key>, pace: &Arc<Pace>) -> Opened {
        self.open_with(table, key, 0, Some(pace)).await
    }

    /// Whether slice `index` of `key` is being filled (in any version).
    pub(crate) fn filling(&self, key: &KeyHash, index: u64) -> bool {
        lock(&self.fills).contains_key(&(*key, index))
    }

    /// Origin requests under way: heads and slice fills.
    pub(crate) fn in_flight(&self) -> usize {
        lock(&self.fills).len() + lock(&self.opening).len()
    }

    async fn open_with(self: &Arc<Cache>, table: usize, key: &Arc<Key>, want: u64, pace: Option<&Arc<Pace>>) -> Opened {
        if let Some(why) = self.passing(&key.hash) {
            self.stats.passes.add(1);
            return Opened::Pass(why);
        }
        let kind = key.kind;
        // Streaming, or being stored: its slices are not all in yet.
        if let Some(live) = self.live_of(key) {
            self.collapsed(table);
            self.tables[table].served(kind, live.stored_at.saturating_mul(1000));
            return Opened::Live(live);
        }
        let now = unix_now_ms();
        let stored = self.store.object(&key.hash).filter(|m| m.key == key.text);
        let opened = match stored {
            Some(m) if now < m.fresh_until_ms => Opened::Object { meta: m, status: CacheStatus::Hit },
            Some(m) if now < m.stale_while_revalidate_until_ms => {
                let _ = self.head(table, key, want, Some(m.clone()), pace.cloned());
                Opened::Object { meta: m, status: CacheStatus::Stale }
            }
            Some(m) => self.wait_head(table, key, want, Some(m), pace).await,
            None => self.wait_head(table, key, want, None, pace).await,
        };
        match &opened {
            // Counted once the response is sent (`count`): a stored head does
            // not make a hit of a body the origin had to send.
            Opened::Object { meta, status } => {
                if meta.status != 200 {
                    self.stats.negative_hits.add(1);
                } else {
                    self.tables[table].served(kind, meta.dated_at_ms);
                    self.refresh_ahead(table, key, meta, *status == CacheStatus::Hit);
                }
            }
            Opened::Pass(why) => {
                self.stats.passes.add(1);
                lock(&self.passing).insert(key.hash, (Instant::now() + PASS_MEMO, *why));
            }
            Opened::Live(live) => self.tables[table].served(kind, live.stored_at.saturating_mul(1000)),
            Opened::Status(_) | Opened::Failed(_) => self.stats.origin_failures.add(1),
        }
        opened
    }

    /// Under `refresh_ahead_percent`, a viewer got the fresh object `m` (`hit`:
    /// from the store). A short-lived object is kept fresh by a task of its own
    /// (`keep_fresh`), started by its first viewer, for as long as viewers keep
    /// asking. For a longer-lived one, a hit within the last
    /// `refresh_ahead_percent` of its lifetime starts its revalidation in the
    /// background, unless an origin request for it is under way. Viewers keep
    /// getting the stored version, which is still fresh, until the answer
    /// replaces it: none waits for the origin, and a herd is not released at once
    /// when it comes (as happens to the viewers that wait on the refresh of an
    /// expired live playlist, who then all ask for the new segment together,
    /// before the origin has sent it).
    fn refresh_ahead(self: &Arc<Cache>, table: usize, key: &Arc<Key>, m: &Arc<ObjectMeta>, hit: bool) {
        let percent = i64::from(self.origins.table(table).refresh_ahead_percent);
        let lifetime = m.fresh_until_ms.saturating_sub(m.dated_at_ms);
        let now = unix_now_ms();
        if percent == 0 || m.status != 200 || lifetime <= 0 || now >= m.fresh_until_ms {
            return;
        }
        if lifetime <= KEEP_FRESH_MAX_LIFETIME_MS {
            // Its task alone refreshes it: a hit in the window would send the
            // refresh at the window's start, once per lifetime less the window.
            if lock(&self.kept_fresh).insert(key.hash, now).is_none() {
                // Weak: the task runs on the runtime the cache owns, and must not
                // keep the cache (its store's threads and files) alive once dropped.
                let (cache, key) = (Arc::downgrade(self), key.clone());
                self.origins.spawn(Cache::keep_fresh(cache, table, key, percent));
            }
            return;
        }
        // Saturating: a lifetime of centuries (a huge max-age) must not overflow.
        let window = lifetime.saturating_mul(percent) / 100;
        if !hit || now < m.fresh_until_ms.saturating_sub(window) || lock(&self.opening).contains_key(&key.hash) {
            return;
        }
        self.stats.refreshed_ahead.add(1);
        let _ = self.head(table, key, 0, Some(m.clone()), None);
    }

    /// Refreshes a short-lived object ahead of its expiry on a timer, for as long
    /// as viewers asked for it within its last two lifetimes. Hits alone do not
    /// suffice: viewers of a live playlist come in bursts (all released by one
    /// refresh), and when none falls in the refresh window the copy expires and
    /// the next burst waits for the origin.
    async fn keep_fresh(cache: Weak<Cache>, table: usize, key: Arc<Key>, percent: i64) {
        let (mut sleep, mut took) = (None, None);
        loop {
            if let Some(d) = sleep.take() {
                tokio::time::sleep(d).await;
            }
            let Some(this) = cache.upgrade() else { return };
            match this.keep_fresh_step(table, &key, percent, &mut took).await {
                Some(d) => sleep = Some(d),
                None => {
                    lock(&this.kept_fresh).remove(&key.hash);
                    return;
                }
            }
        }
    }

    /// One look at a kept-fresh object: revalidates it when due; returns how long
    /// to sleep before the next look, or `None` when it is no longer kept fresh.
    /// `took` is how long the last refresh took (ms). The first refresh is due at
    /// the start of the refresh window; each next one that long before expiry
    /// (within the window), so its answer arrives about when the copy expires and
    /// the origin is asked about once per lifetime, not once per lifetime less the
    /// window.
    async fn keep_fresh_step(
        self: &Arc<Cache>,
        table: usize,
        key: &Arc<Key>,
        percent: i64,
        took: &mut Option<i64>,
    ) -> Option<Duration> {
        let m = self.store.object(&key.hash).filter(|m| m.key == key.text && m.status == 200)?;
        let lifetime = m.fresh_until_ms.saturating_sub(m.dated_at_ms);
        if lifetime <= 0 || lifetime > KEEP_FRESH_MAX_LIFETIME_MS {
            return None;
        }
        let window = lifetime.saturating_mul(percent) / 100;
        let lead = |took: &Option<i64>| took.map_or(window, |t| t.clamp(1, window.max(1)));
        let due = m.fresh_until_ms.saturating_sub(lead(took));
        let now = unix_now_ms();
        if now < due {
            // Looked at again when due: another refresh may have replaced it.
            return Some(Duration::from_millis((due - now) as u64));
        }
        let last_hit = lock(&self.kept_fresh).get(&key.hash).copied().unwrap_or(i64::MIN);
        if last_hit < now.saturating_sub(lifetime.saturating_mul(2)) {
            return None;
        }
        if !lock(&self.opening).contains_key(&key.hash) {
            self.stats.refreshed_ahead.add(1);
        }
        let asked = Instant::now();
        let mut answer = self.head(table, key, 0, Some(m.clone()), None);
        let _ = answer.wait_for(Option::is_some).await;
        *took = Some(i64::try_from(asked.elapsed().as_millis()).unwrap_or(i64::MAX));
        // A refresh that left it due at once (an answer already old, or none): not
        // retried here, so the origin is never asked in a loop.
        let n = self.store.object(&key.hash).filter(|n| !Arc::ptr_eq(n, &m))?;
        (unix_now_ms() < n.fresh_until_ms.saturating_sub(lead(took))).then_some(Duration::ZERO)
    }

    /// Whether the slice holding byte `offset` of the object `meta` describes is
    /// in the index (a byte past the end needs none): no look at its file.
    pub(crate) fn has_slice(&self, key: &Key, meta: &ObjectMeta, offset: u64) -> bool {
        offset >= meta.size || self.store.indexed(&key.hash, meta, offset / self.slice_bytes)
    }

    /// Whether every slice holding bytes `first..first + len` of the object
    /// `meta` describes is in the index.
    pub(crate) fn has_range(&self, key: &Key, meta: &ObjectMeta, first: u64, len: u64) -> bool {
        if len == 0 {
            return true;
        }
        let last = (first + len - 1).min(meta.size.saturating_sub(1));
        (first / self.slice_bytes..=last / self.slice_bytes).all(|i| self.has_slice(key, meta, i * self.slice_bytes))
    }

    /// The object `key` names, when it is stored and fresh (for `only-if-cached`:
    /// no origin request, no revalidation).
    pub(crate) fn stored_fresh(&self, key: &Key) -> Option<Arc<ObjectMeta>> {
        self.store.object(&key.hash).filter(|m| m.key == key.text && unix_now_ms() < m.fresh_until_ms)
    }

    /// Counts a response from an object under the status it was logged with.
    pub(crate) fn count(&self, status: CacheStatus) {
        match status {
            CacheStatus::Hit => self.stats.hits.add(1),
            CacheStatus::Miss => self.stats.misses.add(1),
            CacheStatus::Stale => self.stats.stale.add(1),
            CacheStatus::Revalidated => self.stats.revalidated.add(1),
            CacheStatus::Pass => self.stats.passes.add(1),
        }
    }

    /// A request joined an origin request already under way.
    pub(super) fn collapsed(&self, table: usize) {
        self.stats.collapsed.add(1);
        self.tables[table].collapsed.add(1);
    }

    fn passing(&self, key: &KeyHash) -> Option<Uncacheable> {
        let mut passing = lock(&self.passing);
        match passing.get(key) {
            Some(&(until, why)) if Instant::now() < until => Some(why),
            Some(_) => {
                passing.remove(key);
                None
            }
            None => None,
        }
    }

    async fn wait_head(
        self: &Arc<Cache>,
        table: usize,
        key: &Arc<Key>,
        want: u64,
        old: Option<Arc<ObjectMeta>>,
        pace: Option<&Arc<Pace>>,
    ) -> Opened {
        let mut rx = self.head(table, key, want, old, pace.cloned());
        loop {
            if let Some(opened) = rx.borrow_and_update().clone() {
                return opened;
            }
            if rx.changed().await.is_err() {
                return Opened::Failed(Failure::BadResponse("the origin request was lost".into()));
            }
        }
    }

    /// The head request of `key` under way, or a new one. `old` is the stored,
    /// stale metadata to revalidate, if any; `pace`, the cap of a background
    /// fill's first slice.
    fn head(
        self: &Arc<Cache>,
        table: usize,
        key: &Arc<Key>,
        want: u64,
        old: Option<Arc<ObjectMeta>>,
        pace: Option<Arc<Pace>>,
    ) -> watch::Receiver<Option<Opened>> {
        let mut opening = lock(&self.opening);
        if let Some(rx) = opening.get(&key.hash) {
            self.collapsed(table);
            return rx.clone();
        }
        if let Some(live) = self.live_of(key) {
            self.collapsed(table);
            return watch::channel(Some(Opened::Live(live))).1;
        }
        // The request this viewer would have joined may have ended between its
        // look at the store and this lock: a fill stores its answer before it
        // leaves `opening`, so what is fresh in the store now is that answer
        // (with a lifetime of a second, a herd asking for a playlist as it expires
        // would otherwise make a few requests instead of one).
        if let Some(m) = self.store.object(&key.hash).filter(|m| m.key == key.text) {
            let is_old = old.as_ref().is_some_and(|o| Arc::ptr_eq(o, &m));
            if !is_old && unix_now_ms() < m.fresh_until_ms {
                self.collapsed(table);
                return watch::channel(Some(Opened::Object { meta: m, status: CacheStatus::Miss })).1;
            }
        }
        let (tx, rx) = watch::channel(None);
        opening.insert(key.hash, rx.clone());
        drop(opening);
        let (cache, key) = (self.clone(), key.clone());
        self.origins.spawn(async move {
            let opened = cache.fetch_head(table, &key, want, old.as_deref(), pace).await;
            let _ = tx.send(Some(opened));
            lock(&cache.opening).remove(&key.hash);
        });
        rx
    }

    /// Asks the origin for the slice holding byte `want` (conditionally, when `old`
    /// is there) and makes the object's metadata of the answer.
    async fn fetch_head(
        self: &Arc<Cache>,
        table: usize,
        key: &Arc<Key>,
        want: u64,
        old: Option<&ObjectMeta>,
        pace: Option<Arc<Pace>>,
    ) -> Opened {
        let s = self.slice_bytes;
        let want = old.map_or(want, |m| want.min(m.size.saturating_sub(1)));
        let index = want / s;
        let mut req = OriginRequest {
            path: key.origin_path.clone(),
            query: key.origin_query.clone(),
            via: key.via.clone(),
            range: Some((index * s, index * s + s - 1)),
            peers: true,
            hold: key.hold,
            ..OriginRequest::default()
        };
        if let Some(m) = old.filter(|m| m.status == 200) {
            req.if_none_match = m.etag.clone();
            req.if_modified_since = m.last_modified.clone();
        }
        let t = self.origins.table(table);
        let kind = key.kind;
        self.tables[table].origin_request(kind);
        // A blocking playlist request: held by the origin, timed and counted.
        let mut hold = key.hold.then(|| self.holds[table].start());
        let fetched = self.origins.fetch(table, &req).await;
        if let (Some(h), Err(OriginError::Timeout(Phase::FirstByte))) = (&mut hold, &fetched) {
            h.timed_out();
        }
        drop(hold);
        let mut response = match fetched {
            Ok(r) => r,
            Err(e) => return self.failed(old, Failure::origin(e)),
        };
        let now = unix_now_ms();
        let now_secs = now.div_euclid(1000);
        let status = response.status;
        let (meta, body) = match status {
            304 if old.is_some() => {
                let m = refreshed(old.expect("checked"), &response.headers, now, t);
                (m, None)
            }
            206 | 416 => {
                let cr = match response.content_range() {
                    Ok(Some(cr)) => cr,
                    Ok(None) => {
                        return self.failed(old, refuse(&mut response, format!("{status} without Content-Range")))
                    }
                    Err(e) => return self.failed(old, refuse(&mut response, e.to_string())),
                };
                let Some(total) = cr.total else {
                    return Opened::Pass(Uncacheable::NoLength);
                };
                if let Err(why) = storable(&response.headers, now_secs, &t.forward_headers) {
                    return Opened::Pass(why);
                }
                let m = object_meta(&key.text, 200, total, &response.headers, now, t);
                let mut body = (status == 206 && total > 0).then_some(response);
                if let Some(r) = &mut body {
                    if cr.first != Some(slice_bounds(index, s, total)) {
                        let why = "a Content-Range other than the slice asked for".to_string();
                        return self.failed(old, refuse(r, why));
                    }
                }
                (m, body)
            }
            200 => {
                if let Err(why) = storable(&response.headers, now_secs, &t.forward_headers) {
                    return Opened::Pass(why);
                }
                let len = meta::field(&response.headers, http::header::CONTENT_LENGTH)
                    .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok());
                // No length: still being made (a live segment). Streamed to
                // every viewer, stored once whole.
                let Some(len) = len else {
                    self.tables[table].new_object(kind);
                    return self.start_live(table, key, response, now);
                };
                if len > s {
                    return Opened::Pass(Uncacheable::NoRanges);
                }
                (object_meta(&key.text, 200, len, &response.headers, now, t), (len > 0).then_some(response))
            }
            404 | 410 => (object_meta(&key.text, status, 0, &response.headers, now, t), None),
            400..=499 => return Opened::Status(status),
            _ => return self.failed(old, Failure::BadResponse(format!("status {status}"))),
        };
        // Same version as the stale copy: its slices stay, the answer only refreshes.
        let status = match old {
            Some(o) if o.size == meta.size && o.status == meta.status && same_version(o, &response_headers(&meta)) => {
                CacheStatus::Revalidated
            }
            _ => CacheStatus::Miss,
        };
        if status == CacheStatus::Miss && meta.status == 200 {
            self.tables[table].new_object(kind);
        }
        let meta = Arc::new(meta);
        let publish = || {
            if let Err(e) = self.store.put_object(&key.hash, (*meta).clone()) {
                // Still served: its slices fill into memory, passed through.
                self.note_store_error(&e);
            }
        };
        match body {
            // The slice this answer brings, unless stored already (a refresh of
            // the same version): its fill is registered before the object is
            // published (see `slice_fill_publishing`).
            Some(response) => {
                let index = if response.status == 200 { 0 } else { index };
                if self.store.slice(&key.hash, &meta, index).is_none() {
                    let background = pace.is_some();
                    let _ = self.slice_fill_publishing(table, key, &meta, index, Some(response), pace, Some(&publish));
                    if !background {
                        self.read_ahead(table, key, &meta, index, false);
                    }
                } else {
                    publish();
                }
            }
            None => publish(),
        }
        Opened::Object { meta, status }
    }

    /// The origin failed: the stale copy if `stale-if-error` allows it, else the failure.
    fn failed(&self, old: Option<&ObjectMeta>, failure: Failure) -> Opened {
        tracing::debug!("origin: {failure}");
        match old {
            Some(m) if unix_now_ms() < m.stale_if_error_until_ms => {
                Opened::Object { meta: Arc::new(m.clone()), status: CacheStatus::Stale }
            }
            _ => Opened::Failed(failure),
        }
    }
}

/// The validator fields of `meta` as a header map, to compare it with another.
fn response_headers(meta: &ObjectMeta) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    for (name, v) in [(http::header::ETAG, &meta.etag), (http::header::LAST_MODIFIED, &meta.last_modified)] {
        if let Some(v) = v.as_ref().and_then(|v| http::HeaderValue::from_bytes(v).ok()) {
            h.insert(name, v);
        }
    }
    h
}

/// Milliseconds since the Unix epoch.
pub(crate) fn unix_now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
