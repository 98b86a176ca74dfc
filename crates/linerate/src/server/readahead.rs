//! Disk-centric page-cache placement (`numa.placement = "disk"`).
//!
//! By default the page cache fills where the serving worker reads: on the node of
//! the NIC that received the client (network-centric). In disk-centric mode, before
//! a worker sends a range of a file that lives on a disk with a known node, a
//! helper thread pinned to that disk's node calls `readahead` on the range, so that
//! missing pages are allocated on the disk's node (the kernel allocates them in the
//! caller's context); pages already cached are left where they are. The worker
//! waits for the helper's answer, then sends as usual.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::sync::mpsc;

use crate::sysfs::Host;
use crate::topology::{Plan, Topology};

struct Job {
    file: File,
    offset: u64,
    len: u64,
    done: tokio::sync::oneshot::Sender<()>,
}

/// The helpers, one per node that holds a disk, and which device is on which node.
pub struct Readahead {
    helpers: HashMap<u32, mpsc::Sender<Job>>,
    /// (major, minor) of each disk and partition -> node.
    devices: HashMap<(u32, u32), u32>,
}

impl Readahead {
    pub fn start(topo: &Topology, plan: &Plan) -> std::io::Result<Readahead> {
        let host = Host::new("/");
        let mut devices = HashMap::new();
        for disk in &topo.disks {
            let Some(node) = disk.node else { continue };
            let mut dirs = vec![format!("sys/block/{}", disk.name)];
            dirs.extend(
                host.list(&format!("sys/block/{}", disk.name))
                    .into_iter()
                    .filter(|p| p.starts_with(&disk.name))
                    .map(|p| format!("sys/block/{}/{p}", disk.name)),
            );
            for dir in dirs {
                if let Some((ma, mi)) = host.read(&format!("{dir}/dev")).ok().and_then(|d| parse_dev(&d)) {
                    devices.insert((ma, mi), node);
                }
            }
        }
        let mut helpers = HashMap::new();
        let nodes: Vec<u32> = devices.values().copied().collect();
        for node in nodes {
            if helpers.contains_key(&node) {
                continue;
            }
            let cpus: Vec<u32> = plan.domains.iter().filter(|d| d.node == node).flat_map(|d| d.cpus.clone()).collect();
            let (tx, rx) = mpsc::channel::<Job>();
            std::thread::Builder::new().name(format!("linerate-ra{node}")).spawn(move || helper(node, &cpus, rx))?;
            helpers.insert(node, tx);
        }
        if helpers.is_empty() {
            tracing::warn!("numa.placement = \"disk\": no disk with a known NUMA node (see `linerate topo`); pages fill where workers read");
        } else {
            tracing::info!(nodes = ?helpers.keys().collect::<Vec<_>>(), "disk-centric placement: read-ahead helpers started");
        }
        Ok(Readahead { helpers, devices })
    }

    /// The node of the disk holding a file with this `st_dev`.
    pub fn node_of(&self, dev: u64) -> Option<u32> {
        self.devices.get(&(libc::major(dev), libc::minor(dev))).copied()
    }

    /// Has the helper of `node` read `len` bytes of `file` at `offset` ahead, and
    /// waits for it. Does nothing if there is no helper there or it is gone.
    pub async fn fill(&self, node: u32, file: &File, offset: u64, len: u64) -> bool {
        let Some(tx) = self.helpers.get(&node) else { return false };
        let Ok(file) = file.try_clone() else { return false };
        let (done, wait) = tokio::sync::oneshot::channel();
        if tx.send(Job { file, offset, len, done }).is_err() {
            return false;
        }
        wait.await.is_ok()
    }
}

fn helper(node: u32, cpus: &[u32], jobs: mpsc::Receiver<Job>) {
    if let Err(e) = pin_to(cpus) {
        tracing::warn!(node, "read-ahead helper cannot run on its node's CPUs: {e}");
    }
    if let Err(e) = linerate_sys::numa::prefer_node(node) {
        tracing::warn!(node, "read-ahead helper cannot prefer its node's memory: {e}");
    }
    for job in jobs {
        // At most 2 GiB per call, as for sendfile; the kernel may read less ahead.
        let len = job.len.min(1 << 31) as usize;
        if let Err(e) = linerate_sys::readahead(job.file.as_fd(), job.offset, len) {
            tracing::debug!(node, "readahead: {e}");
        }
        let _ = job.done.send(());
    }
}

/// Pins the calling thread to the first of `cpus` it may run on (helpers are few
/// and mostly wait for the disk).
fn pin_to(cpus: &[u32]) -> std::io::Result<()> {
    let first = cpus.first().ok_or_else(|| std::io::Error::other("no CPU on the node"))?;
    linerate_sys::pin_current_thread(*first as usize)
}

fn parse_dev(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.trim().split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dev_numbers() {
        assert_eq!(parse_dev("259:3\n"), Some((259, 3)));
        assert_eq!(parse_dev("x"), None);
    }
}
