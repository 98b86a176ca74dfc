//! `linerate bench` against a real linerate on loopback: every byte it receives is
//! compared with the files (`--verify`), in paced and closed-loop modes, from a base
//! URL with a file list and from a URL list; and a wrong file must be caught.

use std::time::Duration;

use crate::bench_support::{bench, num};
use crate::common;
use crate::common::{Content, Server};

/// Three titles of different sizes, one not a multiple of the segment size.
fn catalogue() -> Content {
    let c = Content::new();
    c.write_random("a.bin", 1 << 20, 1);
    c.write_random("b.bin", 300_000, 2);
    c.write_random("sub/c d.bin", 700_001, 3);
    c
}

const FILES: &str = "a.bin,b.bin,sub/c d.bin";

#[test]
fn paced_sessions_receive_exactly_the_files_bytes() {
    let content = catalogue();
    let server = Server::start(&["--root", &content.root_arg()]);
    let base = server.url("/");
    let root = content.root_arg();
    let run = bench(
        &[
            "--base-url",
            &base,
            "--files",
            FILES,
            "--sessions",
            "6",
            "--duration",
            "2",
            "--bitrate-mbps",
            "1",
            "--segment-bytes",
            "65536",
            "--startup-segments",
            "3",
            "--verify",
            &root,
            "--json",
        ],
        Duration::from_secs(30),
    );
    let j = run.json();
    assert_eq!(num(&j, "errors_total"), 0.0, "{j:#}");
    // Nothing failed, so nothing was retried: one attempt per segment.
    assert_eq!(num(&j, "retried_segments"), 0.0, "{j:#}");
    assert_eq!(num(&j, "unrecovered_segments"), 0.0, "{j:#}");
    assert_eq!(num(&j, "max_segment_attempts"), 1.0, "{j:#}");
    assert!(num(&j, "requests") >= 12.0, "{j:#}");
    assert!(num(&j, "bytes") > 0.0);
    assert_eq!(num(&j, "verified_bytes"), num(&j, "bytes"), "every body byte was compared");
    assert!(num(&j, "plays_started") >= 6.0, "{j:#}");
    assert!(num(&j, "play_delay_ms.count") >= 6.0);
    assert!(num(&j, "ttfb_ms.p50") > 0.0 && num(&j, "ttfb_ms.p50") <= num(&j, "ttfb_ms.max"));
    assert!(num(&j, "segment_ms.p99") >= num(&j, "ttfb_ms.p50"));
    // 6 viewers at 1 Mb/s with 1.5 s of buffer: a loopback server keeps up without
    // stalls, even on a busy machine.
    assert_eq!(num(&j, "rebuffers"), 0.0, "{j:#}");
    // The client's CPU time may round to 0 ticks at this rate, but it is seconds of
    // CPU (at most every CPU busy for the whole run), and per GB is it over the GB.
    let (cpu_s, gb) = (num(&j, "client_cpu_s"), num(&j, "bytes") / 1e9);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    assert!((0.0..=num(&j, "elapsed_s") * cpus).contains(&cpu_s), "{j:#}");
    let per_gb = num(&j, "client_cpu_s_per_gb");
    assert!((per_gb - cpu_s / gb).abs() <= 1e-9 * (cpu_s / gb), "{per_gb} s/GB for {cpu_s} s over {gb} GB");
    assert_eq!(j["timeline"].as_array().unwrap().len(), 2);
    assert!(run.elapsed < Duration::from_secs(10), "took {:?}", run.elapsed);
}

#[test]
fn paced_sessions_ask_for_one_segment_per_segment_duration() {
    let content = Content::new();
    content.write_random("long.bin", 2 << 20, 4);
    let server = Server::start(&["--root", &content.root_arg()]);
    // 32 KiB at 1.048576 Mb/s = 0.25 s per segment; a 2 MiB title lasts 16 s, longer
    // than the run. Per viewer in 2 s: 3 start-up segments, then one per 0.25 s with
    // 3 segments of buffer ahead: about 3 + 8 = 11 requests.
    let run = bench(
        &[
            "--base-url",
            &server.url("/"),
            "--files",
            "long.bin",
            "--sessions",
            "4",
            "--duration",
            "2",
            "--bitrate-mbps",
            "1.048576",
            "--segment-bytes",
            "32768",
            "--startup-segments",
            "3",
            "--json",
        ],
        Duration::from_secs(30),
    );
    let j = run.json();
    let requests = num(&j, "requests");
    assert!((4.0 * 10.0..=4.0 * 12.0).contains(&requests), "expected about 44 paced requests: {j:#}");
    assert_eq!(num(&j, "plays_started"), 4.0);
    assert_eq!(num(&j, "rebuffers"), 0.0);
    // Each second carries about 4 viewers x 4 segments.
    let timeline = j["timeline"].as_array().unwrap();
    let last = timeline[1]["requests"].as_f64().unwrap();
    assert!((12.0..=20.0).contains(&last), "{timeline:?}");
}

#[test]
fn a_connection_closed_by_the_servers_idle_timeout_is_reopened_without_error() {
    let content = Content::new();
    content.write_random("long.bin", 2 << 20, 5);
    let config = common::ConfigFile::new("[timeouts]\nkeepalive = \"1s\"\n");
    let server = Server::start(&["--root", &content.root_arg(), "--config", config.arg()]);
    // 64 KiB at 0.349525 Mb/s = 1.5 s between requests, longer than the server's
    // 1 s keep-alive: every steady-state request finds its connection closed.
    let run = bench(
        &[
            "--base-url",
            &server.url("/"),
            "--files",
            "long.bin",
            "--sessions",
            "3",
            "--duration",
            "4",
            "--bitrate-mbps",
            "0.349525",
            "--segment-bytes",
            "65536",
            "--startup-segments",
            "1",
            "--verify",
            &content.root_arg(),
            "--json",
        ],
        Duration::from_secs(30),
    );
    let j = run.json();
    assert_eq!(num(&j, "errors_total"), 0.0, "{j:#}");
    assert!(num(&j, "reconnects") >= 3.0, "{j:#}");
    assert!(num(&j, "connections") >= 6.0, "{j:#}");
    assert_eq!(num(&j, "rebuffers"), 0.0, "{j:#}");
    assert_eq!(num(&j, "verified_bytes"), num(&j, "bytes"));
}

#[test]
fn closed_loop_from_a_url_list_verifies_and_reports_the_contract_keys() {
    let content = catalogue();
    let server = Server::start(&["--root", &content.root_arg()]);
    let list = content.path().join("urls.txt");
    std::fs::write(
        &list,
        format!(
            "# most popular first\n{}\n\n{}\n{}\n",
            server.url("/a.bin"),
            server.url("/b.bin"),
            server.url("/sub/c%20d.bin")
        ),
    )
    .unwrap();
    let run = bench(
        &[
            "--url-list",
            list.to_str().unwrap(),
            "--sessions",
            "4",
            "--duration",
            "1",
            "--bitrate-mbps",
            "5", // the contract allows it beside --max-rate, which ignores it
            "--max-rate",
            "--segment-bytes",
            "131072",
            "--verify",
            &content.root_arg(),
            "--json",
            "--workers",
            "2",
        ],
        Duration::from_secs(30),
    );
    let j = run.json();
    for key in ["gbps", "requests", "rebuffer_ratio", "rebuffers", "client_cpu_s_per_gb"] {
        assert!(j[key].is_number(), "missing {key}: {j:#}");
    }
    for key in ["ttfb_ms", "segment_ms", "play_delay_ms"] {
        for p in ["p50", "p99", "max"] {
            assert!(j[key][p].is_number(), "missing {key}.{p}");
        }
    }
    for kind in ["connect", "timeout", "status", "short_body"] {
        assert_eq!(j["errors"][kind], 0, "{j:#}");
    }
    assert_eq!(num(&j, "errors_total"), 0.0, "{j:#}");
    assert_eq!(j["mode"], "max-rate");
    assert!(num(&j, "requests") > 20.0, "closed loop fetches back to back: {j:#}");
    assert!(num(&j, "gbps") > 0.0);
    // Hundreds of MB in a closed loop take more than one 10 ms clock tick of CPU.
    assert!(num(&j, "client_cpu_s") > 0.0 && num(&j, "client_cpu_s_per_gb") > 0.0, "{j:#}");
    assert_eq!(num(&j, "verified_bytes"), num(&j, "bytes"));
    assert_eq!(num(&j, "rebuffers"), 0.0);
}

#[test]
fn a_byte_that_differs_from_the_file_is_reported() {
    let content = catalogue();
    let server = Server::start(&["--root", &content.root_arg()]);
    // The reference copy differs from what is served in one byte of one title.
    let reference = Content::new();
    reference.write_random("a.bin", 1 << 20, 1);
    reference.write_random("b.bin", 300_000, 2);
    let mut c = common::pseudo_random(700_001, 3);
    c[500_000] ^= 0x40;
    reference.write("sub/c d.bin", &c);
    let run = bench(
        &[
            "--base-url",
            &server.url("/"),
            "--files",
            FILES,
            "--sessions",
            "3",
            "--duration",
            "2",
            "--max-rate",
            "--zipf",
            "0",
            "--segment-bytes",
            "65536",
            "--verify",
            &reference.root_arg(),
            "--json",
        ],
        Duration::from_secs(30),
    );
    let j = run.json();
    assert!(num(&j, "errors.verify") > 0.0, "the wrong byte went unnoticed: {j:#}");
    let first = j["first_error"].as_str().unwrap();
    assert!(first.contains("c%20d.bin") && first.contains("differs"), "{first}");
    assert!(num(&j, "verified_bytes") < num(&j, "bytes"));
    // The player retries the bad segment, which never verifies: whoever reached it
    // was still retrying it when the run ended.
    assert!(num(&j, "unrecovered_segments") >= 1.0, "{j:#}");
    assert!(num(&j, "max_segment_attempts") >= 1.0, "{j:#}");
}

#[test]
fn bad_input_is_refused_with_a_clear_message() {
    let content = catalogue();
    let server = Server::start(&["--root", &content.root_arg()]);
    let base = server.url("/");
    let cases: &[(&[&str], &str)] = &[
        (&["--base-url", &base, "--files", "missing.bin"], "status 404"),
        (&["--base-url", &base, "--files", "a.bin", "--sessions", "10001"], "10001"),
        (&["--base-url", &base, "--files", "a.bin", "--duration", "0"], "--duration"),
        (&["--base-url", "ftp://x/", "--files", "a.bin"], "http://"),
        (&["--base-url", &base, "--files", "a.bin", "--verify", "/nonexistent-dir"], "not a directory"),
        (&["--url-list", "/nonexistent-list"], "nonexistent-list"),
    ];
    for (args, expect) in cases {
        let run = bench(args, Duration::from_secs(20));
        assert!(!run.success, "{args:?} should fail");
        assert!(run.stderr.contains(expect), "{args:?}: expected {expect:?} in {}", run.stderr);
    }
}

#[test]
fn hot_titles_ttfb_counts_the_most_popular_titles_only() {
    let content = catalogue();
    let server = Server::start(&["--root", &content.root_arg()]);
    let base = server.url("/");
    let run_with = |extra: &[&str]| {
        let mut args = vec![
            "--base-url",
            &base,
            "--files",
            FILES,
            "--sessions",
            "6",
            "--duration",
            "1",
            "--max-rate",
            "--segment-bytes",
            "65536",
            "--json",
        ];
        args.extend_from_slice(extra);
        bench(&args, Duration::from_secs(30)).json()
    };
    let j = run_with(&["--hot-titles", "1"]);
    assert_eq!(num(&j, "errors_total"), 0.0, "{j:#}");
    let (hot, all) = (num(&j, "hot_ttfb_ms.count"), num(&j, "ttfb_ms.count"));
    // a.bin is the most popular title, but not the only one played.
    assert!(hot > 0.0 && hot < all, "hot {hot} of {all}: {j:#}");
    assert_eq!(num(&j, "hot_ttfb_p99_ms"), num(&j, "hot_ttfb_ms.p99"));
    assert_eq!(j["hot_titles"], 1);

    let j = run_with(&[]);
    assert!(j["hot_ttfb_ms"].is_null() && j["hot_ttfb_p99_ms"].is_null(), "{j:#}");
}
