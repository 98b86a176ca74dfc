//! Cheap kernel counters from /proc: each file is one small read, whatever the
//! number of connections.

use std::path::Path;

use anyhow::Context;

/// Cumulative counters at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Kernel {
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub tx_packets: u64,
    /// Receive and transmit errors and drops.
    pub errors: u64,
    pub tcp_established: u64,
    /// TCP segments retransmitted (`RetransSegs` of /proc/net/snmp).
    pub tcp_retrans_segs: u64,
    /// Milliseconds TCP spent under memory pressure, i.e. above `net.ipv4.tcp_mem`'s
    /// middle value (`TCPMemoryPressuresChrono` of /proc/net/netstat, Linux 4.15+).
    /// The kernel adds a pressure period when it ends, so a long one shows up at once.
    pub tcp_memory_pressure_ms: u64,
    /// Jiffies busy (user, nice, system, irq, softirq, steal) and in total.
    pub cpu_busy: u64,
    pub cpu_total: u64,
    pub context_switches: u64,
    pub interrupts: u64,
    pub mem_available_kb: u64,
    /// Direct-reclaim stalls (`allocstall_*` of /proc/vmstat).
    pub reclaim_stalls: u64,
    /// Bytes read from whole disks (`/proc/diskstats`, partitions left out).
    pub disk_read_bytes: u64,
    /// Microseconds in which some task waited for memory (`/proc/pressure/memory`,
    /// Linux 4.20+ with PSI; 0 without).
    pub memory_pressure_some_us: u64,
}

impl Kernel {
    pub fn read(proc_root: &Path, ifaces: &[String]) -> anyhow::Result<Kernel> {
        let read = |name: &str| {
            let p = proc_root.join(name);
            std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))
        };
        let mut k = Kernel::default();
        parse_net_dev(&read("net/dev")?, ifaces, &mut k);
        let snmp = read("net/snmp")?;
        k.tcp_established = parse_proc_table(&snmp, "Tcp:", "CurrEstab").unwrap_or(0);
        k.tcp_retrans_segs = parse_proc_table(&snmp, "Tcp:", "RetransSegs").unwrap_or(0);
        k.tcp_memory_pressure_ms =
            parse_proc_table(&read("net/netstat")?, "TcpExt:", "TCPMemoryPressuresChrono").unwrap_or(0);
        parse_stat(&read("stat")?, &mut k);
        k.mem_available_kb = parse_meminfo(&read("meminfo")?, "MemAvailable").unwrap_or(0);
        let vmstat = read("vmstat")?;
        k.reclaim_stalls = parse_vmstat_stalls(&vmstat);
        k.disk_read_bytes = disk_reads(proc_root).iter().map(|d| d.1).sum();
        k.memory_pressure_some_us = memory_pressure(proc_root).some_us;
        Ok(k)
    }
}

fn numbers(s: &str) -> Vec<u64> {
    s.split_whitespace().map(|n| n.parse().unwrap_or(0)).collect()
}

/// `/proc/net/dev`: `  IF: rx_bytes rx_packets rx_errs rx_drop fifo frame compressed
/// multicast tx_bytes tx_packets tx_errs tx_drop ...`.
pub fn parse_net_dev(text: &str, ifaces: &[String], k: &mut Kernel) {
    for line in text.lines().skip(2) {
        let Some((name, rest)) = line.split_once(':') else { continue };
        let name = name.trim();
        if !ifaces.is_empty() && !ifaces.iter().any(|i| i == name) {
            continue;
        }
        let v = numbers(rest);
        if v.len() < 12 {
            continue;
        }
        k.rx_bytes += v[0];
        k.rx_packets += v[1];
        k.tx_bytes += v[8];
        k.tx_packets += v[9];
        k.errors += v[2] + v[3] + v[10] + v[11];
    }
}

/// A column of the lines starting with `prefix` (e.g. `Tcp:` in /proc/net/snmp,
/// `TcpExt:` in /proc/net/netstat): a header line, then a line of values.
pub fn parse_proc_table(text: &str, prefix: &str, column: &str) -> Option<u64> {
    let mut lines = text.lines().filter(|l| l.starts_with(prefix));
    let header = lines.next()?;
    let values = lines.next()?;
    let i = header.split_whitespace().position(|h| h == column)?;
    values.split_whitespace().nth(i)?.parse().ok()
}

/// The time columns of one `cpu` or `cpuN` line of /proc/stat, in clock ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuTicks {
    pub user: u64,
    pub nice: u64,
    pub system: u64,
    pub idle: u64,
    pub iowait: u64,
    pub irq: u64,
    pub softirq: u64,
    pub steal: u64,
}

impl CpuTicks {
    /// The columns after the line's name (`guest` is inside `user`; missing
    /// columns, on old kernels, read as 0).
    fn parse<'a>(columns: impl Iterator<Item = &'a str>) -> CpuTicks {
        let mut v = [0u64; 8];
        for (slot, n) in v.iter_mut().zip(columns) {
            *slot = n.parse().unwrap_or(0);
        }
        let [user, nice, system, idle, iowait, irq, softirq, steal] = v;
        CpuTicks { user, nice, system, idle, iowait, irq, softirq, steal }
    }

    pub fn busy(&self) -> u64 {
        self.user + self.nice + self.system + self.irq + self.softirq + self.steal
    }

    pub fn total(&self) -> u64 {
        self.busy() + self.idle + self.iowait
    }
}

/// The `cpuN` lines of /proc/stat: each CPU's number and ticks.
pub fn parse_per_cpu(text: &str) -> impl Iterator<Item = (usize, CpuTicks)> + '_ {
    text.lines().filter_map(|line| {
        let mut parts = line.split_whitespace();
        let cpu = parts.next()?.strip_prefix("cpu")?.parse().ok()?;
        Some((cpu, CpuTicks::parse(parts)))
    })
}

/// `/proc/stat`: the aggregate `cpu` line, `ctxt` and `intr`.
pub fn parse_stat(text: &str, k: &mut Kernel) {
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        match parts.next() {
            Some("cpu") => {
                let t = CpuTicks::parse(parts);
                k.cpu_busy = t.busy();
                k.cpu_total = t.total();
            }
            Some("ctxt") => k.context_switches = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0),
            Some("intr") => k.interrupts = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0),
            _ => {}
        }
    }
}

/// A `Name:   123 kB` line of `/proc/meminfo`.
pub fn parse_meminfo(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == key).then(|| v.split_whitespace().next()?.parse().ok()).flatten()
    })
}

/// The memory this process may use: the limit of its own memory cgroup (v1
/// `memory.limit_in_bytes` or v2 `memory.max`, the lowest on the way up to the
/// hierarchy's root) when one is set, else `MemTotal`. None when neither can be read.
pub fn memory_limit_bytes(root: &Path) -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(root.join(p.trim_start_matches('/'))).ok();
    let cgroup_limit = (|| {
        let (dir, file) = memory_cgroup_dir(&read("proc/self/cgroup")?, &read("proc/self/mountinfo")?)?;
        lowest_limit(&dir, file, |p| read(p))
    })();
    let total = read("proc/meminfo").and_then(|t| parse_meminfo(&t, "MemTotal")).map(|kib| kib * 1024);
    match (cgroup_limit, total) {
        (Some(l), Some(t)) => Some(l.min(t)),
        (l, t) => l.or(t),
    }
}

/// The directory of this process's memory cgroup and the name of its limit file,
/// from `/proc/self/cgroup` and `/proc/self/mountinfo`: the v1 `memory` hierarchy
/// when it is mounted, else the v2 one.
pub fn memory_cgroup_dir(cgroup: &str, mountinfo: &str) -> Option<(String, &'static str)> {
    // (mount point, root of the hierarchy the mount shows) of each kind.
    let (mut v1, mut v2) = (None, None);
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let f: Vec<&str> = left.split_whitespace().collect();
        let r: Vec<&str> = right.split_whitespace().collect();
        let (Some(&root), Some(&point), Some(&fstype)) = (f.get(3), f.get(4), r.first()) else { continue };
        if fstype == "cgroup" && r.get(2).is_some_and(|o| o.split(',').any(|o| o == "memory")) {
            v1 = Some((point, root));
        } else if fstype == "cgroup2" && v2.is_none() {
            v2 = Some((point, root));
        }
    }
    let path_of = |want: &dyn Fn(&str) -> bool| {
        cgroup.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            want(controllers).then_some(path)
        })
    };
    let ((point, root), path, file) = match (v1, v2) {
        (Some(m), _) => (m, path_of(&|c| c.split(',').any(|c| c == "memory"))?, "memory.limit_in_bytes"),
        (None, Some(m)) => (m, path_of(&|c| c.is_empty())?, "memory.max"),
        (None, None) => return None,
    };
    // The path is relative to the hierarchy's root; the mount shows `root` of it.
    let rel = path.strip_prefix(root.trim_end_matches('/')).unwrap_or(path);
    Some((format!("{}/{}", point.trim_end_matches('/'), rel.trim_start_matches('/')), file))
}

/// The lowest limit set in `dir` or any directory above it that has the `file`
/// (a cgroup and its ancestors); None when none is set. v1 writes "no limit" as a
/// page-rounded `i64::MAX`, v2 as `max`.
pub fn lowest_limit(dir: &str, file: &str, read: impl Fn(&str) -> Option<String>) -> Option<u64> {
    let mut lowest: Option<u64> = None;
    let mut at = dir.trim_end_matches('/');
    loop {
        match read(&format!("{at}/{file}")) {
            Some(text) => {
                if let Ok(v) = text.trim().parse::<u64>() {
                    if v < 1 << 62 {
                        lowest = Some(lowest.map_or(v, |l| l.min(v)));
                    }
                }
            }
            None if at != dir.trim_end_matches('/') => break, // above the hierarchy's mount
            None => {}
        }
        match at.rfind('/') {
            Some(i) if i > 0 => at = &at[..i],
            _ => break,
        }
    }
    lowest
}

/// Sum of the `allocstall*` counters of `/proc/vmstat`.
pub fn parse_vmstat_stalls(text: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with("allocstall"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// The value of one `name value` line of `/proc/vmstat`.
pub fn parse_vmstat(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Bytes read per whole disk, from `/proc/diskstats` (sectors are 512 bytes
/// there whatever the device's own sector size). A disk is a device that has a
/// `/sys/block/NAME` entry; partitions and devices that read nothing are left out.
pub fn disk_reads(proc_root: &Path) -> Vec<(String, u64)> {
    let text = std::fs::read_to_string(proc_root.join("diskstats")).unwrap_or_default();
    parse_diskstats(&text, |name| Path::new("/sys/block").join(name).exists())
}

pub fn parse_diskstats(text: &str, is_disk: impl Fn(&str) -> bool) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let name = *f.get(2)?;
            let sectors: u64 = f.get(5)?.parse().ok()?;
            (sectors > 0 && is_disk(name)).then(|| (name.to_string(), sectors * 512))
        })
        .collect()
}

/// Memory pressure stall information: total microseconds in which some (or all
/// non-idle) tasks waited for memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryPressure {
    pub some_us: u64,
    pub full_us: u64,
}

pub fn memory_pressure(proc_root: &Path) -> MemoryPressure {
    parse_pressure(&std::fs::read_to_string(proc_root.join("pressure/memory")).unwrap_or_default())
}

/// `/proc/pressure/memory`: `some avg10=0.00 avg60=0.00 avg300=0.00 total=123`.
pub fn parse_pressure(text: &str) -> MemoryPressure {
    let total = |kind: &str| {
        text.lines()
            .find(|l| l.starts_with(kind))
            .and_then(|l| l.split_whitespace().find_map(|f| f.strip_prefix("total=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    MemoryPressure { some_us: total("some "), full_us: total("full ") }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NET_DEV: &str = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0
  eth0: 5000      50    1    2    0     0          0         0     7000      70    3    4    0     0       0          0
";

    #[test]
    fn net_dev() {
        let mut k = Kernel::default();
        parse_net_dev(NET_DEV, &[], &mut k);
        assert_eq!((k.rx_bytes, k.tx_bytes, k.rx_packets, k.tx_packets, k.errors), (6000, 8000, 60, 80, 10));
        let mut k = Kernel::default();
        parse_net_dev(NET_DEV, &["eth0".to_string()], &mut k);
        assert_eq!((k.rx_bytes, k.errors), (5000, 10));
    }

    #[test]
    fn snmp_stat_meminfo_vmstat() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs\nTcp: 1 200 120000 -1 10 20 0 0 42 1000\n";
        assert_eq!(parse_proc_table(snmp, "Tcp:", "CurrEstab"), Some(42));
        assert_eq!(parse_proc_table(snmp, "Tcp:", "InSegs"), Some(1000));
        assert_eq!(parse_proc_table(snmp, "Tcp:", "RetransSegs"), None);
        let netstat = "TcpExt: SyncookiesSent TCPMemoryPressures TCPMemoryPressuresChrono\nTcpExt: 0 3 1500\nIpExt: InNoRoutes\nIpExt: 0\n";
        assert_eq!(parse_proc_table(netstat, "TcpExt:", "TCPMemoryPressuresChrono"), Some(1500));
        let mut k = Kernel::default();
        parse_stat("cpu  10 1 5 100 4 2 3 1 0 0\ncpu0 1 1 1 1 1 1 1 1 0 0\nintr 999 1 2\nctxt 777\n", &mut k);
        assert_eq!((k.cpu_busy, k.cpu_total, k.interrupts, k.context_switches), (22, 126, 999, 777));
        assert_eq!(parse_meminfo("MemTotal: 10 kB\nMemAvailable:    2048 kB\n", "MemAvailable"), Some(2048));
        assert_eq!(parse_vmstat_stalls("allocstall_dma 1\nallocstall_normal 5\npgfault 100\n"), 6);
    }

    #[test]
    fn diskstats_pressure_vmstat_keys() {
        let ds = " 254       0 vda 100 0 2048 50 0 0 0 0 0 0 0\n 254       1 vda1 90 0 2000 40 0 0 0 0 0 0 0\n 7 0 loop0 0 0 0 0 0 0 0 0 0 0 0\n";
        assert_eq!(parse_diskstats(ds, |n| !n.ends_with('1')), vec![("vda".to_string(), 2048 * 512)]);
        let psi =
            "some avg10=1.50 avg60=0.00 avg300=0.00 total=4000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=1000\n";
        assert_eq!(parse_pressure(psi), MemoryPressure { some_us: 4000, full_us: 1000 });
        assert_eq!(parse_pressure(""), MemoryPressure::default());
        assert_eq!(parse_vmstat("pgscan_direct 12\npgscan_direct_throttle 3\n", "pgscan_direct"), Some(12));
    }

    #[test]
    fn finds_the_memory_cgroup_and_its_lowest_limit() {
        let hybrid = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                      41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        let cg = "5:devices:/\n4:memory:/bench/run1\n0::/\n";
        assert_eq!(
            memory_cgroup_dir(cg, hybrid),
            Some(("/sys/fs/cgroup/memory/bench/run1".to_string(), "memory.limit_in_bytes"))
        );
        let v2 = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            memory_cgroup_dir("0::/system.slice/linerate.service\n", v2),
            Some(("/sys/fs/cgroup/system.slice/linerate.service".to_string(), "memory.max"))
        );
        // A mount that shows only a sub-tree of the hierarchy (a container's).
        let sub = "30 23 0:26 /lxc/c1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(memory_cgroup_dir("0::/lxc/c1/app\n", sub).unwrap().0, "/sys/fs/cgroup/app");
        assert_eq!(memory_cgroup_dir("0::/\n", "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"), None);

        let files = |p: &str| -> Option<String> {
            match p {
                "/cg/a/b/memory.max" => Some("max\n".into()),
                "/cg/a/memory.max" => Some("1677721600\n".into()),
                "/cg/memory.max" => Some("9223372036854771712\n".into()),
                _ => None,
            }
        };
        assert_eq!(lowest_limit("/cg/a/b", "memory.max", files), Some(1_677_721_600), "the parent's limit binds");
        assert_eq!(lowest_limit("/cg", "memory.max", files), None, "v1's no-limit value");
        assert_eq!(lowest_limit("/cg/x", "memory.max", files), None);
    }

    #[test]
    fn reads_this_machine() {
        let k = Kernel::read(Path::new("/proc"), &[]).unwrap();
        assert!(k.cpu_total > 0 && k.mem_available_kb > 0 && k.context_switches > 0, "{k:?}");
    }
}
