//! `[prefill]`: pre-positioning titles from a manifest ahead of demand
//! (docs/PREFILL.md): when, how fast, and where the job's state is kept.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{bad, range, Bad};

/// The filler that pre-positions a manifest's titles (`[prefill]`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Prefill {
    /// When the filler may fetch, local time: `"02:00-14:00"` (may wrap midnight:
    /// `"22:00-06:00"`); empty: at any time.
    pub window: String,
    /// The most the filler reads from origins, in bits per second: a number, or
    /// text with a unit (`"200Mb/s"`, `"1.5Gb/s"`, `"500kb/s"`, `"2000000b/s"`).
    pub rate: Rate,
    /// Where the job (its manifest and progress) is kept across restarts;
    /// default: the first `[[cache.dirs]]` directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    /// The filler starts no slice while this many viewer origin requests (heads
    /// and slice fills) or more are under way: 1, only when none is.
    pub busy_fills: usize,
}

impl Default for Prefill {
    fn default() -> Self {
        Prefill { window: String::new(), rate: Rate(100_000_000), state_dir: None, busy_fills: 1 }
    }
}

impl Prefill {
    pub(super) fn validate(&self) -> Result<(), Bad> {
        if let Err(e) = Window::parse(&self.window) {
            return bad("prefill.window", e);
        }
        range("prefill.rate", self.rate.0, 8_000, 1_000_000_000_000)?;
        range("prefill.busy_fills", self.busy_fills, 1, 1_000_000)?;
        if let Some(d) = &self.state_dir {
            if !d.is_absolute() {
                return bad("prefill.state_dir", "must be an absolute path");
            }
        }
        Ok(())
    }

    /// The window (validated: `None` is "at any time").
    pub fn window(&self) -> Option<Window> {
        Window::parse(&self.window).ok().flatten()
    }
}

/// A rate in bits per second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate(pub u64);

impl Rate {
    /// `"200Mb/s"`, `"1.5 Gbit/s"`, `"500kb/s"`, `"8000b/s"` or a bare number of
    /// bits per second; units are decimal (M = 10^6) and in bits.
    pub fn parse(text: &str) -> Result<Rate, String> {
        let t = text.trim();
        let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
        let (number, unit) = (&t[..split], t[split..].trim());
        let n: f64 = number.parse().map_err(|_| format!("{text:?} is not a rate like \"200Mb/s\""))?;
        let scale = match unit {
            "" | "b/s" | "bit/s" | "bps" => 1.0,
            "kb/s" | "kbit/s" | "Kb/s" | "kbps" => 1e3,
            "Mb/s" | "Mbit/s" | "mbit/s" | "Mbps" => 1e6,
            "Gb/s" | "Gbit/s" | "gbit/s" | "Gbps" => 1e9,
            u if u.contains('B') => return Err(format!("{text:?}: write the rate in bits (\"200Mb/s\"), not bytes")),
            _ => return Err(format!("{text:?}: unknown unit {unit:?}; use b/s, kb/s, Mb/s or Gb/s")),
        };
        let bits = n * scale;
        if !(1.0..=1e15).contains(&bits) {
            return Err(format!("{text:?} is out of range"));
        }
        Ok(Rate(bits.round() as u64))
    }

    /// Bytes per second.
    pub fn bytes_per_second(self) -> f64 {
        self.0 as f64 / 8.0
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}b/s", self.0)
    }
}

impl Serialize for Rate {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Rate, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bits(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bits(b) => Ok(Rate(b)),
            Raw::Text(t) => Rate::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

/// A daily window of local time, in minutes of the day: `start` included, `end`
/// excluded; `end < start` wraps midnight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub start: u16,
    pub end: u16,
}

const DAY_MINUTES: u16 = 24 * 60;

impl Window {
    /// `"HH:MM-HH:MM"`; empty is `None` (at any time). `24:00` may end a window.
    pub fn parse(text: &str) -> Result<Option<Window>, String> {
        let t = text.trim();
        if t.is_empty() {
            return Ok(None);
        }
        let form = || format!("{text:?} is not a window like \"02:00-14:00\" (local time, HH:MM-HH:MM)");
        let (a, b) = t.split_once('-').ok_or_else(form)?;
        let minute = |s: &str, end: bool| -> Result<u16, String> {
            let (h, m) = s.trim().split_once(':').ok_or_else(form)?;
            if h.is_empty() || h.len() > 2 || m.len() != 2 {
                return Err(form());
            }
            let (h, m): (u16, u16) = (h.parse().map_err(|_| form())?, m.parse().map_err(|_| form())?);
            match (h, m) {
                (24, 0) if end => Ok(DAY_MINUTES),
                (0..=23, 0..=59) => Ok(h * 60 + m),
                _ => Err(format!("{s:?} is not a time of day (00:00 to 23:59)")),
            }
        };
        let (start, end) = (minute(a, false)?, minute(b, true)?);
        if start == 0 && end == DAY_MINUTES {
            return Ok(None);
        }
        if start == end % DAY_MINUTES {
            return Err(format!("{text:?} is empty; leave `window` out (or \"\") to fill at any time"));
        }
        Ok(Some(Window { start, end: end % DAY_MINUTES }))
    }

    /// Whether minute `m` of the day (0..1440) is inside.
    pub fn contains(&self, m: u16) -> bool {
        if self.start < self.end {
            (self.start..self.end).contains(&m)
        } else {
            m >= self.start || m < self.end
        }
    }

    /// Minutes from minute `m` of the day until the window opens (0 when open).
    pub fn minutes_until_open(&self, m: u16) -> u16 {
        if self.contains(m) {
            0
        } else {
            (self.start + DAY_MINUTES - m) % DAY_MINUTES
        }
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let end = if self.end == 0 { DAY_MINUTES } else { self.end };
        write!(f, "{:02}:{:02}-{:02}:{:02}", self.start / 60, self.start % 60, end / 60, end % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse_and_may_wrap_midnight() {
        let w = Window::parse("02:00-14:00").unwrap().unwrap();
        assert_eq!(w, Window { start: 120, end: 840 });
        assert!(w.contains(120) && w.contains(839) && !w.contains(840) && !w.contains(60));
        assert_eq!(w.minutes_until_open(60), 60);
        assert_eq!(w.minutes_until_open(840), 12 * 60);
        assert_eq!(w.minutes_until_open(200), 0);
        let night = Window::parse("22:30-06:00").unwrap().unwrap();
        assert!(night.contains(23 * 60) && night.contains(0) && night.contains(359) && !night.contains(360));
        assert!(!night.contains(22 * 60 + 29));
        assert_eq!(night.minutes_until_open(12 * 60), 10 * 60 + 30);
        let to_midnight = Window::parse("18:00-24:00").unwrap().unwrap();
        assert!(to_midnight.contains(1439) && !to_midnight.contains(0));
        assert_eq!(to_midnight.to_string(), "18:00-24:00");
        assert_eq!(Window::parse("").unwrap(), None);
        assert_eq!(Window::parse("  ").unwrap(), None);
        assert_eq!(Window::parse("00:00-24:00").unwrap(), None, "the whole day");
    }

    #[test]
    fn bad_windows_say_why() {
        for bad in ["2-14", "02:00", "25:00-03:00", "02:60-03:00", "02:00-02:00", "x:00-01:00"] {
            let e = Window::parse(bad).unwrap_err();
            assert!(e.contains(bad.split('-').next().unwrap()) || e.contains("empty"), "{bad}: {e}");
        }
        assert!(Window::parse("02:00-02:00").unwrap_err().contains("empty"));
    }

    #[test]
    fn rates_are_bits_per_second() {
        assert_eq!(Rate::parse("200Mb/s"), Ok(Rate(200_000_000)));
        assert_eq!(Rate::parse("1.5 Gbit/s"), Ok(Rate(1_500_000_000)));
        assert_eq!(Rate::parse("500kb/s"), Ok(Rate(500_000)));
        assert_eq!(Rate::parse("8000"), Ok(Rate(8000)));
        assert!(Rate::parse("200MB/s").unwrap_err().contains("bits"));
        assert!(Rate::parse("fast").unwrap_err().contains("not a rate"));
        assert!(Rate::parse("3 furlongs").unwrap_err().contains("unknown unit"));
        assert_eq!(Rate(200_000_000).bytes_per_second(), 25e6);
    }
}
