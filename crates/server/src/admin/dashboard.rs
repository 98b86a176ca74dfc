//! `/` (also `/dashboard`): a live page for people, drawn in the browser.
//!
//! One self-contained HTML document carried in the binary: its script polls `/status`
//! every second, keeps the last five minutes in memory and draws them on canvases
//! (Gb/s, connections, requests/s, page-cache hits, kernel-TLS and cross-domain
//! shares, errors). It loads nothing else, and its Content-Security-Policy says so:
//! nothing but the page's own inline style and script (allowed by their SHA-256) and
//! `fetch` to its own origin.

use std::sync::LazyLock;

use aws_lc_rs::digest::{digest, SHA256};
use base64::Engine as _;

/// The page, as served.
pub(super) const PAGE: &str = include_str!("../../assets/admin/dashboard.html");

/// The response header lines that go with the page (each ending in CRLF).
pub(super) fn headers() -> &'static str {
    static HEADERS: LazyLock<String> = LazyLock::new(|| {
        format!(
            "Content-Security-Policy: {}\r\nX-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\nX-Frame-Options: DENY\r\n",
            content_security_policy(PAGE)
        )
    });
    &HEADERS
}

/// The policy for `page`: its inline `<style>` and `<script>` blocks by hash,
/// `fetch` to its own origin, an empty `data:` icon (so the browser asks for no
/// `/favicon.ico`), nothing else.
fn content_security_policy(page: &str) -> String {
    let hashes = |tag: &str| {
        inline_blocks(page, tag)
            .map(|block| {
                let sum = digest(&SHA256, block.as_bytes());
                format!(" 'sha256-{}'", base64::engine::general_purpose::STANDARD.encode(sum.as_ref()))
            })
            .collect::<String>()
    };
    format!(
        "default-src 'none'; script-src{}; style-src{}; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        hashes("script"),
        hashes("style"),
    )
}

/// The text of each `<tag>…</tag>` element in `page` (exactly what a browser hashes
/// for a CSP source).
fn inline_blocks<'a>(page: &'a str, tag: &str) -> impl Iterator<Item = &'a str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut rest = page;
    std::iter::from_fn(move || {
        let start = rest.find(&open)? + open.len();
        let len = rest[start..].find(&close)?;
        let block = &rest[start..start + len];
        rest = &rest[start + len + close.len()..];
        Some(block)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_allows_exactly_the_inline_blocks() {
        let csp = content_security_policy(PAGE);
        assert_eq!(inline_blocks(PAGE, "script").count(), 1);
        assert_eq!(inline_blocks(PAGE, "style").count(), 1);
        assert_eq!(csp.matches("'sha256-").count(), 2, "{csp}");
        assert!(csp.starts_with("default-src 'none';"), "{csp}");
        assert!(!csp.contains("unsafe"), "{csp}");
        // Neither any other element that loads a script or style, nor a style attribute.
        for other in ["<script ", "<style ", "<link rel=\"stylesheet", "style=\"", "<iframe", "<img", "<object"] {
            assert!(!PAGE.contains(other), "the page has {other}");
        }
    }

    #[test]
    fn hashes_follow_the_text_of_the_blocks() {
        let page = "<style>a{}</style><p><script>x()</script><script>y()</script>";
        assert_eq!(inline_blocks(page, "script").collect::<Vec<_>>(), ["x()", "y()"]);
        let csp = content_security_policy(page);
        // echo -n 'x()' | openssl dgst -sha256 -binary | base64
        assert!(csp.contains("'sha256-D6IGS8VMvCoyaR/l0h9tERrBTATY01CoPS7l6xDv0kI='"), "{csp}");
        assert_eq!(csp.matches("'sha256-").count(), 3, "{csp}");
        let edited = content_security_policy("<style>a{}</style><p><script>x();</script><script>y()</script>");
        assert_ne!(csp, edited, "an edited script gets another hash");
    }

    #[test]
    fn the_page_loads_nothing_from_elsewhere() {
        for origin in ["http:", "https:", "//", "ws:", "wss:", "@import", "url("] {
            // `//` also catches protocol-relative URLs (the script's comments are /* */).
            assert!(!PAGE.contains(origin), "the page mentions {origin}");
        }
        assert!(PAGE.contains("fetch('status'"), "it reads /status relative to itself");
        for id in ["gbps", "conns", "rps", "hit", "ktls", "xdom", "errs", "state", "samples"] {
            assert!(PAGE.contains(&format!("id=\"{id}\"")), "no element #{id}");
        }
    }
}
