//! NUMA memory: a thread's allocation policy, and which node holds given pages.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

const MPOL_PREFERRED: libc::c_long = 1;
const MPOL_F_NODE: libc::c_ulong = 1;
const MPOL_F_ADDR: libc::c_ulong = 2;
/// Node mask words passed to the kernel: room for 1024 nodes.
const MASK_WORDS: usize = 16;

/// Makes the calling thread allocate its memory on `node` when it can, and
/// elsewhere when that node is full (`set_mempolicy(MPOL_PREFERRED)`).
pub fn prefer_node(node: u32) -> io::Result<()> {
    let node = node as usize;
    if node >= MASK_WORDS * 64 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "node number out of range"));
    }
    let mut mask = [0u64; MASK_WORDS];
    mask[node / 64] |= 1 << (node % 64);
    // SAFETY: `mask` is a live, readable array of MASK_WORDS u64 words; with `maxnode`
    // MASK_WORDS * 64 + 1 the kernel reads `maxnode - 1` bits, exactly that array, and
    // writes nothing. (Neither libc nor rustix wraps set_mempolicy.)
    let ret = unsafe {
        libc::syscall(libc::SYS_set_mempolicy, MPOL_PREFERRED, mask.as_ptr(), (MASK_WORDS * 64 + 1) as libc::c_ulong)
    };
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The node of the page holding `byte` (which must have been written, so that the
/// page exists): `get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR)`.
pub fn node_of(byte: &u8) -> io::Result<u32> {
    let mut node: libc::c_int = -1;
    // SAFETY: `node` is a live, writable int, the only memory the kernel writes; no
    // node mask is passed (null, maxnode 0); with MPOL_F_ADDR the address is only
    // looked up by the kernel, and `byte` is a live reference, so it is mapped for
    // the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut node as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_ulong>(),
            0 as libc::c_ulong,
            byte as *const u8,
            MPOL_F_NODE | MPOL_F_ADDR,
        )
    };
    if ret == -1 {
        return Err(io::Error::last_os_error());
    }
    u32::try_from(node).map_err(|_| io::Error::other("no node for that address"))
}

/// The node of up to `samples` pages spread evenly over `len` bytes of `file` at
/// `offset`, as they sit in the page cache: a node number, or `None` for a page that
/// is not cached.
///
/// The range is mapped read-only; `mincore` says which pages are cached without
/// touching them, and only those are looked up with `get_mempolicy(MPOL_F_NODE |
/// MPOL_F_ADDR)`, which maps a cached page through the kernel (`get_user_pages`):
/// no disk I/O, and a page the file no longer has (it shrank meanwhile) is an
/// error return, not a `SIGBUS`. (`move_pages` with no target node would be one
/// call, but it only sees pages already mapped in this process.)
pub fn page_cache_nodes(file: BorrowedFd<'_>, offset: u64, len: u64, samples: usize) -> io::Result<Vec<Option<u32>>> {
    if len == 0 || samples == 0 {
        return Ok(Vec::new());
    }
    let page = 4096u64;
    let start = offset / page * page;
    let map_len = (offset + len - start).div_ceil(page) * page;
    let pages = map_len / page;
    let take = (samples as u64).min(pages);
    // SAFETY: a new read-only shared mapping at an address the kernel chooses (no
    // hint), so it replaces nothing; failure is checked before use, and it is
    // unmapped below on every path. Nothing in user space reads it, so a file that
    // shrinks meanwhile cannot raise SIGBUS here. The descriptor is borrowed.
    let base = unsafe {
        libc::mmap64(
            std::ptr::null_mut(),
            map_len as usize,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            start as i64,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mut resident = vec![0u8; pages as usize];
    // SAFETY: `base`/`map_len` is the page-aligned mapping made above; the kernel
    // writes one byte per page of it into `resident`, which has exactly `pages`
    // bytes. (rustix has no mincore.)
    let ret = unsafe { libc::mincore(base, map_len as usize, resident.as_mut_ptr()) };
    let mut out = Vec::with_capacity(take as usize);
    let mut failure = (ret == -1).then(io::Error::last_os_error);
    if failure.is_none() {
        for i in 0..take {
            let p = i * pages / take;
            if resident[p as usize] & 1 == 0 {
                out.push(None);
                continue;
            }
            let mut node: libc::c_int = -1;
            // SAFETY: `node` is a live, writable int, the only memory written; no
            // mask is passed; the address lies inside the mapping made above
            // (`p < pages`) and is only resolved by the kernel, never read here.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_get_mempolicy,
                    &mut node as *mut libc::c_int,
                    std::ptr::null_mut::<libc::c_ulong>(),
                    0 as libc::c_ulong,
                    base.cast::<u8>().wrapping_add((p * page) as usize),
                    MPOL_F_NODE | MPOL_F_ADDR,
                )
            };
            out.push(if r == -1 { None } else { u32::try_from(node).ok() });
        }
    }
    // SAFETY: `base`/`map_len` describe exactly the mapping created above, and no
    // reference into it exists.
    unsafe { libc::munmap(base, map_len as usize) };
    match failure.take() {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    #[test]
    fn page_nodes_of_a_cached_file() {
        let dir = std::env::temp_dir().join(format!("linerate-numa-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::File::create(&path).unwrap().write_all(&vec![7u8; 1 << 20]).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let nodes = page_cache_nodes(f.as_fd(), 1000, 500_000, 16).unwrap();
        assert_eq!(nodes.len(), 16);
        assert!(nodes.iter().all(|n| *n == Some(0)), "{nodes:?} (just written: cached, on the only node)");
        // Past the end of the file: pages that cannot be cached, no fault.
        let past = page_cache_nodes(f.as_fd(), 2 << 20, 8192, 4).unwrap();
        assert!(past.iter().all(|n| n.is_none()), "{past:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn policy_and_own_pages() {
        std::thread::spawn(|| {
            prefer_node(0).unwrap();
            let buf = vec![1u8; 65536];
            assert_eq!(node_of(&buf[4096]).unwrap(), 0);
            assert!(prefer_node(5000).is_err());
        })
        .join()
        .unwrap();
    }
}
