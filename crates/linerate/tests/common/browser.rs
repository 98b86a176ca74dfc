//! Headless Chromium driven through chromedriver (WebDriver over curl).

use std::process::Stdio;
use std::time::Duration;

use super::{curl, eventually, tool, Guarded};

/// A Chromium session. Chromium and its helpers die with chromedriver's process
/// group when this is dropped, even when an assertion fails before the session is
/// closed.
pub struct Browser {
    session: String,
    _profile: tempfile::TempDir,
    _driver: Guarded,
    /// Chromium's temporary files and PulseAudio's runtime directory, which would
    /// otherwise outlive it in /tmp; removed after the driver's group is gone.
    _scratch: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session, with `args` added to
    /// Chromium's command line. Console messages are kept for [`Browser::console`].
    pub fn start(args: &[&str]) -> Browser {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let scratch = tempfile::tempdir().unwrap();
        let driver = Guarded::spawn_group(
            tool("chromedriver")
                .arg(format!("--port={port}"))
                .env("TMPDIR", scratch.path())
                .env("PULSE_RUNTIME_PATH", scratch.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        );
        let wd = format!("http://127.0.0.1:{port}");
        assert!(eventually(Duration::from_secs(10), || curl(&[&format!("{wd}/status")]).status.success()));
        let profile = tempfile::tempdir().unwrap();
        let mut chromium_args: Vec<String> = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--disable-sync",
            "--disable-quic",
        ]
        .iter()
        .chain(args)
        .map(|a| a.to_string())
        .collect();
        chromium_args.push(format!("--user-data-dir={}", profile.path().display()));
        let caps = serde_json::json!({"capabilities": {"alwaysMatch": {
            "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": chromium_args},
            "goog:loggingPrefs": {"browser": "ALL"}
        }}});
        let session = webdriver(&format!("{wd}/session"), "POST", &caps);
        let id = session["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {session}"));
        Browser { session: format!("{wd}/session/{id}"), _profile: profile, _driver: driver, _scratch: scratch }
    }

    /// Navigates to `url` (returns once the page has loaded).
    pub fn open(&self, url: &str) {
        webdriver(&format!("{}/url", self.session), "POST", &serde_json::json!({ "url": url }));
    }

    /// Runs `script` (a function body) in the page; returns its value.
    pub fn script(&self, script: &str) -> serde_json::Value {
        let body = serde_json::json!({ "script": script, "args": [] });
        let answer = webdriver(&format!("{}/execute/sync", self.session), "POST", &body);
        answer["value"].clone()
    }

    /// The console messages and page errors since the last call:
    /// `{"level": "SEVERE", "message": ...}` objects.
    pub fn console(&self) -> Vec<serde_json::Value> {
        let log = webdriver(&format!("{}/se/log", self.session), "POST", &serde_json::json!({ "type": "browser" }));
        log["value"].as_array().cloned().unwrap_or_else(|| panic!("no browser log: {log}"))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Best effort: the driver's guard kills whatever is left.
        let _ = curl(&["--max-time", "5", "-X", "DELETE", &self.session]);
    }
}

/// One WebDriver command, sent with curl; returns the parsed JSON answer.
pub fn webdriver(url: &str, method: &str, body: &serde_json::Value) -> serde_json::Value {
    let body = body.to_string();
    let out = curl(&["-X", method, "-H", "Content-Type: application/json", "--data-binary", &body, url]);
    assert!(out.status.success(), "{method} {url}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}
