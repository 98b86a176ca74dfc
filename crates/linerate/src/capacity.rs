//! `linerate capacity`: measures this host and prints the serving ceiling per
//! transport mode (`linerate::capacity`).

use linerate::capacity::{self, measure};

/// `linerate capacity`: what this box can serve, per transport mode.
#[derive(clap::Args, Debug)]
pub struct CapacityArgs {
    /// Shorter measurements (about 0.3 s each instead of 2 s): rougher figures.
    #[arg(long)]
    quick: bool,
    /// The AEAD the TLS rows are for.
    #[arg(long, value_enum, default_value = "aes-128-gcm")]
    cipher: CipherArg,
    /// Bytes per read of the loopback client the loopback rows model (8192: wrk).
    #[arg(long, value_name = "BYTES", default_value_t = 8192)]
    loopback_read: usize,
    /// The loopback client's decryption rate in GB/s per core, when it is not the
    /// seal rate measured here (e.g. `openssl speed -evp aes-128-gcm` for wrk).
    #[arg(long, value_name = "GBPS")]
    loopback_decrypt: Option<f64>,
    /// One JSON object (the measurements, the model's inputs and every row) instead
    /// of text.
    #[arg(long)]
    json: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum CipherArg {
    #[value(name = "aes-128-gcm")]
    Aes128Gcm,
    #[value(name = "aes-256-gcm")]
    Aes256Gcm,
}

pub fn run(args: CapacityArgs) -> anyhow::Result<()> {
    let mut budget = if args.quick { measure::Budget::QUICK } else { measure::Budget::DEFAULT };
    budget.loopback_read = args.loopback_read.max(1);
    let cipher = match args.cipher {
        CipherArg::Aes128Gcm => measure::Cipher::Aes128Gcm,
        CipherArg::Aes256Gcm => measure::Cipher::Aes256Gcm,
    };
    let facts = measure::host(budget)?;
    if let Some(g) = args.loopback_decrypt {
        anyhow::ensure!(g > 0.0 && g.is_finite(), "--loopback-decrypt must be a positive rate in GB/s");
    }
    let inputs = facts.inputs(cipher, args.loopback_decrypt.map(|g| g * 1e9));
    let rows = capacity::predict(&inputs);
    if args.json {
        let v = serde_json::json!({
            "cipher": cipher,
            "host": facts,
            "inputs": inputs,
            "ceilings": rows,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let gb = 1e9;
    println!(
        "host: {} CPUs in {} NUMA node(s); last-level cache {}",
        facts.cpus.len(),
        facts.nodes.len(),
        facts.last_level_cache_bytes.map(|b| format!("{} MiB", b >> 20)).unwrap_or_else(|| "unknown".into())
    );
    println!(
        "memory, every CPU: copy {:.1} GB/s, triad {:.1} GB/s (arrays of {} MiB per thread)",
        facts.memory_copy_bytes_per_s / gb,
        facts.memory_triad_bytes_per_s / gb,
        facts.stream_array_bytes >> 20
    );
    println!("one core: memcpy {:.1} GB/s", facts.copy_core_bytes_per_s / gb);
    println!(
        "one core: seal AES-128-GCM {:.2} GB/s, AES-256-GCM {:.2} GB/s (16 KiB records, aws-lc-rs)",
        facts.seal_aes128_gcm_bytes_per_s / gb,
        facts.seal_aes256_gcm_bytes_per_s / gb
    );
    println!(
        "one core: sendfile over loopback {:.2} GB/s per sender CPU-s, {:.2} GB/s per CPU-s of sender and receiver \
         with their interrupts ({:.0}% of it) (receiver reads of {} bytes on the next CPU; all pairs, wall clock: {:.1} Gb/s)",
        facts.sendfile_sender_bytes_per_s / gb,
        facts.sendfile_pair_bytes_per_s / gb,
        facts.sendfile_interrupt_share * 100.0,
        facts.loopback_read_bytes,
        facts.sendfile_wall_bytes_per_s * 8.0 / gb
    );
    for n in &facts.nics {
        println!(
            "nic {} ({}): speed {}, node {}, tls-hw-tx-offload {}",
            n.name,
            if n.driver.is_empty() { "-" } else { &n.driver },
            n.speed_mbps.map(|s| format!("{s} Mb/s")).unwrap_or_else(|| "unknown".into()),
            n.node.map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
            match (n.tls_offload_active, n.tls_offload_changeable) {
                (Some(true), _) => "on",
                (Some(false), Some(true)) => "off (can be turned on)",
                (Some(false), _) => "no",
                (None, _) => "unknown",
            }
        );
    }
    if facts.nics.is_empty() {
        println!("nic: none with a device");
    }
    match &facts.kernel_tls_note {
        None => println!("kernel TLS: available"),
        Some(why) => println!("kernel TLS: not available ({why})"),
    }
    if let Some(g) = args.loopback_decrypt {
        println!("client on loopback: decrypts {g:.2} GB/s per core (given)");
    }
    println!(
        "\nceilings for {} (Gb/s; the smallest of memory, CPU and NIC):",
        match cipher {
            measure::Cipher::Aes128Gcm => "AES-128-GCM",
            measure::Cipher::Aes256Gcm => "AES-256-GCM",
        }
    );
    print!("{}", capacity::render_table(&rows));
    Ok(())
}
