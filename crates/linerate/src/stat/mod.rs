//! `linerate stat`: one line per interval saying whether the box is healthy.
//!
//! Like the `nstat` of the systems linerate learns from: packets and Gb/s in and
//! out, errors, established TCP connections, TCP retransmissions and the share of
//! time TCP spent under memory pressure (`tcp_mem`: the kernel prunes receive
//! queues and refuses send buffer, and viewers stall on retransmission timeouts),
//! CPU busy, context switches, interrupts, free memory and reclaim stalls, all from
//! cheap kernel counters (/proc/net/dev, /proc/net/snmp, /proc/net/netstat,
//! /proc/stat, /proc/meminfo, /proc/vmstat; never a
//! walk over every socket), plus the server's own view from its admin endpoint
//! when it answers: connections, requests/s, the kTLS share of TLS bytes, 5xx/s and
//! the share of connections accepted across NUMA domains.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use linerate::procfs::Kernel;

#[derive(clap::Args, Debug)]
pub struct StatArgs {
    /// Seconds between lines.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Lines to print, then exit (default: until interrupted).
    #[arg(long)]
    count: Option<u64>,
    /// The server's admin endpoint.
    #[arg(long, default_value = "http://127.0.0.1:9090")]
    admin: String,
    /// Count only these interfaces (repeatable; default: all, loopback included).
    #[arg(long = "iface", value_name = "IF")]
    ifaces: Vec<String>,
    /// One JSON object per line instead of the table.
    #[arg(long)]
    json: bool,
    /// Read kernel counters under this directory instead of /proc (for tests).
    #[arg(long, default_value = "/proc", hide = true)]
    proc_root: PathBuf,
}

/// The server's counters that `stat` shows, from /status.
#[derive(Clone, Copy, Debug, Default)]
struct Server {
    connections: u64,
    requests: u64,
    responses_5xx: u64,
    ktls_bytes: u64,
    usertls_bytes: u64,
    accepted: u64,
    cross_domain: u64,
    resident_bytes: u64,
    filled_bytes: u64,
    fill_queue: i64,
    /// The pull-through cache's body bytes sent from stored slices and from slices
    /// being filled, and received from origins (0 without `[[origin]]`).
    cache_hit_bytes: u64,
    cache_miss_bytes: u64,
    origin_bytes: u64,
}

/// One line of output.
#[derive(Serialize, Debug)]
struct Row {
    time: f64,
    in_mpps: f64,
    out_mpps: f64,
    in_gbps: f64,
    out_gbps: f64,
    /// NIC errors and drops per second, both directions.
    errors_per_sec: f64,
    tcp_established: u64,
    /// TCP segments retransmitted per second.
    tcp_retrans_per_sec: f64,
    /// Share of the interval TCP spent under memory pressure (`tcp_mem`), counted
    /// when a pressure period ends (so a long one lands in one interval, capped at 100).
    tcp_memory_pressure_pct: f64,
    cpu_busy_pct: f64,
    context_switches_per_sec: f64,
    interrupts_per_sec: f64,
    gb_free: f64,
    reclaim_stalls_per_sec: f64,
    /// Bytes read from whole disks per second, in MB (10^6).
    disk_read_mbps: f64,
    /// Share of the interval in which some task waited for memory (PSI "some").
    memory_pressure_pct: f64,
    server: Option<ServerRow>,
}

#[derive(Serialize, Debug)]
struct ServerRow {
    connections: u64,
    requests_per_sec: f64,
    /// Share of TLS body bytes whose records the kernel sealed, in the interval.
    ktls_pct: Option<f64>,
    responses_5xx_per_sec: f64,
    /// Share of connections accepted in the interval whose SYN came in on another domain.
    cross_domain_pct: Option<f64>,
    /// Share of the body bytes sent in the interval that were in the page cache
    /// (the rest waited for a disk fill).
    page_cache_hit_pct: Option<f64>,
    /// Disk fills queued or running at the end of the interval.
    fill_queue: i64,
    /// Share of the cached objects' body bytes sent in the interval that came from
    /// stored slices (the rest from slices being filled from an origin).
    cache_hit_pct: Option<f64>,
    /// Megabits per second received from origins in the interval.
    origin_mbps: f64,
}

pub fn run(args: StatArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.interval > 0.0 && args.interval.is_finite(),
        "--interval must be a positive number of seconds"
    );
    let interval = Duration::from_secs_f64(args.interval);
    let admin = AdminClient::new(&args.admin)?;
    let mut prev = (Instant::now(), Kernel::read(&args.proc_root, &args.ifaces)?, admin.fetch());
    let mut out = std::io::stdout().lock();
    let mut printed = 0u64;
    while args.count.is_none_or(|c| printed < c) {
        std::thread::sleep(interval);
        let cur = (Instant::now(), Kernel::read(&args.proc_root, &args.ifaces)?, admin.fetch());
        let row = row(&prev, &cur);
        if args.json {
            writeln!(out, "{}", serde_json::to_string(&row)?)?;
        } else {
            if printed % 20 == 0 {
                writeln!(out, "{HEADER}")?;
            }
            writeln!(out, "{}", format_row(&row))?;
        }
        out.flush()?;
        printed += 1;
        prev = cur;
    }
    Ok(())
}

const HEADER: &str = "    time InMpps OMpps InGb/s OGb/s  errs TCPest  rtx/s tcpmem%  %CPU    cs/s  intr/s GBfree stalls diskMB/s mpsi% |  conns   req/s kTLS%  5xx/s xdom%  hit% fillq chit% oMb/s";

fn format_row(r: &Row) -> String {
    let clock = {
        let secs = r.time as u64 % 86_400;
        format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
    };
    let mut s = format!(
        "{clock} {:6.3} {:5.3} {:6.2} {:5.2} {:5.0} {:6} {:6.0} {:7.1} {:5.1} {:7.0} {:7.0} {:6.1} {:6.0} {:8.1} {:5.1} |",
        r.in_mpps,
        r.out_mpps,
        r.in_gbps,
        r.out_gbps,
        r.errors_per_sec,
        r.tcp_established,
        r.tcp_retrans_per_sec,
        r.tcp_memory_pressure_pct,
        r.cpu_busy_pct,
        r.context_switches_per_sec,
        r.interrupts_per_sec,
        r.gb_free,
        r.reclaim_stalls_per_sec,
        r.disk_read_mbps,
        r.memory_pressure_pct,
    );
    let pct = |v: Option<f64>| v.map_or("    -".to_string(), |p| format!("{p:5.1}"));
    match &r.server {
        Some(sv) => s.push_str(&format!(
            " {:6} {:7.0} {} {:6.1} {} {} {:5} {} {:5.0}",
            sv.connections,
            sv.requests_per_sec,
            pct(sv.ktls_pct),
            sv.responses_5xx_per_sec,
            pct(sv.cross_domain_pct),
            pct(sv.page_cache_hit_pct),
            sv.fill_queue,
            pct(sv.cache_hit_pct),
            sv.origin_mbps
        )),
        None => s.push_str("      -       -     -      -     -     -     -     -     -"),
    }
    s
}

fn row(prev: &(Instant, Kernel, Option<Server>), cur: &(Instant, Kernel, Option<Server>)) -> Row {
    let secs = cur.0.duration_since(prev.0).as_secs_f64().max(1e-6);
    let (a, b) = (&prev.1, &cur.1);
    let per_sec = |x: u64, y: u64| y.saturating_sub(x) as f64 / secs;
    let cpu_total = b.cpu_total.saturating_sub(a.cpu_total);
    let server = match (&prev.2, &cur.2) {
        (Some(p), Some(c)) => {
            let tls = c.ktls_bytes.saturating_sub(p.ktls_bytes) + c.usertls_bytes.saturating_sub(p.usertls_bytes);
            let accepted = c.accepted.saturating_sub(p.accepted);
            let resident = c.resident_bytes.saturating_sub(p.resident_bytes);
            let filled = c.filled_bytes.saturating_sub(p.filled_bytes);
            Some(ServerRow {
                connections: c.connections,
                requests_per_sec: per_sec(p.requests, c.requests),
                ktls_pct: (tls > 0).then(|| 100.0 * c.ktls_bytes.saturating_sub(p.ktls_bytes) as f64 / tls as f64),
                responses_5xx_per_sec: per_sec(p.responses_5xx, c.responses_5xx),
                cross_domain_pct: (accepted > 0)
                    .then(|| 100.0 * c.cross_domain.saturating_sub(p.cross_domain) as f64 / accepted as f64),
                page_cache_hit_pct: (resident + filled > 0)
                    .then(|| 100.0 * resident as f64 / (resident + filled) as f64),
                fill_queue: c.fill_queue,
                cache_hit_pct: {
                    let hit = c.cache_hit_bytes.saturating_sub(p.cache_hit_bytes);
                    let miss = c.cache_miss_bytes.saturating_sub(p.cache_miss_bytes);
                    (hit + miss > 0).then(|| 100.0 * hit as f64 / (hit + miss) as f64)
                },
                origin_mbps: per_sec(p.origin_bytes, c.origin_bytes) * 8.0 / 1e6,
            })
        }
        _ => None,
    };
    Row {
        time: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()),
        in_mpps: per_sec(a.rx_packets, b.rx_packets) / 1e6,
        out_mpps: per_sec(a.tx_packets, b.tx_packets) / 1e6,
        in_gbps: per_sec(a.rx_bytes, b.rx_bytes) * 8.0 / 1e9,
        out_gbps: per_sec(a.tx_bytes, b.tx_bytes) * 8.0 / 1e9,
        errors_per_sec: per_sec(a.errors, b.errors),
        tcp_established: b.tcp_established,
        tcp_retrans_per_sec: per_sec(a.tcp_retrans_segs, b.tcp_retrans_segs),
        tcp_memory_pressure_pct: (per_sec(a.tcp_memory_pressure_ms, b.tcp_memory_pressure_ms) / 10.0).min(100.0),
        cpu_busy_pct: if cpu_total > 0 {
            100.0 * b.cpu_busy.saturating_sub(a.cpu_busy) as f64 / cpu_total as f64
        } else {
            0.0
        },
        context_switches_per_sec: per_sec(a.context_switches, b.context_switches),
        interrupts_per_sec: per_sec(a.interrupts, b.interrupts),
        gb_free: b.mem_available_kb as f64 / (1024.0 * 1024.0),
        reclaim_stalls_per_sec: per_sec(a.reclaim_stalls, b.reclaim_stalls),
        disk_read_mbps: per_sec(a.disk_read_bytes, b.disk_read_bytes) / 1e6,
        memory_pressure_pct: (per_sec(a.memory_pressure_some_us, b.memory_pressure_some_us) / 1e4).min(100.0),
        server,
    }
}

/// A minimal HTTP/1.0 GET of the admin endpoint's /status.
struct AdminClient {
    addr: Option<std::net::SocketAddr>,
    host: String,
}

impl AdminClient {
    fn new(url: &str) -> anyhow::Result<AdminClient> {
        let rest = url.strip_prefix("http://").context("--admin must be an http:// URL")?;
        let host = rest.split('/').next().unwrap_or(rest).to_string();
        let addr = host.to_socket_addrs().ok().and_then(|mut a| a.next());
        Ok(AdminClient { addr, host })
    }

    /// The server's counters, or None when the endpoint does not answer.
    fn fetch(&self) -> Option<Server> {
        let mut s = TcpStream::connect_timeout(&self.addr?, Duration::from_millis(300)).ok()?;
        s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
        s.write_all(format!("GET /status HTTP/1.0\r\nHost: {}\r\n\r\n", self.host).as_bytes()).ok()?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).ok()?;
        let body = &resp[resp.windows(4).position(|w| w == b"\r\n\r\n")? + 4..];
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        let t = v.get("totals")?;
        let n = |k: &str| t.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
        Some(Server {
            connections: n("connections_open"),
            requests: n("requests"),
            responses_5xx: n("responses_5xx"),
            ktls_bytes: n("body_bytes_ktls"),
            usertls_bytes: n("body_bytes_usertls"),
            accepted: n("connections_accepted"),
            cross_domain: n("cross_domain_connections"),
            resident_bytes: n("body_resident_bytes"),
            filled_bytes: n("body_filled_bytes"),
            fill_queue: v.pointer("/cold/fill_queue_depth").and_then(|x| x.as_i64()).unwrap_or(0),
            cache_hit_bytes: v.pointer("/cache/hit_bytes").and_then(|x| x.as_u64()).unwrap_or(0),
            cache_miss_bytes: v.pointer("/cache/miss_bytes").and_then(|x| x.as_u64()).unwrap_or(0),
            origin_bytes: v.pointer("/cache/origin_bytes").and_then(|x| x.as_u64()).unwrap_or(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_rates_over_the_interval() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(2);
        let a = Kernel {
            rx_bytes: 0,
            tx_bytes: 0,
            rx_packets: 0,
            tx_packets: 0,
            cpu_busy: 100,
            cpu_total: 1000,
            ..Kernel::default()
        };
        let b = Kernel {
            rx_bytes: 2_500_000_000,
            tx_bytes: 5_000_000_000,
            rx_packets: 2_000_000,
            tx_packets: 4_000_000,
            cpu_busy: 600,
            cpu_total: 2000,
            mem_available_kb: 2 * 1024 * 1024,
            tcp_established: 7,
            tcp_retrans_segs: 500,
            tcp_memory_pressure_ms: 500,
            disk_read_bytes: 300_000_000,
            memory_pressure_some_us: 200_000,
            ..Kernel::default()
        };
        let sa = Server { requests: 10, accepted: 4, ktls_bytes: 0, usertls_bytes: 0, ..Server::default() };
        let sb = Server {
            requests: 30,
            accepted: 8,
            cross_domain: 1,
            ktls_bytes: 300,
            usertls_bytes: 100,
            connections: 3,
            resident_bytes: 900,
            filled_bytes: 100,
            fill_queue: 2,
            cache_hit_bytes: 300,
            cache_miss_bytes: 100,
            origin_bytes: 1_000_000,
            ..Server::default()
        };
        let r = row(&(t0, a, Some(sa)), &(t1, b, Some(sb)));
        assert_eq!(r.in_gbps, 10.0);
        assert_eq!(r.out_gbps, 20.0);
        assert_eq!(r.in_mpps, 1.0);
        assert_eq!(r.cpu_busy_pct, 50.0);
        assert_eq!(r.gb_free, 2.0);
        assert_eq!(r.tcp_retrans_per_sec, 250.0);
        assert_eq!(r.tcp_memory_pressure_pct, 25.0);
        let s = r.server.as_ref().unwrap();
        assert_eq!(s.requests_per_sec, 10.0);
        assert_eq!(s.ktls_pct, Some(75.0));
        assert_eq!(s.cross_domain_pct, Some(25.0));
        assert_eq!(s.page_cache_hit_pct, Some(90.0));
        assert_eq!(s.fill_queue, 2);
        assert_eq!(s.cache_hit_pct, Some(75.0));
        assert_eq!(s.origin_mbps, 4.0, "1 MB in the 2-s interval");
        assert_eq!(r.disk_read_mbps, 150.0);
        assert_eq!(r.memory_pressure_pct, 10.0);
        let line = format_row(&r);
        assert!(line.contains("|"), "{line}");
        assert_eq!(HEADER.split_whitespace().count(), line.split_whitespace().count(), "{HEADER}\n{line}");
    }
}
