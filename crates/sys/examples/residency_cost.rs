//! What one page-cache residency check costs, per 2 MiB range of a file:
//! `cachestat` over the range, and the fallback's one-byte `preadv2(RWF_NOWAIT)`
//! probes every 128 KiB (17 per range).
//!
//! `cargo run --release -p linerate-sys --example residency_cost -- FILE [ITERATIONS]`
//!
//! Read FILE into the page cache first (`cat FILE > /dev/null`): the cost of
//! `cachestat` grows with the number of folios in the range, so a file read
//! sequentially (large folios) checks faster than one written in small pieces.
use std::os::fd::AsFd;
use std::time::Instant;

use linerate_sys::pagecache;

const RANGE: u64 = 2 << 20;
const STRIDE: u64 = 128 << 10;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: residency_cost FILE [ITERATIONS]");
    let n: u64 = args.next().map_or(100_000, |s| s.parse().expect("ITERATIONS is a number"));
    let file = std::fs::File::open(&path)?;
    let ranges = (file.metadata()?.len() / RANGE).max(1);
    let fd = file.as_fd();

    let started = Instant::now();
    let mut cached = 0;
    for i in 0..n {
        cached += pagecache::cached_pages(fd, (i % ranges) * RANGE, RANGE)?;
    }
    let cachestat_us = started.elapsed().as_secs_f64() * 1e6 / n as f64;

    let started = Instant::now();
    let mut resident = 0;
    for i in 0..n {
        let base = (i % ranges) * RANGE;
        for k in 0..=RANGE / STRIDE {
            resident += u64::from(pagecache::probe_nowait(fd, base + (k * STRIDE).min(RANGE - 1))?);
        }
    }
    let probe_us = started.elapsed().as_secs_f64() * 1e6 / n as f64;

    let pages = n * pagecache::pages_spanned(0, RANGE);
    println!(
        "per 2 MiB range: cachestat {cachestat_us:.2} us ({:.0}% of pages cached), 17 RWF_NOWAIT probes {probe_us:.2} us ({:.0}% resident)",
        100.0 * cached as f64 / pages as f64,
        100.0 * resident as f64 / (n * (RANGE / STRIDE + 1)) as f64
    );
    Ok(())
}
