//! NUMA topology, read from sysfs.

use std::path::Path;

/// The NUMA node of each CPU (index = CPU number), from
/// `/sys/devices/system/node/node*/cpulist`. CPUs no node lists are `None`; a
/// machine without the node directory (no NUMA support) puts every CPU on node 0.
pub fn cpu_nodes(sys: &Path) -> Vec<Option<usize>> {
    let node_dir = sys.join("devices/system/node");
    let Ok(entries) = std::fs::read_dir(&node_dir) else {
        let cpus = linerate_sys::allowed_cpus().ok().and_then(|c| c.last().copied()).map_or(1, |c| c + 1);
        return vec![Some(0); cpus];
    };
    let mut map: Vec<Option<usize>> = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(node) = name.to_str().and_then(|n| n.strip_prefix("node")).and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        let Ok(list) = std::fs::read_to_string(entry.path().join("cpulist")) else { continue };
        for cpu in parse_cpulist(&list) {
            if map.len() <= cpu {
                map.resize(cpu + 1, None);
            }
            map[cpu] = Some(node);
        }
    }
    map
}

/// Parses a kernel CPU list such as `0-3,8,10-11`. Malformed parts are skipped.
pub fn parse_cpulist(s: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    if a <= b && b - a < 65536 {
                        out.extend(a..=b);
                    }
                }
            }
            None => {
                if let Ok(c) = part.parse() {
                    out.push(c);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists() {
        assert_eq!(parse_cpulist("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpulist(""), Vec::<usize>::new());
        assert_eq!(parse_cpulist("x,2,5-3"), vec![2]);
    }

    #[test]
    fn reads_a_fixture_tree() {
        let dir = tempfile::tempdir().unwrap();
        for (node, list) in [(0, "0-1"), (1, "2-3,6")] {
            let d = dir.path().join(format!("devices/system/node/node{node}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpulist"), list).unwrap();
        }
        let map = cpu_nodes(dir.path());
        assert_eq!(map, vec![Some(0), Some(0), Some(1), Some(1), None, None, Some(1)]);
        // This machine: every allowed CPU has a node.
        let here = cpu_nodes(Path::new("/sys"));
        for cpu in linerate_sys::allowed_cpus().unwrap() {
            assert!(here.get(cpu).copied().flatten().is_some(), "cpu {cpu}: {here:?}");
        }
    }
}
