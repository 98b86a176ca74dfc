//! `linerate tune`: checks a host for what a media-serving box depends on (kTLS,
//! interrupt placement, steering, offloads, pacing, backlogs, memory headroom,
//! open files), explains each finding, and with `--apply` makes the changes it can,
//! recording the old values so `--revert` restores them. [`dim`] is the
//! interrupt-moderation controller (`linerate tune dim`, the `[dim]` section).
//!
//! Everything is read under `--sysroot` (default `/`), so the checks run unchanged
//! on fixture trees in tests and on a snapshot copied from another machine.

mod checks;
pub(crate) mod features;
mod queue_counters;

pub mod dim;
mod nic;
mod state;

use std::path::{Path, PathBuf};

use crate::sysfs::Host;
use checks::Status;
use features::{Features, LiveFeatures, SnapshotFeatures};

/// What `linerate tune` (without a subcommand) does.
#[derive(Clone, Debug)]
pub struct Options {
    /// Make the changes marked "change" (default: only print them).
    pub apply: bool,
    /// Restore every value a previous `apply` changed.
    pub revert: bool,
    /// Root of the /proc and /sys trees to check (a snapshot or a test fixture).
    pub sysroot: PathBuf,
    /// Where `apply` records old values (default: SYSROOT/var/lib/linerate/tune-state.toml).
    pub state_file: Option<PathBuf>,
}

/// Checks the host under `args.sysroot` and prints the findings; applies or reverts
/// the changes as asked.
pub fn run(args: Options) -> anyhow::Result<()> {
    let sysroot =
        args.sysroot.canonicalize().map_err(|e| anyhow::anyhow!("--sysroot {}: {e}", args.sysroot.display()))?;
    let host = Host::new(&sysroot);
    let features: Box<dyn Features> =
        if host.is_live() { Box::new(LiveFeatures) } else { Box::new(SnapshotFeatures { host: host.clone() }) };
    let state_path = args.state_file.unwrap_or_else(|| host.path("var/lib/linerate/tune-state.toml"));
    if args.revert {
        return revert(&host, features.as_ref(), &state_path);
    }
    check(&host, features.as_ref(), args.apply, &state_path)
}

fn check(host: &Host, features: &dyn Features, apply: bool, state_path: &Path) -> anyhow::Result<()> {
    let findings = checks::run_all(host, features);
    let mode = if apply { "applying changes" } else { "dry run; --apply makes the changes marked [change]" };
    println!("linerate tune: {} ({mode})", host.root().display());
    let mut failed = 0;
    for f in &findings {
        println!("[{}] {}: {}", f.status, f.check, f.detail);
        if f.status != Status::Change {
            continue;
        }
        if !apply {
            for a in &f.actions {
                println!("    would {a}");
            }
            continue;
        }
        for (a, outcome) in f.actions.iter().zip(state::apply(host, features, &f.actions, state_path)?) {
            match outcome {
                state::Outcome::Done => println!("    done: {a}"),
                state::Outcome::Skipped(why) => println!("    skipped: {a} ({why})"),
                state::Outcome::Failed(e) => {
                    failed += 1;
                    println!("    FAILED: {a}: {e:#}");
                }
            }
        }
    }
    let changes = findings.iter().filter(|f| f.status == Status::Change).count();
    let advice = findings.iter().filter(|f| f.status == Status::Advice).count();
    println!("{} checks: {changes} to change, {advice} advice", findings.len());
    if apply && changes > 0 {
        println!("previous values saved in {}; `linerate tune --revert` restores them", state_path.display());
    }
    anyhow::ensure!(failed == 0, "{failed} change(s) failed; the others were applied and recorded");
    Ok(())
}

fn revert(host: &Host, features: &dyn Features, state_path: &Path) -> anyhow::Result<()> {
    let results = state::revert(host, features, state_path)?;
    let mut failed = 0;
    for (entry, r) in &results {
        match r {
            Ok(()) => println!("restored: {entry:?}"),
            Err(e) => {
                failed += 1;
                println!("FAILED: {entry:?}: {e:#}");
            }
        }
    }
    anyhow::ensure!(failed == 0, "{failed} value(s) could not be restored; they stay in {}", state_path.display());
    println!("all {} change(s) reverted", results.len());
    Ok(())
}
