//! The bench's own CPU time, from `/proc/self/stat` (all threads of the process).

use anyhow::Context;

/// utime + stime of this process, in seconds.
pub fn process_cpu_seconds() -> anyhow::Result<f64> {
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
    fn own_cpu_time_is_readable() {
        assert!(process_cpu_seconds().unwrap() >= 0.0);
    }
}
