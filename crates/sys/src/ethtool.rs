//! The classic ethtool ioctl (`SIOCETHTOOL`): interrupt coalescing (device-wide and
//! per queue), driver information, driver statistics and offload features.
//!
//! Why the ioctl and not the ethtool generic-netlink family: the maintained Rust
//! netlink crate (`ethtool` 0.2) reads coalescing but cannot set it, and per-queue
//! coalescing (`ETHTOOL_PERQUEUE`) exists only as an ioctl. The kernel serves both
//! interfaces from the same driver callbacks, so the effect is identical. One
//! difference matters: netlink rejects an attribute the driver does not support,
//! while the ioctl rejects a *non-zero* value in an unsupported field; callers that
//! read, modify and write back a full [`Coalesce`] stay within what the driver
//! reported.

use std::ffi::c_void;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::cvt;

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GDRVINFO: u32 = 0x03;
const ETHTOOL_GCOALESCE: u32 = 0x0e;
const ETHTOOL_SCOALESCE: u32 = 0x0f;
const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSTATS: u32 = 0x1d;
const ETHTOOL_GSSET_INFO: u32 = 0x37;
const ETHTOOL_GFEATURES: u32 = 0x3a;
const ETHTOOL_SFEATURES: u32 = 0x3b;
const ETHTOOL_PERQUEUE: u32 = 0x4b;
const ETH_GSTRING_LEN: usize = 32;
/// `MAX_NUM_QUEUE` of the uapi header: per-queue operations address queues 0..4096.
pub const MAX_QUEUES: u32 = 4096;
const QUEUE_MASK_WORDS: usize = MAX_QUEUES as usize / 32;

/// String sets a driver can describe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StringSet {
    /// Names of the `ethtool -S` statistics.
    Stats = 1,
    /// Names of the offload features (`ethtool -k`).
    Features = 4,
}

/// `struct ethtool_coalesce` without its command word: every field the ioctl carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Coalesce {
    pub rx_usecs: u32,
    pub rx_max_frames: u32,
    pub rx_usecs_irq: u32,
    pub rx_max_frames_irq: u32,
    pub tx_usecs: u32,
    pub tx_max_frames: u32,
    pub tx_usecs_irq: u32,
    pub tx_max_frames_irq: u32,
    pub stats_block_usecs: u32,
    pub use_adaptive_rx: u32,
    pub use_adaptive_tx: u32,
    pub pkt_rate_low: u32,
    pub rx_usecs_low: u32,
    pub rx_max_frames_low: u32,
    pub tx_usecs_low: u32,
    pub tx_max_frames_low: u32,
    pub pkt_rate_high: u32,
    pub rx_usecs_high: u32,
    pub rx_max_frames_high: u32,
    pub tx_usecs_high: u32,
    pub tx_max_frames_high: u32,
    pub rate_sample_interval: u32,
}

const COALESCE_WORDS: usize = 23;

impl Coalesce {
    fn to_words(self, cmd: u32) -> [u32; COALESCE_WORDS] {
        [
            cmd,
            self.rx_usecs,
            self.rx_max_frames,
            self.rx_usecs_irq,
            self.rx_max_frames_irq,
            self.tx_usecs,
            self.tx_max_frames,
            self.tx_usecs_irq,
            self.tx_max_frames_irq,
            self.stats_block_usecs,
            self.use_adaptive_rx,
            self.use_adaptive_tx,
            self.pkt_rate_low,
            self.rx_usecs_low,
            self.rx_max_frames_low,
            self.tx_usecs_low,
            self.tx_max_frames_low,
            self.pkt_rate_high,
            self.rx_usecs_high,
            self.rx_max_frames_high,
            self.tx_usecs_high,
            self.tx_max_frames_high,
            self.rate_sample_interval,
        ]
    }

    fn from_words(w: &[u32]) -> Coalesce {
        Coalesce {
            rx_usecs: w[1],
            rx_max_frames: w[2],
            rx_usecs_irq: w[3],
            rx_max_frames_irq: w[4],
            tx_usecs: w[5],
            tx_max_frames: w[6],
            tx_usecs_irq: w[7],
            tx_max_frames_irq: w[8],
            stats_block_usecs: w[9],
            use_adaptive_rx: w[10],
            use_adaptive_tx: w[11],
            pkt_rate_low: w[12],
            rx_usecs_low: w[13],
            rx_max_frames_low: w[14],
            tx_usecs_low: w[15],
            tx_max_frames_low: w[16],
            pkt_rate_high: w[17],
            rx_usecs_high: w[18],
            rx_max_frames_high: w[19],
            tx_usecs_high: w[20],
            tx_max_frames_high: w[21],
            rate_sample_interval: w[22],
        }
    }
}

/// `struct ifreq` as SIOCETHTOOL uses it: a name and a pointer to the command buffer.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: *mut c_void,
    _pad: [u8; 16],
}

fn iface_name(iface: &str) -> io::Result<[u8; libc::IFNAMSIZ]> {
    let bytes = iface.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) || bytes.contains(&b'/') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("not an interface name: {iface:?}")));
    }
    let mut name = [0u8; libc::IFNAMSIZ];
    name[..bytes.len()].copy_from_slice(bytes);
    Ok(name)
}

/// A socket to address ethtool requests to (any socket works; this one is a
/// close-on-exec UDP socket that is never bound).
pub fn control_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call without pointers; on success the descriptor is
    // new and owned by nobody else.
    let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: as above.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Issues SIOCETHTOOL with `buf` as the command buffer. `buf` must start with the
/// command word and be as large as the command's structure says, including any
/// trailing array sized by a count field inside it.
fn ethtool_ioctl<T>(sock: BorrowedFd<'_>, iface: &str, buf: &mut [T]) -> io::Result<()> {
    let mut req = IfReq { name: iface_name(iface)?, data: buf.as_mut_ptr().cast(), _pad: [0; 16] };
    // SAFETY: `req` is a valid ifreq whose data pointer refers to `buf`, which is
    // mutably borrowed and alive for the whole call. Each caller sizes `buf` for the
    // command it encodes (the kernel reads and writes within the sizes the buffer's
    // own header fields announce, which the callers set from `buf`'s length).
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut req as *mut IfReq) })?;
    Ok(())
}

/// The device-wide coalescing settings (`ethtool -c`).
pub fn coalesce(sock: BorrowedFd<'_>, iface: &str) -> io::Result<Coalesce> {
    let mut w = Coalesce::default().to_words(ETHTOOL_GCOALESCE);
    ethtool_ioctl(sock, iface, &mut w)?;
    Ok(Coalesce::from_words(&w))
}

/// Sets the device-wide coalescing (`ethtool -C`). Drivers reject non-zero values in
/// fields they do not support (`EOPNOTSUPP`) and values out of their range (`EINVAL`).
pub fn set_coalesce(sock: BorrowedFd<'_>, iface: &str, c: &Coalesce) -> io::Result<()> {
    let mut w = c.to_words(ETHTOOL_SCOALESCE);
    ethtool_ioctl(sock, iface, &mut w)
}

fn per_queue_buffer(sub_command: u32, queues: &[u32], settings: Option<&[Coalesce]>) -> io::Result<Vec<u32>> {
    if queues.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no queues given"));
    }
    let mut mask = [0u32; QUEUE_MASK_WORDS];
    for &q in queues {
        if q >= MAX_QUEUES {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("queue {q} beyond {MAX_QUEUES}")));
        }
        if mask[q as usize / 32] & (1 << (q % 32)) != 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("queue {q} given twice")));
        }
        mask[q as usize / 32] |= 1 << (q % 32);
    }
    let mut buf = Vec::with_capacity(2 + QUEUE_MASK_WORDS + COALESCE_WORDS * queues.len());
    buf.extend([ETHTOOL_PERQUEUE, sub_command]);
    buf.extend(mask);
    // The kernel walks the mask in ascending queue order; entries follow that order.
    let mut order: Vec<(u32, usize)> = queues.iter().copied().zip(0..).collect();
    order.sort_unstable();
    for (_, i) in order {
        let c = settings.map(|s| s[i]).unwrap_or_default();
        buf.extend(c.to_words(sub_command));
    }
    Ok(buf)
}

/// Per-queue coalescing settings (`ethtool --per-queue IF queue_mask M --show-coalesce`),
/// in the order of `queues`. Drivers without per-queue support give `EOPNOTSUPP`.
pub fn queue_coalesce(sock: BorrowedFd<'_>, iface: &str, queues: &[u32]) -> io::Result<Vec<Coalesce>> {
    let mut buf = per_queue_buffer(ETHTOOL_GCOALESCE, queues, None)?;
    ethtool_ioctl(sock, iface, &mut buf)?;
    let mut sorted: Vec<u32> = queues.to_vec();
    sorted.sort_unstable();
    let base = 2 + QUEUE_MASK_WORDS;
    Ok(queues
        .iter()
        .map(|q| {
            let pos = sorted.binary_search(q).expect("every queue is in the sorted copy");
            Coalesce::from_words(&buf[base + pos * COALESCE_WORDS..base + (pos + 1) * COALESCE_WORDS])
        })
        .collect())
}

/// Sets per-queue coalescing; `settings[i]` goes to `queues[i]`.
pub fn set_queue_coalesce(sock: BorrowedFd<'_>, iface: &str, queues: &[u32], settings: &[Coalesce]) -> io::Result<()> {
    if settings.len() != queues.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "one setting per queue is required"));
    }
    let mut buf = per_queue_buffer(ETHTOOL_SCOALESCE, queues, Some(settings))?;
    ethtool_ioctl(sock, iface, &mut buf)
}

/// What `ethtool -i` shows, the parts linerate uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverInfo {
    pub driver: String,
    pub bus_info: String,
    pub n_stats: u32,
}

fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Driver name, bus address and number of driver statistics (`ethtool -i`).
pub fn driver_info(sock: BorrowedFd<'_>, iface: &str) -> io::Result<DriverInfo> {
    // struct ethtool_drvinfo: cmd, five 32-byte strings, 12 reserved bytes, five u32.
    let mut buf = [0u32; 1 + 5 * 8 + 3 + 5];
    buf[0] = ETHTOOL_GDRVINFO;
    ethtool_ioctl(sock, iface, &mut buf)?;
    let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
    Ok(DriverInfo {
        driver: c_string(&bytes[4..36]),
        bus_info: c_string(&bytes[100..132]),
        n_stats: buf[1 + 5 * 8 + 3 + 1],
    })
}

/// Number of strings in a set, or 0 when the driver does not have that set.
fn string_set_len(sock: BorrowedFd<'_>, iface: &str, set: StringSet) -> io::Result<u32> {
    // struct ethtool_sset_info: cmd, reserved, u64 mask, then one u32 per mask bit.
    let mut buf = [0u64; 3];
    buf[0] = u64::from_ne_bytes(words_to_bytes(ETHTOOL_GSSET_INFO, 0));
    buf[1] = 1u64 << (set as u32);
    ethtool_ioctl(sock, iface, &mut buf)?;
    if buf[1] & (1u64 << (set as u32)) == 0 {
        return Ok(0);
    }
    Ok(u32::from_ne_bytes(buf[2].to_ne_bytes()[..4].try_into().expect("four bytes")))
}

fn words_to_bytes(a: u32, b: u32) -> [u8; 8] {
    let mut out = [0u8; 8];
    out[..4].copy_from_slice(&a.to_ne_bytes());
    out[4..].copy_from_slice(&b.to_ne_bytes());
    out
}

/// The names of a string set (`ethtool -S` names, feature names).
pub fn string_set(sock: BorrowedFd<'_>, iface: &str, set: StringSet) -> io::Result<Vec<String>> {
    let len = string_set_len(sock, iface, set)? as usize;
    if len == 0 {
        return Ok(Vec::new());
    }
    // struct ethtool_gstrings: cmd, string_set, len, then len * 32 bytes.
    let mut buf = vec![0u32; 3 + len * ETH_GSTRING_LEN / 4];
    buf[0] = ETHTOOL_GSTRINGS;
    buf[1] = set as u32;
    buf[2] = len as u32;
    ethtool_ioctl(sock, iface, &mut buf)?;
    let n = (buf[2] as usize).min(len);
    let bytes: Vec<u8> = buf[3..].iter().flat_map(|w| w.to_ne_bytes()).collect();
    Ok(bytes.chunks(ETH_GSTRING_LEN).take(n).map(c_string).collect())
}

/// Driver statistics with their names (`ethtool -S`).
pub fn named_stats(sock: BorrowedFd<'_>, iface: &str) -> io::Result<Vec<(String, u64)>> {
    let names = string_set(sock, iface, StringSet::Stats)?;
    if names.is_empty() {
        return Ok(Vec::new());
    }
    // struct ethtool_stats: cmd, n_stats, then n_stats u64 values.
    let mut buf = vec![0u64; 1 + names.len()];
    buf[0] = u64::from_ne_bytes(words_to_bytes(ETHTOOL_GSTATS, names.len() as u32));
    ethtool_ioctl(sock, iface, &mut buf)?;
    Ok(names.into_iter().zip(buf[1..].iter().copied()).collect())
}

/// One offload feature's state (`ethtool -k`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeatureState {
    /// The device can change it (not "[fixed]").
    pub changeable: bool,
    pub active: bool,
}

/// Every named offload feature of the device and its state.
pub fn features(sock: BorrowedFd<'_>, iface: &str) -> io::Result<Vec<(String, FeatureState)>> {
    let names = string_set(sock, iface, StringSet::Features)?;
    let blocks = names.len().div_ceil(32);
    // struct ethtool_gfeatures: cmd, size, then size * {available, requested, active, never_changed}.
    let mut buf = vec![0u32; 2 + 4 * blocks];
    buf[0] = ETHTOOL_GFEATURES;
    buf[1] = blocks as u32;
    ethtool_ioctl(sock, iface, &mut buf)?;
    Ok(names
        .into_iter()
        .enumerate()
        .filter(|(_, n)| !n.is_empty())
        .map(|(i, name)| {
            let block = &buf[2 + 4 * (i / 32)..2 + 4 * (i / 32) + 4];
            let bit = 1u32 << (i % 32);
            let state =
                FeatureState { changeable: block[0] & bit != 0 && block[3] & bit == 0, active: block[2] & bit != 0 };
            (name, state)
        })
        .collect())
}

/// Turns one named feature on or off (`ethtool -K IF NAME on|off`).
pub fn set_feature(sock: BorrowedFd<'_>, iface: &str, name: &str, on: bool) -> io::Result<()> {
    let names = string_set(sock, iface, StringSet::Features)?;
    let index = names
        .iter()
        .position(|n| n == name)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{iface} has no feature {name}")))?;
    let blocks = names.len().div_ceil(32);
    // struct ethtool_sfeatures: cmd, size, then size * {valid, requested}.
    let mut buf = vec![0u32; 2 + 2 * blocks];
    buf[0] = ETHTOOL_SFEATURES;
    buf[1] = blocks as u32;
    let bit = 1u32 << (index % 32);
    buf[2 + 2 * (index / 32)] = bit;
    if on {
        buf[2 + 2 * (index / 32) + 1] = bit;
    }
    ethtool_ioctl(sock, iface, &mut buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn coalesce_words_round_trip() {
        let c = Coalesce { rx_usecs: 1, rate_sample_interval: 22, use_adaptive_rx: 9, ..Coalesce::default() };
        let w = c.to_words(7);
        assert_eq!(w[0], 7);
        assert_eq!(Coalesce::from_words(&w), c);
    }

    #[test]
    fn per_queue_buffer_sets_the_mask_and_orders_entries_by_queue() {
        let a = Coalesce { rx_usecs: 10, ..Coalesce::default() };
        let b = Coalesce { rx_usecs: 20, ..Coalesce::default() };
        let buf = per_queue_buffer(ETHTOOL_SCOALESCE, &[33, 1], Some(&[a, b])).unwrap();
        assert_eq!(buf[0], ETHTOOL_PERQUEUE);
        assert_eq!(buf[2], 1 << 1);
        assert_eq!(buf[3], 1 << 1); // queue 33
        let base = 2 + QUEUE_MASK_WORDS;
        assert_eq!(buf[base + 1], 20, "queue 1 first");
        assert_eq!(buf[base + COALESCE_WORDS + 1], 10);
        assert!(per_queue_buffer(ETHTOOL_SCOALESCE, &[4096], None).is_err());
        assert!(per_queue_buffer(ETHTOOL_SCOALESCE, &[2, 2], None).is_err());
        assert!(per_queue_buffer(ETHTOOL_SCOALESCE, &[], None).is_err());
    }

    #[test]
    fn bad_interface_names_are_refused_before_the_kernel() {
        let sock = control_socket().unwrap();
        for bad in ["", "a-name-that-is-too-long", "a/b", "a\0b"] {
            assert_eq!(coalesce(sock.as_fd(), bad).unwrap_err().kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
        // A name that fits but does not exist: the kernel says so.
        assert_eq!(coalesce(sock.as_fd(), "nosuchif0").unwrap_err().raw_os_error(), Some(libc::ENODEV));
    }

    #[test]
    fn loopback_has_features_and_no_driver_statistics() {
        let sock = control_socket().unwrap();
        let f = features(sock.as_fd(), "lo").unwrap();
        assert!(f.iter().any(|(n, _)| n == "rx-gro"), "{f:?}");
        assert!(named_stats(sock.as_fd(), "lo").unwrap().is_empty());
    }
}
