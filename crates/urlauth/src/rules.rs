//! Which policy applies to a path: rules by path prefix, the longest match wins.
//!
//! A prefix matches whole segments: `/premium/` (or `/premium`) covers `/premium`,
//! `/premium/` and everything below, not `/premium-trailers/`. A rule without a policy
//! opens its prefix inside a signed one (`/premium/` signed, `/premium/free/` open).

use std::fmt;

use crate::{Policy, Request, Verdict};

#[derive(Clone, Debug)]
struct Rule {
    /// As configured, for messages.
    prefix: Box<str>,
    /// Without its leading and trailing `/`: empty for the root.
    segments: Box<[u8]>,
    policy: Option<Policy>,
}

impl Rule {
    fn matches(&self, relative: &[u8]) -> bool {
        let p = &self.segments[..];
        relative.starts_with(p) && (p.is_empty() || relative.len() == p.len() || relative[p.len()] == b'/')
    }
}

/// The signed-URL rules of a server, by path prefix.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    /// Longest prefix first.
    rules: Vec<Rule>,
}

/// A rule that cannot be added.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleError {
    /// The prefix can never equal the start of a normalised path.
    BadPrefix { prefix: String, why: &'static str },
    /// Another rule has the same prefix.
    Duplicate { prefix: String, other: String },
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleError::BadPrefix { prefix, why } => write!(f, "prefix `{prefix}`: {why}"),
            RuleError::Duplicate { prefix, other } => {
                write!(f, "prefix `{prefix}`: the same prefix as `{other}`")
            }
        }
    }
}

impl std::error::Error for RuleError {}

impl Rules {
    pub fn new() -> Rules {
        Rules::default()
    }

    /// Adds a rule: requests under `prefix` (decoded, as in the path, starting with `/`)
    /// must satisfy `policy`; `None` lets them through unsigned.
    pub fn add(&mut self, prefix: &str, policy: Option<Policy>) -> Result<(), RuleError> {
        let bad = |why| Err(RuleError::BadPrefix { prefix: prefix.to_string(), why });
        let Some(rest) = prefix.strip_prefix('/') else {
            return bad("must start with `/`");
        };
        let segments = rest.strip_suffix('/').unwrap_or(rest);
        if !segments.is_empty() {
            for segment in segments.split('/') {
                match segment {
                    "" => return bad("has an empty segment (`//`), which paths never have"),
                    "." | ".." => return bad("has a `.` or `..` segment, which paths never have"),
                    s if s.contains('\0') => return bad("contains NUL"),
                    _ => {}
                }
            }
        }
        if let Some(other) = self.rules.iter().find(|r| &*r.segments == segments.as_bytes()) {
            return Err(RuleError::Duplicate { prefix: prefix.to_string(), other: other.prefix.to_string() });
        }
        let rule = Rule { prefix: prefix.into(), segments: segments.as_bytes().into(), policy };
        let at = self.rules.partition_point(|r| r.segments.len() >= rule.segments.len());
        self.rules.insert(at, rule);
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The policy for `path` (with or without its leading `/`): the longest matching
    /// prefix's, `None` when no rule matches or the matching rule is open.
    pub fn find(&self, path: &[u8]) -> Option<&Policy> {
        let relative = path.strip_prefix(b"/").unwrap_or(path);
        self.rules.iter().find(|r| r.matches(relative)).and_then(|r| r.policy.as_ref())
    }

    /// Checks `request` against the policy for its path; `None` when it needs none.
    pub fn check(&self, request: &Request<'_>) -> Option<Verdict> {
        self.find(request.path).map(|policy| policy.check(request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Key, SecureLink, SecureLinkSpec};

    fn policy(secret: &str) -> Policy {
        Policy::SecureLink(
            SecureLink::new(SecureLinkSpec {
                expression: "$uri$secret".into(),
                keys: vec![Key::new("k", secret.as_bytes().to_vec()).unwrap()],
                ..Default::default()
            })
            .unwrap(),
        )
    }

    fn which<'r>(rules: &'r Rules, path: &str) -> Option<&'r str> {
        rules.find(path.as_bytes()).map(|p| match p {
            Policy::SecureLink(s) => std::str::from_utf8(s.keys()[0].secret()).unwrap(),
            Policy::Token(_) => unreachable!(),
        })
    }

    #[test]
    fn longest_prefix_on_segment_boundaries() {
        let mut rules = Rules::new();
        rules.add("/premium/", Some(policy("premium"))).unwrap();
        rules.add("/premium/free", None).unwrap();
        rules.add("/premium/free/vip/", Some(policy("vip"))).unwrap();
        rules.add("/public/", None).unwrap();
        for (path, want) in [
            ("/premium", Some("premium")),
            ("/premium/", Some("premium")),
            ("/premium/a/b.m4s", Some("premium")),
            ("premium/a/b.m4s", Some("premium")),
            ("/premium-trailers/a.mp4", None),
            ("/premiumfoo", None),
            ("/premium/free", None),
            ("/premium/free/a.mp4", None),
            ("/premium/freebie.mp4", Some("premium")),
            ("/premium/free/vip/x", Some("vip")),
            ("/public/a", None),
            ("/", None),
            ("/other", None),
        ] {
            assert_eq!(which(&rules, path), want, "{path}");
        }
    }

    #[test]
    fn a_root_rule_covers_everything_else() {
        let mut rules = Rules::new();
        assert!(rules.is_empty());
        rules.add("/public/", None).unwrap();
        rules.add("/", Some(policy("all"))).unwrap();
        assert!(!rules.is_empty());
        assert_eq!(which(&rules, "/"), Some("all"));
        assert_eq!(which(&rules, ""), Some("all"));
        assert_eq!(which(&rules, "/x/y"), Some("all"));
        assert_eq!(which(&rules, "/public/x"), None);
    }

    #[test]
    fn refuses_prefixes_no_path_has() {
        let mut rules = Rules::new();
        for bad in ["premium/", "", "/a//b/", "/a/../b", "/./a", "/a/.", "/a\0b"] {
            assert!(matches!(rules.add(bad, None), Err(RuleError::BadPrefix { .. })), "{bad:?}");
        }
        rules.add("/premium/", None).unwrap();
        assert_eq!(
            rules.add("/premium", None),
            Err(RuleError::Duplicate { prefix: "/premium".into(), other: "/premium/".into() })
        );
        assert_eq!(
            rules.add("/a//", None).unwrap_err().to_string(),
            "prefix `/a//`: has an empty segment (`//`), which paths never have"
        );
    }

    #[test]
    fn check_applies_the_rule() {
        let mut rules = Rules::new();
        rules.add("/premium/", Some(policy("premium"))).unwrap();
        let request = |path: &'static str| Request {
            path: path.as_bytes(),
            query: None,
            cookies: &[],
            client: "192.0.2.1".parse().unwrap(),
            now: 0,
        };
        assert_eq!(rules.check(&request("/public/a.mp4")), None);
        assert_eq!(rules.check(&request("/premium/a.mp4")), Some(Verdict::Deny(crate::Reason::Missing)));
        assert_eq!(
            rules.check(&request("premium/a.mp4")),
            Some(Verdict::Deny(crate::Reason::Malformed)),
            "a path without its `/` is refused, not passed"
        );
    }
}
