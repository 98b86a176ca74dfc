//! Real media clients: ffprobe reading MP4 over HTTP (with and without seeking),
//! and headless Chromium playing the demo page's video.

mod common;

use common::*;

/// Makes a 4 s H.264/AAC MP4 with ffmpeg's test sources.
fn make_mp4(path: &std::path::Path, faststart: bool) {
    let mut cmd = tool("ffmpeg");
    cmd.args([
        "-v",
        "error",
        "-y",
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=320x240:rate=25",
        "-f",
        "lavfi",
        "-i",
        "sine=frequency=1000",
    ])
    .args(["-t", "4", "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-c:a", "aac"]);
    if faststart {
        cmd.args(["-movflags", "+faststart"]);
    }
    let out = cmd.arg(path).output().unwrap();
    assert!(out.status.success(), "ffmpeg: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn ffprobe_reads_mp4_over_http() {
    let c = Content::new();
    make_mp4(&c.path().join("fast.mp4"), true);
    // moov at the end: the reader must seek there with a range request.
    make_mp4(&c.path().join("slow.mp4"), false);
    let s = Server::start(&["--root", &c.root_arg()]);
    for name in ["fast.mp4", "slow.mp4"] {
        let out = tool("ffprobe")
            .args([
                "-v",
                "error",
                "-show_entries",
                "stream=codec_name:format=duration,format_name",
                "-of",
                "default=nw=1",
            ])
            .arg(s.url(&format!("/{name}")))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("codec_name=h264"), "{name}: {text}");
        assert!(text.contains("codec_name=aac"), "{name}: {text}");
        assert!(text.contains("format_name=mov,mp4"), "{name}: {text}");
        let duration: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("duration="))
            .and_then(|d| d.parse().ok())
            .unwrap_or_else(|| panic!("{name}: no duration in {text}"));
        assert!((duration - 4.0).abs() < 0.2, "{name}: {duration}");
    }
    // A full decode pass over HTTP (every byte read through ranges the demuxer asks for).
    let out = tool("ffmpeg").args(["-v", "error", "-i", &s.url("/slow.mp4"), "-f", "null", "-"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "decode errors: {}", String::from_utf8_lossy(&out.stderr));
}

/// Headless Chromium opens the demo page; the page writes the player's state into
/// the DOM, which `--dump-dom` prints once the virtual time budget is spent.
#[test]
fn chromium_plays_the_demo_video() {
    let s = Server::start(&["--demo"]);
    let profile = tempfile::tempdir().unwrap();
    let out = tool("timeout")
        .args(["120", "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        .args(["--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic"])
        .args(["--autoplay-policy=no-user-gesture-required", "--virtual-time-budget=30000", "--dump-dom"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(s.url("/"))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    let status = dom
        .split("<span id=\"status\">")
        .nth(1)
        .and_then(|rest| rest.split("</span>").next())
        .unwrap_or_else(|| panic!("no player status in the page: {dom}\n{}", String::from_utf8_lossy(&out.stderr)));
    let field = |name: &str| -> String {
        status.split_whitespace().find_map(|f| f.strip_prefix(&format!("{name}="))).unwrap_or("").to_string()
    };
    assert_eq!(field("error"), "none", "media error: {status}");
    let t: f64 = field("currentTime").parse().unwrap_or_else(|_| panic!("{status}"));
    assert!(t > 0.1, "video did not play: {status}");
    let ready: u32 = field("readyState").parse().unwrap_or(0);
    assert!(ready >= 2, "no decodable data: {status}");
}
