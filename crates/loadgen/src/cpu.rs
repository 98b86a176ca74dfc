//! The bench's own CPU time, from `/proc/self/stat` (all threads of the process).

use anyhow::Context;

/// utime + stime of this process, in seconds.
pub(crate) fn process_cpu_seconds() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").context("reading /proc/self/stat")?;
    let ticks = parse_cpu_ticks(&stat).context("unexpected /proc/self/stat format")?;
    let per_second = linerate_sys::clock::ticks_per_second().context("sysconf(_SC_CLK_TCK)")?;
    Ok(ticks as f64 / per_second as f64)
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line. The command name
/// (field 2) may contain spaces and parentheses, so fields are counted after its
/// last `)`.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_utime_and_stime_after_an_awkward_name() {
        let line = "1234 (a (b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 100 1000 10";
        assert_eq!(parse_cpu_ticks(line), Some(325));
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }

    #[test]
    fn own_cpu_time_grows_with_work() {
        // Spinning on this thread must show up within a few ticks of CPU time, and
        // as seconds (the wall time spent bounds it, times the CPUs), not ticks.
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let wall = std::time::Instant::now();
        let before = process_cpu_seconds().unwrap();
        let mut after = before;
        while after <= before && wall.elapsed() < std::time::Duration::from_secs(10) {
            std::hint::black_box((0..10_000u64).sum::<u64>());
            after = process_cpu_seconds().unwrap();
        }
        let waited = wall.elapsed().as_secs_f64();
        assert!(after > before, "no CPU time counted after {waited:.1} s of spinning");
        assert!(after - before <= waited * cpus + 0.05, "{} s of CPU in {waited} s", after - before);
    }
}
