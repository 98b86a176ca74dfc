//! The admin endpoint's live page: served whole, with nothing to fetch from another
//! origin, and in headless Chromium its numbers follow the load put on the server.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::*;

/// Every `src="…"`/`href="…"`/`action="…"` value and every `fetch(…)` argument in `page`.
fn references(page: &str) -> Vec<String> {
    let mut out = Vec::new();
    for attr in ["src=", "href=", "action=", "fetch("] {
        let mut rest = page;
        while let Some(at) = rest.find(attr) {
            rest = &rest[at + attr.len()..];
            let quote = rest.chars().next().unwrap();
            let value = if quote == '"' || quote == '\'' {
                rest[1..].split(quote).next().unwrap()
            } else {
                rest.split(|c: char| c.is_whitespace() || c == '>' || c == ')').next().unwrap()
            };
            out.push(value.to_string());
        }
    }
    out
}

#[test]
fn the_page_is_served_whole_and_refers_to_no_other_origin() {
    let c = Content::new();
    let s = Server::start(&["--root", &c.root_arg()]);
    let page = get(&s.admin_url("/"), &[]);
    assert_eq!(page.status, 200);
    assert_eq!(page.header("content-type").as_deref(), Some("text/html; charset=utf-8"));
    assert_eq!(page.header("cache-control").as_deref(), Some("no-store"));
    assert_eq!(page.header("x-content-type-options").as_deref(), Some("nosniff"));
    let csp = page.header("content-security-policy").expect("a Content-Security-Policy");
    for directive in ["default-src 'none'", "connect-src 'self'", "base-uri 'none'", "frame-ancestors 'none'"] {
        assert!(csp.split(';').any(|d| d.trim() == directive), "no {directive} in {csp}");
    }
    assert!(!csp.contains("unsafe") && !csp.contains("http"), "{csp}");
    let body = String::from_utf8(page.body.clone()).unwrap();
    assert!(body.starts_with("<!doctype html>"), "{body}");
    for origin in ["http://", "https://", "ws://", "wss://"] {
        assert!(!body.contains(origin), "the page names an origin: {origin}");
    }
    let refs = references(&body);
    assert!(refs.iter().any(|r| r == "status"), "the page does not fetch status: {refs:?}");
    for r in &refs {
        let relative = !r.contains(':') && !r.starts_with("//");
        assert!(relative || r.starts_with("data:"), "not a relative reference: {r}");
    }

    // The same page under /dashboard; HEAD has the head only.
    let again = get(&s.admin_url("/dashboard"), &[]);
    assert_eq!((again.status, &again.body), (200, &page.body));
    let head = get(&s.admin_url("/"), &["-I"]);
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-length"), Some(page.body.len().to_string()));
    assert_eq!(head.header("content-security-policy"), Some(csp));
    // The other endpoints are unchanged by it.
    assert_eq!(get(&s.admin_url("/status"), &[]).header("content-security-policy"), None);
    assert_eq!(get(&s.admin_url("/nope"), &[]).status, 404);
}

/// What the page shows, by element id.
struct Shown(serde_json::Value);

impl Shown {
    const IDS: [&'static str; 9] = ["state", "samples", "gbps", "conns", "rps", "hit", "ktls", "errs", "errs-detail"];

    fn read(browser: &browser::Browser) -> Shown {
        let ids = serde_json::to_string(&Shown::IDS).unwrap();
        Shown(browser.script(&format!(
            "const out = {{}}; for (const id of {ids}) out[id] = document.getElementById(id).textContent; return out;"
        )))
    }

    fn text(&self, id: &str) -> &str {
        self.0[id].as_str().unwrap_or_else(|| panic!("no #{id} in {}", self.0))
    }

    /// The number shown, or None for text that is not one ("–" when there was
    /// nothing to divide).
    fn number(&self, id: &str) -> Option<f64> {
        self.text(id).parse().ok()
    }
}

/// Headless Chromium loads the page from the admin endpoint; idle, it reads 0 Gb/s
/// and 0 requests/s; a bounded curl loop fetching a file makes both non-zero and
/// shows the connection and the page-cache hits; once the load stops they go back to
/// 0. The charts have been drawn on, and the browser logged no error (a script the
/// page's own policy refused, or one that threw, would show here or freeze the
/// numbers).
#[test]
fn chromium_shows_the_numbers_follow_the_load() {
    let c = Content::new();
    c.write_random("movie.bin", 2 << 20, 7);
    let s = Server::start(&["--root", &c.root_arg(), "--workers", "2"]);
    let browser = browser::Browser::start(&[]);
    browser.open(&s.admin_url("/"));

    let mut shown = Shown::read(&browser);
    let idle = eventually(Duration::from_secs(15), || {
        shown = Shown::read(&browser);
        shown.text("state") == "live"
            && shown.number("samples").unwrap_or(0.0) >= 2.0
            && shown.number("gbps") == Some(0.0)
            && shown.number("rps") == Some(0.0)
    });
    assert!(idle, "the idle page does not read 0: {}", shown.0);
    assert_eq!(shown.text("conns"), "0", "{}", shown.0);
    assert_eq!(shown.text("hit"), "–", "nothing served, no ratio: {}", shown.0);

    // 20 requests/s (0.34 Gb/s) on one keep-alive connection, for at most 600
    // requests or 35 s.
    let mut load = Guarded::spawn(
        tool("curl")
            .args(["-sS", "--fail", "--max-time", "35", "--rate", "20/s"])
            .arg(s.url("/movie.bin?[1-600]"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let mut busy = Vec::new();
    let loaded = eventually(Duration::from_secs(15), || {
        shown = Shown::read(&browser);
        let (gbps, rps) = (shown.number("gbps").unwrap_or(0.0), shown.number("rps").unwrap_or(0.0));
        if gbps > 0.0 && rps > 0.0 {
            busy.push((gbps, rps));
        }
        busy.len() >= 3
    });
    assert!(loaded, "the numbers did not move under load: {}", shown.0);
    if let Some(status) = load.try_wait().unwrap() {
        let mut err = String::new();
        std::io::Read::read_to_string(load.stderr.as_mut().unwrap(), &mut err).unwrap();
        panic!("the load ended early ({status}): {err}");
    }
    assert_eq!(shown.number("conns"), Some(1.0), "{}", shown.0);
    let hit = shown.number("hit").unwrap_or_else(|| panic!("no hit ratio under load: {}", shown.0));
    assert!((0.0..=100.0).contains(&hit), "{}", shown.0);
    assert_eq!(shown.text("ktls"), "–", "no TLS, no kernel-TLS share: {}", shown.0);
    assert_eq!(shown.number("errs"), Some(0.0), "{}", shown.0);
    for (gbps, rps) in &busy {
        // 2 MiB a response: Gb/s and requests/s agree (0.0168 Gb per request), within
        // what one interval's partial response can skew.
        let per_request = gbps / rps;
        assert!((0.005..0.05).contains(&per_request), "{gbps} Gb/s for {rps} requests/s");
    }

    // The chart has been drawn on.
    let painted = browser.script(
        "const c = document.getElementById('chart-gbps'); \
         const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; \
         let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n;",
    );
    assert!(painted.as_u64().unwrap_or(0) > 100, "the Gb/s chart is blank: {painted}");

    let _ = load.kill();
    let _ = load.wait();
    let stopped = Instant::now();
    let back = eventually(Duration::from_secs(15), || {
        shown = Shown::read(&browser);
        shown.number("gbps") == Some(0.0) && shown.number("rps") == Some(0.0) && shown.number("conns") == Some(0.0)
    });
    assert!(back, "the numbers stayed up {:?} after the load stopped: {}", stopped.elapsed(), shown.0);

    let severe: Vec<_> = browser.console().into_iter().filter(|m| m["level"] == "SEVERE").collect();
    assert!(severe.is_empty(), "the browser logged errors: {severe:?}");
}
