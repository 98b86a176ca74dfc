//! Clock facts the kernel reports in its own units.

use std::io;

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`, which the kernel hands every
/// process in its auxiliary vector as `AT_CLKTCK`): the unit of the `utime`/`stime`
/// fields of `/proc/<pid>/stat` and of the CPU lines of `/proc/stat`.
pub fn ticks_per_second() -> io::Result<u64> {
    match rustix::param::clock_ticks_per_second() {
        0 => Err(io::Error::other("the kernel reported no clock tick rate (AT_CLKTCK)")),
        ticks => Ok(ticks),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ticks_per_second_is_positive() {
        assert!(super::ticks_per_second().unwrap() > 0);
    }
}
