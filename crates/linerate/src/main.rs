//! The `linerate` command: `linerate serve` runs the media server, `linerate bench`
//! the streaming load generator.
#![forbid(unsafe_code)]

mod capacity;
mod prefill;
mod stat;
mod topo;
mod tune;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use linerate::config::{Config, LogFormat, Overrides};
use linerate::{demo, server};
use linerate_dim_sim as dim_sim;
use linerate_loadgen as bench;

#[derive(Parser)]
#[command(name = "linerate", version, about = "An edge server for bulk media delivery")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve files over HTTP/1.1 and HTTPS (sendfile, kernel TLS, one worker per CPU).
    Serve(ServeArgs),
    /// The NUMA silo plan: domains, CPUs, workers, NICs and disks, IRQ placement.
    Topo(topo::TopoArgs),
    /// One line per interval on the box's health: traffic, TCP, CPU, memory, and the
    /// server's own counters from its admin endpoint.
    Stat(stat::StatArgs),
    /// Measure this host (memory bandwidth, AES-GCM and sendfile per core, NICs, NUMA)
    /// and predict what it can serve per transport mode, naming the limit.
    Capacity(capacity::CapacityArgs),
    /// Dynamic interrupt moderation tools (`dim simulate`).
    Dim(dim_sim::DimArgs),
    /// Check (and with --apply, change) host settings a serving box depends on;
    /// `tune dim` runs the interrupt-moderation controller on a NIC.
    Tune(tune::TuneArgs),
    /// Play paced streaming sessions (or a closed loop) against a server; report QoE.
    Bench(bench::BenchArgs),
    /// Draw the per-second timelines of `bench --json` runs (and the server's CPU and
    /// memory samples) side by side, one SVG panel per figure.
    Chart(bench::chart::ChartArgs),
    /// Replace a running server with the binary now installed at its path, without
    /// losing a connection: sends it SIGUSR2 and waits until the new process serves
    /// (exit 0, its pid printed) or the upgrade failed and the old one serves on.
    Upgrade(UpgradeArgs),
    /// Pre-position a manifest's titles in a running server's cache (POST to its
    /// admin endpoint), then follow the job with a progress bar until it is done.
    Prefill(prefill::PrefillArgs),
}

#[derive(Args)]
struct UpgradeArgs {
    /// The server's pid file (`pid_file` in its configuration).
    #[arg(long, value_name = "FILE", required_unless_present = "config", conflicts_with = "config")]
    pid_file: Option<PathBuf>,
    /// Read `pid_file` from the server's configuration file instead.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Longest wait for the outcome, in seconds (more than the server's
    /// `timeouts.upgrade`).
    #[arg(long, value_name = "S", default_value_t = 90)]
    timeout: u64,
}

#[derive(Args)]
struct ServeArgs {
    /// TOML configuration file (keys in docs/CONFIG.md); flags below override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Directory to serve.
    #[arg(long, value_name = "DIR", conflicts_with = "demo")]
    root: Option<PathBuf>,
    /// Address to listen on; repeat for several. Port 0 picks a free port.
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Vec<SocketAddr>,
    /// Address to listen on for HTTPS; repeat for several. Needs --cert and --key
    /// (or tls.cert and tls.key in the config file).
    #[arg(long, value_name = "ADDR:PORT")]
    tls_listen: Vec<SocketAddr>,
    /// Default certificate chain (PEM) for HTTPS.
    #[arg(long, value_name = "FILE")]
    cert: Option<PathBuf>,
    /// Private key (PEM) of the default certificate.
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    /// Worker threads (default: one per CPU the process may use).
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// Admin endpoint (/metrics, /status, /healthz, /load); default 127.0.0.1:9090.
    #[arg(long, value_name = "ADDR:PORT", conflicts_with = "no_admin")]
    admin: Option<SocketAddr>,
    /// Do not start the admin endpoint.
    #[arg(long)]
    no_admin: bool,
    /// Add `X-Linerate-Worker: <worker> cpu=<cpu> node=<node>` to every response.
    #[arg(long)]
    debug_headers: bool,
    /// Append an access-log record per response to FILE (JSON lines; `[access_log]`
    /// in the config file for the format and sampling).
    #[arg(long, value_name = "FILE")]
    access_log: Option<PathBuf>,
    /// Connections one client (address or prefix) may have open at once
    /// (`client_limits.max_connections`); 0 = no limit.
    #[arg(long, value_name = "N")]
    max_client_connections: Option<u32>,
    /// New connections per second one client may open
    /// (`client_limits.max_new_connections_per_second`); 0 = no limit.
    #[arg(long, value_name = "N")]
    max_client_connection_rate: Option<u32>,
    /// Log filter, e.g. `info`, `debug`, `linerate=trace`.
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
    /// Serve a built-in demo page and video from a temporary directory.
    #[arg(long)]
    demo: bool,
    /// Print the effective configuration and exit (non-zero if it is invalid).
    #[arg(long)]
    check_config: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Stat(args) => stat::run(args),
        Command::Topo(args) => topo::run(args),
        Command::Capacity(args) => capacity::run(args),
        Command::Dim(args) => dim_sim::run(args),
        Command::Tune(args) => tune::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Chart(args) => bench::chart::run(args),
        Command::Upgrade(args) => upgrade(args),
        Command::Prefill(args) => prefill::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("linerate: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let demo = if args.demo { Some(demo::Demo::create()?) } else { None };
    let overrides = Overrides {
        root: demo.as_ref().map(|d| d.root().to_owned()).or(args.root),
        listen: args.listen,
        tls_listen: args.tls_listen,
        cert: args.cert,
        key: args.key,
        workers: args.workers,
        log_level: args.log_level,
        admin: args.admin,
        no_admin: args.no_admin,
        debug_headers: args.debug_headers,
        access_log: args.access_log,
        max_client_connections: args.max_client_connections,
        max_client_connection_rate: args.max_client_connection_rate,
    };
    let config = Config::load(args.config.as_deref(), &overrides)?;
    if args.check_config {
        print!("{}", config.to_toml());
        return Ok(());
    }
    init_logging(&config);
    if demo.is_some() {
        tracing::info!("demo mode: open the address below in a browser to play the demo video");
    }
    let opts = server::ServeOptions { config_file: args.config, overrides };
    let result = server::run(config, opts);
    drop(demo);
    result
}

fn upgrade(args: UpgradeArgs) -> anyhow::Result<()> {
    let pid_file = match (args.pid_file, &args.config) {
        (Some(f), _) => f,
        (None, Some(config)) => Config::from_file(config)?
            .pid_file
            .ok_or_else(|| anyhow::anyhow!("{} sets no `pid_file`", config.display()))?,
        (None, None) => anyhow::bail!("give --pid-file FILE or --config FILE"),
    };
    let new = server::upgrade::request(&pid_file, std::time::Duration::from_secs(args.timeout))?;
    println!("upgraded: the new process {new} serves; the old one drains its transfers");
    Ok(())
}

fn init_logging(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::builder()
        .parse(&config.log.level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
        // The S3 signer traces its canonical requests, which hold a session
        // token in the clear: never shown, whatever the level asked for.
        .add_directive("aws_sigv4=info".parse().expect("a valid directive"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match config.log.format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
