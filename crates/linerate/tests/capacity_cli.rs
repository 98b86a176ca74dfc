//! `linerate capacity --quick --json`: measures this host in a few seconds and gives
//! positive, plausible figures and a named limit for every mode; a server given its
//! output (`admin.capacity_model`) reports served Gb/s against it in /status and /load.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

fn run(args: &[&str]) -> std::process::Output {
    // It measures with every CPU for seconds: load for the tests that run alone.
    let _share = share();
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn quick_json_gives_plausible_figures_and_a_named_limit() {
    // It measures the machine: not the other tests' load.
    let _alone = alone();
    let started = Instant::now();
    let out = run(&["capacity", "--quick", "--json"]);
    assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let host = &v["host"];
    let gbs = |key: &str| host[key].as_f64().unwrap_or_else(|| panic!("{key} missing: {host}")) / 1e9;
    // Between a slow VM and a large server, in GB/s.
    for (key, lo, hi) in [
        ("memory_copy_bytes_per_s", 0.5, 2000.0),
        ("memory_triad_bytes_per_s", 0.05, 2000.0),
        ("copy_core_bytes_per_s", 0.2, 200.0),
        ("seal_aes128_gcm_bytes_per_s", 0.05, 200.0),
        ("seal_aes256_gcm_bytes_per_s", 0.05, 200.0),
        ("sendfile_sender_bytes_per_s", 0.05, 1000.0),
        ("sendfile_pair_bytes_per_s", 0.05, 1000.0),
        ("sendfile_wall_bytes_per_s", 0.01, 1000.0),
    ] {
        let g = gbs(key);
        assert!(g > lo && g < hi, "{key} = {g} GB/s");
    }
    // AES-256 takes more rounds than AES-128: not faster by more than noise.
    assert!(gbs("seal_aes256_gcm_bytes_per_s") < 1.5 * gbs("seal_aes128_gcm_bytes_per_s"));
    // The pair includes the receiver's copy: it cannot beat the sender alone.
    assert!(gbs("sendfile_pair_bytes_per_s") <= gbs("sendfile_sender_bytes_per_s") * 1.0001);
    let cpus = host["cpus"].as_array().unwrap().len();
    assert!(cpus >= 1);
    assert_eq!(v["inputs"]["cores"].as_u64().unwrap() as usize, cpus);
    assert!(!host["nodes"].as_array().unwrap().is_empty());

    let rows = v["ceilings"].as_array().unwrap();
    assert_eq!(rows.len(), 7, "{rows:?}");
    for r in rows {
        let ceiling = r["ceiling_bps"].as_f64().unwrap();
        let limit = r["limit"].as_str().unwrap();
        let named = match limit {
            "memory" => r["memory_bps"].as_f64().unwrap(),
            "cpu" => r["cpu_bps"].as_f64().unwrap(),
            "nic" => r["nic_bps"].as_f64().unwrap(),
            other => panic!("unknown limit {other}"),
        };
        assert_eq!(ceiling, named, "{r}");
        assert!(ceiling > 1e8 && ceiling <= r["memory_bps"].as_f64().unwrap(), "{r}");
        assert!(ceiling <= r["cpu_bps"].as_f64().unwrap());
    }
    let row = |path: &str, mode: &str| {
        rows.iter().find(|r| r["path"] == path && r["mode"] == mode).unwrap_or_else(|| panic!("no {path} {mode}"))
    };
    // Encrypting on the CPU costs more than not encrypting, on both paths.
    for path in ["network", "loopback"] {
        let plain = row(path, "plain")["cpu_seconds_per_gb"].as_f64().unwrap();
        let tls = row(path, "user-tls")["cpu_seconds_per_gb"].as_f64().unwrap();
        assert!(tls > plain, "{path}: {tls} vs {plain}");
    }
    assert_eq!(row("network", "plain")["memory_passes"], 1.0);
    assert_eq!(row("network", "ktls-software")["memory_passes"], 3.0);
}

#[test]
fn text_table_names_each_mode_and_its_limit() {
    let out = run(&["capacity", "--quick", "--cipher", "aes-256-gcm", "--loopback-decrypt", "5"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("ceilings for AES-256-GCM"), "{text}");
    assert!(text.contains("client on loopback: decrypts 5.00 GB/s"), "{text}");
    for mode in ["plain", "ktls-software", "ktls-offload", "user-tls"] {
        assert!(text.lines().any(|l| l.starts_with("network") && l.contains(mode)), "{mode}: {text}");
    }
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("network") || l.starts_with("loopback")).collect();
    assert_eq!(rows.len(), 7);
    for r in rows {
        assert!(r.contains(" cpu") || r.contains(" memory") || r.contains(" nic"), "{r}");
    }
}

/// A model whose plain loopback ceiling is 1 Gb/s (one core, 125 MB per CPU-second of
/// sender and receiver, memory far from binding): a 20 MB/s download is about 16 %
/// of it.
#[test]
fn status_reports_served_gbps_against_the_model() {
    let c = Content::new();
    c.write_random("big.bin", 64 << 20, 3);
    let model = tempfile::tempdir().unwrap();
    let file = model.path().join("capacity.json");
    let rates = serde_json::json!({
        "sendfile_sender": 1e9, "sendfile_pair": 125e6, "seal": 1e9, "client_open": 1e9, "copy_core": 1e9
    });
    let inputs = serde_json::json!({
        "cores": 1, "memory_bandwidth": 1e12, "rates": rates,
        "nic_bits_per_second": null, "nic_tls_offload": false, "kernel_tls": false
    });
    std::fs::write(&file, serde_json::json!({ "inputs": inputs }).to_string()).unwrap();
    let cfg = ConfigFile::new(&format!(
        "root = {:?}\n[admin]\ncapacity_model = {:?}\ncapacity_model_clients = \"loopback\"\n",
        c.path(),
        file
    ));
    let s = Server::start(&["--config", cfg.arg(), "--workers", "1"]);
    let status =
        || -> serde_json::Value { serde_json::from_slice(&curl(&["--fail", &s.admin_url("/status")]).stdout).unwrap() };
    let before = status();
    assert_eq!(before["capacity"]["clients"], "loopback", "{before}");
    assert!(before["capacity"]["ceiling_gbps"].is_null(), "nothing served yet: {before}");

    let out = model.path().join("big.out");
    let _download = slow_download(&s.url("/big.bin"), "20M", &out);
    let mut last = serde_json::Value::Null;
    let seen = eventually(Duration::from_secs(10), || {
        last = status();
        let cap = &last["capacity"];
        let gbps = last["gbps"].as_f64().unwrap_or(0.0);
        cap["ceiling_gbps"].as_f64().is_some_and(|c| (c - 1.0).abs() < 1e-9)
            && gbps > 0.05
            && cap["share"].as_f64().is_some_and(|sh| (sh - gbps).abs() < 1e-9)
    });
    assert!(seen, "{last}");
    // /load, with no capacity_gbps, uses the model's ceiling: the same snapshot's
    // line is 100 x (1 - share) (the one connection of thousands allowed counts for
    // nothing).
    let share = last["capacity"]["share"].as_f64().unwrap();
    let weight = ((1.0 - share) * 100.0).round().clamp(1.0, 100.0) as u32;
    assert_eq!(last["load"], format!("up ready {weight}%"), "{last}");
    assert_ne!(weight, 100);
}

#[test]
fn a_server_refuses_a_capacity_model_that_is_not_one() {
    let c = Content::new();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("capacity.json");
    std::fs::write(&file, "{\"inputs\": {}}").unwrap();
    let cfg = ConfigFile::new(&format!("root = {:?}\n[admin]\ncapacity_model = {:?}\n", c.path(), file));
    let out = Command::new(BIN).args(["serve", "--config", cfg.arg(), "--listen", "127.0.0.1:0"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("admin.capacity_model"), "{err}");
}
