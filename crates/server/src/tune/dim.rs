//! The interrupt-moderation controller: dynamic interrupt moderation from user
//! space, for NICs whose driver does not adapt coalescing itself. `linerate tune dim`
//! runs it in the foreground ([`run_until`]); the server runs one thread per NIC of
//! its `[dim]` section ([`spawn`]).
//!
//! Every tick the controller reads each receive queue's packets, bytes and
//! interrupts, feeds one [`Tuner`] per queue (or one for the device when the NIC
//! cannot be driven per queue), and writes the profiles the tuners ask for: per
//! queue with `ETHTOOL_PERQUEUE` where the driver supports it, device-wide
//! otherwise. Writes are rate-limited (programming coalescing costs firmware
//! commands on some NICs), and the settings found at start are restored on exit,
//! on SIGINT/SIGTERM, on error and on panic.
//!
//! It stands aside when the driver already adapts (`use-adaptive-rx` on, or an
//! e1000e/igb-style "dynamic" `rx-usecs` value) unless told to take over.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use linerate_dim::{Direction, Profile, ProfileTable, TimerMode, Tuner, TunerConfig};
use linerate_sys::ethtool::Coalesce;

use super::nic::{quirks, DriverQuirks, LiveNic, NicControl};
use super::queue_counters::{self, QueueCounters};
use crate::config::Dim;
use crate::sysfs::{Host, InterruptLine};

/// How one controller runs: on which interface, how often, for how long.
#[derive(Clone, Debug)]
pub struct Options {
    /// Interface whose receive coalescing to drive.
    pub iface: String,
    /// Sampling period.
    pub interval: Duration,
    /// Stop after this long (restoring the original settings).
    pub duration: Option<Duration>,
    /// Stop after this many samples.
    pub count: Option<u64>,
    /// Most coalescing writes per second to the device (all queues together).
    pub max_writes_per_sec: f64,
    /// Drive the NIC even when its driver adapts coalescing itself (the driver's
    /// mode is switched off while it runs and restored at exit).
    pub take_over: bool,
}

/// Starts one controller thread per configured interface; each runs until `stop`
/// is set, then restores the interface's settings. A thread whose NIC adapts by
/// itself returns at once with [`Summary::stood_aside`] set.
pub fn spawn(config: &Dim, stop: Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<anyhow::Result<Summary>>> {
    config
        .interfaces
        .iter()
        .map(|iface| {
            let opts = Options {
                iface: iface.clone(),
                interval: config.interval,
                duration: None,
                count: None,
                max_writes_per_sec: config.max_writes_per_sec,
                take_over: config.take_over,
            };
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("dim-{iface}"))
                .spawn(move || {
                    let result = run_until(&opts, &stop, |line| tracing::info!(target: "linerate::dim", "{line}"));
                    if let Err(e) = &result {
                        // Reported as it happens, not when the server stops.
                        tracing::warn!(target: "linerate::dim", iface = %opts.iface, "interrupt moderation stopped: {e:#}");
                    }
                    result
                })
                .expect("spawning a controller thread")
        })
        .collect()
}

/// What a run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub stood_aside: Option<String>,
    pub samples: u64,
    pub writes: u64,
    pub restored: bool,
}

/// Runs one controller until `stop` is set, `opts.duration` has passed or
/// `opts.count` samples were taken, then restores the interface's settings. Each
/// line worth reporting (the plan, every change) goes to `log`.
pub fn run_until(opts: &Options, stop: &AtomicBool, mut log: impl FnMut(&str)) -> anyhow::Result<Summary> {
    anyhow::ensure!(opts.interval >= Duration::from_millis(1), "--interval must be at least 1ms");
    anyhow::ensure!(opts.max_writes_per_sec > 0.0, "--max-writes-per-sec must be positive");
    let nic = LiveNic::open(&opts.iface).with_context(|| format!("{}: opening an ethtool socket", opts.iface))?;
    let mut c = match Controller::start(Host::new("/"), Box::new(nic), opts)? {
        Start::StandAside(why) => return Ok(Summary { stood_aside: Some(why), ..Summary::default() }),
        Start::Run(c) => c,
    };
    log(&c.describe());
    let began = Instant::now();
    let mut samples = 0;
    let result = loop {
        if stop.load(Ordering::Relaxed)
            || opts.count.is_some_and(|n| samples >= n)
            || opts.duration.is_some_and(|d| began.elapsed() >= d)
        {
            break Ok(());
        }
        let now_usecs = began.elapsed().as_micros() as u64;
        match c.tick(now_usecs) {
            Ok(lines) => lines.iter().for_each(|l| log(l)),
            Err(e) => break Err(e),
        }
        samples += 1;
        // Sleep in short slices so a signal is noticed quickly.
        let wake = Instant::now() + opts.interval;
        while !stop.load(Ordering::Relaxed) && Instant::now() < wake {
            std::thread::sleep((wake - Instant::now()).min(Duration::from_millis(50)));
        }
    };
    let writes = c.writes;
    let restored = c.restore();
    if let Err(e) = &restored {
        log(&format!("{}: FAILED to restore the original coalescing: {e:#}", opts.iface));
    }
    result?;
    restored?;
    Ok(Summary { stood_aside: None, samples, writes, restored: writes > 0 })
}

pub enum Start {
    Run(Box<Controller>),
    StandAside(String),
}

/// Whether tuners map to queues or to the whole device.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Scope {
    Device { original: Coalesce },
    PerQueue { queues: Vec<u32>, originals: Vec<Coalesce> },
}

/// Writes allowed now: a token bucket of one write, refilled at the cap.
struct WriteBudget {
    per_sec: f64,
    tokens: f64,
    last_usecs: Option<u64>,
}

impl WriteBudget {
    fn take(&mut self, now_usecs: u64) -> bool {
        let elapsed = self.last_usecs.map_or(1.0, |l| now_usecs.saturating_sub(l) as f64 / 1e6);
        self.last_usecs = Some(now_usecs);
        self.tokens = (self.tokens + elapsed * self.per_sec).min(1.0);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

pub struct Controller {
    host: Host,
    nic: Box<dyn NicControl>,
    iface: String,
    driver: String,
    irqs: Vec<u32>,
    scope: Scope,
    tuners: Vec<Tuner>,
    /// The profile each tuner wants and that is not written yet.
    pending: Vec<Option<Profile>>,
    frames_supported: bool,
    budget: WriteBudget,
    failures_in_a_row: u32,
    last: Option<(u64, Vec<QueueCounters>)>,
    pub writes: u64,
    restored: bool,
}

fn table_for(q: DriverQuirks) -> ProfileTable {
    let base = ProfileTable::default_for(Direction::Rx, TimerMode::FromFirstEvent);
    let mut seen = Vec::new();
    let profiles: Vec<Profile> = base
        .profiles()
        .iter()
        .map(|p| Profile { usecs: p.usecs.max(q.min_usecs), ..*p })
        .filter(|p| {
            let new = !seen.contains(&p.usecs);
            seen.push(p.usecs);
            new
        })
        .collect();
    ProfileTable::new(profiles).expect("a clamped default table keeps at least one profile")
}

fn nearest(table: &ProfileTable, usecs: u32) -> usize {
    (0..table.len()).min_by_key(|&i| table.profile(i).usecs.abs_diff(usecs)).unwrap_or(0)
}

fn is_unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::EINVAL))
}

impl Controller {
    /// Reads the NIC and decides how to drive it, or why not to.
    pub fn start(host: Host, nic: Box<dyn NicControl>, opts: &Options) -> anyhow::Result<Start> {
        let iface = opts.iface.clone();
        let info = host.interface(&iface).with_context(|| format!("{iface}: no such interface"))?;
        let driver = nic.driver().ok().filter(|d| !d.is_empty()).unwrap_or_else(|| info.driver.clone());
        let driver = if driver.is_empty() { "(unknown)".to_string() } else { driver };
        let q = quirks(&driver);
        let original = nic.coalesce().map_err(|e| {
            if is_unsupported(&e) {
                anyhow::anyhow!("{iface}: driver {driver} has no interrupt coalescing settings ({e})")
            } else {
                anyhow::anyhow!("{iface}: reading coalescing: {e}")
            }
        })?;
        let adaptive = |c: &Coalesce| {
            if c.use_adaptive_rx != 0 {
                Some("the driver's adaptive RX coalescing is on (use-adaptive-rx)".to_string())
            } else if q.adaptive_usecs.contains(&c.rx_usecs) {
                Some(format!("rx-usecs {} selects {driver}'s own dynamic interrupt throttling", c.rx_usecs))
            } else {
                None
            }
        };
        if let Some(why) = adaptive(&original) {
            if !opts.take_over {
                return Ok(Start::StandAside(format!("{why}; pass --take-over to replace it")));
            }
        }
        let stats = queue_counters::per_queue_from_stats(&nic.named_stats().unwrap_or_default());
        let lines = queue_counters::nic_interrupts(&host, &iface, &info.irqs, &[]);
        let irq_queues = queue_counters::interrupts_per_queue(&lines);
        let queues: Vec<u32> = stats.keys().copied().collect();
        let per_queue = queues.len() > 1 && queues.iter().all(|q| irq_queues.contains_key(q));
        let scope = match per_queue.then(|| nic.queue_coalesce(&queues)) {
            Some(Ok(originals)) => {
                if let Some(why) = originals.iter().find_map(adaptive) {
                    if !opts.take_over {
                        return Ok(Start::StandAside(format!("{why} on some queue; pass --take-over to replace it")));
                    }
                }
                Scope::PerQueue { queues, originals }
            }
            _ => Scope::Device { original },
        };
        let table = table_for(q);
        let starts: Vec<u32> = match &scope {
            Scope::Device { original } => vec![original.rx_usecs],
            Scope::PerQueue { originals, .. } => originals.iter().map(|c| c.rx_usecs).collect(),
        };
        let tuners: Vec<Tuner> = starts
            .iter()
            .map(|&u| Tuner::starting_at(table.clone(), TunerConfig::default(), nearest(&table, u)))
            .collect();
        Ok(Start::Run(Box::new(Controller {
            host,
            nic,
            iface,
            driver,
            irqs: info.irqs,
            pending: vec![None; tuners.len()],
            scope,
            tuners,
            frames_supported: true,
            budget: WriteBudget { per_sec: opts.max_writes_per_sec, tokens: 1.0, last_usecs: None },
            failures_in_a_row: 0,
            last: None,
            writes: 0,
            restored: false,
        })))
    }

    pub fn describe(&self) -> String {
        let table: Vec<String> = self.tuners[0].table().profiles().iter().map(|p| p.to_string()).collect();
        match &self.scope {
            Scope::Device { original } => format!(
                "{} ({}): one tuner for the device (no per-queue counters or per-queue coalescing); starting from rx-usecs {}; profiles {}",
                self.iface,
                self.driver,
                original.rx_usecs,
                table.join(" ")
            ),
            Scope::PerQueue { queues, .. } => format!(
                "{} ({}): one tuner per receive queue ({} queues, ETHTOOL_PERQUEUE); profiles {}",
                self.iface,
                self.driver,
                queues.len(),
                table.join(" ")
            ),
        }
    }

    fn read_counters(&self) -> anyhow::Result<Vec<QueueCounters>> {
        let lines: Vec<InterruptLine> = queue_counters::nic_interrupts(&self.host, &self.iface, &self.irqs, &[]);
        let stats = queue_counters::per_queue_from_stats(&self.nic.named_stats().unwrap_or_default());
        match &self.scope {
            Scope::Device { .. } => {
                let (packets, bytes) = if stats.is_empty() {
                    queue_counters::device_totals(&self.host, &self.iface).with_context(|| {
                        format!("{}: no receive counters in /sys/class/net/{}/statistics", self.iface, self.iface)
                    })?
                } else {
                    stats.values().fold((0, 0), |(p, b), c| (p + c.packets, b + c.bytes))
                };
                Ok(vec![QueueCounters { packets, bytes, interrupts: queue_counters::interrupts_total(&lines) }])
            }
            Scope::PerQueue { queues, .. } => {
                let irqs = queue_counters::interrupts_per_queue(&lines);
                Ok(queues
                    .iter()
                    .map(|q| {
                        let s = stats.get(q).copied().unwrap_or_default();
                        QueueCounters { interrupts: irqs.get(q).copied().unwrap_or(0), ..s }
                    })
                    .collect())
            }
        }
    }

    /// One sample: feed the tuners, write what they want if the budget allows.
    /// Returns log lines for the changes made.
    pub fn tick(&mut self, now_usecs: u64) -> anyhow::Result<Vec<String>> {
        let counters = self.read_counters()?;
        let mut log = Vec::new();
        for (i, c) in counters.iter().enumerate() {
            let sample = linerate_dim::Sample {
                time_usecs: now_usecs,
                packets: c.packets,
                bytes: c.bytes,
                events: c.interrupts,
            };
            if let Some(p) = self.tuners[i].feed(sample) {
                self.pending[i] = Some(p);
            }
        }
        let rates = self.last.as_ref().map(|(t, prev)| {
            let secs = (now_usecs.saturating_sub(*t)).max(1) as f64 / 1e6;
            counters
                .iter()
                .zip(prev)
                .map(|(c, p)| {
                    (
                        c.packets.saturating_sub(p.packets) as f64 / secs,
                        c.interrupts.saturating_sub(p.interrupts) as f64 / secs,
                    )
                })
                .collect::<Vec<_>>()
        });
        self.last = Some((now_usecs, counters));
        if self.pending.iter().all(Option::is_none) || !self.budget.take(now_usecs) {
            return Ok(log);
        }
        match self.write_pending() {
            Ok(changed) => {
                self.failures_in_a_row = 0;
                self.writes += 1;
                for (i, p) in changed {
                    self.tuners[i].applied();
                    let (pps, ips) = rates.as_ref().and_then(|r| r.get(i).copied()).unwrap_or((0.0, 0.0));
                    let what = match &self.scope {
                        Scope::Device { .. } => self.iface.clone(),
                        Scope::PerQueue { queues, .. } => format!("{} queue {}", self.iface, queues[i]),
                    };
                    log.push(format!(
                        "{:.1}s {what}: rx-usecs {} rx-frames {} ({pps:.0} packets/s, {ips:.0} interrupts/s)",
                        now_usecs as f64 / 1e6,
                        p.usecs,
                        if self.frames_supported { p.max_frames.to_string() } else { "(not supported)".into() },
                    ));
                }
            }
            Err(e) => {
                for (i, p) in self.pending.iter_mut().enumerate() {
                    if p.take().is_some() {
                        self.tuners[i].apply_failed();
                    }
                }
                self.failures_in_a_row += 1;
                log.push(format!("{}: writing coalescing failed: {e}", self.iface));
                anyhow::ensure!(
                    self.failures_in_a_row < 3,
                    "{}: three coalescing writes in a row failed; last: {e}",
                    self.iface
                );
            }
        }
        Ok(log)
    }

    fn settings(&self, base: &Coalesce, p: Profile) -> Coalesce {
        let mut c = *base;
        c.rx_usecs = p.usecs;
        c.use_adaptive_rx = 0;
        if self.frames_supported {
            c.rx_max_frames = p.max_frames;
        }
        c
    }

    /// Writes every pending profile in one operation; returns what was written.
    fn write_pending(&mut self) -> io::Result<Vec<(usize, Profile)>> {
        let wanted: Vec<(usize, Profile)> =
            self.pending.iter().enumerate().filter_map(|(i, p)| p.map(|p| (i, p))).collect();
        let attempt = |this: &Self| -> io::Result<()> {
            match &this.scope {
                Scope::Device { original } => this.nic.set_coalesce(&this.settings(original, wanted[0].1)),
                Scope::PerQueue { queues, originals } => {
                    let qs: Vec<u32> = wanted.iter().map(|(i, _)| queues[*i]).collect();
                    let cs: Vec<Coalesce> = wanted.iter().map(|(i, p)| this.settings(&originals[*i], *p)).collect();
                    this.nic.set_queue_coalesce(&qs, &cs)
                }
            }
        };
        match attempt(self) {
            Err(e) if self.frames_supported && is_unsupported(&e) => {
                // Many drivers (e1000e among them) have a timer but no frame cap:
                // retry with the frame cap left as it was, and keep it that way.
                self.frames_supported = false;
                attempt(self)?;
            }
            r => r?,
        }
        for (i, _) in &wanted {
            self.pending[*i] = None;
        }
        Ok(wanted)
    }

    /// Puts back the settings found at start (if anything was written).
    pub fn restore(&mut self) -> anyhow::Result<()> {
        if self.restored || self.writes == 0 {
            self.restored = true;
            return Ok(());
        }
        let r = match &self.scope {
            Scope::Device { original } => self.nic.set_coalesce(original),
            Scope::PerQueue { queues, originals } => self.nic.set_queue_coalesce(queues, originals),
        };
        r.with_context(|| format!("{}: restoring the original coalescing", self.iface))?;
        self.restored = true;
        Ok(())
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        // Covers panics and early returns: never leave the NIC on our profile.
        if let Err(e) = self.restore() {
            eprintln!("linerate: {e:#}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    /// A scripted NIC: coalescing state, what it supports, what was written.
    #[derive(Default)]
    struct Fake {
        driver: String,
        device: Coalesce,
        queues: Vec<Coalesce>,
        per_queue: bool,
        frames: bool,
        stats: Vec<(String, u64)>,
        device_writes: Vec<Coalesce>,
        queue_writes: Vec<(Vec<u32>, Vec<Coalesce>)>,
        fail_writes: bool,
    }

    struct FakeNic(Rc<RefCell<Fake>>);

    fn unsupported() -> io::Error {
        io::Error::from_raw_os_error(libc::EOPNOTSUPP)
    }

    impl NicControl for FakeNic {
        fn driver(&self) -> io::Result<String> {
            Ok(self.0.borrow().driver.clone())
        }
        fn named_stats(&self) -> io::Result<Vec<(String, u64)>> {
            Ok(self.0.borrow().stats.clone())
        }
        fn coalesce(&self) -> io::Result<Coalesce> {
            Ok(self.0.borrow().device)
        }
        fn set_coalesce(&self, c: &Coalesce) -> io::Result<()> {
            let mut f = self.0.borrow_mut();
            if f.fail_writes || (!f.frames && c.rx_max_frames != 0) {
                return Err(unsupported());
            }
            f.device = *c;
            f.device_writes.push(*c);
            Ok(())
        }
        fn queue_coalesce(&self, queues: &[u32]) -> io::Result<Vec<Coalesce>> {
            let f = self.0.borrow();
            if !f.per_queue {
                return Err(unsupported());
            }
            Ok(queues.iter().map(|q| f.queues[*q as usize]).collect())
        }
        fn set_queue_coalesce(&self, queues: &[u32], c: &[Coalesce]) -> io::Result<()> {
            let mut f = self.0.borrow_mut();
            if f.fail_writes || !f.per_queue {
                return Err(unsupported());
            }
            for (q, c) in queues.iter().zip(c) {
                f.queues[*q as usize] = *c;
            }
            f.queue_writes.push((queues.to_vec(), c.to_vec()));
            Ok(())
        }
    }

    /// A host tree with one NIC `eth9` of `queues` receive queues.
    fn host(queues: u32) -> (tempfile::TempDir, Host) {
        let dir = tempfile::tempdir().unwrap();
        let h = Host::new(dir.path());
        std::fs::create_dir_all(h.path("sys/class/net/eth9/device")).unwrap();
        h.write("sys/class/net/eth9/device/uevent", "DRIVER=fake").unwrap();
        for q in 0..queues {
            std::fs::create_dir_all(h.path(&format!("sys/class/net/eth9/queues/rx-{q}"))).unwrap();
        }
        std::fs::create_dir_all(h.path("sys/class/net/eth9/statistics")).unwrap();
        std::fs::create_dir_all(h.path("proc")).unwrap();
        (dir, h)
    }

    /// Traffic on one queue for one 100 ms tick under timer `usecs`: bulk gives
    /// one interrupt per timer period, ping-pong one per packet at a rate that
    /// falls as the timer grows.
    fn tick_traffic(bulk: bool, usecs: u32) -> (u64, u64, u64) {
        let usecs = u64::from(usecs.max(1));
        if bulk {
            let packets = 50_000;
            (packets, packets * 1500, (100_000 / usecs).min(packets))
        } else {
            let packets = 100_000 / (30 + usecs);
            (packets, packets * 100, packets)
        }
    }

    struct Queues {
        totals: Vec<(u64, u64, u64)>,
    }

    impl Queues {
        /// Advances every queue by one tick and publishes the counters.
        fn step(&mut self, h: &Host, fake: &Rc<RefCell<Fake>>, bulk: &[bool]) {
            let f = fake.borrow();
            let mut interrupts = String::from("  CPU0\n");
            let mut stats = Vec::new();
            for (q, t) in self.totals.iter_mut().enumerate() {
                let usecs = if f.per_queue { f.queues[q].rx_usecs } else { f.device.rx_usecs };
                let (p, b, i) = tick_traffic(bulk[q], usecs);
                *t = (t.0 + p, t.1 + b, t.2 + i);
                interrupts.push_str(&format!(" {}: {} PCI-MSIX {q}-edge eth9-rx-{q}\n", 40 + q, t.2));
                stats.push((format!("rx_queue_{q}_packets"), t.0));
                stats.push((format!("rx_queue_{q}_bytes"), t.1));
            }
            interrupts.push_str(" 99: 5 PCI-MSIX 9-edge eth9-tx-0\n");
            drop(f);
            h.write("proc/interrupts", &interrupts).unwrap();
            let (p, b): (u64, u64) = self.totals.iter().fold((0, 0), |a, t| (a.0 + t.0, a.1 + t.1));
            h.write("sys/class/net/eth9/statistics/rx_packets", &p.to_string()).unwrap();
            h.write("sys/class/net/eth9/statistics/rx_bytes", &b.to_string()).unwrap();
            fake.borrow_mut().stats = if fake.borrow().per_queue { stats } else { Vec::new() };
        }
    }

    fn options() -> Options {
        Options {
            iface: "eth9".into(),
            interval: Duration::from_millis(100),
            duration: None,
            count: None,
            max_writes_per_sec: 10.0,
            take_over: false,
        }
    }

    fn start(h: &Host, fake: &Rc<RefCell<Fake>>, a: &Options) -> Start {
        Controller::start(h.clone(), Box::new(FakeNic(fake.clone())), a).unwrap()
    }

    fn run_ticks(
        c: &mut Controller,
        q: &mut Queues,
        h: &Host,
        fake: &Rc<RefCell<Fake>>,
        bulk: &[bool],
        from: u64,
        n: u64,
    ) {
        for t in from..from + n {
            q.step(h, fake, bulk);
            c.tick(t * 100_000).unwrap();
        }
    }

    #[test]
    fn stands_aside_when_the_driver_adapts() {
        let (_d, h) = host(1);
        let fake = Rc::new(RefCell::new(Fake { driver: "mlx5_core".into(), ..Fake::default() }));
        fake.borrow_mut().device.use_adaptive_rx = 1;
        assert!(matches!(start(&h, &fake, &options()), Start::StandAside(w) if w.contains("use-adaptive-rx")));
        let e1000e = Rc::new(RefCell::new(Fake { driver: "e1000e".into(), ..Fake::default() }));
        e1000e.borrow_mut().device.rx_usecs = 3;
        assert!(
            matches!(start(&h, &e1000e, &options()), Start::StandAside(w) if w.contains("dynamic interrupt throttling"))
        );
        assert!(e1000e.borrow().device_writes.is_empty() && fake.borrow().device_writes.is_empty());
    }

    #[test]
    fn device_scope_follows_bulk_then_ping_pong_and_restores() {
        let (_d, h) = host(1);
        let fake = Rc::new(RefCell::new(Fake { driver: "e1000e".into(), ..Fake::default() }));
        fake.borrow_mut().device.rx_usecs = 3; // the driver's dynamic mode
        let a = Options { take_over: true, ..options() };
        let Start::Run(mut c) = start(&h, &fake, &a) else { panic!("should take over") };
        let mut q = Queues { totals: vec![(0, 0, 0)] };
        run_ticks(&mut c, &mut q, &h, &fake, &[true], 0, 60);
        let bulk_usecs = fake.borrow().device.rx_usecs;
        assert_eq!(bulk_usecs, 256, "bulk moves to the most moderated profile");
        // e1000e has no frame cap: the controller learned that and stopped sending it.
        assert!(fake.borrow().device_writes.iter().all(|w| w.rx_max_frames == 0 && w.use_adaptive_rx == 0));
        // The e1000e table never goes below its 10 us minimum.
        assert!(fake.borrow().device_writes.iter().all(|w| w.rx_usecs >= 10));
        run_ticks(&mut c, &mut q, &h, &fake, &[false], 60, 80);
        assert_eq!(fake.borrow().device.rx_usecs, 10, "ping-pong moves back to the lowest timer");
        c.restore().unwrap();
        assert_eq!(fake.borrow().device.rx_usecs, 3, "the driver's own mode is back");
    }

    #[test]
    fn per_queue_scope_tunes_each_queue_on_its_own() {
        let (_d, h) = host(2);
        let fake = Rc::new(RefCell::new(Fake {
            driver: "ice".into(),
            per_queue: true,
            frames: true,
            queues: vec![Coalesce { rx_usecs: 50, ..Coalesce::default() }; 2],
            ..Fake::default()
        }));
        let mut q = Queues { totals: vec![(0, 0, 0); 2] };
        q.step(&h, &fake, &[true, false]);
        let Start::Run(mut c) = start(&h, &fake, &options()) else { panic!("should run") };
        assert!(c.describe().contains("one tuner per receive queue"), "{}", c.describe());
        run_ticks(&mut c, &mut q, &h, &fake, &[true, false], 1, 80);
        {
            let f = fake.borrow();
            assert_eq!(f.queues[0].rx_usecs, 256, "bulk queue");
            assert_eq!(f.queues[1].rx_usecs, 1, "ping-pong queue");
            assert_eq!(f.queues[0].rx_max_frames, 256);
            assert!(f.device_writes.is_empty(), "never a device-wide write");
        }
        drop(c); // restores on drop
        assert!(fake.borrow().queues.iter().all(|c| c.rx_usecs == 50 && c.rx_max_frames == 0));
    }

    #[test]
    fn writes_are_capped() {
        let (_d, h) = host(1);
        let fake = Rc::new(RefCell::new(Fake { driver: "fake".into(), frames: true, ..Fake::default() }));
        let a = Options { max_writes_per_sec: 1.0, ..options() };
        let Start::Run(mut c) = start(&h, &fake, &a) else { panic!() };
        let mut q = Queues { totals: vec![(0, 0, 0)] };
        // 3 seconds of samples every 10 ms under bulk traffic.
        for t in 0..300u64 {
            q.step(&h, &fake, &[true]);
            c.tick(t * 10_000).unwrap();
        }
        let n = fake.borrow().device_writes.len();
        assert!((2..=4).contains(&n), "{n} writes in 3 s with a cap of 1/s");
    }

    #[test]
    fn repeated_write_failures_stop_the_controller() {
        let (_d, h) = host(1);
        let fake =
            Rc::new(RefCell::new(Fake { driver: "fake".into(), frames: true, fail_writes: true, ..Fake::default() }));
        let Start::Run(mut c) = start(&h, &fake, &options()) else { panic!() };
        let mut q = Queues { totals: vec![(0, 0, 0)] };
        let mut err = None;
        for t in 0..200u64 {
            q.step(&h, &fake, &[true]);
            if let Err(e) = c.tick(t * 100_000) {
                err = Some(e);
                break;
            }
        }
        assert!(err.expect("should fail").to_string().contains("three coalescing writes"));
        assert!(c.restore().is_ok(), "nothing was written, nothing to restore");
    }

    #[test]
    fn an_unknown_interface_is_a_clear_error() {
        let (_d, h) = host(1);
        let fake = Rc::new(RefCell::new(Fake::default()));
        let a = Options { iface: "nope0".into(), ..options() };
        let e = Controller::start(h, Box::new(FakeNic(fake)), &a).err().unwrap();
        assert!(e.to_string().contains("nope0: no such interface"), "{e}");
    }

    #[test]
    fn spawns_nothing_without_interfaces() {
        assert!(spawn(&Dim::default(), Arc::new(AtomicBool::new(true))).is_empty());
    }
}
