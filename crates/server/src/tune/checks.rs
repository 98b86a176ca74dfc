//! The host checks of `linerate tune`: each looks at a few files, says what it
//! found and why it matters for a box that serves media, and proposes changes
//! where a file write (or a feature flip, or a module load) fixes it.

use std::fmt;

use super::features::Features;
use crate::sysfs::{format_cpu_list, format_cpu_mask, parse_cpu_list, parse_cpu_mask, Host, Nic};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Status {
    /// Fine as it is.
    Ok,
    /// `--apply` would change it.
    Change,
    /// Needs an operator (a package, a unit file, a firmware setting).
    Advice,
    /// Could not be checked here.
    Unknown,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Ok => "ok",
            Status::Change => "change",
            Status::Advice => "advice",
            Status::Unknown => "unknown",
        })
    }
}

/// One thing `--apply` can do, and undo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// Write `value` to the file at `path` (relative to the root).
    Write { path: String, value: String },
    /// Turn a NIC feature on or off.
    Feature { iface: String, name: String, on: bool },
    /// Load a kernel module (live root only).
    LoadModule { name: String },
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Write { path, value } => write!(f, "write {value:?} to /{path}"),
            Action::Feature { iface, name, on } => {
                write!(f, "ethtool -K {iface} {name} {}", if *on { "on" } else { "off" })
            }
            Action::LoadModule { name } => write!(f, "modprobe {name}"),
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct Finding {
    pub check: &'static str,
    pub status: Status,
    /// What was found and why it matters.
    pub detail: String,
    pub actions: Vec<Action>,
}

impl Finding {
    fn new(check: &'static str, status: Status, detail: impl Into<String>) -> Finding {
        Finding { check, status, detail: detail.into(), actions: Vec::new() }
    }

    fn change(check: &'static str, detail: impl Into<String>, actions: Vec<Action>) -> Finding {
        Finding { check, status: Status::Change, detail: detail.into(), actions }
    }
}

/// Runs every check against `host`.
pub(super) fn run_all(host: &Host, features: &dyn Features) -> Vec<Finding> {
    let mut out = Vec::new();
    out.extend(ktls(host));
    let nics = host.nics();
    if nics.is_empty() {
        out.push(Finding::new("nic", Status::Unknown, "no network interface with a device behind it was found"));
    }
    if host.nodes().len() > 1 {
        out.extend(irqbalance(host));
    }
    for nic in &nics {
        out.extend(irq_affinity(host, nic));
        out.extend(steering(host, nic));
        out.extend(offloads(features, nic));
    }
    out.extend(pacing(host));
    out.extend(backlog(host));
    out.extend(notsent_lowat(host));
    out.extend(memory_headroom(host));
    out.extend(open_files(host));
    out
}

/// Whether a module is loaded (or built in), and whether it exists for the
/// running kernel: `None` when the kernel's module lists are not there to ask.
fn module_state(host: &Host, name: &str) -> (bool, Option<bool>) {
    let loaded =
        host.read("proc/modules").map(|m| m.lines().any(|l| l.split(' ').next() == Some(name))).unwrap_or(false)
            || host.exists(&format!("sys/module/{name}/initstate"));
    let Some(release) = host.kernel_release() else { return (loaded, None) };
    let dir = format!("lib/modules/{release}");
    if !host.exists(&dir) {
        return (loaded, None);
    }
    let same = |a: &str, b: &str| a.replace('-', "_") == b.replace('-', "_");
    let names = |line: &str| {
        let path = line.split(':').next().unwrap_or("");
        let base = path.rsplit('/').next().unwrap_or("");
        base.split(".ko").next().is_some_and(|b| same(b, name))
    };
    let builtin = host.read(&format!("{dir}/modules.builtin")).map(|s| s.lines().any(names)).unwrap_or(false);
    let file = host.read(&format!("{dir}/modules.dep")).map(|s| s.lines().any(names)).unwrap_or(false);
    (loaded || builtin, Some(builtin || file))
}

fn ktls(host: &Host) -> Vec<Finding> {
    let (loaded, available) = module_state(host, "tls");
    // /proc/net/tls_stat exists whenever kTLS is in the kernel, module or built in.
    let loaded = loaded || host.exists("proc/net/tls_stat");
    let f = if loaded {
        Finding::new(
            "ktls",
            Status::Ok,
            "the tls module is loaded: HTTPS bodies can go out with sendfile, encrypted by the kernel (kTLS)",
        )
    } else if available == Some(true) {
        Finding::change(
            "ktls",
            "the tls module is available but not loaded: without it every HTTPS byte is copied through user space to be encrypted; load it (and list it in /etc/modules-load.d/ to keep it after a reboot)",
            vec![Action::LoadModule { name: "tls".into() }],
        )
    } else {
        let what = if available.is_none() {
            "kTLS is not in the running kernel (no /proc/net/tls_stat) and it has no module directory to load it from"
        } else {
            "this kernel has no tls module (CONFIG_TLS)"
        };
        Finding::new(
            "ktls",
            Status::Advice,
            format!("{what}: HTTPS falls back to user-space TLS, about one extra copy per byte; a distribution kernel (Debian, Ubuntu, RHEL) has it"),
        )
    };
    vec![f]
}

fn irq_affinity(host: &Host, nic: &Nic) -> Vec<Finding> {
    const CHECK: &str = "irq-affinity";
    let nodes = host.nodes();
    if nic.irqs.is_empty() {
        return vec![Finding::new(CHECK, Status::Unknown, format!("{}: no interrupts found for this NIC", nic.name))];
    }
    if nodes.len() < 2 {
        return vec![Finding::new(
            CHECK,
            Status::Ok,
            format!(
                "{}: one NUMA node, so its {} interrupt(s) cannot be served from a remote node",
                nic.name,
                nic.irqs.len()
            ),
        )];
    }
    let Some(node) = nic.node else {
        return vec![Finding::new(
            CHECK,
            Status::Advice,
            format!("{}: the firmware does not report which NUMA node the NIC is on (numa_node = -1), so interrupt placement cannot be checked; enable ACPI SRAT/proximity domains in the BIOS", nic.name),
        )];
    };
    let node_cpus = host.node_cpus(node);
    if node_cpus.is_empty() {
        return vec![Finding::new(CHECK, Status::Unknown, format!("{}: node {node} has no CPUs listed", nic.name))];
    }
    let mut actions = Vec::new();
    let mut remote = Vec::new();
    for (i, irq) in nic.irqs.iter().enumerate() {
        let path = format!("proc/irq/{irq}/smp_affinity_list");
        let Some(cpus) = host.read(&path).ok().and_then(|s| parse_cpu_list(&s)) else { continue };
        if cpus.iter().any(|c| !node_cpus.contains(c)) {
            remote.push(*irq);
            // One CPU per queue interrupt, in order, all on the NIC's node.
            actions.push(Action::Write { path, value: node_cpus[i % node_cpus.len()].to_string() });
        }
    }
    if actions.is_empty() {
        vec![Finding::new(
            CHECK,
            Status::Ok,
            format!(
                "{}: all {} interrupt(s) run on node {node} (CPUs {}), the NIC's own node",
                nic.name,
                nic.irqs.len(),
                format_cpu_list(&node_cpus)
            ),
        )]
    } else {
        vec![Finding::change(
            CHECK,
            format!(
                "{}: interrupt(s) {:?} may run on CPUs outside node {node}, the NIC's node; received packets would then be processed away from the memory the NIC writes them to and from the workers of that node. Pin each queue's interrupt to one CPU of node {node} ({})",
                nic.name, remote, format_cpu_list(&node_cpus)
            ),
            actions,
        )]
    }
}

fn irqbalance(host: &Host) -> Option<Finding> {
    host.process_names().iter().any(|n| n == "irqbalance").then(|| {
        Finding::new(
            "irq-affinity",
            Status::Advice,
            "irqbalance is running: it moves interrupts on its own and will undo pinning; stop it, or ban the serving CPUs (IRQBALANCE_BANNED_CPULIST)",
        )
    })
}

fn steering(host: &Host, nic: &Nic) -> Vec<Finding> {
    const CHECK: &str = "rps-xps";
    let base = format!("sys/class/net/{}/queues", nic.name);
    let node_cpus = nic
        .node
        .map(|n| host.node_cpus(n))
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| host.nodes().into_iter().flat_map(|(_, c)| c).collect());
    let all_cpus: Vec<u32> = host.nodes().into_iter().flat_map(|(_, c)| c).collect();
    let mut out = Vec::new();
    let read_mask = |rel: &str| host.read(rel).ok().and_then(|s| parse_cpu_mask(&s));
    // RPS: only worth it when the NIC has fewer receive queues than CPUs to spread to.
    if nic.rx_queues == 1 && node_cpus.len() > 1 {
        let rel = format!("{base}/rx-0/rps_cpus");
        match read_mask(&rel) {
            Some(m) if m.is_empty() => out.push(Finding::change(
                CHECK,
                format!("{}: one receive queue and RPS off: every packet's protocol work lands on the one CPU that takes the interrupt; spread it over node CPUs {} with RPS", nic.name, format_cpu_list(&node_cpus)),
                vec![Action::Write { path: rel, value: format_cpu_mask(&node_cpus) }],
            )),
            Some(m) => out.push(Finding::new(CHECK, Status::Ok, format!("{}: one receive queue, RPS spreads it over CPUs {}", nic.name, format_cpu_list(&m)))),
            None => {}
        }
    } else if nic.rx_queues > 1 {
        let on: Vec<u32> = (0..nic.rx_queues)
            .filter(|q| read_mask(&format!("{base}/rx-{q}/rps_cpus")).is_some_and(|m| !m.is_empty()))
            .collect();
        if on.is_empty() {
            out.push(Finding::new(
                CHECK,
                Status::Ok,
                format!(
                    "{}: {} receive queues spread by the NIC (RSS); RPS off, no extra inter-CPU interrupts",
                    nic.name, nic.rx_queues
                ),
            ));
        } else {
            out.push(Finding::new(CHECK, Status::Advice, format!("{}: RPS is on for rx queues {on:?} although the NIC spreads {} queues itself; RPS on top of RSS adds an inter-CPU interrupt per batch", nic.name, nic.rx_queues)));
        }
    }
    // XPS: map each CPU to one transmit queue so a worker never contends for another's.
    if nic.tx_queues > 1 && !all_cpus.is_empty() {
        let unset: Vec<u32> = (0..nic.tx_queues)
            .filter(|q| read_mask(&format!("{base}/tx-{q}/xps_cpus")).is_some_and(|m| m.is_empty()))
            .collect();
        if unset.len() as u32 == nic.tx_queues {
            let actions = (0..nic.tx_queues)
                .map(|q| {
                    let cpus: Vec<u32> = all_cpus
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| *i as u32 % nic.tx_queues == q)
                        .map(|(_, c)| *c)
                        .collect();
                    Action::Write { path: format!("{base}/tx-{q}/xps_cpus"), value: format_cpu_mask(&cpus) }
                })
                .filter(|a| !matches!(a, Action::Write { value, .. } if value == "0"))
                .collect();
            out.push(Finding::change(
                CHECK,
                format!("{}: XPS is unset on all {} transmit queues: the queue is picked by flow hash, so CPUs share queues and their locks; map every CPU to one queue", nic.name, nic.tx_queues),
                actions,
            ));
        } else {
            out.push(Finding::new(
                CHECK,
                Status::Ok,
                format!("{}: XPS maps CPUs to its {} transmit queues", nic.name, nic.tx_queues),
            ));
        }
    }
    out
}

fn offloads(features: &dyn Features, nic: &Nic) -> Vec<Finding> {
    let f = match features.features(&nic.name) {
        Ok(f) => f,
        Err(e) => {
            return vec![Finding::new(
                "offloads",
                Status::Unknown,
                format!("{}: cannot read offload features: {e}", nic.name),
            )]
        }
    };
    let mut out = Vec::new();
    match f.get("rx-gro") {
        Some(g) if g.active => out.push(Finding::new("gro", Status::Ok, format!("{}: GRO on: request and ACK streams are merged before the stack, fewer per-packet costs", nic.name))),
        Some(g) if g.changeable => out.push(Finding::change(
            "gro",
            format!("{}: GRO is off: every received segment (client ACKs above all) goes through the stack alone; turn it on", nic.name),
            vec![Action::Feature { iface: nic.name.clone(), name: "rx-gro".into(), on: true }],
        )),
        Some(_) => out.push(Finding::new("gro", Status::Advice, format!("{}: GRO is off and the driver does not let it be changed", nic.name))),
        None => out.push(Finding::new("gro", Status::Unknown, format!("{}: the driver reports no GRO feature", nic.name))),
    }
    match f.get("rx-lro") {
        Some(l) if l.active => out.push(Finding::new("lro", Status::Ok, format!("{}: LRO on: fine on a server that does not forward packets (LRO breaks routing and bridging)", nic.name))),
        Some(l) if l.changeable => out.push(Finding::new("lro", Status::Ok, format!("{}: LRO off; GRO does the same job in software. On a box that never forwards, `ethtool -K {} lro on` saves a little more CPU", nic.name, nic.name))),
        _ => out.push(Finding::new("lro", Status::Ok, format!("{}: no hardware LRO; GRO does the job", nic.name))),
    }
    match f.get("tls-hw-tx-offload") {
        Some(t) if t.active => out.push(Finding::new("tls-offload", Status::Ok, format!("{}: kTLS transmit offload on: the NIC encrypts, halving memory traffic per TLS byte", nic.name))),
        Some(t) if t.changeable => out.push(Finding::change(
            "tls-offload",
            format!("{}: the NIC can encrypt TLS records (tls-hw-tx-offload) but it is off: kTLS sessions then encrypt on the CPU; turn it on", nic.name),
            vec![Action::Feature { iface: nic.name.clone(), name: "tls-hw-tx-offload".into(), on: true }],
        )),
        _ => out.push(Finding::new("tls-offload", Status::Ok, format!("{}: no kTLS offload in this NIC; kTLS encrypts in software", nic.name))),
    }
    out
}

fn pacing(host: &Host) -> Vec<Finding> {
    let mut out = Vec::new();
    let qdisc_rel = "proc/sys/net/core/default_qdisc";
    match host.read(qdisc_rel) {
        Ok(q) if q.trim() == "fq" => out.push(Finding::new(
            "fq",
            Status::Ok,
            "default qdisc is fq: per-flow pacing and fairness between thousands of streams",
        )),
        Ok(q) => {
            // When the module lists are missing, propose it anyway: the kernel
            // refuses the write if fq does not exist, and the apply says so.
            let (_, available) = module_state(host, "sch_fq");
            if available != Some(false) {
                out.push(Finding::change(
                    "fq",
                    format!("default qdisc is {}: fq paces each flow (what BBR wants) and keeps one bulk stream from filling the NIC queue ahead of the others. This applies to qdiscs created afterwards: re-create the NIC's root qdisc (`tc qdisc replace dev IF root mq` or reboot) to use it", q.trim()),
                    vec![Action::Write { path: qdisc_rel.into(), value: "fq".into() }],
                ));
            } else {
                out.push(Finding::new(
                    "fq",
                    Status::Advice,
                    format!("default qdisc is {} and this kernel has no sch_fq module", q.trim()),
                ));
            }
        }
        Err(e) => out.push(Finding::new("fq", Status::Unknown, format!("cannot read net.core.default_qdisc: {e}"))),
    }
    let cc_rel = "proc/sys/net/ipv4/tcp_congestion_control";
    let available = host.read("proc/sys/net/ipv4/tcp_available_congestion_control").unwrap_or_default();
    match host.read(cc_rel) {
        Ok(cc) if cc.trim() == "bbr" => out.push(Finding::new(
            "bbr",
            Status::Ok,
            "congestion control is BBR: steady throughput on lossy last-mile paths, small queues",
        )),
        Ok(cc) => {
            let why = format!("congestion control is {}: BBR keeps media streams at the path's rate on lossy last-mile links where loss-based control backs off, and keeps queues short", cc.trim());
            let set = Action::Write { path: cc_rel.into(), value: "bbr".into() };
            if available.split_whitespace().any(|c| c == "bbr") {
                out.push(Finding::change("bbr", why, vec![set]));
            } else if module_state(host, "tcp_bbr").1 == Some(true) {
                out.push(Finding::change("bbr", why, vec![Action::LoadModule { name: "tcp_bbr".into() }, set]));
            } else {
                out.push(Finding::new("bbr", Status::Advice, format!("{why}; this kernel has no tcp_bbr")));
            }
        }
        Err(e) => {
            out.push(Finding::new("bbr", Status::Unknown, format!("cannot read net.ipv4.tcp_congestion_control: {e}")))
        }
    }
    out
}

/// A sysctl that should be at least `min`.
fn at_least(host: &Host, check: &'static str, rel: &str, min: u64, why: &str) -> Finding {
    let name = rel.trim_start_matches("proc/sys/").replace('/', ".");
    match host.read_u64(rel) {
        Ok(v) if v >= min => Finding::new(check, Status::Ok, format!("{name} = {v} (at least {min})")),
        Ok(v) => Finding::change(
            check,
            format!("{name} = {v}; {why}"),
            vec![Action::Write { path: rel.into(), value: min.to_string() }],
        ),
        Err(e) => Finding::new(check, Status::Unknown, format!("cannot read {name}: {e}")),
    }
}

fn backlog(host: &Host) -> Vec<Finding> {
    vec![
        at_least(host, "backlog", "proc/sys/net/core/somaxconn", 4096, "it caps every listen backlog (linerate asks for 4096); a burst of new players beyond it gets SYNs dropped and waits a retransmit timeout (1 s and more)"),
        at_least(host, "backlog", "proc/sys/net/ipv4/tcp_max_syn_backlog", 4096, "half-open connections beyond it are dropped during connection bursts"),
    ]
}

const NOTSENT_LOWAT_BYTES: u64 = 1 << 20;

fn notsent_lowat(host: &Host) -> Vec<Finding> {
    let rel = "proc/sys/net/ipv4/tcp_notsent_lowat";
    let f = match host.read_u64(rel) {
        Ok(v) if v <= 4 * NOTSENT_LOWAT_BYTES => Finding::new("notsent-lowat", Status::Ok, format!("net.ipv4.tcp_notsent_lowat = {v}: unsent data per socket is bounded")),
        Ok(v) => Finding::change(
            "notsent-lowat",
            format!("net.ipv4.tcp_notsent_lowat = {v} (unlimited): a slow client's socket can hold up to the whole send buffer (tcp_wmem max) of unsent data, so 10,000 slow clients can pin tens of GB of kernel memory; 1 MiB bounds it while one sendfile call still moves a large chunk"),
            vec![Action::Write { path: rel.into(), value: NOTSENT_LOWAT_BYTES.to_string() }],
        ),
        Err(e) => Finding::new("notsent-lowat", Status::Unknown, format!("cannot read net.ipv4.tcp_notsent_lowat: {e}")),
    };
    vec![f]
}

fn meminfo_kib(host: &Host, key: &str) -> Option<u64> {
    host.read("proc/meminfo").ok()?.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

fn memory_headroom(host: &Host) -> Vec<Finding> {
    let mut out = Vec::new();
    let stalls: u64 = host
        .read("proc/vmstat")
        .map(|s| {
            s.lines()
                .filter(|l| l.starts_with("allocstall"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    let evidence = if stalls > 0 {
        format!(" This host has already had {stalls} direct-reclaim stalls (allocstall in /proc/vmstat).")
    } else {
        String::new()
    };
    let Some(total_kib) = meminfo_kib(host, "MemTotal") else {
        return vec![Finding::new("memory", Status::Unknown, "cannot read MemTotal from /proc/meminfo")];
    };
    // 0.5 % of memory, at least 128 MiB, at most 4 GiB: enough for bursts of
    // socket buffers and page-cache fills to be met from free pages.
    let want_min_free = (total_kib / 200).clamp(128 * 1024, 4 * 1024 * 1024);
    let rel = "proc/sys/vm/min_free_kbytes";
    match host.read_u64(rel) {
        Ok(v) if v >= want_min_free => out.push(Finding::new("memory", Status::Ok, format!("vm.min_free_kbytes = {v}: enough free-page reserve for {} GiB", total_kib >> 20))),
        Ok(v) => out.push(Finding::change(
            "memory",
            format!("vm.min_free_kbytes = {v} for {} GiB of memory: when page-cache churn eats the free pages, network allocations (socket buffers, received packets) enter direct reclaim and serving stalls; keep {want_min_free} KiB free.{evidence}", total_kib >> 20),
            vec![Action::Write { path: rel.into(), value: want_min_free.to_string() }],
        )),
        Err(e) => out.push(Finding::new("memory", Status::Unknown, format!("cannot read vm.min_free_kbytes: {e}"))),
    }
    out.push(at_least(
        host,
        "memory",
        "proc/sys/vm/watermark_scale_factor",
        100,
        "kswapd wakes only when free memory is within 0.1 % of the minimum by default; 1 % (100) starts background reclaim earlier, so page-cache fills rarely stall a worker in direct reclaim",
    ));
    out
}

fn open_files(host: &Host) -> Vec<Finding> {
    let mut out = Vec::new();
    out.push(at_least(
        host,
        "open-files",
        "proc/sys/fs/file-max",
        1 << 20,
        "the whole system's open files: every connection and open media file counts",
    ));
    let hard = host.read("proc/self/limits").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(4).map(str::to_string))
    });
    match hard.as_deref().map(|h| if h == "unlimited" { Some(u64::MAX) } else { h.parse::<u64>().ok() }) {
        Some(Some(h)) if h >= 65_536 => out.push(Finding::new("open-files", Status::Ok, format!("hard open-file limit {h}: linerate raises its soft limit to it at start"))),
        Some(Some(h)) => out.push(Finding::new(
            "open-files",
            Status::Advice,
            format!("hard open-file limit is {h} for processes started like this one: each connection needs a descriptor, so it caps concurrent clients at about {h} minus the file cache; set LimitNOFILE=1048576 in the systemd unit (a sysctl cannot raise it for a running session)"),
        )),
        _ => out.push(Finding::new("open-files", Status::Unknown, "cannot read the open-file limit from /proc/self/limits")),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::features::SnapshotFeatures;

    fn fixture(name: &str) -> Host {
        Host::new(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../linerate/tests/fixtures/tune").join(name))
    }

    fn findings(host: &Host) -> Vec<Finding> {
        run_all(host, &SnapshotFeatures { host: host.clone() })
    }

    fn one<'a>(f: &'a [Finding], check: &str, contains: &str) -> &'a Finding {
        let matching: Vec<&Finding> = f.iter().filter(|x| x.check == check && x.detail.contains(contains)).collect();
        assert_eq!(matching.len(), 1, "{check} / {contains}: {f:#?}");
        matching[0]
    }

    fn write(path: &str, value: &str) -> Action {
        Action::Write { path: path.into(), value: value.into() }
    }

    #[test]
    fn board4_finds_the_misplaced_nic_and_leaves_the_good_one() {
        let f = findings(&fixture("board4"));
        let eth0 = one(&f, "irq-affinity", "eth0");
        assert_eq!(eth0.status, Status::Ok);
        let eth1 = one(&f, "irq-affinity", "eth1");
        assert_eq!(eth1.status, Status::Change);
        assert_eq!(
            eth1.actions,
            vec![
                write("proc/irq/50/smp_affinity_list", "8"),
                write("proc/irq/51/smp_affinity_list", "9"),
                write("proc/irq/52/smp_affinity_list", "10"),
                write("proc/irq/53/smp_affinity_list", "11"),
            ]
        );
        assert_eq!(one(&f, "irq-affinity", "irqbalance").status, Status::Advice);
    }

    #[test]
    fn board4_steering_offloads_and_modules() {
        let f = findings(&fixture("board4"));
        assert_eq!(one(&f, "ktls", "").actions, vec![Action::LoadModule { name: "tls".into() }]);
        assert_eq!(one(&f, "rps-xps", "eth0: XPS").status, Status::Ok);
        let xps = one(&f, "rps-xps", "eth1: XPS");
        assert_eq!(xps.actions[0], write("sys/class/net/eth1/queues/tx-0/xps_cpus", "1111"));
        assert_eq!(xps.actions.len(), 4);
        assert_eq!(one(&f, "rps-xps", "eth1: 4 receive").status, Status::Ok);
        assert_eq!(
            one(&f, "gro", "eth1").actions,
            vec![Action::Feature { iface: "eth1".into(), name: "rx-gro".into(), on: true }]
        );
        assert_eq!(one(&f, "gro", "eth0").status, Status::Ok);
        assert_eq!(one(&f, "tls-offload", "eth0").status, Status::Change);
        assert_eq!(one(&f, "tls-offload", "eth1").status, Status::Ok);
        assert_eq!(
            one(&f, "bbr", "").actions,
            vec![
                Action::LoadModule { name: "tcp_bbr".into() },
                write("proc/sys/net/ipv4/tcp_congestion_control", "bbr")
            ]
        );
        assert_eq!(one(&f, "fq", "").actions, vec![write("proc/sys/net/core/default_qdisc", "fq")]);
    }

    #[test]
    fn board4_sysctls_and_memory() {
        let f = findings(&fixture("board4"));
        assert_eq!(one(&f, "backlog", "somaxconn").status, Status::Ok);
        assert_eq!(
            one(&f, "backlog", "tcp_max_syn_backlog").actions,
            vec![write("proc/sys/net/ipv4/tcp_max_syn_backlog", "4096")]
        );
        assert_eq!(one(&f, "notsent-lowat", "").actions, vec![write("proc/sys/net/ipv4/tcp_notsent_lowat", "1048576")]);
        let min_free = one(&f, "memory", "min_free_kbytes");
        // 0.5 % of 263921856 KiB.
        assert_eq!(min_free.actions, vec![write("proc/sys/vm/min_free_kbytes", "1319609")]);
        assert!(min_free.detail.contains("1540 direct-reclaim stalls"), "{}", min_free.detail);
        assert_eq!(one(&f, "memory", "watermark").actions, vec![write("proc/sys/vm/watermark_scale_factor", "100")]);
        assert_eq!(one(&f, "open-files", "hard open-file limit").status, Status::Ok);
        // The loopback has no device and is not a NIC.
        assert!(!f.iter().any(|x| x.detail.contains("lo:")));
    }

    #[test]
    fn laptop1_has_one_node_and_a_single_queue_nic() {
        let f = findings(&fixture("laptop1"));
        assert_eq!(one(&f, "ktls", "").status, Status::Ok);
        assert_eq!(one(&f, "irq-affinity", "enp0s31f6").status, Status::Ok);
        assert!(!f.iter().any(|x| x.detail.contains("irqbalance")));
        assert_eq!(one(&f, "rps-xps", "").actions, vec![write("sys/class/net/enp0s31f6/queues/rx-0/rps_cpus", "f")]);
        for check in ["fq", "bbr", "notsent-lowat", "gro", "tls-offload"] {
            assert_eq!(one(&f, check, "").status, Status::Ok, "{check}");
        }
        assert_eq!(one(&f, "memory", "min_free").actions, vec![write("proc/sys/vm/min_free_kbytes", "131072")]);
        assert_eq!(f.iter().filter(|x| x.status == Status::Change).count(), 3);
    }

    #[test]
    fn an_empty_root_gives_unknowns_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let f = findings(&Host::new(dir.path()));
        assert!(f.iter().all(|x| x.status != Status::Change), "{f:#?}");
        assert!(f.iter().any(|x| x.status == Status::Unknown));
    }
}
