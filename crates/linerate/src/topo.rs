//! `linerate topo`: prints the silo plan the server would use (`linerate::topology`).

use std::path::PathBuf;

use linerate::config::Config;
use linerate::topology;

/// `linerate topo`: the silo plan the server would use.
#[derive(clap::Args, Debug)]
pub struct TopoArgs {
    /// The configuration whose `[numa]` section and `workers` apply.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Worker count, as `serve --workers`.
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Read sysfs and procfs under this directory instead of / (fixture trees).
    #[arg(long, value_name = "DIR", default_value = "/")]
    sysroot: PathBuf,
}

pub fn run(args: TopoArgs) -> anyhow::Result<()> {
    let config = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    let workers = args.workers.unwrap_or(config.workers);
    let (topo, plan) = topology::plan_for(&config, workers, &args.sysroot)?;
    if args.json {
        let v = serde_json::json!({
            "domains": plan.domains,
            "steering": plan.steering,
            "pin": plan.pin,
            "workers": plan.workers,
            "nodes": topo.nodes,
            "nics": topo.nics,
            "disks": topo.disks,
            "warnings": plan.warnings,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", plan.render_text(&topo));
    }
    Ok(())
}
