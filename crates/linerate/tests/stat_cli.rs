//! `linerate stat` against a known load: its Gb/s agrees with the load generator's,
//! its server columns with the admin endpoint, and its table repeats the header.

use std::process::Stdio;
use std::time::Duration;

use crate::common::*;

#[test]
fn gbps_agrees_with_the_load_generator() {
    // stat counts every byte on lo: another test's traffic would be wrk's.
    let _alone = alone();
    let c = Content::new();
    for i in 0..4 {
        c.write_random(&format!("f{i}.bin"), 8 << 20, i);
    }
    let s = Server::start(&["--root", &c.root_arg()]);
    let scripts = tempfile::tempdir().unwrap();
    let script = scripts.path().join("load.lua");
    std::fs::write(
        &script,
        "local n = 0\nrequest = function()\n  n = n + 1\n  return wrk.format(\"GET\", \"/f\" .. (n % 4) .. \".bin\")\nend\n",
    )
    .unwrap();
    // wrk for 7 s; stat samples 5 whole seconds inside that window, from one
    // second in. wrk's load flows within milliseconds: this pause is not a wait
    // for it but where stat's window sits in wrk's run, away from both its ends.
    let wrk = tool("wrk")
        .args(["-t1", "-c4", "-d7s", "-s", script.to_str().unwrap(), &s.url("/")])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let stat = tool(BIN)
        .args(["stat", "--interval", "1", "--count", "5", "--json", "--iface", "lo", "--admin", &s.admin_url("")])
        .output()
        .unwrap();
    let wrk = wrk.wait_with_output().unwrap();
    assert!(stat.status.success(), "{}", String::from_utf8_lossy(&stat.stderr));
    let rows: Vec<serde_json::Value> =
        String::from_utf8_lossy(&stat.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 5);
    let stat_gbps = rows.iter().map(|r| r["out_gbps"].as_f64().unwrap()).sum::<f64>() / rows.len() as f64;

    // wrk: "Transfer/sec:    1.23GB" (binary units), over its whole run.
    let report = String::from_utf8_lossy(&wrk.stdout);
    let rate = report.lines().find_map(|l| l.trim().strip_prefix("Transfer/sec:")).expect(&report).trim().to_string();
    let (num, unit) = rate.split_at(rate.find(|ch: char| ch.is_ascii_alphabetic()).unwrap());
    let scale = match unit {
        "GB" => 1024.0 * 1024.0 * 1024.0,
        "MB" => 1024.0 * 1024.0,
        other => panic!("unit {other}"),
    };
    let wrk_gbps = num.parse::<f64>().unwrap() * scale * 8.0 / 1e9;
    let ratio = stat_gbps / wrk_gbps;
    assert!((0.9..=1.1).contains(&ratio), "stat {stat_gbps:.2} Gb/s vs wrk {wrk_gbps:.2} Gb/s");

    // The server columns come from the admin endpoint while it answers.
    for r in &rows {
        let server = &r["server"];
        assert!(server.is_object(), "{r}");
        assert!(server["requests_per_sec"].as_f64().unwrap() > 0.0, "{r}");
        // The files were just written: every byte served came from the page cache.
        assert_eq!(server["page_cache_hit_pct"].as_f64(), Some(100.0), "{r}");
        assert_eq!(server["fill_queue"].as_i64(), Some(0), "{r}");
    }
    assert!(rows.iter().all(|r| r["cpu_busy_pct"].as_f64().unwrap() > 0.0));
}

#[test]
fn table_repeats_its_header_and_marks_a_missing_server() {
    let out = tool(BIN)
        .args(["stat", "--interval", "0.05", "--count", "25", "--admin", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 27, "{text}");
    assert!(lines[0].contains("InGb/s") && lines[21].contains("InGb/s"), "{text}");
    assert!(lines[1].trim_end().ends_with('-'), "no server: {}", lines[1]);
}
