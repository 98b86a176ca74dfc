//! NIC offload features (GRO, LRO, TLS offload). They live in the driver, not in a
//! file, so they come from the ethtool ioctl on a live host, and from a captured
//! `ethtool -k IF` output (`<root>/ethtool/IF.features`) under a snapshot root.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsFd;

use linerate_sys::ethtool;

use crate::sysfs::Host;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Feature {
    pub active: bool,
    pub changeable: bool,
}

/// Where feature states come from and go to.
pub(crate) trait Features {
    /// Every feature of `iface` by its kernel name (`rx-gro`, `rx-lro`, `tls-hw-tx-offload`).
    fn features(&self, iface: &str) -> io::Result<BTreeMap<String, Feature>>;
    fn set(&self, iface: &str, name: &str, on: bool) -> io::Result<()>;
}

/// The running kernel, through `SIOCETHTOOL`.
pub(crate) struct LiveFeatures;

impl Features for LiveFeatures {
    fn features(&self, iface: &str) -> io::Result<BTreeMap<String, Feature>> {
        let sock = ethtool::control_socket()?;
        Ok(ethtool::features(sock.as_fd(), iface)?
            .into_iter()
            .map(|(n, s)| (n, Feature { active: s.active, changeable: s.changeable }))
            .collect())
    }

    fn set(&self, iface: &str, name: &str, on: bool) -> io::Result<()> {
        let sock = ethtool::control_socket()?;
        ethtool::set_feature(sock.as_fd(), iface, name, on)
    }
}

/// Captured `ethtool -k` outputs under a snapshot root.
pub(crate) struct SnapshotFeatures {
    pub host: Host,
}

/// `ethtool -k` prints a few features under their old names.
fn kernel_name(display: &str) -> &str {
    match display {
        "generic-receive-offload" => "rx-gro",
        "large-receive-offload" => "rx-lro",
        "generic-segmentation-offload" => "tx-generic-segmentation",
        "rx-vlan-offload" => "rx-vlan-hw-parse",
        "tx-vlan-offload" => "tx-vlan-hw-insert",
        "receive-hashing" => "rx-hashing",
        "ntuple-filters" => "rx-ntuple-filter",
        other => other,
    }
}

/// Parses `ethtool -k` output: `name: on|off [fixed]` per line.
pub(crate) fn parse_ethtool_k(text: &str) -> BTreeMap<String, Feature> {
    text.lines()
        .filter_map(|l| {
            let (name, state) = l.trim().split_once(':')?;
            let state = state.trim();
            let active = state.starts_with("on");
            if !active && !state.starts_with("off") {
                return None;
            }
            Some((kernel_name(name.trim()).to_string(), Feature { active, changeable: !state.contains("[fixed]") }))
        })
        .collect()
}

impl SnapshotFeatures {
    fn rel(iface: &str) -> String {
        format!("ethtool/{iface}.features")
    }
}

impl Features for SnapshotFeatures {
    fn features(&self, iface: &str) -> io::Result<BTreeMap<String, Feature>> {
        Ok(parse_ethtool_k(&self.host.read(&Self::rel(iface))?))
    }

    fn set(&self, iface: &str, name: &str, on: bool) -> io::Result<()> {
        let text = self.host.read(&Self::rel(iface))?;
        let mut found = false;
        let lines: Vec<String> = text
            .lines()
            .map(|l| match l.trim().split_once(':') {
                Some((n, state)) if kernel_name(n.trim()) == name => {
                    found = true;
                    let indent = &l[..l.len() - l.trim_start().len()];
                    let rest = state.trim().trim_start_matches("on").trim_start_matches("off");
                    format!("{indent}{}: {}{rest}", n.trim(), if on { "on" } else { "off" })
                }
                _ => l.to_string(),
            })
            .collect();
        if !found {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("{iface} has no feature {name}")));
        }
        self.host.write(&Self::rel(iface), &lines.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ethtool_k_output_parses_with_kernel_names() {
        let f = parse_ethtool_k(
            "Features for eth0:\nrx-checksumming: on\ngeneric-receive-offload: off\nlarge-receive-offload: off [fixed]\ntls-hw-tx-offload: on\n",
        );
        assert_eq!(f["rx-gro"], Feature { active: false, changeable: true });
        assert_eq!(f["rx-lro"], Feature { active: false, changeable: false });
        assert!(f["tls-hw-tx-offload"].active);
        assert!(!f.contains_key("Features for eth0"));
    }
}
