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
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use rustix::net::{AddressFamily, SocketFlags, SocketType};

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
    Ok(rustix::net::socket_with(AddressFamily::INET, SocketType::DGRAM, SocketFlags::CLOEXEC, None)?)
}

/// Issues `SIOCETHTOOL` on `iface` with `buf` as the command buffer.
///
/// # Safety
///
/// The kernel reads and writes the buffer as the structure that the command word
/// in its first four bytes names, trusting its size: the caller must make sure that
///
/// - `buf` starts with that command word, laid out as the command's structure
///   (`struct ethtool_coalesce`, `struct ethtool_gstrings`, ...) in native byte
///   order, and `T` is a plain integer type whose alignment suits that structure;
/// - `buf` spans at least the structure's full size, including any trailing array
///   whose length a count field inside the buffer announces (`len`, `n_stats`,
///   `size`, the number of bits set in a queue mask): the kernel writes that many
///   entries with no other bound.
///
/// A command word that does not match the buffer's layout lets the kernel write
/// past the end of `buf`.
unsafe fn ethtool_ioctl<T>(sock: BorrowedFd<'_>, iface: &str, buf: &mut [T]) -> io::Result<()> {
    let mut req = IfReq { name: iface_name(iface)?, data: buf.as_mut_ptr().cast(), _pad: [0; 16] };
    // SAFETY: `req` is a valid `struct ifreq` (NUL-terminated name, padded to the
    // kernel's size) whose data pointer refers to `buf`, which is mutably borrowed
    // and alive for the whole call. That the kernel stays within `buf` is this
    // function's safety contract, upheld by the caller. The descriptor is borrowed.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut req as *mut IfReq) })?;
    Ok(())
}

/// The device-wide coalescing settings (`ethtool -c`).
pub fn coalesce(sock: BorrowedFd<'_>, iface: &str) -> io::Result<Coalesce> {
    let mut w = Coalesce::default().to_words(ETHTOOL_GCOALESCE);
    // SAFETY: `w` is a whole `struct ethtool_coalesce` (command word and the 22 u32
    // fields) headed by ETHTOOL_GCOALESCE, which reads and writes exactly that struct.
    unsafe { ethtool_ioctl(sock, iface, &mut w) }?;
    Ok(Coalesce::from_words(&w))
}

/// Sets the device-wide coalescing (`ethtool -C`). Drivers reject non-zero values in
/// fields they do not support (`EOPNOTSUPP`) and values out of their range (`EINVAL`).
pub fn set_coalesce(sock: BorrowedFd<'_>, iface: &str, c: &Coalesce) -> io::Result<()> {
    let mut w = c.to_words(ETHTOOL_SCOALESCE);
    // SAFETY: `w` is a whole `struct ethtool_coalesce` headed by ETHTOOL_SCOALESCE,
    // which only reads that struct.
    unsafe { ethtool_ioctl(sock, iface, &mut w) }
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
    // SAFETY: `per_queue_buffer` lays out `struct ethtool_per_queue_op` (ETHTOOL_PERQUEUE,
    // the sub-command, the queue mask) followed by one `struct ethtool_coalesce` per
    // bit set in the mask, which is what the kernel reads and writes.
    unsafe { ethtool_ioctl(sock, iface, &mut buf) }?;
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
    // SAFETY: as in `queue_coalesce`: one `struct ethtool_coalesce` per mask bit
    // follows the per-queue header; the kernel reads exactly those.
    unsafe { ethtool_ioctl(sock, iface, &mut buf) }
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
    // SAFETY: `buf` is exactly `struct ethtool_drvinfo` (196 bytes, headed by
    // ETHTOOL_GDRVINFO), the fixed-size struct that command writes.
    unsafe { ethtool_ioctl(sock, iface, &mut buf) }?;
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
    // SAFETY: `buf` is `struct ethtool_sset_info` (ETHTOOL_GSSET_INFO, reserved,
    // the mask) with room for one u32 answer; the mask has one bit set, and the
    // kernel writes one u32 per bit set.
    unsafe { ethtool_ioctl(sock, iface, &mut buf) }?;
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

/// How many times a query is tried when the size of its answer keeps changing
/// between counting and fetching (see [`GuardedWords`]).
const SIZE_CHANGE_TRIES: usize = 3;

/// The names of a string set (`ethtool -S` names, feature names).
///
/// The set is counted first and fetched second; when its size changes in between (a
/// driver whose statistics follow its channel count, reconfigured meanwhile), the
/// pair of requests is repeated, and after `SIZE_CHANGE_TRIES` (3) such changes the
/// answer is an error of kind `Interrupted`.
pub fn string_set(sock: BorrowedFd<'_>, iface: &str, set: StringSet) -> io::Result<Vec<String>> {
    for _ in 0..SIZE_CHANGE_TRIES {
        let len = string_set_len(sock, iface, set)? as usize;
        if len == 0 {
            return Ok(Vec::new());
        }
        // struct ethtool_gstrings: cmd, string_set, len, then len * 32 bytes.
        let mut guarded = GuardedWords::<u32>::zeroed(3 + len * ETH_GSTRING_LEN / 4)?;
        let buf = guarded.as_mut_slice();
        buf[0] = ETHTOOL_GSTRINGS;
        buf[1] = set as u32;
        buf[2] = len as u32;
        // SAFETY: `buf` is `struct ethtool_gstrings` (ETHTOOL_GSTRINGS, the set, `len`)
        // followed by room for `len` strings of ETH_GSTRING_LEN bytes. The kernel
        // writes as many strings as the set has at the time of the call: `len`, or
        // (before Linux 6.19) more if the set grew since it was counted. Those extra
        // bytes meet the guard page that ends `buf` and fail the call with EFAULT
        // instead of landing in memory that is not `buf`.
        match unsafe { ethtool_ioctl(sock, iface, buf) } {
            Err(e) if e.raw_os_error() == Some(libc::EFAULT) => continue,
            other => other?,
        }
        // A set whose size changed: Linux 6.19+ answers 0 strings, older kernels the
        // new (smaller) count.
        if buf[2] as usize != len {
            continue;
        }
        let bytes: Vec<u8> = buf[3..].iter().flat_map(|w| w.to_ne_bytes()).collect();
        return Ok(bytes.chunks(ETH_GSTRING_LEN).map(c_string).collect());
    }
    Err(size_kept_changing(iface))
}

fn size_kept_changing(iface: &str) -> io::Error {
    io::Error::new(io::ErrorKind::Interrupted, format!("the statistics of {iface} kept changing size"))
}

/// Driver statistics with their names (`ethtool -S`). The names and the values are
/// two requests; should the number of statistics change between them, both are
/// made again (see [`string_set`]).
pub fn named_stats(sock: BorrowedFd<'_>, iface: &str) -> io::Result<Vec<(String, u64)>> {
    for _ in 0..SIZE_CHANGE_TRIES {
        let names = string_set(sock, iface, StringSet::Stats)?;
        if names.is_empty() {
            return Ok(Vec::new());
        }
        // struct ethtool_stats: cmd, n_stats, then n_stats u64 values.
        let mut guarded = GuardedWords::<u64>::zeroed(1 + names.len())?;
        let buf = guarded.as_mut_slice();
        buf[0] = u64::from_ne_bytes(words_to_bytes(ETHTOOL_GSTATS, names.len() as u32));
        // SAFETY: `buf` is `struct ethtool_stats` (ETHTOOL_GSTATS, n_stats) followed by
        // room for n_stats u64 values. The kernel writes as many values as the device
        // has at the time of the call: n_stats, or (before Linux 6.19) more if the
        // set grew since it was counted; those meet the guard page that ends `buf`
        // and fail the call with EFAULT instead of landing outside `buf`.
        match unsafe { ethtool_ioctl(sock, iface, buf) } {
            Err(e) if e.raw_os_error() == Some(libc::EFAULT) => continue,
            other => other?,
        }
        let answered = u32::from_ne_bytes(buf[0].to_ne_bytes()[4..].try_into().expect("four bytes"));
        if answered as usize != names.len() {
            continue;
        }
        return Ok(names.into_iter().zip(buf[1..].iter().copied()).collect());
    }
    Err(size_kept_changing(iface))
}

/// Integer types a zero-filled buffer can be read as: every bit pattern is a value.
trait Word: Copy {}
impl Word for u32 {}
impl Word for u64 {}

/// `len` zeroed words that end exactly where an inaccessible page begins, for the
/// commands whose answer the kernel sizes by itself.
///
/// Before Linux 6.19 (commit "ethtool: Avoid overflowing userspace buffer on stats
/// query", also in the stable kernels of early 2026), `ETHTOOL_GSTRINGS` and
/// `ETHTOOL_GSTATS` write as many entries as the device has at the moment of the call,
/// whatever count the request carries; drivers such as mlx5 change that number when
/// reconfigured. A write past the end of this buffer hits the guard page, where the
/// kernel's copy to user space stops and the ioctl fails with `EFAULT`.
struct GuardedWords<T: Word> {
    map: *mut c_void,
    map_len: usize,
    data: *mut T,
    len: usize,
}

impl<T: Word> GuardedWords<T> {
    fn zeroed(len: usize) -> io::Result<Self> {
        let page = rustix::param::page_size();
        let too_large = || io::Error::new(io::ErrorKind::InvalidInput, "ethtool buffer too large");
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(too_large)?;
        let data_len = bytes.checked_next_multiple_of(page).ok_or_else(too_large)?;
        let map_len = data_len.checked_add(page).ok_or_else(too_large)?;
        // SAFETY: a new private anonymous mapping at an address the kernel chooses
        // (no hint), so it replaces nothing; `map_len` is non-zero.
        let map = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                map_len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE,
            )
        }?;
        // From here on, dropping `guarded` unmaps.
        let data = map.cast::<u8>().wrapping_add(data_len - bytes).cast::<T>();
        let guarded = GuardedWords { map, map_len, data, len };
        // SAFETY: the last page of the mapping made above (`data_len` is a multiple of
        // the page size), which nothing refers to yet.
        unsafe {
            rustix::mm::mprotect(
                map.cast::<u8>().wrapping_add(data_len).cast(),
                page,
                rustix::mm::MprotectFlags::empty(),
            )
        }?;
        Ok(guarded)
    }

    fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: `data` points `len * size_of::<T>()` bytes before the guard page, all
        // inside the read-write part of the mapping, which lives as long as `self`
        // and which only this value refers to (the `&mut self` borrow makes the
        // slice unique). The start is aligned for `T`: a page boundary less a
        // multiple of `size_of::<T>()`, itself a multiple of `T`'s alignment. The
        // memory is zero-filled or holds what was written as `T`, and every bit
        // pattern is a valid `T` (`Word`).
        unsafe { std::slice::from_raw_parts_mut(self.data, self.len) }
    }
}

impl<T: Word> Drop for GuardedWords<T> {
    fn drop(&mut self) {
        // SAFETY: `map`/`map_len` are exactly the mapping made in `zeroed`, and no
        // reference into it outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.map, self.map_len) };
    }
}

/// One offload feature's state (`ethtool -k`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeatureState {
    /// The device can change it (not `[fixed]`).
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
    // SAFETY: `buf` is `struct ethtool_gfeatures` (ETHTOOL_GFEATURES, size) followed
    // by `size` blocks of four u32; the kernel writes at most `size` blocks.
    unsafe { ethtool_ioctl(sock, iface, &mut buf) }?;
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
    // SAFETY: `buf` is `struct ethtool_sfeatures` (ETHTOOL_SFEATURES, size) followed
    // by `size` blocks of two u32; the kernel reads those and writes back at most
    // the header.
    unsafe { ethtool_ioctl(sock, iface, &mut buf) }
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

    #[test]
    fn guarded_words_end_at_an_inaccessible_page() {
        let mut guarded = GuardedWords::<u32>::zeroed(3).unwrap();
        let words = guarded.as_mut_slice();
        assert_eq!(words, &[0, 0, 0]);
        words.copy_from_slice(&[1, 2, 3]);
        let zero = std::fs::File::open("/dev/zero").unwrap();
        // Ask the kernel for 8 bytes more than the slice holds.
        // SAFETY: the 12 bytes of `words` are writable; the 8 after them are the guard
        // page of the same mapping, owned by `guarded` and referred to by nothing
        // else, so even a missing guard would only let the kernel write into memory
        // that no Rust value uses.
        let n = unsafe { libc::read(zero.as_raw_fd(), words.as_mut_ptr().cast(), 12 + 8) };
        let error = (n < 0).then(io::Error::last_os_error);
        assert!(
            (0..=12).contains(&n) || error.as_ref().and_then(|e| e.raw_os_error()) == Some(libc::EFAULT),
            "read {n} bytes into 12 ({error:?}): the page after the words is writable"
        );
        assert_eq!(guarded.as_mut_slice().len(), 3);
    }

    /// ETHTOOL_GCHANNELS / ETHTOOL_SCHANNELS: `struct ethtool_channels`, nine u32.
    fn set_rx_tx_channels(sock: BorrowedFd<'_>, iface: &str, count: u32) -> io::Result<()> {
        let mut ch = [0u32; 9];
        ch[0] = 0x3c;
        // SAFETY: `ch` is a whole `struct ethtool_channels` headed by ETHTOOL_GCHANNELS.
        unsafe { ethtool_ioctl(sock, iface, &mut ch) }?;
        ch[0] = 0x3d;
        (ch[5], ch[6]) = (count, count);
        // SAFETY: the same struct, now headed by ETHTOOL_SCHANNELS, which only reads it.
        unsafe { ethtool_ioctl(sock, iface, &mut ch) }
    }

    /// Runs `f` on a thread that has entered the network namespace `ns`.
    fn in_namespace<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> std::thread::JoinHandle<T> {
        let ns = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
        std::thread::spawn(move || {
            use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};
            move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Network)).unwrap();
            f()
        })
    }

    /// A veth pair in a namespace of our own, whose number of statistics follows its
    /// channel count (per-queue counters): the names and values stay paired while
    /// another thread changes that count as fast as it can.
    #[test]
    fn veth_statistics_stay_consistent_while_the_channel_count_changes() {
        let ns = format!("lr-sys-ethtool-{}", std::process::id());
        let ip = |args: &[&str]| {
            let out = std::process::Command::new("ip").args(args).output().expect("ip (iproute2) is required");
            assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        ip(&["netns", "add", &ns]);
        struct Cleanup(String);
        impl Drop for Cleanup {
            fn drop(&mut self) {
                let _ = std::process::Command::new("ip").args(["netns", "del", &self.0]).status();
            }
        }
        let _cleanup = Cleanup(ns.clone());
        let queues = ["numrxqueues", "4", "numtxqueues", "4"];
        let mut add = vec!["-n", &ns, "link", "add", "v0"];
        add.extend(queues);
        add.extend(["type", "veth", "peer", "name", "v1"]);
        add.extend(queues);
        ip(&add);

        let names_at = |count: u32| {
            let sock = control_socket().unwrap();
            set_rx_tx_channels(sock.as_fd(), "v0", count).unwrap();
            let stats = named_stats(sock.as_fd(), "v0").unwrap();
            assert_eq!(string_set_len(sock.as_fd(), "v0", StringSet::Stats).unwrap() as usize, stats.len());
            stats.into_iter().map(|(name, _)| name).collect::<Vec<_>>()
        };
        let (four, one) = in_namespace(&ns, move || (names_at(4), names_at(1))).join().unwrap();
        assert!(four.len() > one.len(), "{four:?} / {one:?}");
        assert!(four.iter().any(|n| n.starts_with("rx_queue_3_")), "{four:?}");
        assert!(!one.iter().any(|n| n.starts_with("rx_queue_1_")), "{one:?}");

        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let toggler = {
            let stop = stop.clone();
            in_namespace(&ns, move || {
                let sock = control_socket().unwrap();
                let mut changes = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    set_rx_tx_channels(sock.as_fd(), "v0", if changes % 2 == 0 { 1 } else { 4 }).unwrap();
                    changes += 1;
                }
                changes
            })
        };
        let reader = in_namespace(&ns, move || {
            let sock = control_socket().unwrap();
            let (mut answers, mut gave_up) = (0u32, 0u32);
            let started = std::time::Instant::now();
            while answers + gave_up < 2000 && started.elapsed() < std::time::Duration::from_secs(5) {
                match named_stats(sock.as_fd(), "v0") {
                    Ok(stats) => {
                        let names: Vec<String> = stats.into_iter().map(|(n, _)| n).collect();
                        assert!(names == four || names == one, "names of neither channel count: {names:?}");
                        answers += 1;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => gave_up += 1,
                    Err(e) => panic!("{e}"),
                }
            }
            (answers, gave_up)
        });
        let (answers, gave_up) = reader.join().unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let changes = toggler.join().unwrap();
        assert!(changes > 0 && answers > 0, "{changes} changes, {answers} answers, {gave_up} given up");
    }
}
