//! `linerate dim simulate`: a receive queue under ping-pong, bulk and changing
//! traffic, with each static coalescing profile and with adaptive moderation, so the
//! algorithm in `linerate-dim` can be judged against the best fixed setting.
//!
//! The simulator is its own crate, not part of `linerate-dim`, because it needs a
//! plotting library and a histogram; the algorithm crate and the server stay free of
//! both.
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]

mod plot;
mod queue;
mod traffic;

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use linerate_dim::{Direction, ProfileTable, TimerMode, Tuner, TunerConfig};

use queue::{simulate, Coalescing, Costs, Outcome};
use traffic::{Flow, Traffic, TrafficModel};

#[derive(Args)]
pub struct DimArgs {
    #[command(subcommand)]
    command: DimCommand,
}

#[derive(Subcommand)]
enum DimCommand {
    /// Simulate one receive queue with static and adaptive coalescing and report
    /// CPU per packet and latency for each (markdown on stdout).
    Simulate(SimulateArgs),
}

#[derive(Args)]
pub struct SimulateArgs {
    /// Simulated seconds per workload (and per phase of the changing one).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Ping-pong flows in the request/response workload.
    #[arg(long, default_value_t = 1)]
    rr_flows: u32,
    /// Bulk streams in the bulk workload.
    #[arg(long, default_value_t = 8)]
    bulk_streams: u32,
    /// Packets per second of all bulk streams together (1500-byte frames).
    #[arg(long, default_value_t = 300_000.0)]
    bulk_pps: f64,
    /// CPU cost of one interrupt, ns.
    #[arg(long, default_value_t = 3_000)]
    irq_ns: u64,
    /// CPU cost of one packet, ns.
    #[arg(long, default_value_t = 400)]
    packet_ns: u64,
    /// CPU cost of programming a new profile, ns.
    #[arg(long, default_value_t = 20_000)]
    apply_ns: u64,
    /// Sampling period of the user-space controller row, ms.
    #[arg(long, default_value_t = 10)]
    controller_tick_ms: u64,
    /// Random seed (arrivals and jitter); the same seed gives the same report.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the profile-over-time chart of the RR -> bulk -> RR run here (SVG).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

pub fn run(args: DimArgs) -> anyhow::Result<()> {
    match args.command {
        DimCommand::Simulate(a) => {
            let report = simulate_all(&a)?;
            print!("{report}");
            Ok(())
        }
    }
}

/// The policies compared, in report order.
#[derive(Clone, Copy)]
enum Policy {
    Static(usize),
    DriverRules,
    Linerate,
    Controller,
}

fn table() -> ProfileTable {
    ProfileTable::default_for(Direction::Rx, TimerMode::FromFirstEvent)
}

impl Policy {
    fn all() -> Vec<Policy> {
        let mut v: Vec<Policy> = (0..table().len()).map(Policy::Static).collect();
        v.extend([Policy::DriverRules, Policy::Linerate, Policy::Controller]);
        v
    }

    fn name(&self) -> String {
        match self {
            Policy::Static(i) => format!("static {}", table().profile(*i)),
            Policy::DriverRules => "adaptive, driver rules".into(),
            Policy::Linerate => "adaptive, linerate rules".into(),
            Policy::Controller => "adaptive, user-space tick".into(),
        }
    }

    fn coalescing(&self, tick_ns: u64) -> Coalescing {
        let adaptive = |config, sample_every_ns| Coalescing::Adaptive {
            tuner: Box::new(Tuner::new(table(), config)),
            sample_every_ns,
        };
        match self {
            Policy::Static(i) => Coalescing::Static(table().profile(*i)),
            Policy::DriverRules => adaptive(TunerConfig::DRIVER, 0),
            Policy::Linerate => adaptive(TunerConfig::default(), 0),
            Policy::Controller => adaptive(TunerConfig::default(), tick_ns),
        }
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn mean_us(h: &hdrhistogram::Histogram<u64>) -> f64 {
    h.mean() / 1000.0
}

fn simulate_all(a: &SimulateArgs) -> anyhow::Result<String> {
    anyhow::ensure!(a.seconds > 0.0 && a.seconds <= 600.0, "--seconds must be in (0, 600]");
    anyhow::ensure!(a.bulk_pps > 0.0 && a.bulk_pps <= 20e6, "--bulk-pps must be in (0, 20e6]");
    anyhow::ensure!(a.rr_flows >= 1 && a.bulk_streams >= 1, "--rr-flows and --bulk-streams must be at least 1");
    let costs = Costs { irq_ns: a.irq_ns, packet_ns: a.packet_ns, apply_ns: a.apply_ns, ..Costs::default() };
    let phase_ns = (a.seconds * 1e9) as u64;
    let tick_ns = a.controller_tick_ms * 1_000_000;
    let model = TrafficModel::default();
    let rr = |seed| {
        let mut t = Traffic::new(model, seed);
        for _ in 0..a.rr_flows {
            t.add(Flow::PingPong, 0, u64::MAX);
        }
        t
    };
    let bulk = |seed| {
        let mut t = Traffic::new(model, seed);
        for _ in 0..a.bulk_streams {
            t.add(Flow::Bulk { packets_per_sec: a.bulk_pps / f64::from(a.bulk_streams) }, 0, u64::MAX);
        }
        t
    };
    let policies = Policy::all();
    let mut rr_out = Vec::new();
    let mut bulk_out = Vec::new();
    for p in &policies {
        rr_out.push(simulate(&mut rr(a.seed), costs, p.coalescing(tick_ns), phase_ns));
        bulk_out.push(simulate(&mut bulk(a.seed), costs, p.coalescing(tick_ns), phase_ns));
    }

    let mut r = String::new();
    writeln!(
        r,
        "Receive queue, {} s per workload, seed {}; costs: {} ns/interrupt, {} ns/packet, {} ns/poll, {} ns/profile write.\n",
        a.seconds, a.seed, costs.irq_ns, costs.packet_ns, costs.poll_ns, costs.apply_ns
    )?;
    writeln!(r, "Request/response: {} ping-pong flow(s), {} B requests, {} us rest of round trip (+ exp. jitter, mean {} us).\n",
        a.rr_flows, model.rr_request_bytes, us(model.rr_base_ns), us(model.rr_jitter_ns))?;
    writeln!(r, "| policy | transactions/s | transaction mean / p99 (us) | rx latency p50 / p99 (us) | CPU ns/packet | profile writes |")?;
    writeln!(r, "|---|---:|---:|---:|---:|---:|")?;
    for (p, o) in policies.iter().zip(&rr_out) {
        writeln!(
            r,
            "| {} | {:.0} | {:.1} / {:.1} | {:.1} / {:.1} | {:.0} | {} |",
            p.name(),
            o.transactions_per_sec(),
            mean_us(&o.transaction_ns),
            us(o.transaction_ns.value_at_quantile(0.99)),
            us(o.rx_latency_ns.value_at_quantile(0.5)),
            us(o.rx_latency_ns.value_at_quantile(0.99)),
            o.cpu_ns_per_packet(),
            o.profile_changes
        )?;
    }
    writeln!(
        r,
        "\nBulk: {} streams, {:.0} packets/s of {} B in trains of 1..={} frames ({:.2} Gb/s).\n",
        a.bulk_streams,
        a.bulk_pps,
        model.bulk_frame_bytes,
        model.bulk_max_train,
        a.bulk_pps * f64::from(model.bulk_frame_bytes) * 8.0 / 1e9
    )?;
    writeln!(r, "| policy | CPU ns/packet | CPU busy | interrupts/s | rx latency p50 / p99 (us) | profile writes |")?;
    writeln!(r, "|---|---:|---:|---:|---:|---:|")?;
    for (p, o) in policies.iter().zip(&bulk_out) {
        writeln!(
            r,
            "| {} | {:.0} | {:.1} % | {:.0} | {:.1} / {:.1} | {} |",
            p.name(),
            o.cpu_ns_per_packet(),
            100.0 * o.cpu_share(),
            o.interrupts as f64 / (o.duration_ns as f64 / 1e9),
            us(o.rx_latency_ns.value_at_quantile(0.5)),
            us(o.rx_latency_ns.value_at_quantile(0.99)),
            o.profile_changes
        )?;
    }
    write_checks(&mut r, &policies, &rr_out, &bulk_out)?;

    // RR -> bulk -> RR, every adaptive policy, for the chart.
    let phases = [(0, phase_ns, "RR"), (phase_ns, 2 * phase_ns, "bulk"), (2 * phase_ns, 3 * phase_ns, "RR")];
    let changing = |seed| {
        let mut t = Traffic::new(model, seed);
        for _ in 0..a.rr_flows {
            t.add(Flow::PingPong, 0, phase_ns);
            t.add(Flow::PingPong, 2 * phase_ns, u64::MAX);
        }
        for _ in 0..a.bulk_streams {
            t.add(Flow::Bulk { packets_per_sec: a.bulk_pps / f64::from(a.bulk_streams) }, phase_ns, 2 * phase_ns);
        }
        t
    };
    let adaptive = [Policy::Linerate, Policy::DriverRules, Policy::Controller];
    let runs: Vec<Outcome> =
        adaptive.iter().map(|p| simulate(&mut changing(a.seed), costs, p.coalescing(tick_ns), 3 * phase_ns)).collect();
    writeln!(r, "\nRR -> bulk -> RR ({} s each): profile index at the end of each phase.\n", a.seconds)?;
    writeln!(r, "| policy | after RR | after bulk | after RR again | profile writes |")?;
    writeln!(r, "|---|---:|---:|---:|---:|")?;
    for (p, o) in adaptive.iter().zip(&runs) {
        let at = |t: u64| o.profile_trace.iter().take_while(|(ts, _)| *ts <= t).last().map_or(0, |(_, i)| *i);
        writeln!(
            r,
            "| {} | {} | {} | {} | {} |",
            p.name(),
            at(phase_ns),
            at(2 * phase_ns),
            at(3 * phase_ns),
            o.profile_changes
        )?;
    }
    if let Some(path) = &a.plot {
        let labels: Vec<String> = table().profiles().iter().map(|p| format!("{} {}", "", p)).collect();
        let labels: Vec<String> = labels.iter().map(|l| l.trim().to_string()).collect();
        let titles: Vec<String> = adaptive.iter().map(|p| p.name()).collect();
        let series: Vec<plot::Series<'_>> =
            titles.iter().zip(&runs).map(|(t, o)| plot::Series { title: t, trace: &o.profile_trace }).collect();
        plot::write_profile_chart(path, &series, &phases, 3 * phase_ns, &labels)?;
        writeln!(r, "\nChart written to {}.", path.display())?;
    }
    Ok(r)
}

/// The expectations of the issue, computed and stated, whichever way they fall.
fn write_checks(r: &mut String, policies: &[Policy], rr: &[Outcome], bulk: &[Outcome]) -> anyhow::Result<()> {
    let statics: Vec<usize> =
        policies.iter().enumerate().filter(|(_, p)| matches!(p, Policy::Static(_))).map(|(i, _)| i).collect();
    let best_rr = statics
        .iter()
        .copied()
        .min_by(|&x, &y| rr[x].transaction_ns.mean().total_cmp(&rr[y].transaction_ns.mean()))
        .unwrap_or(0);
    let best_bulk = statics
        .iter()
        .copied()
        .min_by(|&x, &y| bulk[x].cpu_ns_per_packet().total_cmp(&bulk[y].cpu_ns_per_packet()))
        .unwrap_or(0);
    let low_latency = statics.first().copied().unwrap_or(0);
    writeln!(
        r,
        "\nChecks (best static on RR: {}; on bulk CPU: {}):\n",
        policies[best_rr].name(),
        policies[best_bulk].name()
    )?;
    for (i, p) in policies.iter().enumerate() {
        if matches!(p, Policy::Static(_)) {
            continue;
        }
        let rr_ratio = rr[i].transaction_ns.mean() / rr[best_rr].transaction_ns.mean();
        let bulk_ratio = bulk[i].cpu_ns_per_packet() / bulk[best_bulk].cpu_ns_per_packet();
        let vs_low = bulk[i].cpu_ns_per_packet() / bulk[low_latency].cpu_ns_per_packet();
        let verdict = |ok: bool| if ok { "holds" } else { "does NOT hold" };
        writeln!(
            r,
            "- {}: RR mean transaction {:+.1} % vs best static ({} within 5 %); bulk CPU/packet {:+.1} % vs best static ({} within 10 %); bulk CPU/packet {:.0} % of the lowest-latency static.",
            p.name(),
            (rr_ratio - 1.0) * 100.0,
            verdict(rr_ratio <= 1.05),
            (bulk_ratio - 1.0) * 100.0,
            verdict(bulk_ratio <= 1.10),
            vs_low * 100.0
        )?;
    }
    Ok(())
}
