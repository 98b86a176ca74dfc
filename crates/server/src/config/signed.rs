//! `[[signed]]`: signed-URL rules by path prefix, their keys and secrets (never
//! shown: [`Secret`]), and the `linerate-urlauth` rules built from them: secrets
//! read from their files, policies built by `linerate-urlauth`, every error naming
//! its key (`signed[0].keys[1].secret_file`). The checks themselves are
//! `linerate-urlauth`'s; `server::conn` calls them between path normalisation and
//! opening the file.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use linerate_urlauth::{Key, Policy, PolicyError, Rules, SecureLink, SecureLinkSpec, TokenAuth, TokenSpec};
use serde::{Deserialize, Serialize};

use super::{bad, Bad};

/// How requests under a signed-URL rule's prefix are checked.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SignedMode {
    /// nginx `secure_link` compatible MD5 links.
    SecureLink,
    /// HMAC-SHA256 tokens with a path ACL.
    Token,
    /// No signature needed (a prefix opened inside a signed one).
    Open,
}

/// One `[[signed]]` rule. Keys that do not apply to its mode are refused; absent
/// ones take the defaults in docs/CONFIG.md.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SignedRule {
    /// The decoded path prefix the rule covers, on segment boundaries.
    pub prefix: String,
    pub mode: SignedMode,
    /// Keys valid at once (rotation); `secure_link` puts each in `$secret`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<SignedKey>,
    /// `secure_link`: the `secure_link_md5` expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expression: Option<String>,
    /// `secure_link`: the query argument holding the hash (`md5`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_arg: Option<String>,
    /// `secure_link`: the query argument holding the expiry (`expires`); empty: links
    /// never expire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_arg: Option<String>,
    /// `token`: the query argument carrying the token (`__token__`); empty: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_arg: Option<String>,
    /// `token`: the cookie carrying the token (`__token__`); empty: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<String>,
    /// `token`: refuse tokens that are not bound to a client address (`ip=`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind_client_address: Option<bool>,
    /// `token`: clock difference with the signers tolerated on `st` and `exp`.
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub leeway: Option<Duration>,
}

/// A signing key: an id and a secret, given inline or in a file of its own.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SignedKey {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<Secret>,
    /// A file whose contents (less one trailing newline) are the secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "SecretEncoding::is_text")]
    pub encoding: SecretEncoding,
}

/// How a secret's text becomes its bytes.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SecretEncoding {
    /// The bytes of the text.
    #[default]
    Text,
    /// Hex digits, two per byte (as EdgeAuth keys are written).
    Hex,
}

impl SecretEncoding {
    fn is_text(&self) -> bool {
        *self == SecretEncoding::Text
    }
}

/// A secret written in the configuration. Never shown: `Debug` and the printed
/// configuration (`--check-config`) say `<redacted>`.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(pub String);

/// What a [`Secret`] prints as.
pub const REDACTED: &str = "<redacted>";

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(REDACTED)
    }
}

/// Builds the rules of a configuration, reading key files. The error is the key at
/// fault (`signed[N].field`) and the problem.
pub(super) fn rules(config: &[SignedRule]) -> Result<Rules, Bad> {
    let mut rules = Rules::new();
    for (i, rule) in config.iter().enumerate() {
        let policy = policy(i, rule)?;
        if let Err(e) = rules.add(&rule.prefix, policy) {
            return bad(format!("signed[{i}].prefix"), e.to_string());
        }
    }
    Ok(rules)
}

fn policy(i: usize, rule: &SignedRule) -> Result<Option<Policy>, Bad> {
    let field = |name: &str| format!("signed[{i}].{name}");
    let set: [(&str, bool); 8] = [
        ("keys", !rule.keys.is_empty()),
        ("expression", rule.expression.is_some()),
        ("hash_arg", rule.hash_arg.is_some()),
        ("expires_arg", rule.expires_arg.is_some()),
        ("query_arg", rule.query_arg.is_some()),
        ("cookie", rule.cookie.is_some()),
        ("bind_client_address", rule.bind_client_address.is_some()),
        ("leeway", rule.leeway.is_some()),
    ];
    let (mode, allowed): (&str, &[&str]) = match rule.mode {
        SignedMode::Open => ("open", &[]),
        SignedMode::SecureLink => ("secure_link", &["keys", "expression", "hash_arg", "expires_arg"]),
        SignedMode::Token => ("token", &["keys", "query_arg", "cookie", "bind_client_address", "leeway"]),
    };
    if let Some((name, _)) = set.iter().find(|(name, present)| *present && !allowed.contains(name)) {
        return bad(field(name), format!("not used with mode = \"{mode}\""));
    }
    let keys = rule.keys.iter().enumerate().map(|(j, k)| key(i, j, k)).collect::<Result<Vec<Key>, Bad>>()?;
    // Which key a policy error is about (for a repeated id, the repetition).
    let key_field = |id: &str| match rule.keys.iter().rposition(|k| k.id == id) {
        Some(j) => field(&format!("keys[{j}]")),
        None => field("keys"),
    };
    match rule.mode {
        SignedMode::Open => Ok(None),
        SignedMode::SecureLink => {
            let Some(expression) = rule.expression.clone() else {
                return bad(field("expression"), "required with mode = \"secure_link\"");
            };
            let defaults = SecureLinkSpec::default();
            let spec = SecureLinkSpec {
                expression,
                keys,
                hash_arg: rule.hash_arg.clone().unwrap_or(defaults.hash_arg),
                expires_arg: match &rule.expires_arg {
                    None => defaults.expires_arg,
                    Some(name) if name.is_empty() => None,
                    Some(name) => Some(name.clone()),
                },
            };
            let hash_arg = spec.hash_arg.clone();
            SecureLink::new(spec).map(|p| Some(Policy::SecureLink(p))).or_else(|e| {
                let at = match &e {
                    PolicyError::Key(_) | PolicyError::NoKeys | PolicyError::UnusedKeys => field("keys"),
                    PolicyError::DuplicateKey(id) => key_field(id),
                    PolicyError::BadArgName(name) if *name == hash_arg => field("hash_arg"),
                    PolicyError::BadArgName(_) => field("expires_arg"),
                    _ => field("expression"),
                };
                bad(at, e.to_string())
            })
        }
        SignedMode::Token => {
            let defaults = TokenSpec::default();
            let carrier = |given: &Option<String>, default: Option<String>| match given {
                None => default,
                Some(name) if name.is_empty() => None,
                Some(name) => Some(name.clone()),
            };
            let spec = TokenSpec {
                keys,
                query_arg: carrier(&rule.query_arg, defaults.query_arg),
                cookie: carrier(&rule.cookie, defaults.cookie),
                require_client_address: rule.bind_client_address.unwrap_or(false),
                leeway: match rule.leeway {
                    Some(d) if d.subsec_nanos() != 0 => return bad(field("leeway"), "must be whole seconds"),
                    Some(d) => d.as_secs(),
                    None => 0,
                },
            };
            TokenAuth::new(spec).map(|p| Some(Policy::Token(p))).or_else(|e| {
                let at = match &e {
                    PolicyError::ShortSecret { id, .. } | PolicyError::DuplicateKey(id) => key_field(id),
                    PolicyError::BadArgName(_) => field("query_arg"),
                    PolicyError::BadCookieName(_) => field("cookie"),
                    PolicyError::NoCarrier => field("query_arg"),
                    PolicyError::Leeway(_) => field("leeway"),
                    _ => field("keys"),
                };
                bad(at, e.to_string())
            })
        }
    }
}

/// One key, its secret read and decoded.
fn key(i: usize, j: usize, k: &SignedKey) -> Result<Key, Bad> {
    let field = |name: &str| format!("signed[{i}].keys[{j}].{name}");
    let text = match (&k.secret, &k.secret_file) {
        (Some(_), Some(_)) => {
            return bad(field("secret"), format!("key `{}`: give `secret` or `secret_file`, not both", k.id))
        }
        (None, None) => return bad(field("secret"), format!("key `{}`: needs `secret` or `secret_file`", k.id)),
        (Some(secret), None) => secret.0.clone().into_bytes(),
        (None, Some(path)) => {
            let mut text = std::fs::read(path).or_else(|e| {
                bad(field("secret_file"), format!("key `{}`: cannot read {}: {e}", k.id, path.display()))
            })?;
            // Files written by `echo` or an editor end with a newline that is not the secret's.
            if text.ends_with(b"\n") {
                text.pop();
                if text.ends_with(b"\r") {
                    text.pop();
                }
            }
            text
        }
    };
    let at = if k.secret.is_some() { "secret" } else { "secret_file" };
    let bytes = match k.encoding {
        SecretEncoding::Text => text,
        SecretEncoding::Hex => match decode_hex(&text) {
            Some(bytes) => bytes,
            None => {
                return bad(field(at), format!("key `{}`: encoding = \"hex\" but the secret is not hex digits", k.id))
            }
        },
    };
    Key::new(k.id.clone(), bytes).or_else(|e| {
        let at = if matches!(e, linerate_urlauth::KeyError::BadId(_)) { "id" } else { at };
        bad(field(at), e.to_string())
    })
}

fn decode_hex(text: &[u8]) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    let digit = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    text.chunks_exact(2).map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Overrides, DEFAULT_LISTEN};

    fn parse(toml: &str) -> Vec<SignedRule> {
        Config::from_toml(toml).unwrap_or_else(|e| panic!("{e:?}")).signed
    }

    fn err(toml: &str) -> (String, String) {
        rules(&parse(toml)).unwrap_err()
    }

    #[test]
    fn builds_rules_of_every_mode() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("k2");
        std::fs::write(&key_file, "k2-secret-fedcba9876543210fedcba\n").unwrap();
        let r = rules(&parse(&format!(
            r#"
            [[signed]]
            prefix = "/premium/"
            mode = "token"
            cookie = ""
            keys = [
              {{ id = "k1", secret = "k1-secret-0123456789abcdef012345" }},
              {{ id = "k2", secret_file = {key_file:?} }},
              {{ id = "edge", secret = "00112233445566778899aabbccddeeff", encoding = "hex" }},
            ]
            [[signed]]
            prefix = "/premium/free/"
            mode = "open"
            [[signed]]
            prefix = "/s/"
            mode = "secure_link"
            expression = "$secure_link_expires$uri$remote_addr secret"
            "#
        )))
        .unwrap();
        let Some(Policy::Token(t)) = r.find(b"/premium/a.mp4") else { panic!("token rule") };
        assert_eq!(t.keys().map(Key::id).collect::<Vec<_>>(), ["k1", "k2", "edge"]);
        assert_eq!((t.query_arg(), t.cookie()), (Some("__token__"), None));
        assert!(r.find(b"/premium/free/a.mp4").is_none());
        let Some(Policy::SecureLink(s)) = r.find(b"/s/link") else { panic!("secure_link rule") };
        assert_eq!((s.hash_arg(), s.expires_arg()), ("md5", Some("expires")));
        assert!(r.find(b"/other").is_none());
    }

    #[test]
    fn secrets_from_files_lose_one_newline_and_decode_hex() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("k");
        for (contents, encoding, want) in [
            ("abc\n", "text", &b"abc"[..]),
            ("abc\r\n", "text", b"abc"),
            ("abc\n\n", "text", b"abc\n"),
            ("abc", "text", b"abc"),
            ("00ff10\n", "hex", &[0x00, 0xff, 0x10]),
            ("00FF10", "hex", &[0x00, 0xff, 0x10]),
        ] {
            std::fs::write(&file, contents).unwrap();
            let k = SignedKey {
                id: "k".into(),
                secret: None,
                secret_file: Some(file.clone()),
                encoding: if encoding == "hex" { SecretEncoding::Hex } else { SecretEncoding::Text },
            };
            // Equal keys compare their secrets, so this checks the bytes without exposing them.
            assert_eq!(key(0, 0, &k).unwrap(), Key::new("k", want.to_vec()).unwrap(), "{contents:?}");
        }
    }

    #[test]
    fn errors_name_the_key() {
        let token = "[[signed]]\nprefix = \"/p/\"\nmode = \"token\"\n";
        let long = "keys = [{ id = \"k1\", secret = \"k1-secret-0123456789abcdef012345\" }";
        let cases: &[(String, &str, &str)] = &[
            (
                format!("{token}{long}, {{ id = \"k2\", secret = \"short\" }}]"),
                "signed[0].keys[1]",
                "key `k2`: secret is 5 bytes",
            ),
            (
                format!("{token}{long}, {{ id = \"k1\", secret = \"k1-secret-0123456789abcdef012345\" }}]"),
                "signed[0].keys[1]",
                "key `k1`",
            ),
            (format!("{token}keys = [{{ id = \"k 1\", secret = \"x\" }}]"), "signed[0].keys[0].id", "key id `k 1`"),
            (
                format!("{token}keys = [{{ id = \"k1\" }}]"),
                "signed[0].keys[0].secret",
                "key `k1`: needs `secret` or `secret_file`",
            ),
            (
                format!("{token}keys = [{{ id = \"k1\", secret = \"x\", secret_file = \"/x\" }}]"),
                "signed[0].keys[0].secret",
                "not both",
            ),
            (
                format!("{token}keys = [{{ id = \"k1\", secret_file = \"/nonexistent/k1\" }}]"),
                "signed[0].keys[0].secret_file",
                "key `k1`: cannot read /nonexistent/k1",
            ),
            (
                format!("{token}keys = [{{ id = \"k1\", secret = \"xyz0\", encoding = \"hex\" }}]"),
                "signed[0].keys[0].secret",
                "not hex",
            ),
            (token.to_string(), "signed[0].keys", "at least one key"),
            (format!("{token}{long}]\ncookie = \"a;b\""), "signed[0].cookie", "cookie name `a;b`"),
            (
                format!("{token}{long}]\ncookie = \"\"\nquery_arg = \"\""),
                "signed[0].query_arg",
                "query argument, a cookie",
            ),
            (format!("{token}{long}]\nleeway = \"2h\""), "signed[0].leeway", "out of range"),
            (format!("{token}{long}]\nleeway = \"1500ms\""), "signed[0].leeway", "whole seconds"),
            (
                format!("{token}{long}]\nexpression = \"$uri s\""),
                "signed[0].expression",
                "not used with mode = \"token\"",
            ),
            (
                "[[signed]]\nprefix = \"/p/\"\nmode = \"secure_link\"\nexpression = \"$uri $http_host s\"".into(),
                "signed[0].expression",
                "unknown variable `$http_host`",
            ),
            ("[[signed]]\nprefix = \"/p/\"\nmode = \"secure_link\"".into(), "signed[0].expression", "required"),
            (
                "[[signed]]\nprefix = \"/p/\"\nmode = \"secure_link\"\nexpression = \"$uri $secret\"".into(),
                "signed[0].keys",
                "no key",
            ),
            (
                "[[signed]]\nprefix = \"/p/\"\nmode = \"secure_link\"\nexpression = \"$uri s\"\nhash_arg = \"a b\""
                    .into(),
                "signed[0].hash_arg",
                "`a b`",
            ),
            (
                "[[signed]]\nprefix = \"/p/\"\nmode = \"secure_link\"\nexpression = \"$uri s\"\ncookie = \"c\"".into(),
                "signed[0].cookie",
                "not used with mode = \"secure_link\"",
            ),
            (
                "[[signed]]\nprefix = \"/p/\"\nmode = \"open\"\nkeys = [{ id = \"a\", secret = \"b\" }]".into(),
                "signed[0].keys",
                "not used",
            ),
            ("[[signed]]\nprefix = \"p/\"\nmode = \"open\"".into(), "signed[0].prefix", "must start with `/`"),
            (
                "[[signed]]\nprefix = \"/p/\"\nmode = \"open\"\n[[signed]]\nprefix = \"/p\"\nmode = \"open\"".into(),
                "signed[1].prefix",
                "the same prefix as `/p/`",
            ),
        ];
        for (toml, key, problem) in cases {
            let (k, p) = err(toml);
            assert_eq!(k, *key, "{toml}\n{p}");
            assert!(p.contains(problem), "{toml}\n{p}");
        }
        // The mode itself, and unknown keys, are caught when parsing.
        let (k, p) = Config::from_toml("[[signed]]\nprefix = \"/p/\"\nmode = \"md5\"").unwrap_err();
        assert!(k.starts_with("signed") && p.contains("unknown variant"), "{k} {p}");
        let (k, p) = Config::from_toml("[[signed]]\nprefix = \"/p/\"\nmode = \"open\"\nsecert = \"x\"").unwrap_err();
        assert!(k.starts_with("signed") && p.contains("unknown field `secert`"), "{k} {p}");
    }

    #[test]
    fn inline_secrets_are_never_printed() {
        let text = "root = \"/srv\"\n[[signed]]\nprefix = \"/p/\"\nmode = \"token\"\nkeys = [{ id = \"k1\", secret = \"do-not-print-0123456789\" }]\n";
        let config = Config::from_toml(text).unwrap();
        assert_eq!(config.signed[0].keys[0].secret.as_ref().unwrap().0, "do-not-print-0123456789");
        for shown in [config.to_toml(), format!("{config:?}"), format!("{config:#?}")] {
            assert!(!shown.contains("do-not-print"), "{shown}");
            assert!(shown.contains(crate::config::REDACTED), "{shown}");
        }
    }

    /// Validation builds the rules and the server takes them (`Settings::new` calls
    /// `Config::signed_rules`), so a load reads the secret files once; a reload loads
    /// again and reads them again, which is how keys rotate.
    #[test]
    fn a_load_reads_secret_files_once_and_the_next_load_again() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("k1");
        std::fs::write(&secret, "k1-secret-0123456789abcdef012345\n").unwrap();
        let file = dir.path().join("linerate.toml");
        let keys = format!("keys = [{{ id = \"k1\", secret_file = {secret:?} }}]");
        let text = format!("root = {:?}\n[[signed]]\nprefix = \"/p/\"\nmode = \"token\"\n{keys}\n", dir.path());
        std::fs::write(&file, text).unwrap();
        let config = Config::load(Some(&file), &Overrides::default()).unwrap();
        std::fs::remove_file(&secret).unwrap();
        let rules = config.signed_rules().expect("the rules validation built");
        let Some(Policy::Token(t)) = rules.find(b"/p/a.mp4") else { panic!("token rule") };
        assert_eq!(t.keys().map(Key::id).collect::<Vec<_>>(), ["k1"]);
        for shown in [config.to_toml(), format!("{config:?}")] {
            assert!(!shown.contains("k1-secret"), "{shown}");
        }
        let e = Config::load(Some(&file), &Overrides::default()).expect_err("the next load reads the file again");
        assert_eq!(e.key, "signed[0].keys[0].secret_file");
        assert!(e.problem.contains("cannot read"), "{}", e.problem);
    }

    /// Rules are handed out only for the tables they were built from: a configuration
    /// whose `signed` changed after validation gets rules of its own.
    #[test]
    fn rules_follow_the_tables_they_were_built_from() {
        let base = Config {
            root: Some(std::env::temp_dir()),
            listen: vec![DEFAULT_LISTEN.parse().unwrap()],
            ..Config::default()
        };
        base.validate().unwrap();
        let signed = parse("[[signed]]\nprefix = \"/s/\"\nmode = \"secure_link\"\nexpression = \"$uri secret\"\n");
        let changed = Config { signed, ..base.clone() };
        assert!(base.signed_rules().unwrap().find(b"/s/a").is_none());
        assert!(matches!(changed.signed_rules().unwrap().find(b"/s/a"), Some(Policy::SecureLink(_))));
    }
}
