//! What the server writes about itself: its log (`[log]`) and the access log, one
//! record per response (`[access_log]`, written by `server::access_log`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{bad, range, Bad};

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Log {
    /// A tracing filter: `info`, `debug`, `linerate=debug,warn`...
    pub level: String,
    pub format: LogFormat,
}

impl Default for Log {
    fn default() -> Self {
        Log { level: "info".into(), format: LogFormat::Text }
    }
}

impl Log {
    pub(super) fn validate(&self) -> Result<(), Bad> {
        // tracing-subscriber (0.3.20 and later) trims each comma-separated directive
        // but slices the untrimmed text, and panics on a directive that starts with
        // whitespace before a non-ASCII character; it never reads them right anyway.
        if self.level.split(',').any(|d| d.starts_with(char::is_whitespace)) {
            return bad("log.level", "directives are separated by commas without spaces, like `linerate=debug,warn`");
        }
        if tracing_subscriber::EnvFilter::builder().parse(&self.level).is_err() {
            return bad("log.level", format!("{:?} is not a log filter like `info` or `linerate=debug`", self.level));
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AccessLogFormat {
    /// One JSON object per line.
    #[default]
    Json,
    /// nginx's `combined` format, so pipelines that parse it read it unchanged.
    Combined,
}

impl AccessLogFormat {
    /// Whether records print the response's duration and time to first byte (each
    /// costs a clock read per response).
    pub fn has_timings(self) -> bool {
        self == AccessLogFormat::Json
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AccessLog {
    /// The file records are appended to; unset or `"off"`: no access log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    pub format: AccessLogFormat,
    /// Log one response in this many (1: every response).
    pub sample: u64,
}

impl Default for AccessLog {
    fn default() -> Self {
        AccessLog { path: None, format: AccessLogFormat::Json, sample: 1 }
    }
}

impl AccessLog {
    /// The file to write, or None when logging is off.
    pub fn file(&self) -> Option<&Path> {
        self.path.as_deref().filter(|p| *p != Path::new("off"))
    }

    pub(super) fn validate(&self) -> Result<(), Bad> {
        range("access_log.sample", self.sample, 1, 1 << 32)?;
        if let Some(path) = self.file() {
            if path.as_os_str().is_empty() || path.is_dir() {
                return bad("access_log.path", format!("{:?} is not a file path (or \"off\")", path.display()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, DEFAULT_LISTEN};

    /// tracing-subscriber's directive parser trims a directive but slices the
    /// untrimmed text, so a directive after `, ` with a non-ASCII character panicked
    /// validation: at start, or on a reload, in the running server's supervisor.
    #[test]
    fn log_level_with_a_space_after_a_comma_is_refused_not_a_panic() {
        let dir = std::env::temp_dir();
        for level in [" é=info", "info, é=debug", "info,\u{a0}linerate=debug", "warn, linerate=debug", " "] {
            let c = Config {
                root: Some(dir.clone()),
                listen: vec![DEFAULT_LISTEN.parse().unwrap()],
                log: Log { level: level.into(), ..Log::default() },
                ..Config::default()
            };
            let (key, problem) = c.validate().unwrap_err();
            assert_eq!(key, "log.level", "{level:?}");
            assert!(problem.contains("without spaces"), "{problem}");
        }
        for level in ["info", "linerate=debug,warn", "info,é=debug", "", "debug "] {
            let c = Config {
                root: Some(dir.clone()),
                log: Log { level: level.into(), ..Log::default() },
                ..Config::default()
            };
            let c = Config { listen: vec![DEFAULT_LISTEN.parse().unwrap()], ..c };
            assert!(c.validate().is_ok(), "{level:?}");
        }
    }
}
