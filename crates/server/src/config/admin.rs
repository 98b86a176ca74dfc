//! `[admin]`: the admin endpoint (`/metrics`, `/status`, `/healthz`, `/load`) and
//! the capacity it reports load against.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{bad, file_name, range, Bad, MAX_INTEGER};

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Admin {
    /// Serve /metrics, /status, /healthz and /load.
    pub enabled: bool,
    /// Where; keep it on a private address.
    pub listen: SocketAddr,
    /// Connections at which /load reports no spare capacity; 0 = all workers'
    /// connection limits together.
    pub capacity_connections: u64,
    /// Body throughput (Gb/s) at which /load reports no spare capacity; 0 = not used.
    pub capacity_gbps: f64,
    /// A `linerate capacity --json` output: /status reports served Gb/s as a share
    /// of the ceiling it predicts for the current transport mix, and /load uses
    /// that ceiling when `capacity_gbps` is 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_model: Option<PathBuf>,
    /// Which of the model's ceilings apply: clients over the NICs, or on this host.
    pub capacity_model_clients: ModelClients,
}

/// Where the clients the capacity model is applied to are.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ModelClients {
    #[default]
    Network,
    Loopback,
}

impl Default for Admin {
    fn default() -> Self {
        Admin {
            enabled: true,
            listen: "127.0.0.1:9090".parse().expect("valid default address"),
            capacity_connections: 0,
            capacity_gbps: 0.0,
            capacity_model: None,
            capacity_model_clients: ModelClients::Network,
        }
    }
}

impl Admin {
    /// `serving`: the addresses the server serves on, which the endpoint may not share.
    pub(super) fn validate(&self, serving: &[&SocketAddr]) -> Result<(), Bad> {
        range("admin.capacity_connections", self.capacity_connections, 0, MAX_INTEGER)?;
        if !(self.capacity_gbps >= 0.0 && self.capacity_gbps.is_finite()) {
            return bad("admin.capacity_gbps", "must be 0 or more");
        }
        if let Some(model) = &self.capacity_model {
            file_name("admin.capacity_model", model)?;
        }
        if self.enabled && serving.contains(&&self.listen) && self.listen.port() != 0 {
            return bad("admin.listen", format!("{} is also a serving address", self.listen));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{toml_with_section, Config};

    #[test]
    fn capacity_model_names_a_file_and_clients_parse() {
        let admin = |lines: &str| Config::from_toml(&toml_with_section("admin", lines));
        let c = admin("capacity_model = \"/var/lib/linerate/capacity.json\"\ncapacity_model_clients = \"loopback\"\n")
            .unwrap();
        assert!(c.validate().is_ok());
        assert_eq!(c.admin.capacity_model_clients, ModelClients::Loopback);
        assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c);
        let c = admin("capacity_model = \"\"\n").unwrap();
        assert_eq!(c.validate().unwrap_err().0, "admin.capacity_model");
        assert!(admin("capacity_model_clients = \"moon\"\n").is_err());
    }
}
