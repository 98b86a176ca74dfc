//! Helpers shared by the access log's unit tests.

use std::time::{Duration, SystemTime};

use super::Record;
use crate::counters::tcp_info::TcpFigures;

pub(super) fn record<'a>(target: &'a [u8], ua: Option<&'a [u8]>) -> Record<'a> {
    Record {
        // 2026-11-23T22:30:00.123Z
        time: SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_473_000_123),
        client: "[2001:db8::7]:51000".parse().unwrap(),
        method: b"GET",
        target,
        version: "HTTP/1.1",
        status: 206,
        range: Some(b"bytes=0-99"),
        body_bytes: 100,
        bytes: 350,
        duration: Duration::from_micros(1500),
        ttfb: Some(Duration::from_micros(250)),
        transport: "usertls",
        tls_version: Some("TLSv1.3"),
        cipher: Some("TLS13_AES_128_GCM_SHA256"),
        sni: Some("cdn.example"),
        worker: 1,
        cross_domain: false,
        filled: true,
        cache: None,
        origin: None,
        signed: Some("allowed"),
        user_agent: ua,
        referer: None,
        tcp: Some(TcpFigures { rtt_us: 1234, total_retransmits: 2, delivery_rate_bps: 8_000_000 }),
    }
}

/// xorshift64*: reproducible inputs for the property tests below.
pub(super) struct Rng(pub(super) u64);
impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}
