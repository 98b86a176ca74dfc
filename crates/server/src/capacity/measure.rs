//! The host measurements behind the capacity model, each bounded in time.
//!
//! Rates per core are bytes per CPU-second of the measuring threads (their own
//! `CLOCK_THREAD_CPUTIME_ID`), so other load on a shared machine slows a
//! measurement down without making the host look slower per core. Memory bandwidth
//! is wall-clock: it is a property of the whole machine.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::Context;
use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use serde::Serialize;

use super::{Inputs, Rates};
use crate::sysfs::Host;
use crate::tune::features::{Features, LiveFeatures};

/// The AEAD the TLS prediction is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cipher {
    Aes128Gcm,
    Aes256Gcm,
}

/// How long each measurement runs, and how the loopback client reads.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub per_measurement: Duration,
    /// Bytes per `read` of the loopback receiver: the client the loopback rows
    /// model (wrk reads 8 KiB at a time).
    pub loopback_read: usize,
}

impl Budget {
    pub const DEFAULT: Budget = Budget { per_measurement: Duration::from_secs(2), loopback_read: 8192 };
    pub const QUICK: Budget = Budget { per_measurement: Duration::from_millis(300), loopback_read: 8192 };
}

/// A NIC as the model sees it.
#[derive(Clone, Debug, Serialize)]
pub struct NicFacts {
    pub name: String,
    pub driver: String,
    pub node: Option<u32>,
    /// Link speed in Mb/s; `None` when the device does not report one (virtio, down).
    pub speed_mbps: Option<u64>,
    /// `tls-hw-tx-offload`: `None` when the features could not be read.
    pub tls_offload_active: Option<bool>,
    pub tls_offload_changeable: Option<bool>,
}

/// Every figure measured or read on the host.
#[derive(Clone, Debug, Serialize)]
pub struct HostFacts {
    pub cpus: Vec<usize>,
    /// NUMA nodes and their CPUs.
    pub nodes: Vec<(u32, Vec<u32>)>,
    pub last_level_cache_bytes: Option<u64>,
    /// Bytes per array per thread in the memory measurements.
    pub stream_array_bytes: usize,
    /// STREAM copy with every CPU: bytes read plus written per second.
    pub memory_copy_bytes_per_s: f64,
    /// STREAM triad (a = b + s*c) with every CPU: bytes read plus written per second.
    pub memory_triad_bytes_per_s: f64,
    /// One core's `memcpy` rate on arrays larger than the last-level cache (bytes
    /// copied per second).
    pub copy_core_bytes_per_s: f64,
    /// AES-128-GCM and AES-256-GCM sealing of 16 KiB records, one core, bytes per
    /// CPU-second (aws-lc-rs, the server's crypto library).
    pub seal_aes128_gcm_bytes_per_s: f64,
    pub seal_aes256_gcm_bytes_per_s: f64,
    /// `sendfile` of a page-cached file to a loopback socket, one sender pinned on
    /// each CPU with its receiver pinned on the next CPU: bytes per sender
    /// CPU-second, per CPU-second of both, and the wall-clock total of all pairs.
    pub sendfile_sender_bytes_per_s: f64,
    pub sendfile_pair_bytes_per_s: f64,
    pub sendfile_wall_bytes_per_s: f64,
    /// The share of the pairs' CPU time spent in interrupts on their CPUs (counted
    /// in the per-CPU-second of both, not in the sender's).
    pub sendfile_interrupt_share: f64,
    /// The receiver's read size in those pairs.
    pub loopback_read_bytes: usize,
    pub nics: Vec<NicFacts>,
    /// The kernel takes TLS 1.3 keys for the cipher (the server's start-up probe).
    pub kernel_tls: bool,
    pub kernel_tls_note: Option<String>,
}

impl HostFacts {
    /// The model's inputs for one cipher; `client_open` is the loopback client's
    /// decryption rate (bytes per CPU-second), the seal rate when `None`.
    pub fn inputs(&self, cipher: Cipher, client_open: Option<f64>) -> Inputs {
        let seal = match cipher {
            Cipher::Aes128Gcm => self.seal_aes128_gcm_bytes_per_s,
            Cipher::Aes256Gcm => self.seal_aes256_gcm_bytes_per_s,
        };
        let speeds: Vec<u64> = self.nics.iter().filter_map(|n| n.speed_mbps).collect();
        Inputs {
            cores: self.cpus.len(),
            memory_bandwidth: self.memory_copy_bytes_per_s,
            rates: Rates {
                sendfile_sender: self.sendfile_sender_bytes_per_s,
                sendfile_pair: self.sendfile_pair_bytes_per_s,
                seal,
                client_open: client_open.unwrap_or(seal),
                copy_core: self.copy_core_bytes_per_s,
            },
            nic_bits_per_second: if speeds.is_empty() {
                None
            } else {
                Some(speeds.iter().map(|&m| m as f64 * 1e6).sum())
            },
            nic_tls_offload: self
                .nics
                .iter()
                .any(|n| n.tls_offload_active == Some(true) || n.tls_offload_changeable == Some(true)),
            kernel_tls: self.kernel_tls,
        }
    }
}

/// Measures the host: about six budgets of time in all.
pub fn host(budget: Budget) -> anyhow::Result<HostFacts> {
    let sys = Host::new("/");
    let cpus = linerate_sys::allowed_cpus().context("reading the affinity mask")?;
    let llc = last_level_cache(&sys);
    // Each array much larger than the last-level cache even split among threads.
    let array = ((llc.unwrap_or(32 << 20) as usize * 4) / cpus.len()).max(64 << 20);
    let (copy_all, triad_all) = stream(&cpus, array, budget.per_measurement).context("memory bandwidth")?;
    let (copy_one, _) = stream(&cpus[..1], array, budget.per_measurement / 2).context("one core's copy rate")?;
    let seal128 = seal_rate(&aead::AES_128_GCM, budget.per_measurement / 2)?;
    let seal256 = seal_rate(&aead::AES_256_GCM, budget.per_measurement / 2)?;
    let send = sendfile_rates(&cpus, budget.per_measurement, budget.loopback_read).context("sendfile over loopback")?;
    let probe = crate::tls::kernel::probe();
    let kernel_tls = probe.supports(linerate_sys::ktls::Version::Tls13, linerate_sys::ktls::Cipher::Aes128Gcm);
    Ok(HostFacts {
        nodes: sys.nodes(),
        last_level_cache_bytes: llc,
        stream_array_bytes: array,
        memory_copy_bytes_per_s: copy_all,
        memory_triad_bytes_per_s: triad_all,
        copy_core_bytes_per_s: copy_one / 2.0,
        seal_aes128_gcm_bytes_per_s: seal128,
        seal_aes256_gcm_bytes_per_s: seal256,
        sendfile_sender_bytes_per_s: send.sender,
        sendfile_pair_bytes_per_s: send.pair,
        sendfile_wall_bytes_per_s: send.wall,
        sendfile_interrupt_share: send.interrupt_share,
        loopback_read_bytes: budget.loopback_read,
        nics: nics(&sys),
        kernel_tls,
        kernel_tls_note: probe.unavailable_because,
        cpus,
    })
}

fn last_level_cache(sys: &Host) -> Option<u64> {
    let base = "sys/devices/system/cpu/cpu0/cache";
    sys.list(base)
        .iter()
        .filter(|d| d.starts_with("index"))
        .filter_map(|d| {
            let level = sys.read_u64(&format!("{base}/{d}/level")).ok()?;
            let size = parse_size(&sys.read(&format!("{base}/{d}/size")).ok()?)?;
            Some((level, size))
        })
        .max()
        .map(|(_, size)| size)
}

/// `32768K`, `2M`, `512` as sysfs writes cache sizes.
fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1 << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok().map(|n| n * mult)
}

fn nics(sys: &Host) -> Vec<NicFacts> {
    sys.nics()
        .into_iter()
        .map(|n| {
            let speed = sys
                .read(&format!("sys/class/net/{}/speed", n.name))
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .and_then(|s| u64::try_from(s).ok())
                .filter(|&s| s > 0);
            let tls = LiveFeatures.features(&n.name).ok().map(|f| f.get("tls-hw-tx-offload").copied());
            NicFacts {
                speed_mbps: speed,
                tls_offload_active: tls.map(|f| f.is_some_and(|f| f.active)),
                tls_offload_changeable: tls.map(|f| f.is_some_and(|f| f.changeable)),
                name: n.name,
                driver: n.driver,
                node: n.node,
            }
        })
        .collect()
}

/// STREAM copy and triad, one thread pinned on each CPU of `cpus`, each on its own
/// arrays of `array` bytes, started together. Returns (copy, triad) memory traffic
/// in bytes per second summed over the threads (STREAM's counting: copy moves 2
/// bytes per element byte, triad 3; write-allocate reads are not counted).
fn stream(cpus: &[usize], array: usize, budget: Duration) -> io::Result<(f64, f64)> {
    let barrier = Arc::new(Barrier::new(cpus.len()));
    let threads: Vec<_> = cpus
        .iter()
        .map(|&cpu| {
            let barrier = barrier.clone();
            std::thread::spawn(move || -> io::Result<(f64, f64)> {
                linerate_sys::pin_current_thread(cpu)?;
                let n = array / 8;
                // Filled here, on the pinned thread: first touch puts the pages on its node.
                let mut a = vec![1.0f64; n];
                let b = vec![2.0f64; n];
                let c = vec![0.5f64; n];
                barrier.wait();
                let copy = timed(budget / 2, || {
                    a.copy_from_slice(&b);
                    std::hint::black_box(&a);
                    2 * array
                });
                barrier.wait();
                let triad = timed(budget / 2, || {
                    for ((x, y), z) in a.iter_mut().zip(&b).zip(&c) {
                        *x = y + 3.0 * z;
                    }
                    std::hint::black_box(&a);
                    3 * array
                });
                Ok((copy, triad))
            })
        })
        .collect();
    let mut sum = (0.0, 0.0);
    for t in threads {
        let (c, t) = t.join().map_err(|_| io::Error::other("a measuring thread panicked"))??;
        sum.0 += c;
        sum.1 += t;
    }
    Ok(sum)
}

/// Runs `step` (which returns the bytes it moved) until `budget` has passed, at
/// least twice; bytes per wall-clock second.
fn timed(budget: Duration, mut step: impl FnMut() -> usize) -> f64 {
    step(); // warm-up: pages, caches, frequency
    let start = Instant::now();
    let mut bytes = 0usize;
    let mut rounds = 0;
    while rounds < 2 || start.elapsed() < budget {
        bytes += step();
        rounds += 1;
    }
    bytes as f64 / start.elapsed().as_secs_f64()
}

/// Seals 16 KiB records in place for `budget`; bytes per CPU-second of this thread.
fn seal_rate(alg: &'static aead::Algorithm, budget: Duration) -> anyhow::Result<f64> {
    let key_bytes = vec![0x42u8; alg.key_len()];
    let key = LessSafeKey::new(UnboundKey::new(alg, &key_bytes).map_err(|_| anyhow::anyhow!("AEAD key"))?);
    let mut record = vec![0x17u8; 16 * 1024];
    let mut seq = 0u64;
    let mut seal = |record: &mut [u8]| -> anyhow::Result<()> {
        let mut nonce = [0u8; 12];
        nonce[4..].copy_from_slice(&seq.to_be_bytes());
        seq += 1;
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from([0x17, 3, 3, 0x40, 0x11]),
                record,
            )
            .map_err(|_| anyhow::anyhow!("AEAD seal failed"))?;
        let _ = std::hint::black_box(tag);
        Ok(())
    };
    seal(&mut record)?;
    let (wall, cpu) = (Instant::now(), linerate_sys::clock::thread_cpu_time());
    let mut bytes = 0usize;
    while wall.elapsed() < budget || bytes == 0 {
        for _ in 0..16 {
            seal(&mut record)?;
            bytes += record.len();
        }
    }
    Ok(bytes as f64 / (linerate_sys::clock::thread_cpu_time() - cpu).as_secs_f64().max(1e-6))
}

struct SendRates {
    sender: f64,
    pair: f64,
    wall: f64,
    interrupt_share: f64,
}

/// One sender thread pinned on each CPU, the sender `sendfile`-ing a page-cached file
/// in 2 MiB calls to a loopback TCP connection, its receiver pinned on the next CPU
/// reading it `read_size` bytes at a time, for `budget`.
///
/// Each pair spans two CPUs, as a server's workers and a benchmark client's threads
/// run side by side. With both threads of a pair on one CPU they alternate at every
/// wake-up, and the pair costs about 40% more CPU per byte than the server and wrk
/// spend together (0.55 against 0.39 CPU-s/GB on the 2-CPU development machine).
/// With one CPU, sender and receiver share it.
fn sendfile_rates(cpus: &[usize], budget: Duration, read_size: usize) -> anyhow::Result<SendRates> {
    const FILE: usize = 64 << 20;
    const CHUNK: usize = 2 << 20;
    let mut file = tempfile::tempfile().context("a temporary file")?;
    let block = vec![0x5au8; 1 << 20];
    for _ in 0..FILE / block.len() {
        file.write_all(&block)?;
    }
    file.flush()?;
    let file = Arc::new(file);
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let barrier = Arc::new(Barrier::new(2 * cpus.len()));
    let interrupts_before = interrupt_ticks(cpus);
    let start = Instant::now();
    let mut handles = Vec::new();
    for (i, &cpu) in cpus.iter().enumerate() {
        let peer = cpus[(i + 1) % cpus.len()];
        let client = TcpStream::connect(addr)?;
        let (server, _) = listener.accept()?;
        let (file, b1, b2) = (file.clone(), barrier.clone(), barrier.clone());
        handles.push(std::thread::spawn(move || -> io::Result<(u64, Duration)> {
            linerate_sys::pin_current_thread(cpu)?;
            b1.wait();
            let (t0, c0) = (Instant::now(), linerate_sys::clock::thread_cpu_time());
            let mut sent = 0u64;
            let mut off = 0u64;
            while t0.elapsed() < budget {
                let n = linerate_sys::sendfile(server.as_fd(), file.as_fd(), off, CHUNK)?;
                if n == 0 {
                    return Err(io::Error::other("sendfile sent nothing"));
                }
                sent += n as u64;
                off = (off + n as u64) % FILE as u64;
            }
            let cpu_time = linerate_sys::clock::thread_cpu_time() - c0;
            server.shutdown(std::net::Shutdown::Write)?;
            Ok((sent, cpu_time))
        }));
        handles.push(std::thread::spawn(move || -> io::Result<(u64, Duration)> {
            let mut client = client;
            linerate_sys::pin_current_thread(peer)?;
            let mut buf = vec![0u8; read_size.max(1)];
            b2.wait();
            let c0 = linerate_sys::clock::thread_cpu_time();
            let mut got = 0u64;
            loop {
                match client.read(&mut buf)? {
                    0 => break,
                    n => got += n as u64,
                }
            }
            Ok((got, linerate_sys::clock::thread_cpu_time() - c0))
        }));
    }
    let (mut sent, mut sender_cpu, mut receiver_cpu) = (0u64, Duration::ZERO, Duration::ZERO);
    for (i, h) in handles.into_iter().enumerate() {
        let (bytes, cpu) = h.join().map_err(|_| anyhow::anyhow!("a sendfile thread panicked"))??;
        if i % 2 == 0 {
            sent += bytes;
            sender_cpu += cpu;
        } else {
            receiver_cpu += cpu;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let interrupts = match (interrupts_before, interrupt_ticks(cpus)) {
        (Some(a), Some(b)) => {
            let per_s = linerate_sys::clock::ticks_per_second().unwrap_or(100) as f64;
            Duration::from_secs_f64(b.saturating_sub(a) as f64 / per_s)
        }
        _ => Duration::ZERO,
    };
    anyhow::ensure!(sent > 0, "no bytes went over loopback");
    Ok(SendRates {
        sender: sent as f64 / sender_cpu.as_secs_f64().max(1e-6),
        pair: sent as f64 / (sender_cpu + receiver_cpu + interrupts).as_secs_f64().max(1e-6),
        wall: sent as f64 / wall,
        interrupt_share: interrupts.as_secs_f64() / (sender_cpu + receiver_cpu + interrupts).as_secs_f64().max(1e-6),
    })
}

/// Ticks the CPUs of `cpus` spent in hard and soft interrupts (`irq` + `softirq` of
/// their `cpuN` lines in /proc/stat), or `None` when /proc/stat cannot be read.
///
/// The loopback receive path runs in softirq. Where the kernel accounts IRQ time
/// apart from tasks (`CONFIG_IRQ_TIME_ACCOUNTING`), that work is in no thread's CPU
/// clock and these ticks add it. Where the kernel does not, softirq work done in a
/// thread's context is in its clock *and* in these (tick-sampled) counters, so the
/// pair's cost comes out too high by that overlap. On the development machine the
/// sum claims 105-106% of the pinned CPUs' time: the overlap is about 5%, and the
/// per-byte cost is an upper estimate by that much.
fn interrupt_ticks(cpus: &[usize]) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    Some(parse_interrupt_ticks(&text, cpus))
}

fn parse_interrupt_ticks(text: &str, cpus: &[usize]) -> u64 {
    crate::procfs::parse_per_cpu(text).filter(|(cpu, _)| cpus.contains(cpu)).map(|(_, t)| t.irq + t.softirq).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interrupt_ticks_are_summed_over_the_chosen_cpus_only() {
        let text = "cpu  10 0 20 300 0 7 90 0 0 0\n\
                    cpu0 5 0 10 150 0 3 40 0 0 0\n\
                    cpu1 5 0 10 150 0 4 50 0 0 0\n\
                    intr 12345\n";
        assert_eq!(parse_interrupt_ticks(text, &[0, 1]), 97);
        assert_eq!(parse_interrupt_ticks(text, &[1]), 54);
        assert_eq!(parse_interrupt_ticks(text, &[2]), 0);
    }

    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_size("32768K"), Some(32 << 20));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("x"), None);
    }

    #[test]
    fn seal_rate_is_positive_and_bounded_in_time() {
        let t = Instant::now();
        let r = seal_rate(&aead::AES_128_GCM, Duration::from_millis(50)).unwrap();
        assert!(r > 1e6, "{r}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
