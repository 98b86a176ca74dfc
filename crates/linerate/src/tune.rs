//! `linerate tune`: the command line of the host checks (`linerate::tune`) and of
//! `linerate tune dim`, the interrupt-moderation controller run in the foreground
//! (`linerate::tune::dim`).

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use linerate::tune::{self, dim};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct TuneArgs {
    #[command(subcommand)]
    command: Option<TuneCommand>,
    /// Make the changes marked "change" (default: only print them).
    #[arg(long, conflicts_with = "revert")]
    apply: bool,
    /// Restore every value a previous --apply changed.
    #[arg(long)]
    revert: bool,
    /// Root of the /proc and /sys trees to check (a snapshot or a test fixture).
    #[arg(long, value_name = "DIR", default_value = "/")]
    sysroot: PathBuf,
    /// Where --apply records old values (default: SYSROOT/var/lib/linerate/tune-state.toml).
    #[arg(long, value_name = "FILE")]
    state_file: Option<PathBuf>,
}

#[derive(Subcommand)]
enum TuneCommand {
    /// Drive a NIC's receive interrupt coalescing with DIM (see docs/DIM.md).
    Dim(DimArgs),
}

#[derive(Args, Clone, Debug)]
pub struct DimArgs {
    /// Interface whose receive coalescing to drive.
    #[arg(long, value_name = "IF")]
    iface: String,
    /// Sampling period.
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// Stop after this long (restoring the original settings).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Stop after this many samples.
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Most coalescing writes per second to the device (all queues together).
    #[arg(long, value_name = "N", default_value_t = 10.0)]
    max_writes_per_sec: f64,
    /// Drive the NIC even when its driver adapts coalescing itself (the driver's
    /// mode is switched off while we run and restored at exit).
    #[arg(long)]
    take_over: bool,
}

pub fn run(args: TuneArgs) -> anyhow::Result<()> {
    if let Some(TuneCommand::Dim(a)) = args.command {
        return run_dim(&a);
    }
    tune::run(tune::Options {
        apply: args.apply,
        revert: args.revert,
        sysroot: args.sysroot,
        state_file: args.state_file,
    })
}

/// `linerate tune dim`: runs until the duration, the count or a signal.
fn run_dim(args: &DimArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.duration.is_some() || args.count.is_some(),
        "give --duration or --count so the controller stops by itself (SIGINT/SIGTERM stop it too)"
    );
    let opts = dim::Options {
        iface: args.iface.clone(),
        interval: args.interval,
        duration: args.duration,
        count: args.count,
        max_writes_per_sec: args.max_writes_per_sec,
        take_over: args.take_over,
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let summary = dim::run_until(&opts, &stop, |line| println!("{line}"))?;
    match summary.stood_aside {
        Some(why) => println!("{}: standing aside: {why}", args.iface),
        None => println!(
            "{}: {} samples, {} writes, original settings {}",
            args.iface,
            summary.samples,
            summary.writes,
            if summary.restored { "restored" } else { "untouched" }
        ),
    }
    Ok(())
}
