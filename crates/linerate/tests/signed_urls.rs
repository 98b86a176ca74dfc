//! Signed URLs against the real binary: tokens signed by Python's hmac/hashlib and
//! secure_link hashes by openssl, over plain HTTP and HTTPS; key rotation by SIGHUP
//! with no failed request; the token never in the server's log or access log; the
//! metric per verdict.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common;
use crate::common::*;

const K1: &str = "k1-secret-0123456789abcdef012345";
const K2: &str = "k2-secret-fedcba9876543210fedcba";
const MD5_SECRET: &str = "md5-secret-a";

/// Python's hmac/hashlib, as a signer outside this code base would be written (the
/// same as docs/SIGNED-URLS.md). Empty `kid`, `st` or `ip` leave the field out.
const PY_SIGNER: &str = r#"
import hashlib, hmac, sys
kid, secret, acl, exp, st, ip = sys.argv[1:7]
fields = []
if ip: fields.append("ip=" + ip)
if st: fields.append("st=" + st)
fields.append("exp=" + exp)
fields.append("acl=" + acl)
if kid: fields.append("kid=" + kid)
signed = "~".join(fields)
print(signed + "~hmac=" + hmac.new(secret.encode(), signed.encode(), hashlib.sha256).hexdigest())
"#;

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// A token from the Python signer.
fn token(kid: &str, secret: &str, acl: &str, exp: u64, st: Option<u64>, ip: &str) -> String {
    let st = st.map(|t| t.to_string()).unwrap_or_default();
    let out =
        tool("/usr/bin/python3").args(["-c", PY_SIGNER, kid, secret, acl, &exp.to_string(), &st, ip]).output().unwrap();
    assert!(out.status.success(), "python3: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// An nginx secure_link hash by openssl, as nginx's documentation computes it.
fn md5_link(text: &str) -> String {
    let out = tool("sh")
        .args(["-c", "printf '%s' \"$1\" | openssl md5 -binary | openssl base64 | tr +/ -_ | tr -d =", "sh", text])
        .output()
        .unwrap();
    assert!(out.status.success(), "openssl: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A hex digit of the token's hmac changed: same length, same syntax, wrong value.
fn tampered(token: &str) -> String {
    let last = token.chars().last().unwrap();
    format!("{}{}", &token[..token.len() - 1], if last == '0' { '1' } else { '0' })
}

struct Site {
    content: Content,
    keys: tempfile::TempDir,
}

impl Site {
    fn new() -> Site {
        let content = Content::new();
        content.write("premium/title1/master.m3u8", b"#EXTM3U title1\n");
        content.write("premium/title1/v720/seg-00001.m4s", b"segment-1 of title1");
        content.write("premium/title2/master.m3u8", b"#EXTM3U title2\n");
        content.write("premium/free/trailer.mp4", b"free trailer");
        content.write("bound/a.mp4", b"bound content");
        content.write("s/link.mp4", b"secure link content");
        content.write("public/a.txt", b"public");
        let keys = tempfile::tempdir().unwrap();
        std::fs::write(keys.path().join("k1"), format!("{K1}\n")).unwrap();
        std::fs::write(keys.path().join("k2"), format!("{K2}\n")).unwrap();
        Site { content, keys }
    }

    /// The configuration with the token keys `token_keys` (ids, secrets from files).
    fn config(&self, token_keys: &[&str]) -> String {
        let keys: Vec<String> = token_keys
            .iter()
            .map(|id| format!("{{ id = \"{id}\", secret_file = {:?} }}", self.keys.path().join(id)))
            .collect();
        format!(
            r#"root = {root:?}
[[signed]]
prefix = "/premium/"
mode = "token"
keys = [{keys}]

[[signed]]
prefix = "/premium/free/"
mode = "open"

[[signed]]
prefix = "/bound/"
mode = "token"
bind_client_address = true
keys = [{{ id = "k1", secret = "{K1}" }}]

[[signed]]
prefix = "/s/"
mode = "secure_link"
expression = "$secure_link_expires$uri$remote_addr $secret"
keys = [{{ id = "a", secret = "{MD5_SECRET}" }}]
"#,
            root = self.content.path(),
            keys = keys.join(", ")
        )
    }
}

/// What a client gets for a path: status and body.
type Fetch<'a> = &'a dyn Fn(&str, &[&str]) -> (u16, Vec<u8>);

/// Every case of the token and secure_link modes, through one way of fetching
/// (`fetch(path_and_query, extra curl arguments)`).
fn check_every_case(fetch: Fetch<'_>, via: &str) {
    let t = now();
    let title1 = token("k1", K1, "/premium/title1/*", t + 600, Some(t - 60), "");
    let expect = |path: &str, extra: &[&str], status: u16, body: Option<&[u8]>, what: &str| {
        let (got, got_body) = fetch(path, extra);
        assert_eq!(got, status, "{via}: {what}: {path}");
        if let Some(b) = body {
            assert_eq!(got_body, b, "{via}: {what}");
        }
    };
    // One token for the manifest and every segment of a title, in the query or a cookie.
    expect(&format!("/premium/title1/master.m3u8?__token__={title1}"), &[], 200, Some(b"#EXTM3U title1\n"), "good");
    let cookie = format!("__token__={title1}");
    expect("/premium/title1/v720/seg-00001.m4s", &["-b", &cookie], 200, Some(b"segment-1 of title1"), "cookie");
    expect("/premium/title1/master.m3u8", &["-b", &format!("lang=en; {cookie}; theme=dark")], 200, None, "cookies");
    expect(&format!("/premium/title2/master.m3u8?__token__={title1}"), &[], 403, None, "another title");
    expect("/premium/title1/master.m3u8", &[], 403, Some(b"403 Forbidden\n"), "unsigned");
    expect(&format!("/premium/title1/master.m3u8?__token__={}", tampered(&title1)), &[], 403, None, "tampered");
    let expired = token("k1", K1, "/premium/title1/*", t - 10, Some(t - 600), "");
    expect(&format!("/premium/title1/master.m3u8?__token__={expired}"), &[], 410, Some(b"410 Gone\n"), "expired");
    let early = token("k1", K1, "/premium/title1/*", t + 7200, Some(t + 3600), "");
    expect(&format!("/premium/title1/master.m3u8?__token__={early}"), &[], 403, None, "not yet valid");
    let wrong_kid = token("k9", K1, "/premium/title1/*", t + 600, None, "");
    expect(&format!("/premium/title1/master.m3u8?__token__={wrong_kid}"), &[], 403, None, "unknown key id");
    let other_key = token("k1", K2, "/premium/title1/*", t + 600, None, "");
    expect(&format!("/premium/title1/master.m3u8?__token__={other_key}"), &[], 403, None, "other key's secret");
    // Normalisation happens first: no way around the rule by spelling the path.
    expect("/public/../premium/title1/master.m3u8", &[], 403, None, "dot-dot into a signed prefix");
    expect("//premium/title1/master.m3u8", &[], 403, None, "double slash");
    expect("/%70remium/title1/master.m3u8", &[], 403, None, "escaped letter");
    // Open prefixes, inside a signed one and elsewhere.
    expect("/premium/free/trailer.mp4", &[], 200, Some(b"free trailer"), "open inside signed");
    expect("/public/a.txt", &[], 200, Some(b"public"), "no rule");
    // Client address binding (the client is 127.0.0.1).
    let bound = token("k1", K1, "/bound/*", t + 600, None, "127.0.0.1");
    expect(&format!("/bound/a.mp4?__token__={bound}"), &[], 200, Some(b"bound content"), "bound to us");
    let elsewhere = token("k1", K1, "/bound/*", t + 600, None, "127.0.0.2");
    expect(&format!("/bound/a.mp4?__token__={elsewhere}"), &[], 403, None, "bound elsewhere");
    let unbound = token("k1", K1, "/bound/*", t + 600, None, "");
    expect(&format!("/bound/a.mp4?__token__={unbound}"), &[], 403, None, "binding required");

    // nginx secure_link: `$secure_link_expires$uri$remote_addr $secret`.
    let exp = t + 600;
    let hash = md5_link(&format!("{exp}/s/link.mp4127.0.0.1 {MD5_SECRET}"));
    expect(&format!("/s/link.mp4?md5={hash}&expires={exp}"), &[], 200, Some(b"secure link content"), "md5 good");
    expect(&format!("/s/link.mp4?md5={hash}&expires={}", exp + 1), &[], 403, None, "md5 longer expiry");
    expect(&format!("/s/link.mp4?expires={exp}"), &[], 403, None, "md5 missing");
    let old = t - 10;
    let old_hash = md5_link(&format!("{old}/s/link.mp4127.0.0.1 {MD5_SECRET}"));
    expect(&format!("/s/link.mp4?md5={old_hash}&expires={old}"), &[], 410, None, "md5 expired");
}

fn curl_fetch(base: String, extra_args: Vec<String>) -> impl Fn(&str, &[&str]) -> (u16, Vec<u8>) {
    move |path: &str, extra: &[&str]| {
        let mut args: Vec<&str> = extra_args.iter().map(String::as_str).collect();
        args.push("-g");
        args.extend_from_slice(extra);
        let r = get(&format!("{base}{path}"), &args);
        (r.status, r.body)
    }
}

fn metric(s: &Server, result: &str) -> u64 {
    s.metric(&format!("linerate_signed_url_total{{result=\"{result}\"}}")) as u64
}

#[test]
fn every_case_over_plain_http_with_metrics() {
    let site = Site::new();
    let cfg = ConfigFile::new(&site.config(&["k1"]));
    let s = Server::start(&["--config", cfg.arg()]);
    check_every_case(&curl_fetch(format!("http://{}", s.addr()), vec![]), "http");
    assert_eq!(metric(&s, "allowed"), 5);
    assert_eq!(metric(&s, "expired"), 2);
    assert_eq!(metric(&s, "missing"), 5);
    assert_eq!(metric(&s, "bad_signature"), 3);
    assert_eq!(metric(&s, "path_not_covered"), 1);
    assert_eq!(metric(&s, "not_yet_valid"), 1);
    assert_eq!(metric(&s, "unknown_key"), 1);
    assert_eq!(metric(&s, "address_mismatch"), 1);
    assert_eq!(metric(&s, "address_required"), 1);
    assert_eq!(metric(&s, "malformed"), 0);
}

#[test]
fn every_case_over_https_in_each_tls_mode() {
    let site = Site::new();
    let ca = common::tls::TestCa::new();
    let (cert, key) = ca.issue("localhost", &["localhost"], -1, 30);
    // `auto` is kernel TLS where the kernel has it (sendfile on a kTLS socket), user
    // space otherwise; `off` is always user space.
    for kernel_tls in ["auto", "off"] {
        let tls = format!("[tls]\ncert = {cert:?}\nkey = {key:?}\nkernel_tls = \"{kernel_tls}\"\n");
        let cfg = ConfigFile::new(&format!("{}\n{tls}", site.config(&["k1"])));
        let s = Server::start(&["--config", cfg.arg(), "--tls-listen", "127.0.0.1:0"]);
        let mode = s.stderr().lines().find(|l| l.contains("tls_mode=")).unwrap_or_default().to_string();
        let via = format!("https kernel_tls={kernel_tls} ({mode})");
        let base = format!("https://localhost:{}", s.tls_addrs[0].port());
        let fetch = curl_fetch(base, vec!["--cacert".into(), ca.ca_arg().into()]);
        check_every_case(&fetch, &via);
        // And with a client that is not curl: rustls, on one keep-alive connection.
        let t = now();
        let good = token("k1", K1, "/premium/title1/*", t + 600, None, "");
        let mut tls = common::tls::connect(s.tls_addrs[0], "localhost", &ca.ca_pem);
        let request = format!(
            "GET /premium/title1/master.m3u8 HTTP/1.1\r\nHost: localhost\r\n\r\n\
             GET /premium/title1/v720/seg-00001.m4s HTTP/1.1\r\nHost: localhost\r\nCookie: __token__={good}\r\n\r\n\
             GET /premium/title1/master.m3u8?__token__={good} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        );
        let raw = common::tls::exchange(&mut tls, request.as_bytes());
        let statuses: Vec<u16> = split_responses(&raw).iter().map(|r| r.status).collect();
        assert_eq!(statuses, [403, 200, 200], "{via}");
    }
}

/// One keep-alive connection sending requests and reading their answers.
struct KeepAlive {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl KeepAlive {
    fn connect(addr: SocketAddr) -> KeepAlive {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        KeepAlive { stream, buf: Vec::new() }
    }

    fn get(&mut self, target: &str) -> u16 {
        write!(self.stream, "GET {target} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        loop {
            let responses = split_responses(&self.buf);
            if let Some(r) = responses.first() {
                let len: usize = r.header("content-length").unwrap().parse().unwrap();
                if r.body.len() == len {
                    let used = self.buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4 + len;
                    self.buf.drain(..used);
                    return r.status;
                }
            }
            let mut chunk = [0u8; 4096];
            let n = common::read_some(&mut self.stream, &mut chunk).unwrap();
            assert!(n > 0, "server closed the keep-alive connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

#[test]
fn keys_rotate_by_sighup_without_a_failed_request() {
    let site = Site::new();
    let cfg = ConfigFile::new(&site.config(&["k1"]));
    let s = Server::start(&["--config", cfg.arg()]);
    let t = now();
    let acl = "/premium/title1/*";
    let with_k1 = token("k1", K1, acl, t + 600, None, "");
    let with_k2 = token("k2", K2, acl, t + 600, None, "");

    // Viewers fetch with whatever token the signer currently hands out: one on a
    // keep-alive connection opened before any reload, one on new connections.
    let current = Arc::new(Mutex::new(with_k1.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    // Successful requests per viewer.
    let oks = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    let failed = Arc::new(Mutex::new(Vec::new()));
    let addr = s.addr();
    let viewers: Vec<_> = [true, false]
        .into_iter()
        .zip(oks.clone())
        .map(|(kept, ok)| {
            let (current, stop, failed) = (current.clone(), stop.clone(), failed.clone());
            std::thread::spawn(move || {
                let mut conn = KeepAlive::connect(addr);
                while !stop.load(Ordering::Relaxed) {
                    if !kept {
                        conn = KeepAlive::connect(addr);
                    }
                    let token = current.lock().unwrap().clone();
                    let status = conn.get(&format!("/premium/title1/v720/seg-00001.m4s?__token__={token}"));
                    if status == 200 {
                        ok.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.lock().unwrap().push((status, token));
                    }
                }
            })
        })
        .collect();
    let reloads = |n: usize| {
        assert!(
            eventually(Duration::from_secs(10), || s.stderr().matches("configuration reloaded").count() == n),
            "reload {n} not reported:\n{}",
            s.stderr()
        );
    };
    // Each viewer makes 25 more requests. Per viewer, not in all: a request already
    // under way when the signer switched keys carries the old token, and one viewer
    // can be held up (a busy machine) while the other makes them all; retiring the
    // old key then would fail that request for the test's timing, not the server's.
    let settle = || {
        let before: Vec<u64> = oks.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        assert!(eventually(Duration::from_secs(10), || oks
            .iter()
            .zip(&before)
            .all(|(c, b)| c.load(Ordering::Relaxed) > b + 25)));
    };
    settle();
    // 1. Both keys valid.
    cfg.rewrite(&site.config(&["k1", "k2"]));
    s.signal("HUP");
    reloads(1);
    settle();
    // 2. The signer switches to the new key; links with the old one still work.
    *current.lock().unwrap() = with_k2.clone();
    settle();
    assert_eq!(get(&s.url(&format!("/premium/title1/master.m3u8?__token__={with_k1}")), &["-g"]).status, 200);
    // 3. The old key is retired.
    cfg.rewrite(&site.config(&["k2"]));
    s.signal("HUP");
    reloads(2);
    settle();
    stop.store(true, Ordering::Relaxed);
    for v in viewers {
        v.join().unwrap();
    }
    let failed = failed.lock().unwrap();
    assert!(failed.is_empty(), "{} requests failed during the rotation: {:?}", failed.len(), &failed[..]);
    let total: u64 = oks.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    assert!(total > 200, "{total} requests");
    // Retired means retired, for connections opened before the reload too.
    assert_eq!(get(&s.url(&format!("/premium/title1/master.m3u8?__token__={with_k1}")), &["-g"]).status, 403);
    let mut old = KeepAlive::connect(addr);
    assert_eq!(old.get(&format!("/premium/title1/master.m3u8?__token__={with_k2}")), 200);
    cfg.rewrite(&site.config(&["k1"]));
    s.signal("HUP");
    reloads(3);
    assert_eq!(old.get(&format!("/premium/title1/master.m3u8?__token__={with_k2}")), 403);
}

#[test]
fn tokens_never_appear_in_the_log() {
    let site = Site::new();
    let ca = common::tls::TestCa::new();
    let (cert, key) = ca.issue("localhost", &["localhost"], -1, 30);
    let logs = tempfile::tempdir().unwrap();
    let access = logs.path().join("access.log");
    let more =
        format!("[log]\nlevel = \"trace\"\n[access_log]\npath = {access:?}\n[tls]\ncert = {cert:?}\nkey = {key:?}\n");
    let cfg = ConfigFile::new(&format!("{}\n{more}", site.config(&["k1"])));
    let s = Server::start(&["--config", cfg.arg(), "--tls-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0"]);
    let t = now();
    let good = token("k1", K1, "/premium/title1/*", t + 600, None, "");
    let expired = token("k1", K1, "/premium/title1/*", t - 10, None, "");
    let hash = md5_link(&format!("{}/s/link.mp4127.0.0.1 {MD5_SECRET}", t + 600));
    let secrets = [good.clone(), expired.clone(), hash.clone(), K1.into(), MD5_SECRET.into()];
    for base in [s.url(""), format!("https://localhost:{}", s.tls_addrs[0].port())] {
        // A segment's Referer may be its manifest's signed URL.
        let referer = format!("{base}/premium/title1/master.m3u8?__token__={good}");
        let ca_args = ["--cacert", ca.ca_arg(), "-g", "-e", &referer];
        let cookie = format!("__token__={good}");
        for (path, extra) in [
            (format!("/premium/title1/master.m3u8?__token__={good}"), None),
            (format!("/premium/title1/master.m3u8?__token__={expired}"), None),
            (format!("/premium/title1/master.m3u8?__token__={}", tampered(&good)), None),
            ("/premium/title1/v720/seg-00001.m4s".to_string(), Some(cookie.as_str())),
            (format!("/s/link.mp4?md5={hash}&expires={}", t + 600), None),
            (format!("/premium/title1/nothing.m4s?__token__={good}"), None),
            (format!("/public/a.txt?__token__={good}"), None),
        ] {
            let mut args = ca_args.to_vec();
            if let Some(c) = extra {
                args.extend(["-b", c]);
            }
            get(&format!("{base}{path}"), &args);
        }
    }
    // The access log: one record per response (batches are written within a second).
    let records = || std::fs::read_to_string(&access).unwrap_or_default();
    assert!(eventually(Duration::from_secs(5), || records().lines().count() == 14), "{}", records());
    let records = records();
    assert!(records.contains("\"query\":true") && records.contains("\"signed\":\"expired\""), "{records}");
    assert!(records.contains("/premium/title1/master.m3u8\""), "the referer without its query: {records}");
    let log = s.stderr();
    // The requests were logged (at trace level), with what a log may say about them...
    assert!(log.contains("query=true") && log.contains("signed=\"allowed\""), "{log}");
    assert!(log.contains("signed URL refused"), "{log}");
    // ...and no token, hash or secret.
    for text in [&log, &records] {
        for secret in &secrets {
            let hmac = secret.rsplit("hmac=").next().unwrap();
            assert!(!text.contains(hmac), "`{hmac}` appears in a log:\n{text}");
        }
        assert!(!text.contains("__token__") && !text.contains("md5="), "{text}");
    }
}

#[test]
fn configuration_errors_name_the_key_and_secrets_are_not_printed() {
    let site = Site::new();
    let text = site.config(&["k1"]).replace(&format!("{:?}", site.keys.path().join("k1")), "\"/nonexistent/k1\"");
    let cfg = ConfigFile::new(&text);
    let out = tool(BIN).args(["serve", "--config", cfg.arg(), "--check-config"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("key `signed[0].keys[0].secret_file`: key `k1`: cannot read /nonexistent/k1"), "{err}");

    let cfg = ConfigFile::new(&site.config(&["k1"]));
    let out = tool(BIN).args(["serve", "--config", cfg.arg(), "--check-config"]).output().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(printed.contains("[[signed]]") && printed.contains("secret = \"<redacted>\""), "{printed}");
    assert!(!printed.contains(K1) && !printed.contains(MD5_SECRET), "{printed}");

    // A bad expression stops the server before it binds, with the key and the variable.
    let bad = site.config(&["k1"]).replace("$remote_addr $secret", "$http_user_agent $secret");
    let cfg = ConfigFile::new(&bad);
    let out = tool(BIN).args(["serve", "--config", cfg.arg(), "--listen", "127.0.0.1:0"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("key `signed[3].expression`") && err.contains("`$http_user_agent`"), "{err}");
}
