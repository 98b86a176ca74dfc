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

/// CPU time the calling thread has used so far (`CLOCK_THREAD_CPUTIME_ID`): user and
/// system time, including the kernel work done on its behalf in its context (on
/// loopback, part of the receiving side's TCP processing).
pub fn thread_cpu_time() -> std::time::Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    #[test]
    fn thread_cpu_time_grows_with_work() {
        let before = super::thread_cpu_time();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        assert!(super::thread_cpu_time() > before, "{x}");
    }

    #[test]
    fn ticks_per_second_is_positive() {
        assert!(super::ticks_per_second().unwrap() > 0);
    }
}
