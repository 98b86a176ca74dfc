//! The NIC operations the DIM controller needs, behind a trait so the
//! controller's logic is tested against a scripted NIC.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use linerate_sys::ethtool::{self, Coalesce};

pub trait NicControl {
    fn driver(&self) -> io::Result<String>;
    /// `ethtool -S` names and values.
    fn named_stats(&self) -> io::Result<Vec<(String, u64)>>;
    fn coalesce(&self) -> io::Result<Coalesce>;
    fn set_coalesce(&self, c: &Coalesce) -> io::Result<()>;
    fn queue_coalesce(&self, queues: &[u32]) -> io::Result<Vec<Coalesce>>;
    fn set_queue_coalesce(&self, queues: &[u32], c: &[Coalesce]) -> io::Result<()>;
}

/// A real interface, through `SIOCETHTOOL`.
pub(super) struct LiveNic {
    iface: String,
    sock: OwnedFd,
}

impl LiveNic {
    pub(super) fn open(iface: &str) -> io::Result<LiveNic> {
        Ok(LiveNic { iface: iface.to_string(), sock: ethtool::control_socket()? })
    }
}

impl NicControl for LiveNic {
    fn driver(&self) -> io::Result<String> {
        Ok(ethtool::driver_info(self.sock.as_fd(), &self.iface)?.driver)
    }

    fn named_stats(&self) -> io::Result<Vec<(String, u64)>> {
        ethtool::named_stats(self.sock.as_fd(), &self.iface)
    }

    fn coalesce(&self) -> io::Result<Coalesce> {
        ethtool::coalesce(self.sock.as_fd(), &self.iface)
    }

    fn set_coalesce(&self, c: &Coalesce) -> io::Result<()> {
        ethtool::set_coalesce(self.sock.as_fd(), &self.iface, c)
    }

    fn queue_coalesce(&self, queues: &[u32]) -> io::Result<Vec<Coalesce>> {
        ethtool::queue_coalesce(self.sock.as_fd(), &self.iface, queues)
    }

    fn set_queue_coalesce(&self, queues: &[u32], c: &[Coalesce]) -> io::Result<()> {
        ethtool::set_queue_coalesce(self.sock.as_fd(), &self.iface, queues, c)
    }
}

/// What a driver accepts for `rx-usecs`, where it differs from "any value".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct DriverQuirks {
    /// `rx-usecs` values that select the driver's own adaptive mode instead of a
    /// timer (e1000e: 1 = dynamic, 3 = dynamic conservative, 4 = simplified).
    pub adaptive_usecs: &'static [u32],
    /// Smallest timer the driver accepts (e1000e and igb reject 5..9 µs).
    pub min_usecs: u32,
}

/// Quirks of the drivers we know; other drivers get none.
pub(super) fn quirks(driver: &str) -> DriverQuirks {
    match driver {
        // Intel's older drivers encode modes in small rx-usecs values
        // (Documentation/networking/device_drivers/ethernet/intel/).
        "e1000" | "e1000e" => DriverQuirks { adaptive_usecs: &[1, 2, 3, 4], min_usecs: 10 },
        "igb" | "igc" | "igbvf" => DriverQuirks { adaptive_usecs: &[1, 2, 3], min_usecs: 10 },
        "ixgbe" | "ixgbevf" => DriverQuirks { adaptive_usecs: &[1], min_usecs: 2 },
        _ => DriverQuirks { adaptive_usecs: &[], min_usecs: 0 },
    }
}
