//! `linerate bench --live` against a real linerate on loopback serving HLS media
//! playlists from files: where viewers join, how often they reload an unchanged
//! playlist, what a finished stream and an unusable playlist give. (A stream encoded
//! in real time is `tests/origin/hls-tests`.)

use std::time::Duration;

use crate::bench_support::{bench, num};
use crate::common::{Content, Server};

/// A media playlist of `n` segments of 1 s, `seg<i>.ts` from media sequence 100.
fn playlist(n: usize, ended: bool) -> String {
    let mut p = String::from("#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:1\n#EXT-X-MEDIA-SEQUENCE:100\n");
    for i in 0..n {
        p += &format!("#EXTINF:1.000,\nseg/{}.ts\n", 100 + i);
    }
    if ended {
        p += "#EXT-X-ENDLIST\n";
    }
    p
}

/// Six segments of different sizes (segment `i` has `10_000 + i` bytes).
fn stream(ended: bool) -> Content {
    let c = Content::new();
    for i in 0..6u64 {
        c.write_random(&format!("live/seg/{}.ts", 100 + i), 10_000 + i as usize, i);
    }
    c.write("live/stream.m3u8", playlist(6, ended).as_bytes());
    c
}

fn run_live(url: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["--live", url, "--sessions", "5", "--duration", "2", "--json"];
    args.extend_from_slice(extra);
    bench(&args, Duration::from_secs(30)).json()
}

#[test]
fn viewers_join_three_target_durations_behind_the_edge_and_reload_as_rfc_8216_says() {
    let content = stream(false);
    let server = Server::start(&["--root", &content.root_arg()]);
    let j = run_live(&server.url("/live/stream.m3u8"), &[]);
    assert_eq!(j["mode"], "live", "{j:#}");
    assert_eq!(num(&j, "errors_total"), 0.0, "{j:#}");
    // Each viewer joined with the last three of six 1 s segments and, the playlist
    // never changing, fetched nothing else.
    assert_eq!(num(&j, "requests"), 15.0, "{j:#}");
    assert_eq!(num(&j, "bytes"), 5.0 * (10_003.0 + 10_004.0 + 10_005.0), "{j:#}");
    assert_eq!((num(&j, "viewer_segments_min"), num(&j, "viewer_segments_max")), (3.0, 3.0));
    assert_eq!(num(&j, "skipped_segments"), 0.0);
    assert_eq!(num(&j, "plays_started"), 5.0, "{j:#}");
    // Loads at 0 s (new), 1 s (a target duration later; unchanged), 1.5 s (half of
    // one later); the next would be at the end (2 s).
    assert_eq!(num(&j, "playlist_requests"), 15.0, "{j:#}");
    // Three seconds of buffer, two of them played: no stall. No latencies: only
    // start-up segments were fetched, and the playlist has no program date-time.
    assert_eq!(num(&j, "rebuffers"), 0.0, "{j:#}");
    assert_eq!(num(&j, "live_latency_ms.count"), 0.0);
    assert_eq!(num(&j, "listed_to_last_byte_ms.count"), 0.0);
}

#[test]
fn a_finished_stream_is_not_reloaded() {
    let content = stream(true);
    let server = Server::start(&["--root", &content.root_arg()]);
    let j = run_live(&server.url("/live/stream.m3u8"), &["--ramp", "10"]);
    assert_eq!(num(&j, "errors_total"), 0.0, "{j:#}");
    assert_eq!(num(&j, "requests"), 15.0, "{j:#}");
    assert_eq!(num(&j, "playlist_requests"), 5.0, "{j:#}");
}

#[test]
fn an_unusable_playlist_is_a_playlist_error_and_conflicting_options_are_refused() {
    let content = Content::new();
    content.write("master.m3u8", b"#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1000\nv.m3u8\n");
    let server = Server::start(&["--root", &content.root_arg()]);
    let url = server.url("/master.m3u8");
    let j = run_live(&url, &[]);
    assert!(num(&j, "errors.playlist") >= 5.0, "{j:#}");
    assert!(j["first_error"].as_str().unwrap().contains("multivariant"), "{j:#}");
    assert_eq!(num(&j, "requests"), 0.0);
    assert_eq!(num(&j, "plays_not_started"), 5.0, "{j:#}");
    for other in [&["--zipf", "1"][..], &["--base-url", "http://x/"], &["--max-rate"]] {
        let mut args = vec!["--live", &url];
        args.extend_from_slice(other);
        let run = bench(&args, Duration::from_secs(20));
        assert!(!run.success, "{args:?} should fail");
        assert!(run.stderr.contains("cannot be used with"), "{args:?}: {}", run.stderr);
    }
}
