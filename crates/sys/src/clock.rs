//! Clock facts the kernel reports in its own units.

use std::io;

use super::cvt_long;

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`): the unit of the `utime`/`stime`
/// fields of `/proc/<pid>/stat` and of the CPU lines of `/proc/stat`.
pub fn ticks_per_second() -> io::Result<u64> {
    // SAFETY: sysconf takes no pointers and only reads a constant name.
    let ticks = cvt_long(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })?;
    u64::try_from(ticks).map_err(|_| io::Error::other("sysconf(_SC_CLK_TCK) returned a negative value"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn ticks_per_second_is_positive() {
        assert!(super::ticks_per_second().unwrap() > 0);
    }
}
