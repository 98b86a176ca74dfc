//! `/metrics`: the workers' counters summed at scrape time, in the Prometheus
//! (OpenMetrics) text format written by prometheus-client.

use std::sync::Arc;

use linerate_http::Status;
use linerate_urlauth::Verdict;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::AdminState;
use crate::counters::{ConnState, ErrorKind, Histogram, Refusal, TransportKind, WorkerCounters};

pub(super) fn registry(state: Arc<AdminState>) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(Workers(state)));
    r
}

#[derive(Debug)]
struct Workers(Arc<AdminState>);

impl std::fmt::Debug for AdminState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminState").field("workers", &self.workers.len()).finish()
    }
}

/// One sample of a counter family: labels and value.
fn counter(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(&[(&str, &str)], u64)],
) -> Result<(), std::fmt::Error> {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in samples {
        if labels.is_empty() {
            m.encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(v, None)?;
        } else {
            let labels: Vec<(&str, &str)> = labels.to_vec();
            m.encode_family(&labels)?.encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(v, None)?;
        }
    }
    Ok(())
}

fn gauge(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(Vec<(&str, String)>, i64)],
) -> Result<(), std::fmt::Error> {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in samples {
        if labels.is_empty() {
            m.encode_gauge(v)?;
        } else {
            m.encode_family(labels)?.encode_gauge(v)?;
        }
    }
    Ok(())
}

fn histogram(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    workers: &[Arc<WorkerCounters>],
    pick: impl Fn(&WorkerCounters) -> &Histogram,
) -> Result<(), std::fmt::Error> {
    let mut acc = (0.0, 0u64, Vec::new());
    let mut bounds: &[f64] = &[];
    for w in workers {
        let h = pick(w);
        bounds = h.bounds();
        h.accumulate(&mut acc);
    }
    // Each bucket's own count: prometheus-client adds them up into the cumulative
    // `_bucket` lines the format wants (adding them here too counted each twice).
    let buckets: Vec<(f64, u64)> = bounds
        .iter()
        .chain(std::iter::once(&f64::INFINITY))
        .enumerate()
        .map(|(i, &bound)| (bound, acc.2.get(i).copied().unwrap_or(0)))
        .collect();
    let mut m = e.encode_descriptor(name, help, None, MetricType::Histogram)?;
    m.encode_histogram::<prometheus_client::encoding::NoLabelSet>(acc.0, acc.1, &buckets, None)
}

impl Workers {
    /// The page-cache and disk families (see `admin::cold`).
    fn encode_cold(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let c = super::cold::snapshot(&self.0);
        counter(
            e,
            "linerate_page_cache_bytes",
            "Body bytes by where they were when about to be sent: in the page cache (resident) or read by a fill first (filled).",
            &[(&[("source", "resident")], c.resident_bytes), (&[("source", "filled")], c.filled_bytes)],
        )?;
        histogram(
            e,
            "linerate_fill_wait_seconds",
            "How long connections waited for a disk fill, per window.",
            &self.0.workers,
            |w| &w.cold.fill_wait_seconds,
        )?;
        gauge(e, "linerate_fill_queue_depth", "Disk fills queued or running.", &[(vec![], c.fill_queue_depth)])?;
        counter(e, "linerate_fill_readahead", "Read-ahead fills queued.", &[(&[], c.readahead_fills)])?;
        if let Some(a) = &c.admission {
            counter(
                e,
                "linerate_page_cache_dropped_bytes",
                "Bytes of ranges of files outside the kept set advised out of the page cache after sending (fill.admission).",
                &[(&[], a.dropped_bytes)],
            )?;
            gauge(
                e,
                "linerate_page_cache_kept_files",
                "Files in the admission policy's kept set: the most-demanded that fit in fill.cache_bytes.",
                &[(vec![], a.kept_files as i64)],
            )?;
            gauge(
                e,
                "linerate_page_cache_kept_bytes",
                "Bytes of the files in the kept set.",
                &[(vec![], a.kept_bytes as i64)],
            )?;
            gauge(
                e,
                "linerate_page_cache_budget_bytes",
                "The page cache the kept set may fill (fill.cache_bytes, or its auto value).",
                &[(vec![], a.cache_bytes as i64)],
            )?;
        }
        type Pick = fn(&super::cold::Device) -> u64;
        let per_device: [(&str, &str, Pick); 6] = [
            ("linerate_fills", "Disk fills done, by device.", |d| d.fills),
            ("linerate_fill_bytes", "Bytes brought into the page cache by fills, by device.", |d| d.fill_bytes),
            ("linerate_fill_errors", "Fills that failed (EIO...), by device.", |d| d.fill_errors),
            ("linerate_fill_timeouts", "Connection waits that passed fill.timeout, by device.", |d| d.fill_timeouts),
            ("linerate_fill_overloads", "Demand fills refused because the device's queue was full.", |d| {
                d.fill_overloads
            }),
            ("linerate_disk_read_bytes", "Bytes read from each disk (/proc/diskstats), by anyone.", |d| d.read_bytes),
        ];
        for (name, help, pick) in per_device {
            let labels: Vec<[(&str, &str); 1]> = c.devices.iter().map(|d| [("device", d.device.as_str())]).collect();
            let samples: Vec<(&[(&str, &str)], u64)> =
                c.devices.iter().zip(&labels).map(|(d, l)| (&l[..], pick(d))).collect();
            counter(e, name, help, &samples)?;
        }
        let m = &c.memory;
        let mut f = e.encode_descriptor(
            "linerate_memory_pressure_seconds",
            "Time in which some (or all non-idle) tasks waited for memory (/proc/pressure/memory).",
            None,
            MetricType::Counter,
        )?;
        for (kind, us) in [("some", m.pressure_some_us), ("full", m.pressure_full_us)] {
            f.encode_family(&[("kind", kind)])?
                .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&(us as f64 / 1e6), None)?;
        }
        counter(
            e,
            "linerate_memory_direct_reclaim",
            "Direct reclaim in the kernel (/proc/vmstat): stalls, pages scanned, pages reclaimed.",
            &[
                (&[("counter", "allocstall")], m.allocstall),
                (&[("counter", "pgscan_direct")], m.pgscan_direct),
                (&[("counter", "pgsteal_direct")], m.pgsteal_direct),
            ],
        )?;
        Ok(())
    }
}

impl Workers {
    /// The prefill job's families, with the cache (docs/PREFILL.md).
    fn encode_prefill(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use crate::server::prefill::Phase;
        let Some(p) = &self.0.prefill else { return Ok(()) };
        let p = p.progress();
        counter(
            e,
            "linerate_prefill_bytes",
            "Origin body bytes the prefill job read (under prefill.rate).",
            &[(&[], p.bytes_fetched)],
        )?;
        gauge(
            e,
            "linerate_prefill_titles",
            "Titles of the prefill manifest, by state (done, failed, total).",
            &[
                (vec![("state", "done".to_string())], p.titles_done as i64),
                (vec![("state", "failed".to_string())], p.titles_failed as i64),
                (vec![("state", "total".to_string())], p.titles_total as i64),
            ],
        )?;
        let states: Vec<(Vec<(&str, String)>, i64)> =
            Phase::ALL.iter().map(|s| (vec![("state", s.label().to_string())], i64::from(*s == p.state))).collect();
        gauge(e, "linerate_prefill_state", "1 for what the prefill job is doing, 0 for the others.", &states)
    }

    /// Blocking playlist requests (LL-HLS) held by each table's origin.
    fn encode_holds(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(cache) = self.0.cache.as_deref() else { return Ok(()) };
        let labels: Vec<Vec<(&str, String)>> = (0..cache.holds.len())
            .map(|i| vec![("table", i.to_string()), ("prefix", cache.origins.table(i).prefix.clone())])
            .collect();
        let mut m = e.encode_descriptor(
            "linerate_cache_holds_in_progress",
            "Blocking playlist requests (_HLS_msn, _HLS_part) held by the origin now.",
            None,
            MetricType::Gauge,
        )?;
        for (l, h) in labels.iter().zip(&cache.holds) {
            m.encode_family(l)?.encode_gauge(&h.in_progress.load(std::sync::atomic::Ordering::Relaxed))?;
        }
        let mut m = e.encode_descriptor(
            "linerate_cache_hold_seconds",
            "Time from a blocking playlist request sent to the origin to its answer (or hold_timeout).",
            None,
            MetricType::Histogram,
        )?;
        for (l, h) in labels.iter().zip(&cache.holds) {
            m.encode_family(l)?.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                h.sum_us.get() as f64 / 1e6,
                h.count.get(),
                &h.buckets(),
                None,
            )?;
        }
        let mut m = e.encode_descriptor(
            "linerate_cache_hold_timeouts",
            "Blocking playlist requests the origin held past hold_timeout: their viewers got 504.",
            None,
            MetricType::Counter,
        )?;
        for (l, h) in labels.iter().zip(&cache.holds) {
            m.encode_family(l)?
                .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&h.timeouts.get(), None)?;
        }
        Ok(())
    }

    /// Per `[[origin]]` table, playlists and segments apart: what a live channel's
    /// operator watches (docs/CACHE.md, "Live").
    fn encode_tables(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use crate::server::cache::Kind;
        let Some(cache) = self.0.cache.as_deref() else { return Ok(()) };
        let now = crate::server::cache::unix_now_ms();
        let table = |i: usize| vec![("table", i.to_string()), ("prefix", cache.origins.table(i).prefix.clone())];
        let by_kind = |i: usize, k: Kind| {
            let mut l = table(i);
            l.push(("kind", k.label().to_string()));
            l
        };
        let mut m = e.encode_descriptor(
            "linerate_cache_table_collapsed",
            "Requests under the table's prefix that joined an origin request already under way.",
            None,
            MetricType::Counter,
        )?;
        for (i, t) in cache.tables.iter().enumerate() {
            m.encode_family(&table(i))?
                .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&t.collapsed.get(), None)?;
        }
        type Pick = fn(&crate::server::cache::TableStats, Kind) -> u64;
        let counters: [(&str, &str, Pick); 2] = [
            (
                "linerate_cache_table_origin_requests",
                "Origin requests (heads, revalidations, slice fills) by table and kind (playlist, segment, other).",
                |t, k| t.origin_requests[k as usize].get(),
            ),
            (
                "linerate_cache_table_new_objects",
                "New objects or versions the origin sent, by table and kind: origin requests per segment is the \
                 ratio of the two.",
                |t, k| t.new_objects[k as usize].get(),
            ),
        ];
        for (name, help, pick) in counters {
            let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (i, t) in cache.tables.iter().enumerate() {
                for k in Kind::ALL {
                    m.encode_family(&by_kind(i, k))?
                        .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&pick(t, k), None)?;
                }
            }
        }
        let mut m = e.encode_descriptor(
            "linerate_cache_table_newest_age_seconds",
            "Age of the newest object of the kind served under the table's prefix (from its origin date): \
             on a live channel, how far behind the encoder viewers are. Absent before one was served.",
            None,
            MetricType::Gauge,
        )?;
        for (i, t) in cache.tables.iter().enumerate() {
            for k in Kind::ALL {
                if let Some(age) = t.newest_age_secs(k, now) {
                    m.encode_family(&by_kind(i, k))?.encode_gauge(&age)?;
                }
            }
        }
        Ok(())
    }

    /// The pull-through cache's families (see `admin::cache`), when it is on.
    fn encode_cache(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(c) = super::cache::snapshot(&self.0) else { return Ok(()) };
        let r = &c.requests;
        counter(
            e,
            "linerate_cache_requests",
            "Requests under an [[origin]] prefix, by where the object came from.",
            &[
                (&[("status", "hit")], r.hit),
                (&[("status", "miss")], r.miss),
                (&[("status", "stale")], r.stale),
                (&[("status", "revalidated")], r.revalidated),
                (&[("status", "pass")], r.pass),
            ],
        )?;
        counter(e, "linerate_cache_negative_hits", "Cached 404 and 410 answers served.", &[(&[], r.negative)])?;
        counter(
            e,
            "linerate_cache_origin_failures",
            "Requests answered 502/504 (or the origin's 4xx, uncached) because no object could be had.",
            &[(&[], r.origin_failures)],
        )?;
        counter(
            e,
            "linerate_cache_collapsed",
            "Requests that joined an origin request already under way.",
            &[(&[], c.collapsed)],
        )?;
        counter(
            e,
            "linerate_cache_refreshed_ahead",
            "Background revalidations a hit started in the last refresh_ahead_percent of its object's lifetime.",
            &[(&[], c.refreshed_ahead)],
        )?;
        counter(
            e,
            "linerate_cache_read_ahead",
            "Slice fills started ahead of a viewer reading in order (read_ahead_slices).",
            &[(&[], c.read_ahead)],
        )?;
        counter(
            e,
            "linerate_cache_bytes",
            "Body bytes of cached objects sent, from stored slices (hit) or slices being filled (miss).",
            &[(&[("source", "hit")], c.hit_bytes), (&[("source", "miss")], c.miss_bytes)],
        )?;
        counter(e, "linerate_cache_origin_bytes", "Body bytes received from origins.", &[(&[], c.origin_bytes)])?;
        counter(e, "linerate_cache_fills", "Slice fills started.", &[(&[], c.fills)])?;
        counter(
            e,
            "linerate_cache_fill_failures",
            "Slice fills that failed (origin, bad answer, replaced).",
            &[(&[], c.fill_failures)],
        )?;
        counter(
            e,
            "linerate_cache_replaced",
            "Objects found replaced at the origin mid-object, and dropped.",
            &[(&[], c.replaced)],
        )?;
        counter(
            e,
            "linerate_cache_store_errors",
            "Slices or objects the store could not take (disk full, read-only...): passed through instead.",
            &[(&[], c.store_errors)],
        )?;
        gauge(e, "linerate_cache_objects", "Objects in the slice store.", &[(vec![], c.store.objects as i64)])?;
        let dirs: Vec<(Vec<(&str, String)>, &crate::store::DirStats)> =
            c.store.dirs.iter().map(|d| (vec![("dir", d.path.display().to_string())], d)).collect();
        type DirGauge = fn(&crate::store::DirStats) -> i64;
        let dir_gauges: [(&str, &str, DirGauge); 4] = [
            ("linerate_cache_slices", "Slices stored, by cache directory.", |d| d.slices as i64),
            ("linerate_cache_store_bytes", "Bytes of slices stored, by cache directory.", |d| d.bytes as i64),
            ("linerate_cache_free_bytes", "Free bytes of each cache directory's file system.", |d| d.free_bytes as i64),
            ("linerate_cache_writable", "1 when the cache directory takes writes.", |d| i64::from(d.writable)),
        ];
        for (name, help, pick) in dir_gauges {
            let samples: Vec<(Vec<(&str, String)>, i64)> = dirs.iter().map(|(l, d)| (l.clone(), pick(d))).collect();
            gauge(e, name, help, &samples)?;
        }
        type DirCounter = fn(&crate::store::DirStats) -> u64;
        let dir_counters: [(&str, &str, DirCounter); 3] = [
            ("linerate_cache_evictions", "Slices evicted, by cache directory.", |d| d.evictions),
            ("linerate_cache_evicted_bytes", "Bytes evicted, by cache directory.", |d| d.evicted_bytes),
            ("linerate_cache_damaged_slices", "Stored slices found missing or changed, and fetched again.", |d| {
                d.damaged_slices
            }),
        ];
        for (name, help, pick) in dir_counters {
            let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (labels, d) in &dirs {
                m.encode_family(labels)?
                    .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&pick(d), None)?;
            }
        }
        counter(
            e,
            "linerate_cache_loops",
            "Requests refused with 508 because their Via field named this node (the parents form a loop).",
            &[(&[], c.loops)],
        )?;
        counter(
            e,
            "linerate_cache_only_if_cached_misses",
            "Requests with Cache-Control: only-if-cached (peers') answered 504: not all stored and fresh.",
            &[(&[], c.only_if_cached_misses)],
        )?;
        self.encode_parents(e, &c.parents)?;
        self.encode_peers(e, &c.peers)?;
        self.encode_holds(e)?;
        self.encode_tables(e)?;
        let origin_labels: Vec<Vec<(&str, String)>> = c
            .origins
            .iter()
            .map(|o| vec![("table", o.stats.table.to_string()), ("url", o.stats.url.clone())])
            .collect();
        let mut m = e.encode_descriptor(
            "linerate_origin_requests",
            "Requests sent to each origin URL.",
            None,
            MetricType::Counter,
        )?;
        for (l, o) in origin_labels.iter().zip(&c.origins) {
            m.encode_family(l)?
                .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&o.stats.requests, None)?;
        }
        let mut m = e.encode_descriptor(
            "linerate_origin_responses",
            "Response heads from each origin URL, by status class.",
            None,
            MetricType::Counter,
        )?;
        for (l, o) in origin_labels.iter().zip(&c.origins) {
            for (i, n) in o.stats.responses_by_class.iter().enumerate() {
                let class = format!("{}xx", i + 1);
                let mut labels = l.clone();
                labels.push(("class", class));
                m.encode_family(&labels)?.encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(n, None)?;
            }
        }
        let mut m = e.encode_descriptor(
            "linerate_origin_body_bytes",
            "Body bytes received from each origin URL.",
            None,
            MetricType::Counter,
        )?;
        for (l, o) in origin_labels.iter().zip(&c.origins) {
            m.encode_family(l)?
                .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&o.stats.body_bytes, None)?;
        }
        let mut m = e.encode_descriptor(
            "linerate_origin_errors",
            "Failed requests to each origin URL, by kind.",
            None,
            MetricType::Counter,
        )?;
        for (l, o) in origin_labels.iter().zip(&c.origins) {
            for (kind, n) in &o.stats.errors {
                let mut labels = l.clone();
                labels.push(("kind", kind.to_string()));
                m.encode_family(&labels)?.encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(n, None)?;
            }
        }
        let mut m = e.encode_descriptor(
            "linerate_origin_open_connections",
            "Connections open to each origin URL.",
            None,
            MetricType::Gauge,
        )?;
        for (l, o) in origin_labels.iter().zip(&c.origins) {
            m.encode_family(l)?.encode_gauge(&(o.stats.open_connections as i64))?;
        }
        let mut m = e.encode_descriptor(
            "linerate_origin_first_byte_seconds",
            "Time from a request sent to an origin URL to its response head.",
            None,
            MetricType::Histogram,
        )?;
        for (l, o) in origin_labels.iter().zip(&c.origins) {
            let u = &o.stats;
            m.encode_family(l)?.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                u.first_byte_sum_secs,
                u.first_byte_count,
                &u.first_byte_buckets,
                None,
            )?;
        }
        Ok(())
    }
}

impl Workers {
    /// Each parent's requests, answers, errors and state.
    fn encode_parents(
        &self,
        e: &mut DescriptorEncoder,
        parents: &[crate::origin::ParentStats],
    ) -> Result<(), std::fmt::Error> {
        if parents.is_empty() {
            return Ok(());
        }
        let labels: Vec<Vec<(&str, String)>> = parents
            .iter()
            .map(|p| vec![("table", p.stats.table.to_string()), ("parent", p.stats.url.clone())])
            .collect();
        let mut m = e.encode_descriptor(
            "linerate_parent_requests",
            "Requests sent to each parent.",
            None,
            MetricType::Counter,
        )?;
        for (l, p) in labels.iter().zip(parents) {
            m.encode_family(l)?
                .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&p.stats.requests, None)?;
        }
        let mut m = e.encode_descriptor(
            "linerate_parent_responses",
            "Response heads from each parent, by status class.",
            None,
            MetricType::Counter,
        )?;
        for (l, p) in labels.iter().zip(parents) {
            for (i, n) in p.stats.responses_by_class.iter().enumerate() {
                let mut labels = l.clone();
                labels.push(("class", format!("{}xx", i + 1)));
                m.encode_family(&labels)?.encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(n, None)?;
            }
        }
        let mut m = e.encode_descriptor(
            "linerate_parent_errors",
            "Failed requests to each parent, by kind.",
            None,
            MetricType::Counter,
        )?;
        for (l, p) in labels.iter().zip(parents) {
            for (kind, n) in &p.stats.errors {
                let mut labels = l.clone();
                labels.push(("kind", kind.to_string()));
                m.encode_family(&labels)?.encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(n, None)?;
            }
        }
        let mut m = e.encode_descriptor(
            "linerate_parent_body_bytes",
            "Body bytes received from each parent.",
            None,
            MetricType::Counter,
        )?;
        for (l, p) in labels.iter().zip(parents) {
            m.encode_family(l)?
                .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&p.stats.body_bytes, None)?;
        }
        let mut m = e.encode_descriptor(
            "linerate_parent_marked_down",
            "Times each parent was marked down (no connection, a timeout, a broken connection).",
            None,
            MetricType::Counter,
        )?;
        for (l, p) in labels.iter().zip(parents) {
            m.encode_family(l)?
                .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&p.marked_down, None)?;
        }
        let mut m = e.encode_descriptor(
            "linerate_parent_up",
            "1 while a parent is asked, 0 while it is marked down and skipped.",
            None,
            MetricType::Gauge,
        )?;
        for (l, p) in labels.iter().zip(parents) {
            m.encode_family(l)?.encode_gauge(&i64::from(p.up))?;
        }
        Ok(())
    }
}

impl Workers {
    /// Each peer's requests, answers, misses, errors and state.
    fn encode_peers(
        &self,
        e: &mut DescriptorEncoder,
        peers: &[crate::origin::PeerStats],
    ) -> Result<(), std::fmt::Error> {
        if peers.is_empty() {
            return Ok(());
        }
        let labels: Vec<Vec<(&str, String)>> =
            peers.iter().map(|p| vec![("table", p.stats.table.to_string()), ("peer", p.stats.url.clone())]).collect();
        type Pick = fn(&crate::origin::PeerStats) -> u64;
        let counters: [(&str, &str, Pick); 4] = [
            ("linerate_peer_requests", "Requests sent to each peer (only-if-cached).", |p| p.stats.requests),
            (
                "linerate_peer_misses",
                "504s (and other 3xx or 4xx) from each peer: it did not have what was asked.",
                |p| p.misses,
            ),
            ("linerate_peer_body_bytes", "Body bytes received from each peer.", |p| p.stats.body_bytes),
            (
                "linerate_peer_marked_down",
                "Times each peer was marked down (no connection, a timeout, a broken connection).",
                |p| p.marked_down,
            ),
        ];
        for (name, help, pick) in counters {
            let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (l, p) in labels.iter().zip(peers) {
                m.encode_family(l)?
                    .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&pick(p), None)?;
            }
        }
        let mut m = e.encode_descriptor(
            "linerate_peer_responses",
            "Response heads from each peer, by status class.",
            None,
            MetricType::Counter,
        )?;
        for (l, p) in labels.iter().zip(peers) {
            for (i, n) in p.stats.responses_by_class.iter().enumerate() {
                let mut labels = l.clone();
                labels.push(("class", format!("{}xx", i + 1)));
                m.encode_family(&labels)?.encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(n, None)?;
            }
        }
        let mut m = e.encode_descriptor(
            "linerate_peer_errors",
            "Failed requests to each peer, by kind (a 504 is a miss, not an error).",
            None,
            MetricType::Counter,
        )?;
        for (l, p) in labels.iter().zip(peers) {
            for (kind, n) in &p.stats.errors {
                let mut labels = l.clone();
                labels.push(("kind", kind.to_string()));
                m.encode_family(&labels)?.encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(n, None)?;
            }
        }
        let mut m = e.encode_descriptor(
            "linerate_peer_up",
            "1 while a peer is asked, 0 while it is marked down and skipped.",
            None,
            MetricType::Gauge,
        )?;
        for (l, p) in labels.iter().zip(peers) {
            m.encode_family(l)?.encode_gauge(&i64::from(p.up))?;
        }
        Ok(())
    }
}

impl Collector for Workers {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &*self.0;
        let ws = &s.workers;

        let transports: Vec<[(&str, &str); 1]> =
            TransportKind::ALL.iter().map(|k| [("transport", k.label())]).collect();
        let body: Vec<(&[(&str, &str)], u64)> = TransportKind::ALL
            .iter()
            .zip(&transports)
            .map(|(k, l)| (&l[..], s.total(|w| w.body_bytes_of(*k))))
            .collect();
        counter(&mut e, "linerate_body_bytes", "Response body bytes sent, by send path.", &body)?;
        counter(&mut e, "linerate_head_bytes", "Response head bytes sent.", &[(&[], s.total(|w| w.head_bytes.get()))])?;

        let codes: Vec<String> = Status::ALL.iter().map(|st| st.code().to_string()).collect();
        let labels: Vec<[(&str, &str); 1]> = codes.iter().map(|c| [("code", c.as_str())]).collect();
        let requests: Vec<(&[(&str, &str)], u64)> = Status::ALL
            .iter()
            .zip(&labels)
            .map(|(st, l)| (&l[..], s.total(|w| w.responses[st.index()].get())))
            .collect();
        counter(&mut e, "linerate_requests", "Responses sent, by status code.", &requests)?;

        let conns: Vec<(Vec<(&str, String)>, i64)> = ConnState::ALL
            .iter()
            .map(|st| (vec![("state", st.label().to_string())], ws.iter().map(|w| w.connections_in(*st)).sum()))
            .collect();
        gauge(&mut e, "linerate_connections", "Open connections, by what they are doing.", &conns)?;
        counter(
            &mut e,
            "linerate_connections_accepted",
            "Connections accepted.",
            &[(&[], s.total(|w| w.connections_accepted.get()))],
        )?;

        let kinds: Vec<[(&str, &str); 1]> = ErrorKind::ALL.iter().map(|k| [("kind", k.label())]).collect();
        let errors: Vec<(&[(&str, &str)], u64)> =
            ErrorKind::ALL.iter().zip(&kinds).map(|(k, l)| (&l[..], s.total(|w| w.errors_of(*k)))).collect();
        counter(&mut e, "linerate_errors", "Failed requests and connections, by kind.", &errors)?;

        let results: Vec<[(&str, &str); 1]> = Verdict::LABELS.iter().map(|l| [("result", *l)]).collect();
        let signed: Vec<(&[(&str, &str)], u64)> =
            results.iter().enumerate().map(|(i, l)| (&l[..], s.total(|w| w.signed[i].get()))).collect();
        counter(
            &mut e,
            "linerate_signed_url",
            "Requests under a signed-URL rule, by verdict: allowed, expired (410) or why refused (403).",
            &signed,
        )?;

        let refusals: Vec<[(&str, &str); 1]> = Refusal::ALL.iter().map(|r| [("limit", r.label())]).collect();
        let refused: Vec<(&[(&str, &str)], u64)> = Refusal::ALL
            .iter()
            .zip(&refusals)
            .map(|(r, l)| (&l[..], s.total(|w| w.client_limit_refusals[*r as usize].get())))
            .collect();
        counter(
            &mut e,
            "linerate_client_limit_refusals",
            "New connections closed at once because their client was over a [client_limits] limit, by limit.",
            &refused,
        )?;

        let certs = s.certificates.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let now = crate::tls::certs::unix_now();
        let cert_labels = |c: &crate::tls::certs::CertExpiry| {
            vec![("key", c.key.clone()), ("file", c.file.display().to_string()), ("name", c.name.clone())]
        };
        let days: Vec<(Vec<(&str, String)>, i64)> = certs.iter().map(|c| (cert_labels(c), c.days_left(now))).collect();
        gauge(
            &mut e,
            "linerate_tls_certificate_days_left",
            "Whole days until each certificate in use expires (negative once expired); alert well before 0.",
            &days,
        )?;
        let not_after: Vec<(Vec<(&str, String)>, i64)> = certs.iter().map(|c| (cert_labels(c), c.not_after)).collect();
        gauge(
            &mut e,
            "linerate_tls_certificate_not_after_seconds",
            "When each certificate in use expires, in Unix seconds (compare with time()).",
            &not_after,
        )?;
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        counter(
            &mut e,
            "linerate_reloads",
            "Configuration reloads (SIGHUP), by result.",
            &[
                (&[("result", "ok")], s.reloads.load(relaxed)),
                (&[("result", "failed")], s.reload_failures.load(relaxed)),
            ],
        )?;
        counter(
            &mut e,
            "linerate_upgrade_failures",
            "Binary upgrades (SIGUSR2) whose new process did not start; this one kept serving.",
            &[(&[], s.upgrade_failures.load(relaxed))],
        )?;
        counter(
            &mut e,
            "linerate_tls_handshakes",
            "Completed TLS handshakes.",
            &[(&[], s.total(|w| w.tls_handshakes.get()))],
        )?;
        counter(
            &mut e,
            "linerate_tls_handshake_failures",
            "TLS handshakes that failed or timed out.",
            &[(&[], s.total(|w| w.tls_handshake_failures.get()))],
        )?;
        counter(
            &mut e,
            "linerate_tls_sessions",
            "TLS sessions by where records are protected: kernel (ktls; ktls_device when the NIC seals them) or user space.",
            &[
                (&[("mode", "ktls")], s.total(|w| w.ktls_sessions.get())),
                (&[("mode", "ktls_device")], s.total(|w| w.ktls_device_sessions.get())),
                (&[("mode", "usertls")], s.total(|w| w.usertls_sessions.get())),
            ],
        )?;
        counter(
            &mut e,
            "linerate_cross_domain_connections",
            "Connections whose SYN arrived on a CPU in another NUMA node than the worker that accepted them.",
            &[(&[], s.total(|w| w.cross_domain_connections.get()))],
        )?;
        counter(
            &mut e,
            "linerate_tcp_info_samples",
            "TCP_INFO readings taken.",
            &[(&[], s.total(|w| w.tcp.samples.get()))],
        )?;

        histogram(&mut e, "linerate_tcp_rtt_seconds", "Smoothed RTT of sampled connections.", ws, |w| {
            &w.tcp.rtt_seconds
        })?;
        histogram(&mut e, "linerate_tcp_rtt_variance_seconds", "RTT variance of sampled connections.", ws, |w| {
            &w.tcp.rtt_variance_seconds
        })?;
        histogram(
            &mut e,
            "linerate_tcp_delivery_rate_bits_per_second",
            "Delivery rate of sampled connections.",
            ws,
            |w| &w.tcp.delivery_rate_bits,
        )?;
        histogram(
            &mut e,
            "linerate_tcp_pacing_rate_bits_per_second",
            "Pacing rate of sampled connections.",
            ws,
            |w| &w.tcp.pacing_rate_bits,
        )?;
        histogram(&mut e, "linerate_tcp_cwnd_segments", "Congestion window of sampled connections.", ws, |w| {
            &w.tcp.cwnd_segments
        })?;
        histogram(
            &mut e,
            "linerate_tcp_retransmits",
            "Unrecovered retransmission timeouts of sampled connections.",
            ws,
            |w| &w.tcp.retransmits,
        )?;
        histogram(
            &mut e,
            "linerate_tcp_total_retransmits",
            "Segments retransmitted by sampled connections.",
            ws,
            |w| &w.tcp.total_retransmits,
        )?;

        self.encode_cold(&mut e)?;
        self.encode_cache(&mut e)?;
        self.encode_prefill(&mut e)?;
        if let Some(log) = &self.0.access_log {
            use std::sync::atomic::Ordering::Relaxed;
            let c = &log.counters;
            counter(
                &mut e,
                "linerate_access_log_records",
                "Access-log records written to the file, and dropped (the writer fell behind or the write failed).",
                &[
                    (&[("result", "written")], c.written.load(Relaxed)),
                    (&[("result", "dropped")], c.dropped.load(Relaxed)),
                ],
            )?;
            counter(
                &mut e,
                "linerate_access_log_reopens",
                "Times the access log was reopened (SIGUSR1).",
                &[(&[], c.reopened.load(Relaxed))],
            )?;
        }

        let cpu: Vec<(Vec<(&str, String)>, f64)> = ws
            .iter()
            .filter_map(|w| {
                let secs = super::thread_cpu_seconds(w.tid.load(std::sync::atomic::Ordering::Relaxed))?;
                let labels = vec![
                    ("worker", w.index.to_string()),
                    ("cpu", w.cpu.map_or("-".into(), |c| c.to_string())),
                    ("node", w.node.map_or("-".into(), |n| n.to_string())),
                    ("domain", w.domain.to_string()),
                ];
                Some((labels, secs))
            })
            .collect();
        let mut m = e.encode_descriptor(
            "linerate_worker_cpu_seconds",
            "CPU time used by each worker thread.",
            None,
            MetricType::Counter,
        )?;
        for (labels, v) in &cpu {
            m.encode_family(labels)?.encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(v, None)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Waits(Vec<Arc<WorkerCounters>>);

    impl Collector for Waits {
        fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            histogram(&mut e, "waits_seconds", "Waits.", &self.0, |w| &w.cold.fill_wait_seconds)
        }
    }

    #[test]
    fn histogram_buckets_are_cumulative_once_and_end_at_the_count() {
        let workers =
            vec![Arc::new(WorkerCounters::new(0, None, None, 0)), Arc::new(WorkerCounters::new(1, None, None, 0))];
        for v in [0.0005, 0.0005, 0.003, 20.0] {
            workers[0].cold.fill_wait_seconds.observe(v);
        }
        workers[1].cold.fill_wait_seconds.observe(0.003);
        let mut r = Registry::default();
        r.register_collector(Box::new(Waits(workers)));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        let bucket = |le: &str| -> u64 {
            let prefix = format!("waits_seconds_bucket{{le=\"{le}\"}} ");
            let line = text.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("{prefix} in {text}"));
            line[prefix.len()..].parse().unwrap()
        };
        assert_eq!(bucket("0.001"), 2);
        assert_eq!(bucket("0.0025"), 2);
        assert_eq!(bucket("0.005"), 4);
        assert_eq!(bucket("10.0"), 4);
        assert_eq!(bucket("+Inf"), 5);
        assert!(text.contains("waits_seconds_count 5"), "{text}");
    }
}
