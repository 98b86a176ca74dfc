//! The integration tests: the real `linerate` binary driven by real clients (curl,
//! openssl, raw sockets, ffprobe, Chromium, the bench), one module per area named
//! `<area>_<topic>`. They are one test binary, as ripgrep's are, so the helpers in
//! `common` and `bench_support` compile once and one executable links.
//!
//! `cargo test -p linerate --test integration cold_catalogue::` runs one area, and a
//! test's full name (`serve_limits::idle_connections_are_closed`) runs one test.
//! Tests wait for what they need with a deadline (`common::eventually`); a fixed
//! sleep left in a test is behaviour (a slow client, a pause that proves nothing
//! happens) and says so.
//!
//! Some tests need a service, a tool beyond curl, openssl and python3, or a root
//! facility (nginx, Chromium, ffmpeg, testssl.sh, wrk, strace, cgroup v1 blkio, FUSE,
//! network namespaces): `scripts/test` installs them and runs every test, and
//! `scripts/test --fast` leaves those out by name (its list says which and why). A
//! test that finds its tool missing fails, it never passes quietly.

mod bench_support;
mod common;

mod abuse;
mod access_log;
mod bench_https;
mod bench_live;
mod bench_resume;
mod bench_stall;
mod bench_verify;
mod capacity_cli;
mod client_limits;
mod cold_catalogue;
mod dashboard;
mod dim_simulate;
mod http_curl;
mod http_raw;
mod media_clients;
mod numa_silos;
mod serve_files;
mod serve_lifecycle;
mod serve_limits;
mod signed_urls;
mod stat_cli;
mod stats_admin;
mod tls_https;
mod tls_testssl;
mod tune_dim;
mod tune_host;
mod upgrade;
