//! Real media clients: ffprobe reading MP4 over HTTP (with and without seeking),
//! and headless Chromium playing the demo page's video.

use std::time::Duration;

use crate::common::*;

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

/// Headless Chromium, driven through chromedriver (WebDriver), opens the demo page
/// and the `<video>` plays: its currentTime passes 1.5 s in real time, with no
/// media error. Browsers fetch media with range requests, which the server's trace
/// log shows as 206 answers for the video. Stopped, the server removes the demo
/// catalogue it wrote.
#[test]
fn chromium_plays_the_demo_video() {
    // The server writes its demo catalogue under TMPDIR; this directory, dropped after
    // the server, removes whatever a server killed by a failed assertion left there.
    let tmp = tempfile::tempdir().unwrap();
    let mut s = Server::start_with(&["--demo", "--log-level", "info,linerate::server::conn=trace"], |cmd| {
        cmd.env("TMPDIR", tmp.path());
    });
    let browser = browser::Browser::start(&["--autoplay-policy=no-user-gesture-required"]);
    browser.open(&s.url("/"));
    let probe = "const v = document.querySelector('video'); \
        return [v.currentTime, v.readyState, v.error ? v.error.code : 0];";
    let mut last = serde_json::Value::Null;
    let played = eventually(Duration::from_secs(30), || {
        last = browser.script(probe);
        assert_eq!(last[2].as_i64(), Some(0), "media error: {last}");
        last[0].as_f64().unwrap_or(0.0) > 1.5
    });
    drop(browser);
    assert!(played, "video did not play: [currentTime, readyState, error] = {last}");
    let log = s.stderr();
    assert!(
        log.lines().any(|l| l.contains("status=206") && l.contains("demo.mp4")),
        "the browser fetched no byte range of the video:\n{log}"
    );
    s.signal("TERM");
    assert!(s.wait_exit(Duration::from_secs(10)).is_some(), "the server did not stop on SIGTERM");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(left.is_empty(), "the demo catalogue outlived the server: {left:?}");
}

/// What the browser test relies on: a helper's guard takes the processes the helper
/// started with it, although they are reparented to init when the helper dies (here
/// a shell stands in for chromedriver and its sleeps for Chromium).
#[test]
fn killing_a_driver_leaves_none_of_its_children_behind() {
    let mut driver = Guarded::spawn_group(
        std::process::Command::new("sh")
            .args(["-c", "sleep 60 & echo $!; sleep 60 & echo $!; wait"])
            .stdout(std::process::Stdio::piped()),
    );
    let mut out = std::io::BufReader::new(driver.stdout.take().unwrap());
    let children: Vec<u32> = (0..2)
        .map(|_| {
            let mut line = String::new();
            std::io::BufRead::read_line(&mut out, &mut line).unwrap();
            line.trim().parse().unwrap()
        })
        .collect();
    assert!(children.iter().all(|&p| running(p)), "{children:?}");
    drop(driver);
    let gone = eventually(Duration::from_secs(5), || !children.iter().any(|&p| running(p)));
    let left: Vec<u32> = children.iter().copied().filter(|&p| running(p)).collect();
    for p in &left {
        let _ = std::process::Command::new("kill").args(["-KILL", &p.to_string()]).status();
    }
    assert!(gone, "still running after the driver's guard was dropped: {left:?}");
}

/// The process exists and is not a zombie.
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}
