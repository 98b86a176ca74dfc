//! Pre-positioning (`linerate prefill`, `POST /prefill` on the admin endpoint):
//! a manifest of paths ranked by expected popularity is filled into the slice
//! store ahead of demand, within `prefill.window` (local time), at most at
//! `prefill.rate`, and behind every viewer miss (docs/PREFILL.md).
//!
//! One task on the origin runtime fills one title at a time, in the manifest's
//! order, slice by slice through the very fill path of viewer misses
//! ([`Cache::open_paced`], [`Cache::slice_fill`]): a slice a viewer is fetching
//! is joined, not fetched twice; versions are checked; a slice is stored as a
//! viewer's fill stores it. The origin body is read under a token bucket
//! ([`Pace`]), so the origin sends at the capped rate; a viewer that joins a
//! slice the filler is reading lifts the cap for that slice. No slice is begun
//! while `prefill.busy_fills` viewer origin requests are under way.
//!
//! The manifest and each title's state are saved in `prefill.state_dir`
//! (`state`): after a restart the job goes on, and a slice already in the store
//! is skipped without an origin request. The titles of an unexpired manifest are
//! pinned in the store ([`crate::store::Store::set_pins`]): evicted after every
//! other slice.

mod manifest;
mod state;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::config::{Prefill as PrefillConfig, Window};
use crate::server::cache::{unix_now_ms, Cache, Key, Opened, Pace};
pub(crate) use manifest::Manifest;
pub(crate) use state::{Phase, Progress};
use state::{Saved, Title, TitleState};

/// How often a slice fill that failed is tried before its title is given up.
const TRIES: u32 = 3;
/// How long the filler waits before looking again at a busy origin.
const YIELD_FOR: Duration = Duration::from_millis(20);
/// Failures listed in the progress at most.
const MAX_ERRORS: usize = 20;

/// A manifest's title, resolved to its table and cache key.
struct Entry {
    table: usize,
    key: Arc<Key>,
}

/// A submitted manifest being filled.
struct Job {
    gen: u64,
    entries: Vec<Entry>,
}

struct Inner {
    saved: Option<Saved>,
    job: Option<Arc<Job>>,
    phase: Phase,
    current: Option<usize>,
    /// Bytes of the current title's slices known stored.
    current_bytes: u64,
}

/// The filler, shared by the admin endpoint (submit, progress) and its task.
pub(crate) struct Prefiller {
    cache: Arc<Cache>,
    window: Option<Window>,
    rate: u64,
    busy_fills: usize,
    dir: PathBuf,
    pace: Arc<Pace>,
    inner: Mutex<Inner>,
    /// The job generation: a new manifest bumps it, and the task drops the old.
    gen: AtomicU64,
    wake: Notify,
}

impl Prefiller {
    /// The filler of `cache` with `config`, its state directory made; picks up a
    /// saved job and starts its task on the origin runtime.
    pub(crate) fn start(
        cache: Arc<Cache>,
        config: &PrefillConfig,
        first_cache_dir: PathBuf,
    ) -> anyhow::Result<Arc<Prefiller>> {
        let dir = config.state_dir.clone().unwrap_or(first_cache_dir);
        std::fs::create_dir_all(&dir).map_err(|e| anyhow::anyhow!("prefill.state_dir {}: {e}", dir.display()))?;
        let p = Arc::new(Prefiller {
            pace: Arc::new(Pace::new(config.rate.0)),
            cache,
            window: config.window(),
            rate: config.rate.0,
            busy_fills: config.busy_fills,
            dir,
            inner: Mutex::new(Inner { saved: None, job: None, phase: Phase::Idle, current: None, current_bytes: 0 }),
            gen: AtomicU64::new(0),
            wake: Notify::new(),
        });
        match Saved::load(&p.dir) {
            Ok(Some(saved)) if saved.manifest.expires > unix_now() => match p.resolve(&saved.manifest) {
                Ok(entries) => {
                    let left = saved.titles.iter().filter(|t| t.state == TitleState::Pending).count();
                    tracing::info!(titles = entries.len(), left, "prefill: resuming the saved manifest");
                    p.install(saved, entries);
                }
                Err(e) => tracing::warn!("prefill: the saved manifest no longer fits the configuration ({e}); dropped"),
            },
            Ok(Some(_)) => tracing::info!("prefill: the saved manifest has expired"),
            Ok(None) => {}
            Err(e) => tracing::warn!("prefill: cannot read the saved job: {e}"),
        }
        let task = p.clone();
        p.cache.origins.spawn(async move { task.run().await });
        Ok(p)
    }

    /// Takes a new manifest (`text`), replacing any job: its titles are pinned
    /// and filled from the first. Errors name the line and the problem.
    pub(crate) fn submit(&self, text: &str) -> Result<Progress, String> {
        let manifest = Manifest::parse(text, unix_now())?;
        let entries = self.resolve(&manifest)?;
        let saved = Saved::new(manifest);
        saved.save(&self.dir).map_err(|e| format!("cannot save the job in {}: {e}", self.dir.display()))?;
        tracing::info!(titles = entries.len(), expires = saved.manifest.expires, "prefill: manifest submitted");
        self.install(saved, entries);
        Ok(self.progress())
    }

    fn install(&self, saved: Saved, entries: Vec<Entry>) {
        let gen = self.gen.fetch_add(1, Ordering::SeqCst) + 1;
        self.cache.store.set_pins(entries.iter().enumerate().map(|(i, e)| (e.key.hash, i as u32)).collect());
        let mut inner = lock(&self.inner);
        inner.saved = Some(saved);
        inner.job = Some(Arc::new(Job { gen, entries }));
        inner.phase = Phase::Filling;
        inner.current = None;
        inner.current_bytes = 0;
        drop(inner);
        self.wake.notify_one();
    }

    /// Each path's table and key: every one must be under an `[[origin]]` prefix.
    fn resolve(&self, m: &Manifest) -> Result<Vec<Entry>, String> {
        let origins = &self.cache.origins;
        m.paths
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let (table, rest) = origins
                    .route(p.as_bytes())
                    .ok_or_else(|| format!("entry {} ({p}) is under no [[origin]] prefix", i + 1))?;
                let key = Key::new(p.as_bytes(), rest, None, &origins.table(table).key_args);
                Ok(Entry { table, key: Arc::new(key) })
            })
            .collect()
    }

    /// Where the job is.
    pub(crate) fn progress(&self) -> Progress {
        let inner = lock(&self.inner);
        let mut p = Progress {
            state: inner.phase,
            window: self.window.map(|w| w.to_string()),
            rate_bits_per_second: self.rate,
            titles_total: 0,
            titles_done: 0,
            titles_failed: 0,
            bytes_done: inner.current_bytes,
            bytes_known: 0,
            bytes_fetched: self.pace.bytes.get(),
            current: None,
            submitted: None,
            expires: None,
            errors: Vec::new(),
        };
        if let Some(saved) = &inner.saved {
            p.titles_total = saved.titles.len();
            p.submitted = Some(saved.manifest.submitted);
            p.expires = Some(saved.manifest.expires);
            p.current = inner.current.map(|i| (i + 1, saved.manifest.paths[i].clone()));
            for (i, t) in saved.titles.iter().enumerate() {
                p.bytes_known += t.bytes.unwrap_or(0);
                match t.state {
                    TitleState::Done => {
                        p.titles_done += 1;
                        p.bytes_done += t.bytes.unwrap_or(0);
                    }
                    TitleState::Failed => {
                        p.titles_failed += 1;
                        if p.errors.len() < MAX_ERRORS {
                            let why = t.error.clone().unwrap_or_default();
                            p.errors.push((i + 1, saved.manifest.paths[i].clone(), why));
                        }
                    }
                    TitleState::Pending => {}
                }
            }
        }
        p
    }

    /// The task: fills the job there is, then waits for the next or for the
    /// manifest's end (when its pins go).
    async fn run(self: Arc<Self>) {
        loop {
            let (job, expires) = {
                let inner = lock(&self.inner);
                (inner.job.clone(), inner.saved.as_ref().map(|s| s.manifest.expires))
            };
            let Some(job) = job else {
                self.wake.notified().await;
                continue;
            };
            if let Err(Stop::Superseded) = self.fill(&job).await {
                continue;
            }
            if self.is_current(&job) && lock(&self.inner).phase != Phase::Expired {
                self.set_phase(&job, Phase::Done);
                let left = expires.map_or(0, |e| e - unix_now()).max(0) as u64;
                tokio::select! {
                    _ = self.wake.notified() => continue,
                    _ = tokio::time::sleep(Duration::from_secs(left)) => {}
                }
            }
            if self.is_current(&job) {
                self.expire(&job);
                self.wake.notified().await;
            }
        }
    }

    async fn fill(&self, job: &Job) -> Result<(), Stop> {
        for (i, e) in job.entries.iter().enumerate() {
            let pending = lock(&self.inner).saved.as_ref().is_some_and(|s| s.titles[i].state == TitleState::Pending);
            if !pending {
                continue;
            }
            {
                let mut inner = lock(&self.inner);
                inner.current = Some(i);
                inner.current_bytes = 0;
            }
            let result = self.fill_title(job, i, e).await;
            let title = match result {
                Ok(size) => Title { state: TitleState::Done, bytes: Some(size), error: None },
                Err(Stop::Failed(why)) => {
                    tracing::warn!(path = %String::from_utf8_lossy(&e.key.text), "prefill: title not filled: {why}");
                    let bytes = lock(&self.inner).saved.as_ref().and_then(|s| s.titles[i].bytes);
                    Title { state: TitleState::Failed, bytes, error: Some(why) }
                }
                Err(stop) => return Err(stop),
            };
            let saved = {
                let mut inner = lock(&self.inner);
                if !self.is_current(job) {
                    return Err(Stop::Superseded);
                }
                inner.current = None;
                inner.current_bytes = 0;
                let saved = inner.saved.as_mut().expect("a job has its state");
                saved.titles[i] = title;
                saved.clone()
            };
            if let Err(e) = saved.save(&self.dir) {
                tracing::warn!("prefill: cannot save progress in {}: {e}", self.dir.display());
            }
        }
        Ok(())
    }

    /// Fills title `i`: its head, then each slice the store lacks. Returns its size.
    async fn fill_title(&self, job: &Job, i: usize, e: &Entry) -> Result<u64, Stop> {
        self.turn(job).await?;
        let meta = match self.cache.open_paced(e.table, &e.key, &self.pace).await {
            Opened::Object { meta, .. } if meta.status == 200 => meta,
            Opened::Object { meta, .. } => return Err(Stop::Failed(format!("the origin answered {}", meta.status))),
            Opened::Pass(why) => {
                return Err(Stop::Failed(format!("not storable ({why:?}): passed through to viewers")))
            }
            Opened::Status(s) => return Err(Stop::Failed(format!("the origin answered {s}"))),
            Opened::Failed(f) => return Err(Stop::Failed(f.to_string())),
            // An answer without a length: streamed (unpaced) and stored whole.
            Opened::Live(live) => {
                let len = live.complete().await.map_err(|f| Stop::Failed(f.to_string()))?;
                if let Some(saved) = lock(&self.inner).saved.as_mut() {
                    saved.titles[i].bytes = Some(len);
                }
                return Ok(len);
            }
        };
        if let Some(saved) = lock(&self.inner).saved.as_mut() {
            saved.titles[i].bytes = Some(meta.size);
        }
        let s = self.cache.store.slice_bytes();
        for index in 0..meta.size.div_ceil(s) {
            let len = (meta.size - index * s).min(s);
            let mut tries = 0;
            while self.cache.store.slice(&e.key.hash, &meta, index).is_none() {
                // One under way (the head's, or a viewer's) is joined at once:
                // it costs the origin nothing more.
                if !self.cache.filling(&e.key.hash, index) {
                    self.turn(job).await?;
                    // A fill that ended while the filler waited may have brought it.
                    if self.cache.store.slice(&e.key.hash, &meta, index).is_some() {
                        break;
                    }
                }
                let (mut rx, _) = self.cache.slice_fill(e.table, &e.key, &meta, index, None, Some(self.pace.clone()));
                let end = loop {
                    if let Some(end) = rx.borrow_and_update().end.clone() {
                        break end;
                    }
                    if rx.changed().await.is_err() {
                        break Err(crate::server::cache::Failure::BadResponse("the fill stopped".into()));
                    }
                };
                match end {
                    // Stored, or filled into memory when the store refused it.
                    Ok(()) => break,
                    Err(f) => {
                        tries += 1;
                        if tries >= TRIES {
                            return Err(Stop::Failed(format!("slice {index}: {f}")));
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
            lock(&self.inner).current_bytes += len;
        }
        Ok(meta.size)
    }

    /// Waits until the filler may begin an origin request: the job still
    /// current and unexpired, the window open, viewers' origin requests fewer
    /// than `busy_fills`.
    async fn turn(&self, job: &Job) -> Result<(), Stop> {
        loop {
            if !self.is_current(job) {
                return Err(Stop::Superseded);
            }
            // A new process serves (binary upgrade) and has taken the job over.
            if self.cache.store.frozen() {
                self.set_phase(job, Phase::Idle);
                std::future::pending::<()>().await;
            }
            let expired = lock(&self.inner).saved.as_ref().is_none_or(|s| s.manifest.expires <= unix_now());
            if expired {
                self.expire(job);
                return Err(Stop::Superseded);
            }
            if let Some(w) = self.window {
                if !w.contains(local_minute()) {
                    self.set_phase(job, Phase::WaitingForWindow);
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = self.wake.notified() => self.wake.notify_one(),
                    }
                    continue;
                }
            }
            if self.cache.in_flight() >= self.busy_fills {
                self.set_phase(job, Phase::Yielding);
                tokio::time::sleep(YIELD_FOR).await;
                continue;
            }
            self.set_phase(job, Phase::Filling);
            return Ok(());
        }
    }

    fn is_current(&self, job: &Job) -> bool {
        self.gen.load(Ordering::SeqCst) == job.gen
    }

    fn set_phase(&self, job: &Job, phase: Phase) {
        let mut inner = lock(&self.inner);
        if self.is_current(job) {
            inner.phase = phase;
        }
    }

    /// The manifest's lifetime is over: its titles are no longer pinned.
    fn expire(&self, job: &Job) {
        let mut inner = lock(&self.inner);
        if self.is_current(job) && inner.phase != Phase::Expired {
            inner.phase = Phase::Expired;
            inner.current = None;
            inner.job = None;
            self.cache.store.set_pins(Default::default());
            tracing::info!("prefill: the manifest has expired; its titles are no longer pinned");
        }
    }
}

/// Why the filler stopped a title.
enum Stop {
    /// A new manifest replaced the job, or it expired.
    Superseded,
    Failed(String),
}

/// The minute of the day, local time (`TZ`, else /etc/localtime).
fn local_minute() -> u16 {
    use chrono::Timelike;
    let t = chrono::Local::now();
    (t.hour() * 60 + t.minute()) as u16
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Seconds since the Unix epoch (a manifest's expiry).
fn unix_now() -> i64 {
    unix_now_ms().div_euclid(1000)
}
