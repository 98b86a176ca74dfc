//! `linerate prefill MANIFEST`: hands a manifest to a running server's admin
//! endpoint (`POST /prefill`), then follows the job (`GET /prefill`) with a
//! progress bar until every title is in (docs/PREFILL.md).

use std::io::{IsTerminal, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::Value;

#[derive(Args)]
pub struct PrefillArgs {
    /// The manifest: one path per line, most popular first (`#` comments; an
    /// optional `lifetime 7d` or `expires RFC3339` line first), or the same as JSON.
    #[arg(value_name = "MANIFEST")]
    manifest: PathBuf,
    /// The server's admin endpoint.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9090")]
    admin: String,
    /// Return once the server has taken the manifest, without following the job.
    #[arg(long)]
    no_wait: bool,
    /// How often the progress is read, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 500)]
    interval: u64,
}

pub fn run(args: PrefillArgs) -> anyhow::Result<()> {
    let text = std::fs::read(&args.manifest).with_context(|| format!("cannot read {}", args.manifest.display()))?;
    let admin = args.admin.trim_start_matches("http://").trim_end_matches('/').to_string();
    let (status, body) = request(&admin, "POST", &text).context("cannot reach the admin endpoint")?;
    if status != 202 {
        bail!("{}: {} (HTTP {status})", args.manifest.display(), String::from_utf8_lossy(&body).trim());
    }
    let first: Value = serde_json::from_slice(&body).context("the server's answer is not JSON")?;
    let submitted = first["submitted"].as_i64();
    let total = first["titles_total"].as_u64().unwrap_or(0);
    println!("prefill: {total} titles submitted to {admin} (rate {}, window {})", rate(&first), window(&first));
    if args.no_wait {
        return Ok(());
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} titles  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    let (mut last_fetched, mut last_at, mut last_line) = (first["bytes_fetched"].as_u64().unwrap_or(0), started, None);
    let fetched_at_start = last_fetched;
    let mut mbps = 0.0;
    loop {
        std::thread::sleep(Duration::from_millis(args.interval.max(50)));
        let (status, body) = request(&admin, "GET", b"").context("cannot reach the admin endpoint")?;
        if status != 200 {
            bail!("GET /prefill: HTTP {status}: {}", String::from_utf8_lossy(&body).trim());
        }
        let p: Value = serde_json::from_slice(&body).context("the server's progress is not JSON")?;
        if p["submitted"].as_i64() != submitted {
            bar.abandon();
            bail!("another manifest replaced this one");
        }
        let state = p["state"].as_str().unwrap_or("?").to_string();
        let fetched = p["bytes_fetched"].as_u64().unwrap_or(0);
        let now = Instant::now();
        let secs = now.duration_since(last_at).as_secs_f64();
        if secs >= 1.0 {
            mbps = fetched.saturating_sub(last_fetched) as f64 * 8.0 / secs / 1e6;
            (last_fetched, last_at) = (fetched, now);
        }
        let (done, failed) = (p["titles_done"].as_u64().unwrap_or(0), p["titles_failed"].as_u64().unwrap_or(0));
        let msg = format!(
            "{}/{} MiB  {mbps:.0} Mb/s  {state}",
            p["bytes_done"].as_u64().unwrap_or(0) >> 20,
            p["bytes_known"].as_u64().unwrap_or(0) >> 20
        );
        bar.set_position(done + failed);
        bar.set_message(msg.clone());
        // Without a terminal the bar is not drawn: a line when the state changes.
        if !tty && last_line.as_deref() != Some(state.as_str()) {
            eprintln!("prefill: {state}: {}/{total} titles", done + failed);
            last_line = Some(state.clone());
        }
        match state.as_str() {
            "done" => {
                bar.finish();
                let took = started.elapsed().as_secs_f64();
                let bytes = fetched.saturating_sub(fetched_at_start);
                println!(
                    "prefill: done: {done} titles, {:.1} MiB fetched in {took:.1} s ({:.1} Mb/s)",
                    bytes as f64 / 1048576.0,
                    bytes as f64 * 8.0 / took / 1e6
                );
                if failed > 0 {
                    for e in p["errors"].as_array().into_iter().flatten() {
                        eprintln!(
                            "prefill: entry {} ({}): {}",
                            e[0],
                            e[1].as_str().unwrap_or("?"),
                            e[2].as_str().unwrap_or("?")
                        );
                    }
                    bail!("{failed} of {total} titles could not be filled");
                }
                return Ok(());
            }
            "expired" | "idle" => {
                bar.abandon();
                bail!("the job ended {state} before it was done");
            }
            _ => {}
        }
    }
}

fn rate(p: &Value) -> String {
    format!("{} Mb/s", p["rate_bits_per_second"].as_u64().unwrap_or(0) as f64 / 1e6)
}

fn window(p: &Value) -> String {
    p["window"].as_str().map_or("any time".into(), |w| format!("{w} local time"))
}

/// One request to `/prefill` (HTTP/1.1, closed after), returning status and body.
fn request(admin: &str, method: &str, body: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
    let addr = admin
        .to_socket_addrs()
        .with_context(|| format!("--admin {admin}: not an address"))?
        .next()
        .with_context(|| format!("--admin {admin}: no address"))?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).with_context(|| format!("{addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!("{method} /prefill HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n").into_bytes();
    if method == "POST" {
        req.extend_from_slice(format!("Content-Type: text/plain\r\nContent-Length: {}\r\n", body.len()).as_bytes());
    }
    req.extend_from_slice(b"\r\n");
    req.extend_from_slice(body);
    s.write_all(&req)?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    let end = resp.windows(4).position(|w| w == b"\r\n\r\n").context("no response head")?;
    let head = String::from_utf8_lossy(&resp[..end]);
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("no status")?;
    Ok((status, resp[end + 4..].to_vec()))
}
