//! `linerate capacity`: what this box can serve, predicted from a few measurements.
//!
//! [`measure`] times the host (memory copy bandwidth with every CPU, AES-GCM sealing
//! per core with the server's own crypto library, `sendfile` over loopback per core)
//! and reads its NICs (speed, TLS offload) and NUMA nodes. [`predict`] turns those
//! figures into a serving ceiling per transport mode: the smallest of
//!
//! - the **memory** limit: memory bandwidth / memory passes per byte served
//!   ([`Mode::memory_passes`]);
//! - the **CPU** limit: cores / CPU-seconds per byte, the per-byte cost being built
//!   from the measured per-core rates ([`Mode::cpu_seconds_per_byte`]);
//! - the **NIC** limit: the sum of the NICs' link speeds (network path only).
//!
//! The arithmetic is pure and tested with fixed inputs; docs/performance/capacity.md
//! states the assumptions and compares the prediction with
//! measured runs.

pub mod measure;

use serde::{Deserialize, Serialize};

/// How the response bodies leave the box.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// `sendfile` from the page cache: the NIC reads the pages.
    Plain,
    /// Kernel TLS encrypting on the CPU (`sendfile` on a kTLS socket).
    KtlsSoftware,
    /// Kernel TLS with the NIC encrypting (`tls-hw-tx-offload`).
    KtlsOffload,
    /// linerate's user-space record layer: `preadv` into record slots, seal in
    /// place, one write per batch.
    UserTls,
}

impl Mode {
    pub const ALL: [Mode; 4] = [Mode::Plain, Mode::KtlsSoftware, Mode::KtlsOffload, Mode::UserTls];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::KtlsSoftware => "ktls-software",
            Mode::KtlsOffload => "ktls-offload",
            Mode::UserTls => "user-tls",
        }
    }

    fn encrypts_on_cpu(self) -> bool {
        matches!(self, Mode::KtlsSoftware | Mode::UserTls)
    }

    /// Memory passes per byte served: each time every served byte is read from or
    /// written to DRAM, by a CPU or a device. Page-cache hits are assumed (a cold
    /// byte adds the disk's DMA write).
    ///
    /// Network: plain 1 (the NIC reads the page); kTLS in software 3 (the CPU reads
    /// the page and writes the ciphertext into the socket buffer, which the NIC
    /// reads); NIC offload 1 (the NIC reads the page and encrypts on the way out);
    /// user-space TLS 5 (`preadv` reads the page and writes the record slot, the
    /// write reads the record and writes the socket buffer, the NIC reads it; the
    /// seal in place works on a slot still in cache and is not counted).
    ///
    /// Loopback: there is no NIC read; the receiver's copy out of the socket reads
    /// the sent bytes and writes them into its buffer instead (+1 pass net). A TLS
    /// receiver decrypts in its own buffer, in cache.
    pub fn memory_passes(self, path: Path) -> f64 {
        let network: f64 = match self {
            Mode::Plain | Mode::KtlsOffload => 1.0,
            Mode::KtlsSoftware => 3.0,
            Mode::UserTls => 5.0,
        };
        match path {
            Path::Network => network,
            Path::Loopback => network + 1.0,
        }
    }

    /// CPU-seconds one core spends per byte served in this mode, from the measured
    /// per-core rates (bytes per CPU-second):
    ///
    /// - plain and NIC offload: one `sendfile` byte (network: the sender's cost;
    ///   loopback: sender and receiver together, as measured by pairs spread over
    ///   two CPUs);
    /// - kTLS in software: that plus one seal (the kernel's AES-GCM is taken to cost
    ///   what aws-lc's does);
    /// - user-space TLS: that plus two copies (the `preadv` into the record slot,
    ///   and the socket write, which copies where `sendfile` does not);
    /// - loopback TLS: plus the receiver's decryption, at the client's own rate
    ///   ([`Rates::client_open`]).
    pub fn cpu_seconds_per_byte(self, path: Path, r: &Rates) -> f64 {
        let send = match path {
            Path::Network => 1.0 / r.sendfile_sender,
            Path::Loopback => 1.0 / r.sendfile_pair,
        };
        let crypto = if self.encrypts_on_cpu() {
            match path {
                Path::Network => 1.0 / r.seal,
                Path::Loopback => 1.0 / r.seal + 1.0 / r.client_open,
            }
        } else {
            0.0
        };
        let copies = if self == Mode::UserTls { 2.0 / r.copy_core } else { 0.0 };
        send + crypto + copies
    }
}

/// Where the bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Path {
    /// Out of the NICs to clients elsewhere.
    Network,
    /// To a client on this host, sharing its CPUs and memory (the benchmarks here).
    Loopback,
}

/// Per-core rates the model needs, in bytes per CPU-second.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// `sendfile` to a loopback socket, the sending thread's CPU time only (which
    /// includes the loopback receive path the kernel runs in the sender's context).
    pub sendfile_sender: f64,
    /// `sendfile` to a loopback socket and the receiver's `read`, the receiver on
    /// another CPU: the CPU time of the two.
    pub sendfile_pair: f64,
    /// AES-GCM seal of 16 KiB records (the cipher the prediction is for).
    pub seal: f64,
    /// The loopback client's AES-GCM decryption; by default the seal rate, but a
    /// client with another TLS library (wrk with OpenSSL) may be slower.
    pub client_open: f64,
    /// One core copying memory much larger than the last-level cache (`memcpy`
    /// bytes per second: each byte read once and written once).
    pub copy_core: f64,
}

/// Everything the prediction is computed from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Inputs {
    /// CPUs that serve (the process's affinity mask).
    pub cores: usize,
    /// Memory traffic (bytes read plus bytes written per second) with every CPU
    /// copying: STREAM copy.
    pub memory_bandwidth: f64,
    pub rates: Rates,
    /// Sum of the NICs' link speeds in bits per second; `None` when no NIC reports
    /// a speed (virtual NICs).
    pub nic_bits_per_second: Option<f64>,
    /// Some NIC can encrypt TLS records (`tls-hw-tx-offload` on or changeable).
    pub nic_tls_offload: bool,
    /// The kernel takes TLS keys for the cipher (kTLS probe).
    pub kernel_tls: bool,
}

/// What limits a mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Limit {
    Memory,
    Cpu,
    Nic,
}

impl Limit {
    pub fn name(self) -> &'static str {
        match self {
            Limit::Memory => "memory",
            Limit::Cpu => "cpu",
            Limit::Nic => "nic",
        }
    }
}

/// One mode's prediction, in bits per second.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Ceiling {
    pub mode: Mode,
    pub path: Path,
    /// The host can run this mode (kTLS in the kernel, a NIC with TLS offload); the
    /// figures are still computed, as what it would give.
    pub available: bool,
    pub memory_passes: f64,
    pub memory_bps: f64,
    pub cpu_seconds_per_gb: f64,
    pub cpu_bps: f64,
    pub nic_bps: Option<f64>,
    /// The smallest of the three.
    pub ceiling_bps: f64,
    pub limit: Limit,
}

/// The ceiling of every mode on both paths (NIC offload has no loopback row).
pub fn predict(inputs: &Inputs) -> Vec<Ceiling> {
    let mut out = Vec::new();
    for path in [Path::Network, Path::Loopback] {
        for mode in Mode::ALL {
            if path == Path::Loopback && mode == Mode::KtlsOffload {
                continue;
            }
            out.push(ceiling(inputs, mode, path));
        }
    }
    out
}

/// One mode's ceiling on one path.
pub fn ceiling(inputs: &Inputs, mode: Mode, path: Path) -> Ceiling {
    let passes = mode.memory_passes(path);
    let memory_bps = inputs.memory_bandwidth / passes * 8.0;
    let per_byte = mode.cpu_seconds_per_byte(path, &inputs.rates);
    let cpu_bps = inputs.cores as f64 / per_byte * 8.0;
    let nic_bps = match path {
        Path::Network => inputs.nic_bits_per_second,
        Path::Loopback => None,
    };
    let (mut ceiling_bps, mut limit) =
        if memory_bps < cpu_bps { (memory_bps, Limit::Memory) } else { (cpu_bps, Limit::Cpu) };
    if let Some(nic) = nic_bps {
        if nic < ceiling_bps {
            ceiling_bps = nic;
            limit = Limit::Nic;
        }
    }
    let available = match mode {
        Mode::Plain | Mode::UserTls => true,
        Mode::KtlsSoftware => inputs.kernel_tls,
        Mode::KtlsOffload => inputs.kernel_tls && inputs.nic_tls_offload,
    };
    Ceiling {
        mode,
        path,
        available,
        memory_passes: passes,
        memory_bps,
        cpu_seconds_per_gb: per_byte * 1e9,
        cpu_bps,
        nic_bps,
        ceiling_bps,
        limit,
    }
}

/// The ceiling for a mix of modes: `shares` gives each mode's share of the bytes
/// served (they need not sum to one; they are normalised). The mix's ceiling is
/// where its cost per byte, weighted by the shares, uses up the limiting resource:
/// the harmonic mean of the modes' ceilings on each resource, then the smallest.
pub fn mix_ceiling(inputs: &Inputs, path: Path, shares: &[(Mode, f64)]) -> Option<f64> {
    let total: f64 = shares.iter().map(|(_, s)| s.max(0.0)).sum();
    if total <= 0.0 {
        return None;
    }
    let mut memory_cost = 0.0;
    let mut cpu_cost = 0.0;
    for &(mode, share) in shares {
        let c = ceiling(inputs, mode, path);
        let w = share.max(0.0) / total;
        memory_cost += w / c.memory_bps;
        cpu_cost += w / c.cpu_bps;
    }
    let mut best = (1.0 / memory_cost).min(1.0 / cpu_cost);
    if let (Path::Network, Some(nic)) = (path, inputs.nic_bits_per_second) {
        best = best.min(nic);
    }
    Some(best)
}

/// Reads the model's inputs from a `linerate capacity --json` output, checking
/// that every rate is a positive number.
pub fn load_inputs(file: &std::path::Path) -> anyhow::Result<Inputs> {
    use anyhow::Context;
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", file.display()))?;
    let inputs: Inputs = serde_json::from_value(v.get("inputs").cloned().unwrap_or_default())
        .with_context(|| format!("{}: no `inputs` object of `linerate capacity --json`", file.display()))?;
    let r = &inputs.rates;
    let positive = [inputs.memory_bandwidth, r.sendfile_sender, r.sendfile_pair, r.seal, r.client_open, r.copy_core]
        .iter()
        .all(|x| x.is_finite() && *x > 0.0);
    anyhow::ensure!(
        positive && inputs.cores > 0 && inputs.nic_bits_per_second.is_none_or(|n| n.is_finite() && n > 0.0),
        "{}: the capacity model's inputs must be positive numbers",
        file.display()
    );
    Ok(inputs)
}

/// Bytes served per transport over an interval, as the server counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Served {
    pub plain: f64,
    /// kTLS bytes; `ktls_offload_share` of them taken to be encrypted by the NIC.
    pub ktls: f64,
    pub ktls_offload_share: f64,
    pub user_tls: f64,
}

/// The ceiling (bits per second) for the mix of transports in `served`; `None` when
/// nothing was served.
pub fn served_mix_ceiling(inputs: &Inputs, path: Path, served: &Served) -> Option<f64> {
    let offload = served.ktls_offload_share.clamp(0.0, 1.0);
    let mut shares = vec![
        (Mode::Plain, served.plain),
        (Mode::KtlsSoftware, served.ktls * (1.0 - offload)),
        (Mode::UserTls, served.user_tls),
    ];
    // Loopback has no NIC to offload to.
    match path {
        Path::Network => shares.push((Mode::KtlsOffload, served.ktls * offload)),
        Path::Loopback => shares[1].1 = served.ktls,
    }
    mix_ceiling(inputs, path, &shares)
}

/// The text table `linerate capacity` prints.
pub fn render_table(rows: &[Ceiling]) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "{:<9} {:<14} {:>6} {:>11} {:>9} {:>11} {:>9} {:>11}  {}\n",
        "path", "mode", "passes", "memory Gb/s", "CPU-s/GB", "CPU Gb/s", "NIC Gb/s", "ceiling Gb/s", "limit"
    ));
    for r in rows {
        let nic = r.nic_bps.map(|b| format!("{:.1}", b / 1e9)).unwrap_or_else(|| "-".into());
        let note = if r.available { "" } else { " (not available here)" };
        s.push_str(&format!(
            "{:<9} {:<14} {:>6} {:>11.1} {:>9.3} {:>11.1} {:>9} {:>11.1}  {}{}\n",
            match r.path {
                Path::Network => "network",
                Path::Loopback => "loopback",
            },
            r.mode.name(),
            r.memory_passes,
            r.memory_bps / 1e9,
            r.cpu_seconds_per_gb,
            r.cpu_bps / 1e9,
            nic,
            r.ceiling_bps / 1e9,
            r.limit.name(),
            note
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: f64 = 1e9;

    fn inputs() -> Inputs {
        Inputs {
            cores: 2,
            memory_bandwidth: 40.0 * GB,
            rates: Rates {
                sendfile_sender: 4.0 * GB,
                sendfile_pair: 2.0 * GB,
                seal: 5.0 * GB,
                client_open: 5.0 * GB,
                copy_core: 10.0 * GB,
            },
            nic_bits_per_second: Some(100e9),
            nic_tls_offload: false,
            kernel_tls: true,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn plain_network_is_cpu_bound_at_cores_times_sender_rate() {
        let c = ceiling(&inputs(), Mode::Plain, Path::Network);
        assert!(close(c.cpu_bps, 2.0 * 4.0 * GB * 8.0), "{c:?}");
        assert!(close(c.memory_bps, 40.0 * GB * 8.0));
        assert!(close(c.cpu_seconds_per_gb, 0.25));
        assert_eq!(c.limit, Limit::Cpu);
        assert!(close(c.ceiling_bps, 64e9));
    }

    #[test]
    fn software_ktls_costs_a_seal_and_two_more_passes() {
        let c = ceiling(&inputs(), Mode::KtlsSoftware, Path::Network);
        assert_eq!(c.memory_passes, 3.0);
        // 1/4 + 1/5 = 0.45 CPU-s/GB.
        assert!(close(c.cpu_seconds_per_gb, 0.45), "{c:?}");
        assert!(close(c.cpu_bps, 2.0 / 0.45 * 8.0 * GB));
    }

    #[test]
    fn user_tls_adds_two_copies_and_loopback_adds_the_receivers_decryption() {
        let net = ceiling(&inputs(), Mode::UserTls, Path::Network);
        // 1/4 + 1/5 + 2/10 = 0.65
        assert!(close(net.cpu_seconds_per_gb, 0.65), "{net:?}");
        assert_eq!(net.memory_passes, 5.0);
        let lo = ceiling(&inputs(), Mode::UserTls, Path::Loopback);
        // 1/2 + 2/5 + 2/10 = 1.1
        assert!(close(lo.cpu_seconds_per_gb, 1.1), "{lo:?}");
        assert_eq!(lo.memory_passes, 6.0);
        assert_eq!(lo.nic_bps, None);
        // A client decrypting at 2 GB/s: 1/2 + 1/5 + 1/2 + 2/10 = 1.4
        let mut i = inputs();
        i.rates.client_open = 2.0 * GB;
        assert!(close(ceiling(&i, Mode::UserTls, Path::Loopback).cpu_seconds_per_gb, 1.4));
        assert!(close(ceiling(&i, Mode::UserTls, Path::Network).cpu_seconds_per_gb, 0.65));
        assert!(close(ceiling(&i, Mode::Plain, Path::Loopback).cpu_seconds_per_gb, 0.5));
    }

    #[test]
    fn the_smallest_limit_wins_and_is_named() {
        let mut i = inputs();
        i.nic_bits_per_second = Some(10e9);
        let c = ceiling(&i, Mode::Plain, Path::Network);
        assert_eq!((c.limit, c.ceiling_bps), (Limit::Nic, 10e9));
        // Loopback ignores the NIC.
        assert_eq!(ceiling(&i, Mode::Plain, Path::Loopback).limit, Limit::Cpu);
        i.nic_bits_per_second = None;
        i.memory_bandwidth = 3.0 * GB;
        let c = ceiling(&i, Mode::KtlsSoftware, Path::Network);
        assert_eq!(c.limit, Limit::Memory);
        assert!(close(c.ceiling_bps, 8.0 * GB));
    }

    #[test]
    fn offload_saves_the_seal_and_both_passes_but_needs_the_nic_and_the_kernel() {
        let mut i = inputs();
        let off = ceiling(&i, Mode::KtlsOffload, Path::Network);
        let plain = ceiling(&i, Mode::Plain, Path::Network);
        assert_eq!((off.memory_passes, off.cpu_bps), (plain.memory_passes, plain.cpu_bps));
        assert!(!off.available);
        i.nic_tls_offload = true;
        assert!(ceiling(&i, Mode::KtlsOffload, Path::Network).available);
        i.kernel_tls = false;
        assert!(!ceiling(&i, Mode::KtlsOffload, Path::Network).available);
        assert!(!ceiling(&i, Mode::KtlsSoftware, Path::Network).available);
    }

    #[test]
    fn predict_has_seven_rows_and_no_loopback_offload() {
        let rows = predict(&inputs());
        assert_eq!(rows.len(), 7);
        assert!(!rows.iter().any(|r| r.path == Path::Loopback && r.mode == Mode::KtlsOffload));
        let table = render_table(&rows);
        assert_eq!(table.lines().count(), 8);
        assert!(table.contains("ktls-offload") && table.contains("(not available here)"));
    }

    #[test]
    fn mix_is_the_weighted_harmonic_mean_of_the_modes() {
        let i = inputs();
        let plain = ceiling(&i, Mode::Plain, Path::Loopback).ceiling_bps;
        assert!(close(mix_ceiling(&i, Path::Loopback, &[(Mode::Plain, 3.0)]).unwrap(), plain));
        let tls = ceiling(&i, Mode::UserTls, Path::Loopback).ceiling_bps;
        let half = mix_ceiling(&i, Path::Loopback, &[(Mode::Plain, 1.0), (Mode::UserTls, 1.0)]).unwrap();
        assert!(close(half, 1.0 / (0.5 / plain + 0.5 / tls)), "{half} {plain} {tls}");
        assert_eq!(mix_ceiling(&i, Path::Loopback, &[(Mode::Plain, 0.0)]), None);
    }

    #[test]
    fn served_mix_weighs_modes_by_bytes_and_offload_only_on_the_network() {
        let i = inputs();
        let only_plain = Served { plain: 5.0, ..Default::default() };
        let plain = ceiling(&i, Mode::Plain, Path::Network).ceiling_bps;
        assert!(close(served_mix_ceiling(&i, Path::Network, &only_plain).unwrap(), plain));
        let ktls = Served { ktls: 4.0, ktls_offload_share: 1.0, ..Default::default() };
        let off = ceiling(&i, Mode::KtlsOffload, Path::Network).ceiling_bps;
        assert!(close(served_mix_ceiling(&i, Path::Network, &ktls).unwrap(), off));
        let sw = ceiling(&i, Mode::KtlsSoftware, Path::Loopback).ceiling_bps;
        assert!(close(served_mix_ceiling(&i, Path::Loopback, &ktls).unwrap(), sw));
        assert_eq!(served_mix_ceiling(&i, Path::Network, &Served::default()), None);
    }

    #[test]
    fn inputs_load_from_the_json_output_and_bad_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("capacity.json");
        let doc = serde_json::json!({ "cipher": "aes-128-gcm", "inputs": inputs(), "ceilings": predict(&inputs()) });
        std::fs::write(&file, doc.to_string()).unwrap();
        assert_eq!(load_inputs(&file).unwrap(), inputs());
        let mut bad = inputs();
        bad.rates.seal = 0.0;
        std::fs::write(&file, serde_json::json!({ "inputs": bad }).to_string()).unwrap();
        assert!(load_inputs(&file).unwrap_err().to_string().contains("positive"));
        std::fs::write(&file, "{}").unwrap();
        assert!(load_inputs(&file).is_err());
    }

    #[test]
    fn json_names_modes_paths_and_limits_in_kebab_case() {
        let v = serde_json::to_value(ceiling(&inputs(), Mode::KtlsSoftware, Path::Loopback)).unwrap();
        assert_eq!(v["mode"], "ktls-software");
        assert_eq!(v["path"], "loopback");
        assert_eq!(v["limit"], "cpu");
        assert!(v["nic_bps"].is_null());
        assert!(v["ceiling_bps"].as_f64().unwrap() > 0.0);
    }
}
