//! The admin endpoint: exact counters against what clients received (plain and
//! TLS), Prometheus output through a real parser, TCP_INFO sampling, /status,
//! /healthz and /load (also as a bare agent check), draining, and TCP settings
//! inherited by accepted connections.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::common;
use crate::common::tls::TestCa;
use crate::common::*;

/// Scrapes /metrics and parses it with the prometheus-parse crate.
fn scrape(s: &Server) -> prometheus_parse::Scrape {
    let out = curl(&["--fail", &s.admin_url("/metrics")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines = text.lines().map(|l| Ok(l.to_string()));
    prometheus_parse::Scrape::parse(lines).unwrap_or_else(|e| panic!("unparseable metrics: {e}\n{text}"))
}

/// The value of a counter or gauge sample with these labels.
fn value(scrape: &prometheus_parse::Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let found =
        scrape.samples.iter().find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)));
    match found.map(|s| &s.value) {
        Some(prometheus_parse::Value::Counter(v))
        | Some(prometheus_parse::Value::Gauge(v))
        | Some(prometheus_parse::Value::Untyped(v)) => *v,
        other => panic!("{metric}{labels:?}: {other:?}"),
    }
}

#[test]
fn counters_equal_what_clients_received() {
    let ca = TestCa::new();
    let c = Content::new();
    let data = c.write_random("movie.mp4", 5 << 20, 3);
    c.write("small.txt", b"0123456789");
    let s = common::tls::start_server(&ca, c.path(), &[]);
    let port = s.tls_addrs[0].port();
    let resolve = format!("localhost:{port}:127.0.0.1");
    let mut plain_bytes = 0usize;
    let mut tls_bytes = 0usize;
    let mut requests = 0;
    let mut by_code: HashMap<u16, u32> = HashMap::new();
    for (path, extra) in [
        ("/movie.mp4", vec![]),
        ("/movie.mp4", vec!["-r", "0-999"]),
        ("/movie.mp4", vec!["-r", "5-9,100000-200000"]),
        ("/small.txt", vec![]),
        ("/small.txt", vec!["-I"]),
        ("/missing", vec![]),
        ("/movie.mp4", vec!["-r", "99999999-"]),
    ] {
        for tls in [false, true] {
            let url = if tls { s.tls_url(path) } else { s.url(path) };
            let mut args = vec!["-i", "--cacert", ca.ca_arg(), "--resolve", &resolve];
            args.extend(&extra);
            args.push(&url);
            let out = curl(&args);
            let r = parse_response(&out.stdout).unwrap();
            requests += 1;
            *by_code.entry(r.status).or_default() += 1;
            // Everything after the head is body: file bytes, multipart framing,
            // error pages.
            if tls {
                tls_bytes += r.body.len();
            } else {
                plain_bytes += r.body.len();
            }
        }
    }
    assert!(plain_bytes > data.len());
    let m = scrape(&s);
    assert_eq!(value(&m, "linerate_body_bytes_total", &[("transport", "plain")]) as usize, plain_bytes);
    let tls_counted = value(&m, "linerate_body_bytes_total", &[("transport", "usertls")])
        + value(&m, "linerate_body_bytes_total", &[("transport", "ktls")]);
    assert_eq!(tls_counted as usize, tls_bytes);
    let total: f64 = m
        .samples
        .iter()
        .filter(|x| x.metric == "linerate_requests_total")
        .map(|x| match x.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
            ref other => panic!("{other:?}"),
        })
        .sum();
    assert_eq!(total as usize, requests);
    for (code, n) in by_code {
        assert_eq!(value(&m, "linerate_requests_total", &[("code", &code.to_string())]) as u32, n, "code {code}");
    }
    assert_eq!(value(&m, "linerate_tls_handshakes_total", &[]), 7.0);
}

#[test]
fn metrics_parse_and_name_the_contract() {
    let c = Content::new();
    c.write("a.txt", b"A");
    let s = Server::start(&["--root", &c.root_arg()]);
    assert_eq!(curl(&[&s.url("/a.txt")]).stdout, b"A");
    let m = scrape(&s);
    let names: Vec<&str> = m.samples.iter().map(|x| x.metric.as_str()).collect();
    for name in [
        "linerate_body_bytes_total",
        "linerate_requests_total",
        "linerate_connections",
        "linerate_cross_domain_connections_total",
        "linerate_tcp_rtt_seconds",
        "linerate_errors_total",
        "linerate_worker_cpu_seconds_total",
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    // One connection that has sent nothing yet and one kept alive after a response:
    // reading 1, idle 1, sending 0 (once the server has seen curl's connection close).
    let waiting = TcpStream::connect(s.addr()).unwrap();
    let mut kept = TcpStream::connect(s.addr()).unwrap();
    kept.write_all(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut response = Vec::new();
    let mut buf = [0u8; 1024];
    while !response.ends_with(b"\r\n\r\nA") {
        let n = common::read_some(&mut kept, &mut buf).unwrap();
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&response));
        response.extend_from_slice(&buf[..n]);
    }
    let states = |m: &prometheus_parse::Scrape| {
        ["reading", "sending", "idle"].map(|state| value(m, "linerate_connections", &[("state", state)]))
    };
    let mut seen = states(&m);
    eventually(Duration::from_secs(5), || {
        seen = states(&scrape(&s));
        seen == [1.0, 0.0, 1.0]
    });
    assert_eq!(seen, [1.0, 0.0, 1.0], "linerate_connections by state: reading, sending, idle");
    drop((waiting, kept));
    assert!(matches!(
        m.samples.iter().find(|x| x.metric == "linerate_tcp_rtt_seconds").map(|x| &x.value),
        Some(prometheus_parse::Value::Histogram(_))
    ));
    // One CPU time per worker.
    let workers = m.samples.iter().filter(|x| x.metric == "linerate_worker_cpu_seconds_total").count();
    assert_eq!(workers, linerate_cpus());
}

fn linerate_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[test]
fn tcp_info_sampling_follows_the_fraction() {
    let c = Content::new();
    c.write_random("big.bin", 8 << 20, 4);
    for (fraction, expect_samples) in [("1.0", true), ("0.0", false)] {
        let cfg = ConfigFile::new(&format!(
            "root = {:?}\n[stats]\ntcp_info_sample = {fraction}\ntcp_info_interval = \"100ms\"\n",
            c.path()
        ));
        let s = Server::start(&["--config", cfg.arg()]);
        for _ in 0..5 {
            assert!(curl(&["--fail", "-o", "/dev/null", "--limit-rate", "40M", &s.url("/big.bin")]).status.success());
        }
        let m = scrape(&s);
        let samples = value(&m, "linerate_tcp_info_samples_total", &[]);
        let rtt_count = m
            .samples
            .iter()
            .find_map(|x| match (&x.metric[..], &x.value) {
                ("linerate_tcp_rtt_seconds", prometheus_parse::Value::Histogram(h)) => {
                    Some(h.iter().map(|b| b.count).fold(0.0, f64::max))
                }
                _ => None,
            })
            .unwrap();
        if expect_samples {
            // Each transfer takes ~200 ms: sampled during it, after it and at close.
            assert!(samples >= 10.0, "{samples} samples");
            assert!(rtt_count >= samples, "{rtt_count} vs {samples}");
        } else {
            assert_eq!(samples, 0.0);
        }
    }
}

#[test]
fn status_health_and_load() {
    let c = Content::new();
    c.write_random("big.bin", 32 << 20, 5);
    let cfg = ConfigFile::new(&format!("root = {:?}\n[admin]\ncapacity_connections = 10\n", c.path()));
    let mut s = Server::start(&["--config", cfg.arg(), "--workers", "2"]);
    let status: serde_json::Value = serde_json::from_slice(&curl(&["--fail", &s.admin_url("/status")]).stdout).unwrap();
    assert_eq!(status["workers"].as_array().unwrap().len(), 2);
    assert_eq!(status["shutting_down"], false);
    assert_eq!(curl(&[&s.admin_url("/healthz")]).stdout, b"ok\n");
    assert_eq!(curl(&[&s.admin_url("/load")]).stdout, b"up ready 100%\n");

    // Two slow transfers hold 2 of 10 connections: weight 80%.
    let out_dir = tempfile::tempdir().unwrap();
    let dls: Vec<_> = (0..2)
        .map(|i| {
            tool("curl")
                .args([
                    "-sS",
                    "--limit-rate",
                    "8M",
                    "-o",
                    out_dir.path().join(format!("o{i}")).to_str().unwrap(),
                    &s.url("/big.bin"),
                ])
                .spawn()
                .unwrap()
        })
        .collect();
    assert!(eventually(Duration::from_secs(5), || curl(&[&s.admin_url("/load")]).stdout == b"up ready 80%\n"));
    let status: serde_json::Value = serde_json::from_slice(&curl(&[&s.admin_url("/status")]).stdout).unwrap();
    assert_eq!(status["totals"]["connections_sending"], 2, "{status}");

    // HAProxy's agent-check sends nothing and reads one line.
    let mut agent = TcpStream::connect(s.admin_addr.unwrap()).unwrap();
    agent.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut line = String::new();
    agent.read_to_string(&mut line).unwrap();
    assert_eq!(line, "up ready 80%\n");

    // Shutting down: health fails and load says drain while transfers finish.
    s.signal("TERM");
    assert!(eventually(Duration::from_secs(5), || curl(&[&s.admin_url("/load")]).stdout == b"drain\n"));
    let h = curl(&["-i", &s.admin_url("/healthz")]);
    assert!(String::from_utf8_lossy(&h.stdout).starts_with("HTTP/1.1 503"));
    for mut d in dls {
        let _ = d.kill();
        let _ = d.wait();
    }
    assert!(s.wait_exit(Duration::from_secs(40)).is_some());
}

#[test]
fn tcp_settings_are_inherited_by_connections() {
    let c = Content::new();
    c.write_random("big.bin", 16 << 20, 6);
    let cfg = ConfigFile::new(&format!(
        "root = {:?}\n[tcp]\ncongestion_control = \"reno\"\nnotsent_lowat_bytes = 131072\n",
        c.path()
    ));
    let s = Server::start(&["--config", cfg.arg()]);
    let port = s.addr().port();
    let out_dir = tempfile::tempdir().unwrap();
    let mut dl = tool("curl")
        .args(["-sS", "--limit-rate", "4M", "-o", out_dir.path().join("o").to_str().unwrap(), &s.url("/big.bin")])
        .spawn()
        .unwrap();
    let mut seen = String::new();
    let ok = eventually(Duration::from_secs(5), || {
        let out = tool("ss").args(["-tin", "state", "established", &format!("( sport = :{port} )")]).output().unwrap();
        seen = String::from_utf8_lossy(&out.stdout).into_owned();
        seen.contains(" reno ")
    });
    let _ = dl.kill();
    let _ = dl.wait();
    assert!(ok, "server-side socket not using reno:\n{seen}");

    // An unknown algorithm is reported once and the server still serves.
    let cfg = ConfigFile::new(&format!("root = {:?}\n[tcp]\ncongestion_control = \"nosuchcc\"\n", c.path()));
    let s = Server::start(&["--config", cfg.arg()]);
    assert!(curl(&["--fail", "-o", "/dev/null", &s.url("/big.bin")]).status.success());
    assert_eq!(s.stderr().matches("tcp.congestion_control").count(), 1, "{}", s.stderr());
}

#[test]
fn admin_can_be_turned_off_and_rejects_unknown_paths() {
    let c = Content::new();
    let s = Server::start(&["--root", &c.root_arg(), "--no-admin"]);
    assert!(s.admin_addr.is_none());
    let s = Server::start(&["--root", &c.root_arg()]);
    let r = curl(&["-i", &s.admin_url("/nope")]);
    assert!(String::from_utf8_lossy(&r.stdout).starts_with("HTTP/1.1 404"));
}

/// A client that asks for it keeps its admin connection: a second request after a
/// silence longer than the agent check's wait is answered over HTTP (a browser page
/// polling /status does this), pipelined requests are answered in order, and
/// `Connection: close` or HTTP/1.0 end the connection after the answer.
#[test]
fn admin_keeps_connections_alive() {
    let c = Content::new();
    let s = Server::start(&["--root", &c.root_arg()]);
    let admin = s.admin_addr.unwrap();
    let mut conn = TcpStream::connect(admin).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let answer = |conn: &mut TcpStream, request: &[u8]| {
        conn.write_all(request).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        // Until a whole response (head and Content-Length bytes) is in.
        loop {
            let rs = split_responses(&got);
            if let Some(r) = rs.first() {
                let len: usize =
                    r.head.lines().find_map(|l| l.strip_prefix("Content-Length: ")).unwrap().parse().unwrap();
                if r.body.len() == len {
                    return (r.status, r.head.clone(), String::from_utf8_lossy(&r.body).into_owned());
                }
            }
            let n = common::read_some(conn, &mut buf).unwrap();
            assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
    };
    let (status, head, body) = answer(&mut conn, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    assert!(head.contains("Connection: keep-alive"), "{head}");
    // The silence is the test: the connection must outlive it.
    std::thread::sleep(Duration::from_millis(600));
    let (status, _, body) = answer(&mut conn, b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, 200);
    assert!(serde_json::from_str::<serde_json::Value>(&body).is_ok(), "{body}");

    // Two at once, the second closing.
    conn.write_all(
        b"GET /load HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let rs = split_responses(&read_until_close(&mut conn, Duration::from_secs(5)));
    let got: Vec<_> = rs.iter().map(|r| (r.status, String::from_utf8_lossy(&r.body).into_owned())).collect();
    assert_eq!(got, [(200, "up ready 100%\n".to_string()), (200, "ok\n".to_string())]);
    assert!(rs[1].head.contains("Connection: close"), "{}", rs[1].head);

    // HTTP/1.0 without keep-alive: one answer, then the server closes.
    let raw = raw_exchange(admin, b"GET /healthz HTTP/1.0\r\n\r\n", Duration::from_secs(5));
    let r = parse_response(&raw).unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok\n"[..]));
    assert!(r.head.contains("Connection: close"), "{}", r.head);
}
