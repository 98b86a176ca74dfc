//! NUMA siloing on the host: with `steering = "cpu"`, connections steered to the
//! worker on the CPU that received the SYN (loopback handles the SYN on the sender's
//! CPU, so the client is pinned with taskset); by default (`domain`) spread over the
//! domain's workers; cross-domain accounting with fake domains, the silo plan
//! of `linerate topo` on a fixture board, page-node sampling and disk-centric
//! read-ahead. The real multi-node checks run in the qemu harness.

use std::time::Duration;

use crate::common::*;

fn allowed_cpus() -> Vec<usize> {
    let out = tool("sh").args(["-c", "taskset -cp $$"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    parse_cpu_list(text.rsplit(':').next().unwrap().trim())
}

/// The `X-Linerate-Worker` field of a response fetched by curl pinned to `cpu`.
fn worker_seen_from(cpu: usize, url: &str) -> String {
    let out = tool("taskset")
        .args(["-c", &cpu.to_string(), "curl", "-sS", "-o", "/dev/null", "-D", "-", url])
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&out.stdout).into_owned();
    head.lines()
        .find_map(|l| l.strip_prefix("X-Linerate-Worker: "))
        .unwrap_or_else(|| panic!("no X-Linerate-Worker in {head}"))
        .trim()
        .to_string()
}

fn status(s: &Server) -> serde_json::Value {
    serde_json::from_slice(&curl(&["--fail", &s.admin_url("/status")]).stdout).unwrap()
}

#[test]
fn a_connection_is_served_on_the_cpu_that_received_it() {
    let c = Content::new();
    c.write("a.txt", b"A");
    let cfg = ConfigFile::new(&format!("root = {:?}\n[numa]\nsteering = \"cpu\"\n", c.path()));
    let s = Server::start(&["--config", cfg.arg(), "--debug-headers"]);
    assert_eq!(status(&s)["steering"], "cpu-cbpf");
    for round in 0..3 {
        for cpu in allowed_cpus() {
            let seen = worker_seen_from(cpu, &s.url("/a.txt"));
            assert!(seen.contains(&format!(" cpu={cpu} ")), "round {round}: client on CPU {cpu} served by {seen}");
        }
    }
    let st = status(&s);
    assert_eq!(st["totals"]["cross_domain_connections"], 0);
    for w in st["workers"].as_array().unwrap() {
        assert_eq!(w["buffer_node"], w["node"], "worker buffers on the worker's node: {w}");
    }
}

/// The CPUs each worker thread may run on, from `/proc` (`Cpus_allowed_list`), by
/// worker index.
fn worker_cpus(s: &Server) -> std::collections::BTreeMap<usize, Vec<usize>> {
    let mut out = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{}/task", s.pid())).unwrap() {
        let task = task.unwrap().path();
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        let Some(index) = comm.trim().strip_prefix("linerate-w").and_then(|i| i.parse().ok()) else { continue };
        let status = std::fs::read_to_string(task.join("status")).unwrap();
        let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim();
        out.insert(index, parse_cpu_list(list));
    }
    out
}

fn parse_cpu_list(list: &str) -> Vec<usize> {
    list.split(',')
        .flat_map(|p| match p.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().unwrap()..=b.parse().unwrap()).collect::<Vec<_>>(),
            None => vec![p.parse().unwrap()],
        })
        .collect()
}

#[test]
fn workers_run_on_their_domain_unless_steered_by_cpu() {
    let cpus = allowed_cpus();
    assert!(cpus.len() >= 2, "needs two CPUs");
    let c = Content::new();
    c.write("a.txt", b"A");
    // One domain: every worker may run on any CPU the process has.
    let s = Server::start(&["--root", &c.root_arg(), "--workers", "2"]);
    assert_eq!(worker_cpus(&s), (0..2).map(|w| (w, cpus.clone())).collect());
    // Two fake domains of one CPU each: a worker keeps to its domain's CPU.
    let cfg = ConfigFile::new(&format!("root = {:?}\n[numa]\nsplit_domains = 2\n", c.path()));
    let s = Server::start(&["--config", cfg.arg(), "--workers", "2"]);
    let placed = worker_cpus(&s);
    assert_eq!(placed.len(), 2, "{placed:?}");
    assert!(placed.values().all(|c| c.len() == 1) && placed[&0] != placed[&1], "{placed:?}");
    // Steering by CPU, or `pin = "cpu"`: each worker on its own CPU only.
    for numa in ["steering = \"cpu\"", "pin = \"cpu\""] {
        let cfg = ConfigFile::new(&format!("root = {:?}\n[numa]\n{numa}\n", c.path()));
        let s = Server::start(&["--config", cfg.arg(), "--workers", "2"]);
        assert_eq!(worker_cpus(&s), (0..2).map(|w| (w, vec![cpus[w]])).collect(), "{numa}");
    }
}

#[test]
fn by_default_one_clients_cpu_does_not_decide_the_worker() {
    // One domain: a client whose SYNs all arrive on one CPU still reaches every worker
    // (with steering by CPU it would reach one).
    let cpus = allowed_cpus();
    assert!(cpus.len() >= 2, "needs two CPUs");
    let c = Content::new();
    c.write("a.txt", b"A");
    let s = Server::start(&["--root", &c.root_arg(), "--workers", "2", "--debug-headers"]);
    assert_eq!(status(&s)["steering"], "reuseport-hash", "one domain: nothing to steer");
    let workers: std::collections::BTreeSet<String> =
        (0..24).map(|_| worker_seen_from(cpus[0], &s.url("/a.txt")).split(' ').next().unwrap().to_string()).collect();
    assert_eq!(workers.len(), 2, "24 connections from CPU {} reached workers {workers:?}", cpus[0]);
}

#[test]
fn fake_domains_count_connections_that_cross() {
    let cpus = allowed_cpus();
    assert!(cpus.len() >= 2, "needs two CPUs to split into two domains");
    let c = Content::new();
    c.write("a.txt", b"A");
    // Steered: with one CPU and two workers per fake domain (so the kernel took the
    // program's flow-hash branch), nothing crosses.
    let cfg = ConfigFile::new(&format!("root = {:?}\n[numa]\nsplit_domains = 2\n", c.path()));
    let s = Server::start(&["--config", cfg.arg(), "--workers", "4"]);
    assert_eq!(status(&s)["steering"], "domain-cbpf");
    for _ in 0..20 {
        tool("taskset")
            .args(["-c", &cpus[0].to_string(), "curl", "-s", "-o", "/dev/null", &s.url("/a.txt")])
            .status()
            .unwrap();
    }
    assert_eq!(status(&s)["totals"]["cross_domain_connections"], 0);
    // The kernel's hash instead: about half of them land in the other domain.
    let cfg = ConfigFile::new(&format!("root = {:?}\n[numa]\nsplit_domains = 2\nsteering = \"hash\"\n", c.path()));
    let s = Server::start(&["--config", cfg.arg(), "--workers", "2"]);
    assert_eq!(status(&s)["steering"], "reuseport-hash");
    for _ in 0..40 {
        tool("taskset")
            .args(["-c", &cpus[0].to_string(), "curl", "-s", "-o", "/dev/null", &s.url("/a.txt")])
            .status()
            .unwrap();
    }
    let crossed = status(&s)["totals"]["cross_domain_connections"].as_u64().unwrap();
    assert!((4..=36).contains(&crossed), "{crossed} of 40 hashed connections crossed domains");
}

#[test]
fn topo_prints_the_silo_plan_of_a_board() {
    let board = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tune/board4");
    let cfg = ConfigFile::new("[numa]\nsplit_domains = 1\n[numa.nic_nodes]\neth1 = 3\n");
    let out = tool(BIN).args(["topo", "--json", "--sysroot", board, "--config", cfg.arg()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["steering"], "domain-cbpf");
    assert_eq!(v["pin"], "domain");
    let domains = v["domains"].as_array().unwrap();
    assert_eq!(domains.len(), 4);
    for (i, d) in domains.iter().enumerate() {
        assert_eq!(d["node"], i as u64);
        assert_eq!(d["cpus"].as_array().unwrap().len(), 4);
        assert_eq!(d["workers"].as_array().unwrap().len(), 4);
        assert!(d["disks"].is_array());
    }
    assert_eq!(domains[0]["nics"], serde_json::json!(["eth0"]));
    assert_eq!(domains[3]["nics"], serde_json::json!(["eth1"]), "the pretend mapping moved eth1");
    let text = tool(BIN).args(["topo", "--sysroot", board]).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("warning: nic eth1: IRQs 50-53"), "{text}");
}

#[test]
fn page_nodes_are_sampled_and_disk_placement_fills_cold_content() {
    let c = Content::new();
    c.write_random("big.bin", 4 << 20, 1);
    let cfg = ConfigFile::new(&format!("root = {:?}\n[numa]\npage_sample = 1.0\nplacement = \"disk\"\n", c.path()));
    let s = Server::start(&["--config", cfg.arg()]);
    for _ in 0..5 {
        assert!(curl(&["--fail", "-o", "/dev/null", &s.url("/big.bin")]).status.success());
    }
    let t = &status(&s)["totals"];
    assert_eq!(t["page_sampled_bytes"], 5 * (4 << 20), "{t}");
    assert_eq!(t["remote_page_bytes"], 0, "one node: nothing is remote");
    // Is the content on a block device (with a node: on one node, the only node)?
    // Then, once evicted, it is read back by the fill threads of that node's
    // domain; on tmpfs, pages cannot be evicted and nothing is ever filled.
    let dev = std::os::unix::fs::MetadataExt::dev(&std::fs::metadata(c.path().join("big.bin")).unwrap());
    let (major, minor) = ((dev >> 8) & 0xfff | (dev >> 32) & !0xfff, dev & 0xff | (dev >> 12) & !0xff);
    let on_disk = std::path::Path::new(&format!("/sys/dev/block/{major}:{minor}")).exists();
    let path = c.path().join("big.bin");
    let evicted = tool("sh")
        .arg("-c")
        .arg(format!("sync -d '{0}' && dd if='{0}' iflag=nocache count=0 status=none", path.display()))
        .status()
        .unwrap();
    assert!(evicted.success());
    // Past the second for which a worker trusts a window it found resident: a wait
    // for the server's residency memo (one second, fixed), which it does not report
    // and the configuration cannot shorten; it goes when either changes.
    std::thread::sleep(Duration::from_millis(1200));
    assert!(curl(&["--fail", "-o", "/dev/null", &s.url("/big.bin")]).status.success());
    let filled = status(&s)["totals"]["body_filled_bytes"].as_u64().unwrap();
    if on_disk {
        // The first window waited for a fill. The second was read by a fill too, as
        // read-ahead while the first was waited for, so it may have been resident
        // (counted as such) by the time the response reached it.
        assert!((2 << 20..=4 << 20).contains(&filled), "the evicted file waited for fills: {filled} bytes");
        let fill_bytes = || -> u64 {
            let st = status(&s);
            st["cold"]["devices"].as_array().unwrap().iter().map(|d| d["fill_bytes"].as_u64().unwrap()).sum()
        };
        assert!(
            eventually(Duration::from_secs(5), || fill_bytes() == 4 << 20),
            "every byte of the evicted file came through the fill pool: {} bytes",
            fill_bytes()
        );
    } else {
        assert_eq!(filled, 0, "no disk behind a tmpfs file");
    }
}
