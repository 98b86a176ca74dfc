//! `[origin.s3]`: an origin that is an S3 bucket (AWS or any S3-compatible
//! server). The table's `urls` name the S3 endpoint; this sub-table names the
//! bucket, the region, how the bucket is addressed, and where the credentials
//! come from. Every request to it is signed with AWS Signature Version 4
//! (`origin::s3`).
//!
//! Credentials are read when a configuration is loaded (at start and at every
//! reload), from `credentials_file` or, when it is not set, from the environment
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`). The secret
//! and the session token are [`Secret`]s: never shown by `Debug`, never printed.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{bad, Bad, BaseUrl, Secret};

/// An `[[origin]]` table's `[origin.s3]` sub-table.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct S3 {
    /// The bucket objects are fetched from.
    pub bucket: String,
    /// The region the requests are signed for (`us-east-1`; most S3-compatible
    /// servers take any name, or `us-east-1`).
    pub region: String,
    /// How the bucket is named in a request: in the path, or in the host name.
    #[serde(default)]
    pub addressing: Addressing,
    /// An AWS-style credentials file (INI): the profile's `aws_access_key_id`,
    /// `aws_secret_access_key` and optional `aws_session_token`. When absent, the
    /// environment's `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and
    /// `AWS_SESSION_TOKEN` are used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_file: Option<PathBuf>,
    /// The section of `credentials_file` to read.
    #[serde(default = "default_profile")]
    pub profile: String,
}

fn default_profile() -> String {
    "default".into()
}

/// How a request names the bucket.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Addressing {
    /// `http://endpoint/bucket/key`: works with any endpoint, an IP address too.
    #[default]
    Path,
    /// `http://bucket.endpoint/key`: the bucket is part of the host name, which
    /// must resolve (AWS's preferred form).
    Virtual,
}

/// The access key of an S3 origin, as read at load. The secret and the token
/// are never shown.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Credentials {
    pub access_key_id: String,
    pub secret_access_key: Secret,
    pub session_token: Option<Secret>,
    /// Where they were read from, for logs: the file and profile, or
    /// "the environment".
    pub source: String,
}

impl fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &self.secret_access_key)
            .field("session_token", &self.session_token.as_ref().map(|_| super::REDACTED))
            .field("source", &self.source)
            .finish()
    }
}

/// The environment variables credentials are taken from when no file is named.
pub(super) const ENV_ACCESS_KEY_ID: &str = "AWS_ACCESS_KEY_ID";
pub(super) const ENV_SECRET_ACCESS_KEY: &str = "AWS_SECRET_ACCESS_KEY";
pub(super) const ENV_SESSION_TOKEN: &str = "AWS_SESSION_TOKEN";

/// Bytes a URL's path may hold under an S3 table: it is a key prefix, sent as
/// written and signed as written, so only what S3 never encodes.
pub fn is_s3_path_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~/".contains(&b)
}

impl S3 {
    /// Checks the sub-table of `origin[i]`, whose URLs are `urls` and which keys
    /// on `key_args`.
    pub(super) fn validate(&self, i: usize, urls: &[(String, BaseUrl)], key_args: &[String]) -> Result<(), Bad> {
        let key = |k: &str| format!("origin[{i}].s3.{k}");
        let b = &self.bucket;
        let plain =
            !b.is_empty() && b.len() <= 255 && b.bytes().all(|c| c.is_ascii_alphanumeric() || b".-_".contains(&c));
        if !plain {
            return bad(key("bucket"), format!("{b:?} is not a bucket name (letters, digits, `.`, `-`, `_`)"));
        }
        if self.addressing == Addressing::Virtual {
            let dns = (3..=63).contains(&b.len())
                && b.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b".-".contains(&c))
                && !b.starts_with(['.', '-'])
                && !b.ends_with(['.', '-'])
                && !b.contains("..");
            if !dns {
                return bad(
                    key("bucket"),
                    format!(
                        "{b:?} cannot be part of a host name (addressing = \"virtual\" needs 3 to 63 lowercase \
                         letters, digits, `.` and `-`); use addressing = \"path\""
                    ),
                );
            }
            for (j, (text, url)) in urls.iter().enumerate() {
                let h = url.host.as_str();
                if h.starts_with('[') || h.parse::<std::net::Ipv4Addr>().is_ok() {
                    return bad(
                        format!("origin[{i}].urls[{j}]"),
                        format!("{text:?}: addressing = \"virtual\" puts the bucket in the host name, which needs a host name, not an address; use addressing = \"path\""),
                    );
                }
            }
        }
        if self.region.is_empty() || !self.region.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-') {
            return bad(key("region"), format!("{:?} is not a region name like `us-east-1`", self.region));
        }
        if self.profile.is_empty() || self.profile.contains([']', '[', '\n', '\r']) {
            return bad(key("profile"), format!("{:?} is not a profile name", self.profile));
        }
        for (j, (text, url)) in urls.iter().enumerate() {
            if !url.path.bytes().all(is_s3_path_byte) {
                return bad(
                    format!("origin[{i}].urls[{j}]"),
                    format!("{text:?}: under [origin.s3] the path is a key prefix and may hold only letters, digits, `-._~` and `/`"),
                );
            }
        }
        if !key_args.is_empty() {
            return bad(
                format!("origin[{i}].key_args"),
                "not used with [origin.s3]: an object is named by its key alone",
            );
        }
        if let Some(f) = &self.credentials_file {
            if f.as_os_str().is_empty() {
                return bad(key("credentials_file"), "must name a file");
            }
        }
        Ok(())
    }

    /// The credentials of `origin[i]`: read from `credentials_file`, or from
    /// `env` (the process environment, outside tests) when no file is named.
    /// Errors name the key and never hold a secret.
    pub(super) fn credentials(&self, i: usize, env: &dyn Fn(&str) -> Option<String>) -> Result<S3Credentials, Bad> {
        let key = |k: &str| format!("origin[{i}].s3.{k}");
        let Some(path) = &self.credentials_file else {
            let get = |name: &str| env(name).filter(|v| !v.is_empty());
            let (Some(id), Some(secret)) = (get(ENV_ACCESS_KEY_ID), get(ENV_SECRET_ACCESS_KEY)) else {
                return bad(
                    key("credentials_file"),
                    format!(
                        "not set, and the environment has no {ENV_ACCESS_KEY_ID} and {ENV_SECRET_ACCESS_KEY}: \
                         an S3 origin needs an access key"
                    ),
                );
            };
            return Ok(S3Credentials {
                access_key_id: id,
                secret_access_key: Secret(secret),
                session_token: get(ENV_SESSION_TOKEN).map(Secret),
                source: "the environment".into(),
            });
        };
        let text = std::fs::read(path)
            .map_err(|e| (key("credentials_file"), format!("cannot read {}: {e}", path.display())))?;
        let text = String::from_utf8(text)
            .map_err(|_| (key("credentials_file"), format!("{} is not UTF-8 text", path.display())))?;
        read_profile(&text, &self.profile, path).map_err(|problem| (key("credentials_file"), problem))
    }
}

/// The profile `profile` of an AWS-style credentials file: `[name]` sections of
/// `key = value` lines, `#` and `;` comment lines. The problem, when there is
/// one, names the file, the profile and the line, never a value.
fn read_profile(text: &str, profile: &str, path: &Path) -> Result<S3Credentials, String> {
    let (mut id, mut secret, mut token) = (None, None, None);
    let mut section: Option<&str> = None;
    let mut found = false;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some(name) = line.strip_prefix('[') {
            let Some(name) = name.strip_suffix(']') else {
                return Err(format!("{} line {}: a section header is written `[name]`", path.display(), n + 1));
            };
            section = Some(name.trim());
            found |= section == Some(profile);
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!("{} line {}: expected `key = value`", path.display(), n + 1));
        };
        if section != Some(profile) {
            continue;
        }
        let v = v.trim().to_string();
        match k.trim().to_ascii_lowercase().as_str() {
            "aws_access_key_id" => id = Some(v),
            "aws_secret_access_key" => secret = Some(v),
            "aws_session_token" => token = Some(v),
            _ => {}
        }
    }
    let at = || format!("{} [{profile}]", path.display());
    if !found {
        return Err(format!("{}: no such profile", at()));
    }
    let id = id.filter(|v| !v.is_empty()).ok_or_else(|| format!("{}: no aws_access_key_id", at()))?;
    let secret = secret.filter(|v| !v.is_empty()).ok_or_else(|| format!("{}: no aws_secret_access_key", at()))?;
    if !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("{}: aws_access_key_id has a character an access key id cannot hold", at()));
    }
    if !secret.bytes().chain(token.iter().flat_map(|t: &String| t.bytes())).all(|b| b.is_ascii_graphic()) {
        return Err(format!("{}: the secret or the session token has a character a header cannot carry", at()));
    }
    Ok(S3Credentials {
        access_key_id: id,
        secret_access_key: Secret(secret),
        session_token: token.filter(|t| !t.is_empty()).map(Secret),
        source: at(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_base_url;

    fn s3(lines: &str) -> S3 {
        toml::from_str(&format!("bucket = \"media\"\nregion = \"us-east-1\"\n{lines}")).unwrap()
    }

    fn urls(list: &[&str]) -> Vec<(String, BaseUrl)> {
        list.iter().map(|u| (u.to_string(), parse_base_url(u).unwrap())).collect()
    }

    #[test]
    fn the_sub_table_is_checked_key_by_key() {
        let ok = urls(&["http://127.0.0.1:8333/", "https://s3.example.net/videos/"]);
        assert_eq!(s3("").validate(0, &ok, &[]), Ok(()));
        assert_eq!(s3("").addressing, Addressing::Path);
        assert_eq!(s3("").profile, "default");
        let err = |s: &S3, u: &[(String, BaseUrl)], args: &[String]| s.validate(2, u, args).unwrap_err().0;
        let mut bad_bucket = s3("");
        bad_bucket.bucket = "a/b".into();
        assert_eq!(err(&bad_bucket, &ok, &[]), "origin[2].s3.bucket");
        let virt = s3("addressing = \"virtual\"");
        assert_eq!(err(&virt, &ok, &[]), "origin[2].urls[0]", "an IP address cannot carry the bucket");
        assert_eq!(virt.validate(2, &urls(&["https://s3.example.net/"]), &[]), Ok(()));
        let mut upper = virt.clone();
        upper.bucket = "Media".into();
        assert_eq!(err(&upper, &urls(&["https://s3.example.net/"]), &[]), "origin[2].s3.bucket");
        let mut no_region = s3("");
        no_region.region = "us east".into();
        assert_eq!(err(&no_region, &ok, &[]), "origin[2].s3.region");
        assert_eq!(err(&s3(""), &urls(&["http://h/a%20b/"]), &[]), "origin[2].urls[0]");
        assert_eq!(err(&s3(""), &ok, &["v".into()]), "origin[2].key_args");
        assert!(toml::from_str::<S3>("bucket = \"b\"\nregion = \"r\"\naddressing = \"dns\"").is_err());
        assert!(toml::from_str::<S3>("bucket = \"b\"\nregion = \"r\"\nsecret = \"x\"").is_err(), "no inline secret");
    }

    #[test]
    fn bucket_and_region_are_required() {
        assert!(toml::from_str::<S3>("bucket = \"media\"").is_err());
        assert!(toml::from_str::<S3>("region = \"us-east-1\"").is_err());
    }

    #[test]
    fn credentials_come_from_the_profile_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("credentials");
        std::fs::write(
            &file,
            "# keys\n[other]\naws_access_key_id = OTHER\naws_secret_access_key = nope\n\n\
             [default]\naws_access_key_id=AKIDEXAMPLE\n  aws_secret_access_key = wJalr/K7MDENG+bPxRfi\n\
             aws_session_token = tok\nregion = us-east-1\n",
        )
        .unwrap();
        let mut t = s3("");
        t.credentials_file = Some(file.clone());
        let c = t.credentials(0, &|_| None).unwrap();
        assert_eq!(c.access_key_id, "AKIDEXAMPLE");
        assert_eq!(c.secret_access_key.0, "wJalr/K7MDENG+bPxRfi");
        assert_eq!(c.session_token.as_ref().map(|t| t.0.as_str()), Some("tok"));
        let shown = format!("{c:?}");
        assert!(!shown.contains("wJalr") && !shown.contains("tok\""), "{shown}");
        assert!(shown.contains("AKIDEXAMPLE"));
        t.profile = "other".into();
        assert_eq!(t.credentials(0, &|_| None).unwrap().access_key_id, "OTHER");
        t.profile = "missing".into();
        let (key, problem) = t.credentials(1, &|_| None).unwrap_err();
        assert_eq!(key, "origin[1].s3.credentials_file");
        assert!(problem.contains("[missing]: no such profile"), "{problem}");

        std::fs::write(&file, "[default]\naws_access_key_id = A\n").unwrap();
        t.profile = "default".into();
        let problem = t.credentials(0, &|_| None).unwrap_err().1;
        assert!(problem.ends_with("no aws_secret_access_key"), "{problem}");
        std::fs::write(&file, "[default]\naws_access_key_id = A\naws_secret_access_key SECRETVALUE\n").unwrap();
        let problem = t.credentials(0, &|_| None).unwrap_err().1;
        assert!(problem.contains("line 3") && !problem.contains("SECRETVALUE"), "{problem}");

        t.credentials_file = Some(dir.path().join("absent"));
        let (key, problem) = t.credentials(0, &|_| None).unwrap_err();
        assert_eq!(key, "origin[0].s3.credentials_file");
        assert!(problem.starts_with("cannot read") && problem.contains("absent"), "{problem}");
    }

    #[test]
    fn without_a_file_credentials_come_from_the_environment() {
        let t = s3("");
        let env = |name: &str| match name {
            ENV_ACCESS_KEY_ID => Some("AKIDENV".to_string()),
            ENV_SECRET_ACCESS_KEY => Some("envsecret".to_string()),
            _ => None,
        };
        let c = t.credentials(0, &env).unwrap();
        assert_eq!((c.access_key_id.as_str(), c.secret_access_key.0.as_str()), ("AKIDENV", "envsecret"));
        assert_eq!((c.session_token, c.source.as_str()), (None, "the environment"));
        let only_id = |name: &str| (name == ENV_ACCESS_KEY_ID).then(|| "AKIDENV".to_string());
        let (key, problem) = t.credentials(4, &only_id).unwrap_err();
        assert_eq!(key, "origin[4].s3.credentials_file");
        assert!(problem.contains(ENV_SECRET_ACCESS_KEY), "{problem}");
    }

    #[test]
    fn the_secret_is_never_in_the_printed_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("credentials");
        std::fs::write(&file, "[default]\naws_access_key_id = AKIDSHOWN\naws_secret_access_key = SuperSecretValue\n")
            .unwrap();
        let text = format!(
            "root = {root:?}\nlisten = [\"127.0.0.1:0\"]\n\
             [[origin]]\nprefix = \"/s3/\"\nurls = [\"http://127.0.0.1:9000/\"]\n\
             [origin.s3]\nbucket = \"media\"\nregion = \"us-east-1\"\ncredentials_file = {file:?}\n\
             [[cache.dirs]]\npath = {root:?}\nmax_size_bytes = 100000000\n",
            root = dir.path(),
        );
        let config = crate::config::Config::from_toml(&text).unwrap();
        config.validate().unwrap();
        let credentials = config.s3_credentials().unwrap();
        assert_eq!(credentials[0].as_ref().unwrap().access_key_id, "AKIDSHOWN");
        let printed = config.to_toml();
        assert!(printed.contains("[origin.s3]") && printed.contains("credentials_file"), "{printed}");
        for shown in [
            printed.clone(),
            format!("{config:?}"),
            format!("{credentials:?}"),
            serde_json::to_string(&config).unwrap(),
        ] {
            assert!(!shown.contains("SuperSecretValue"), "{shown}");
        }
        let again = crate::config::Config::from_toml(&printed).unwrap();
        assert_eq!(again.origin, config.origin, "the printed configuration reads back the same");
        // A file that cannot be read fails validation, naming the key.
        std::fs::remove_file(&file).unwrap();
        let reloaded = crate::config::Config::from_toml(&text).unwrap();
        assert_eq!(reloaded.validate().unwrap_err().0, "origin[0].s3.credentials_file");
    }
}
