//! `[dim]`: the NICs whose interrupt coalescing the server drives with DIM while it
//! runs, and how (docs/DIM.md).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, duration, Bad};

/// The `[dim]` section (dynamic interrupt moderation, docs/DIM.md): the NICs whose
/// interrupt coalescing the server drives while it runs (`tune::dim::spawn`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Dim {
    /// Interfaces to drive; empty = off.
    pub interfaces: Vec<String>,
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    pub max_writes_per_sec: f64,
    pub take_over: bool,
}

impl Default for Dim {
    fn default() -> Dim {
        Dim { interfaces: Vec::new(), interval: Duration::from_millis(100), max_writes_per_sec: 10.0, take_over: false }
    }
}

impl Dim {
    pub(super) fn validate(&self) -> Result<(), Bad> {
        if self.interval < Duration::from_millis(10) {
            return bad("dim.interval", "must be at least 10ms");
        }
        duration("dim.interval", self.interval)?;
        if !(self.max_writes_per_sec > 0.0 && self.max_writes_per_sec.is_finite()) {
            return bad("dim.max_writes_per_sec", "must be more than 0");
        }
        if let Some(bad_name) = self.interfaces.iter().find(|i| i.is_empty() || i.contains('/') || i.len() > 15) {
            return bad("dim.interfaces", format!("{bad_name:?} is not an interface name"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dim_section_parses() {
        let c: Dim = toml::from_str("interfaces = [\"eth0\"]\ninterval = \"250ms\"\n").unwrap();
        assert_eq!(c.interval, Duration::from_millis(250));
        assert_eq!(c.max_writes_per_sec, 10.0);
        assert!(toml::from_str::<Dim>("bogus = 1").is_err());
    }
}
