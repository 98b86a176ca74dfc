//! What a record says about a response, and its two formats: JSON lines (every
//! field) and nginx's `combined` (what log tools built for nginx read).

use std::cell::RefCell;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use linerate_http::date::Timestamps;

use super::escape::{escape, escape_clf, opt_bytes};
use super::numerals::{client_ip, millis, num};
use crate::counters::tcp_info::TcpFigures;

/// Everything a record says about one response.
pub(crate) struct Record<'a> {
    /// When the request head had arrived.
    pub time: SystemTime,
    pub client: SocketAddr,
    pub method: &'a [u8],
    /// The request target as sent; the query is cut off here, never written.
    pub target: &'a [u8],
    pub version: &'a str,
    pub status: u16,
    pub range: Option<&'a [u8]>,
    pub body_bytes: u64,
    pub bytes: u64,
    pub duration: Duration,
    pub ttfb: Option<Duration>,
    pub transport: &'a str,
    pub tls_version: Option<&'a str>,
    pub cipher: Option<&'a str>,
    pub sni: Option<&'a str>,
    pub worker: usize,
    pub cross_domain: bool,
    pub filled: bool,
    /// Under an `[[origin]]` prefix: HIT, MISS, STALE, REVALIDATED or PASS.
    pub cache: Option<&'static str>,
    /// How long the origin took to give the object's head (not on a hit).
    pub origin: Option<Duration>,
    /// The signed-URL verdict (`Verdict::label`), for paths under a signed prefix.
    pub signed: Option<&'static str>,
    pub user_agent: Option<&'a [u8]>,
    /// The Referer field as sent; its query is cut off here, never written.
    pub referer: Option<&'a [u8]>,
    pub tcp: Option<TcpFigures>,
}

impl Record<'_> {
    /// The path part of the target (no query, no fragment).
    fn path(&self) -> &[u8] {
        let end = self.target.iter().position(|&b| b == b'?' || b == b'#').unwrap_or(self.target.len());
        &self.target[..end]
    }

    fn has_query(&self) -> bool {
        self.target.contains(&b'?')
    }

    /// The Referer without its query and fragment.
    fn referer(&self) -> Option<&[u8]> {
        self.referer.map(|r| &r[..r.iter().position(|&b| b == b'?' || b == b'#').unwrap_or(r.len())])
    }

    pub(crate) fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"time\":\"");
        rfc3339_millis(self.time, out);
        out.extend_from_slice(b"\",\"client\":\"");
        client_ip(self.client.ip(), out);
        out.extend_from_slice(b"\",\"port\":");
        num(out, u64::from(self.client.port()));
        out.extend_from_slice(b",\"method\":\"");
        escape(self.method, out);
        out.extend_from_slice(b"\",\"path\":\"");
        escape(self.path(), out);
        out.extend_from_slice(if self.has_query() { b"\",\"query\":true" } else { b"\",\"query\":false" });
        out.extend_from_slice(b",\"version\":\"");
        out.extend_from_slice(self.version.as_bytes());
        out.extend_from_slice(b"\",\"status\":");
        num(out, u64::from(self.status));
        out.extend_from_slice(b",\"range\":");
        opt_bytes(self.range, out);
        out.extend_from_slice(b",\"body_bytes\":");
        num(out, self.body_bytes);
        out.extend_from_slice(b",\"bytes\":");
        num(out, self.bytes);
        out.extend_from_slice(b",\"duration_ms\":");
        millis(out, self.duration.as_micros());
        out.extend_from_slice(b",\"ttfb_ms\":");
        match self.ttfb {
            Some(t) => millis(out, t.as_micros()),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"transport\":\"");
        out.extend_from_slice(self.transport.as_bytes());
        out.extend_from_slice(b"\",\"tls_version\":");
        opt_bytes(self.tls_version.map(str::as_bytes), out);
        out.extend_from_slice(b",\"cipher\":");
        opt_bytes(self.cipher.map(str::as_bytes), out);
        out.extend_from_slice(b",\"sni\":");
        opt_bytes(self.sni.map(str::as_bytes), out);
        out.extend_from_slice(b",\"worker\":");
        num(out, self.worker as u64);
        out.extend_from_slice(if self.cross_domain { b",\"cross_domain\":true" } else { b",\"cross_domain\":false" });
        out.extend_from_slice(if self.filled { b",\"fill\":true" } else { b",\"fill\":false" });
        if let Some(c) = self.cache {
            out.extend_from_slice(b",\"cache\":\"");
            out.extend_from_slice(c.as_bytes());
            out.extend_from_slice(b"\",\"origin_ms\":");
            match self.origin {
                Some(t) => millis(out, t.as_micros()),
                None => out.extend_from_slice(b"null"),
            }
        }
        out.extend_from_slice(b",\"signed\":");
        opt_bytes(self.signed.map(str::as_bytes), out);
        out.extend_from_slice(b",\"user_agent\":");
        opt_bytes(self.user_agent, out);
        out.extend_from_slice(b",\"referer\":");
        opt_bytes(self.referer(), out);
        if let Some(t) = self.tcp {
            out.extend_from_slice(b",\"rtt_ms\":");
            millis(out, u128::from(t.rtt_us));
            out.extend_from_slice(b",\"retransmits\":");
            num(out, u64::from(t.total_retransmits));
            out.extend_from_slice(b",\"delivery_rate_bps\":");
            num(out, t.delivery_rate_bps);
        }
        out.extend_from_slice(b"}\n");
    }

    /// `$remote_addr - - [$time_local] "$request" $status $body_bytes_sent
    /// "$http_referer" "$http_user_agent"`, as nginx writes it (times in UTC), with
    /// the query left out of `$request` and `$http_referer`.
    pub(crate) fn write_combined(&self, out: &mut Vec<u8>) {
        client_ip(self.client.ip(), out);
        out.extend_from_slice(b" - - [");
        clf_time(self.time, out);
        out.extend_from_slice(b"] \"");
        escape_clf(self.method, out);
        out.push(b' ');
        escape_clf(self.path(), out);
        out.push(b' ');
        out.extend_from_slice(self.version.as_bytes());
        out.extend_from_slice(b"\" ");
        num(out, self.status.into());
        out.push(b' ');
        num(out, self.body_bytes);
        out.extend_from_slice(b" \"");
        escape_clf(self.referer().unwrap_or(b"-"), out);
        out.extend_from_slice(b"\" \"");
        escape_clf(self.user_agent.unwrap_or(b"-"), out);
        out.extend_from_slice(b"\"\n");
    }
}

thread_local! {
    /// The last second formatted for records on this thread: the date is worked out
    /// once a second, not per record.
    static TIMESTAMPS: RefCell<Timestamps> = const { RefCell::new(Timestamps::new()) };
}

/// `2026-11-23T22:30:00.123Z`.
fn rfc3339_millis(t: SystemTime, out: &mut Vec<u8>) {
    TIMESTAMPS.with(|cell| cell.borrow_mut().write_rfc3339_millis(t, out));
}

/// `23/Nov/2026:22:30:00 +0000`.
fn clf_time(t: SystemTime, out: &mut Vec<u8>) {
    TIMESTAMPS.with(|cell| cell.borrow_mut().write_clf(t, out));
}

#[cfg(test)]
mod tests {
    use super::super::testing::record;
    use super::*;

    #[test]
    fn json_record_has_every_field_and_no_query() {
        let mut out = Vec::new();
        record(b"/v/a.mp4?token=SECRET&exp=1", Some(b"player/1.0")).write_json(&mut out);
        assert_eq!(out.last(), Some(&b'\n'));
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains("SECRET") && !text.contains("exp="), "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["time"], "2026-11-23T22:30:00.123Z");
        assert_eq!(v["client"], "2001:db8::7");
        assert_eq!(v["port"], 51000);
        assert_eq!(v["path"], "/v/a.mp4");
        assert_eq!(v["query"], true);
        assert_eq!(v["status"], 206);
        assert_eq!(v["range"], "bytes=0-99");
        assert_eq!((v["body_bytes"].as_u64(), v["bytes"].as_u64()), (Some(100), Some(350)));
        assert_eq!((v["duration_ms"].as_f64(), v["ttfb_ms"].as_f64()), (Some(1.5), Some(0.25)));
        assert_eq!(
            (&v["transport"], &v["tls_version"], &v["sni"]),
            (&"usertls".into(), &"TLSv1.3".into(), &"cdn.example".into())
        );
        assert_eq!(v["cipher"], "TLS13_AES_128_GCM_SHA256");
        assert_eq!((&v["worker"], &v["cross_domain"], &v["fill"]), (&1.into(), &false.into(), &true.into()));
        assert_eq!((&v["user_agent"], &v["referer"]), (&"player/1.0".into(), &serde_json::Value::Null));
        assert_eq!(v["signed"], "allowed");
        assert_eq!((v["rtt_ms"].as_f64(), v["retransmits"].as_u64()), (Some(1.234), Some(2)));
        assert_eq!(v["delivery_rate_bps"], 8_000_000);
    }

    #[test]
    fn a_referer_query_is_never_written() {
        let referer = b"https://cdn.example/premium/t1/master.m3u8?__token__=SECRET#frag";
        let r = Record { referer: Some(referer), ..record(b"/premium/t1/seg-1.m4s", None) };
        let (mut json, mut combined) = (Vec::new(), Vec::new());
        r.write_json(&mut json);
        r.write_combined(&mut combined);
        for out in [json, combined] {
            let text = String::from_utf8(out).unwrap();
            assert!(!text.contains("SECRET") && !text.contains("__token__"), "{text}");
            assert!(text.contains("https://cdn.example/premium/t1/master.m3u8\""), "{text}");
        }
    }

    #[test]
    fn combined_lines_match_nginx_for_both_address_families() {
        for (client, shown) in [("192.0.2.250:40000", "192.0.2.250"), ("[2001:db8::7]:51000", "2001:db8::7")] {
            let r = Record { client: client.parse().unwrap(), ..record(b"/t/seg-1.m4s", Some(b"player/1.0")) };
            let mut line = Vec::new();
            r.write_combined(&mut line);
            let text = String::from_utf8(line).unwrap();
            let (addr, rest) = text.split_once(" - - [").unwrap();
            assert_eq!(addr, shown);
            let rest = rest.split_once("] ").unwrap().1;
            assert_eq!(rest, "\"GET /t/seg-1.m4s HTTP/1.1\" 206 100 \"-\" \"player/1.0\"\n");
        }
    }

    #[test]
    fn times_and_durations_are_exact_across_seconds() {
        let mut r = record(b"/a", None);
        let mut out = Vec::new();
        for (ms, want) in
            [(123, "22:30:00.123Z"), (999, "22:30:00.999Z"), (1000, "22:30:01.000Z"), (61_007, "22:31:01.007Z")]
        {
            r.time = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_473_000_000 + ms);
            r.duration = Duration::from_micros(ms * 1000 + 7);
            out.clear();
            r.write_json(&mut out);
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v["time"], format!("2026-11-23T{want}"));
            assert_eq!(v["duration_ms"].as_f64(), Some(ms as f64 + 0.007));
        }
    }

    #[test]
    fn hostile_bytes_are_escaped_in_both_formats() {
        let target = b"/a\"b\\c\x01\n\xff\xc3\xa9?q";
        let ua = b"x\"}\r\ninjected";
        let mut json = Vec::new();
        record(target, Some(ua)).write_json(&mut json);
        let text = String::from_utf8(json).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["path"], r#"/a\x22b\x5Cc\x01\x0A\xFF\xC3\xA9"#);
        assert_eq!(v["user_agent"], r#"x\x22}\x0D\x0Ainjected"#);
        let mut clf = Vec::new();
        record(target, Some(ua)).write_combined(&mut clf);
        let line = String::from_utf8(clf).unwrap();
        assert_eq!(
            line,
            "2001:db8::7 - - [23/Nov/2026:22:30:00 +0000] \"GET /a\\x22b\\x5Cc\\x01\\x0A\\xFF\\xC3\\xA9 HTTP/1.1\" 206 100 \"-\" \"x\\x22}\\x0D\\x0Ainjected\"\n"
        );
    }
}
