//! `[numa]`: how connections are steered to workers, where workers run and where
//! page-cache pages land (see "NUMA siloing" in ARCHITECTURE.md).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{bad, fraction, range, Bad};

/// How a new connection finds its worker.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Steering {
    /// A worker of the domain whose CPU received the SYN, by flow hash (a
    /// classic-BPF reuseport program).
    #[default]
    Domain,
    /// The worker on the CPU that received the SYN, else one in that CPU's domain:
    /// for NICs whose receive queues are spread one per CPU.
    Cpu,
    /// The kernel's reuseport hash over all workers.
    Hash,
}

/// Which CPUs a worker thread may run on.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Pin {
    /// `Cpu` under `steering = "cpu"` (whose promise is the worker on the very CPU
    /// that received the SYN), `Domain` otherwise.
    #[default]
    Auto,
    /// Its own CPU only.
    Cpu,
    /// Any CPU of its domain: when something else holds the worker's CPU, the
    /// scheduler runs it on an idle CPU of the same domain instead of making its
    /// viewers wait.
    Domain,
}

/// Where page-cache pages of served files are allocated.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// By the serving worker's reads: on the node of the NIC that received the client.
    #[default]
    Network,
    /// By a helper thread on the node of the disk that holds the file.
    Disk,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Numa {
    pub steering: Steering,
    pub pin: Pin,
    pub placement: Placement,
    /// Prefer each worker's own node for its memory (`set_mempolicy(MPOL_PREFERRED)`).
    pub bind_memory: bool,
    /// Fraction of file responses whose page-cache pages are checked for their node.
    pub page_sample: f64,
    /// Split each node into this many domains (for testing on small machines).
    pub split_domains: usize,
    /// Pretend a NIC is on another node (boards that report it wrongly or not at all).
    pub nic_nodes: BTreeMap<String, u32>,
    /// Pretend a block device is on another node.
    pub disk_nodes: BTreeMap<String, u32>,
}

impl Numa {
    /// `pin` with `auto` resolved: `Cpu` or `Domain`.
    pub fn resolved_pin(&self) -> Pin {
        match self.pin {
            Pin::Auto if self.steering == Steering::Cpu => Pin::Cpu,
            Pin::Auto => Pin::Domain,
            pin => pin,
        }
    }

    pub(super) fn validate(&self) -> Result<(), Bad> {
        fraction("numa.page_sample", self.page_sample)?;
        range("numa.split_domains", self.split_domains, 1, 64)?;
        if self.pin == Pin::Domain && self.steering == Steering::Cpu {
            return bad(
                "numa.pin",
                "\"domain\" cannot be combined with `numa.steering = \"cpu\"`, which hands each connection to the \
                 worker on the CPU that received it and so needs every worker on its own CPU (\"cpu\" or \"auto\")",
            );
        }
        Ok(())
    }
}

impl Default for Numa {
    fn default() -> Self {
        Numa {
            steering: Steering::Domain,
            pin: Pin::Auto,
            placement: Placement::Network,
            bind_memory: false,
            page_sample: 0.01,
            split_domains: 1,
            nic_nodes: BTreeMap::new(),
            disk_nodes: BTreeMap::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{toml_with_section, Config};

    #[test]
    fn workers_keep_to_their_domain_unless_steered_by_cpu() {
        let parsed = |extra: &str| Config::from_toml(&toml_with_section("numa", extra)).unwrap();
        let c = parsed("");
        assert_eq!(c.numa.pin, Pin::Auto);
        assert_eq!(c.numa.resolved_pin(), Pin::Domain, "domain steering: any CPU of the domain");
        assert_eq!(parsed("steering = \"cpu\"\n").numa.resolved_pin(), Pin::Cpu, "CPU steering: the worker's own CPU");
        assert_eq!(parsed("pin = \"cpu\"\n").numa.resolved_pin(), Pin::Cpu);
        let c = parsed("pin = \"domain\"\nsteering = \"hash\"\n");
        assert!(c.validate().is_ok());
        assert_eq!(c.numa.resolved_pin(), Pin::Domain);
        assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c);
        let (key, problem) = parsed("pin = \"domain\"\nsteering = \"cpu\"\n").validate().unwrap_err();
        assert_eq!(key, "numa.pin");
        assert!(problem.contains("steering"), "{problem}");
        assert!(Config::from_toml(&toml_with_section("numa", "pin = \"node\"\n")).is_err());
    }
}
