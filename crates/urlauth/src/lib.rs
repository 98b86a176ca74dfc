//! Signed URL checks for linerate. No I/O: the inputs are a request's decoded path, its
//! raw query, its `Cookie` field values, the client's address and the current time; the
//! output is a [`Verdict`] whose label fits a metric.
//!
//! Two kinds of [`Policy`]:
//!
//! - [`SecureLink`]: nginx's `secure_link` module. An MD5 over an expression of the
//!   expiry, the path, the client address and a secret, base64url without padding, read
//!   from query arguments. A signer written for nginx keeps working.
//! - [`TokenAuth`]: HMAC-SHA256 tokens in the layout of Akamai's EdgeAuth
//!   (`st=..~exp=..~acl=..~kid=..~hmac=..`), whose ACL of path patterns lets one token
//!   cover a whole HLS/DASH title, carried in a query argument or a cookie.
//!
//! Both accept several keys at once, so keys rotate without a window of failures, and
//! compare digests in constant time. [`Rules`] picks the policy by path prefix.
//! docs/SIGNED-URLS.md is the reference for both formats.
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]

mod acl;
mod args;
mod key;
mod rules;
mod secure_link;
mod token;

use std::net::IpAddr;

pub use key::{Key, KeyError};
pub use rules::{RuleError, Rules};
pub use secure_link::{Expression, ExpressionError, SecureLink, SecureLinkSpec};
pub use token::{TokenAuth, TokenSpec};

/// What a check looks at, borrowed from the request.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The decoded, normalised path, starting with `/`; ending with `/` when the target
    /// named a directory (nginx's `$uri`). A path without the leading `/` is denied.
    pub path: &'a [u8],
    /// The raw query (after `?`, before any `#`), not percent-decoded.
    pub query: Option<&'a [u8]>,
    /// The value of every `Cookie` field of the request, in order.
    pub cookies: &'a [&'a [u8]],
    /// The client's address (an IPv4-mapped IPv6 address counts as the IPv4 one).
    pub client: IpAddr,
    /// The current time, in seconds since the Unix epoch.
    pub now: u64,
}

/// The outcome of a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Serve the request.
    Allow,
    /// Answer 403 Forbidden.
    Deny(Reason),
    /// Answer 410 Gone: a genuine signature for this request whose expiry has passed
    /// (what nginx's `$secure_link` = `"0"` means).
    Expired,
}

/// Why a request was denied (403).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// No signature or token where the policy looks for one.
    Missing,
    /// A signature or token that cannot be parsed: bad base64 or hex, a bad number, an
    /// unknown or repeated field, a required field absent.
    Malformed,
    /// The token names a key id that is not configured.
    UnknownKey,
    /// The digest does not match under any configured key: tampered, or signed with a
    /// key that is not (or no longer) configured.
    BadSignature,
    /// A genuine token whose ACL does not cover the path.
    PathNotCovered,
    /// The policy binds tokens to the client address and the token carries none.
    AddressRequired,
    /// A genuine token bound to another client address.
    AddressMismatch,
    /// A genuine token whose start time (`st`) is still in the future. 403 rather than
    /// 410: the link is not gone, and a client retrying later may succeed.
    NotYetValid,
}

impl Reason {
    /// Every reason, for registering metric label values up front.
    pub const ALL: [Reason; 8] = [
        Reason::Missing,
        Reason::Malformed,
        Reason::UnknownKey,
        Reason::BadSignature,
        Reason::PathNotCovered,
        Reason::AddressRequired,
        Reason::AddressMismatch,
        Reason::NotYetValid,
    ];

    /// A stable `snake_case` name, for metric labels and logs.
    pub fn label(self) -> &'static str {
        match self {
            Reason::Missing => "missing",
            Reason::Malformed => "malformed",
            Reason::UnknownKey => "unknown_key",
            Reason::BadSignature => "bad_signature",
            Reason::PathNotCovered => "path_not_covered",
            Reason::AddressRequired => "address_required",
            Reason::AddressMismatch => "address_mismatch",
            Reason::NotYetValid => "not_yet_valid",
        }
    }
}

impl Verdict {
    /// Every label [`Verdict::label`] can return.
    pub const LABELS: [&'static str; 10] = [
        "allowed",
        "expired",
        "missing",
        "malformed",
        "unknown_key",
        "bad_signature",
        "path_not_covered",
        "address_required",
        "address_mismatch",
        "not_yet_valid",
    ];

    /// The response status for a refusal: 403, or 410 for [`Verdict::Expired`]; `None`
    /// for [`Verdict::Allow`].
    pub fn status(self) -> Option<u16> {
        match self {
            Verdict::Allow => None,
            Verdict::Deny(_) => Some(403),
            Verdict::Expired => Some(410),
        }
    }

    /// This verdict's position in [`Verdict::LABELS`], for per-verdict counters.
    pub fn index(self) -> usize {
        match self {
            Verdict::Allow => 0,
            Verdict::Expired => 1,
            Verdict::Deny(reason) => 2 + reason as usize,
        }
    }

    /// `allowed`, `expired` or the [`Reason::label`]: one metric label value.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Allow => "allowed",
            Verdict::Expired => "expired",
            Verdict::Deny(reason) => reason.label(),
        }
    }

    /// How far a candidate got before it failed: when several tokens are offered (a
    /// query argument and cookies), the answer is the first that allows, else the one
    /// that got furthest (an expired token for this path says more than a stranger's).
    fn rank(self) -> u8 {
        match self {
            Verdict::Deny(reason) => reason as u8,
            Verdict::Expired => Reason::NotYetValid as u8 + 1,
            Verdict::Allow => u8::MAX,
        }
    }
}

/// How requests under one path prefix must be signed.
#[derive(Clone, Debug)]
pub enum Policy {
    /// nginx `secure_link` compatible MD5 links.
    SecureLink(SecureLink),
    /// HMAC-SHA256 tokens with a path ACL.
    Token(TokenAuth),
}

impl Policy {
    /// Checks one request.
    pub fn check(&self, request: &Request<'_>) -> Verdict {
        if request.path.first() != Some(&b'/') {
            return Verdict::Deny(Reason::Malformed);
        }
        match self {
            Policy::SecureLink(policy) => policy.check(request),
            Policy::Token(policy) => policy.check(request),
        }
    }

    /// Names of the query arguments this policy reads its signature from, so that whoever
    /// logs a request can leave their values out.
    pub fn query_args(&self) -> impl Iterator<Item = &str> {
        let (a, b) = match self {
            Policy::SecureLink(policy) => (Some(policy.hash_arg()), policy.expires_arg()),
            Policy::Token(policy) => (policy.query_arg(), None),
        };
        a.into_iter().chain(b)
    }
}

/// A policy that cannot be built, with the key or setting at fault named in its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyError {
    /// A key is unusable.
    Key(KeyError),
    /// Two keys share an id.
    DuplicateKey(String),
    /// A token key's secret is too short for HMAC-SHA256.
    ShortSecret { id: String, len: usize },
    /// The secure_link expression does not parse.
    Expression(ExpressionError),
    /// The expression uses `$secret` and no key is given.
    NoKeys,
    /// Keys are given and the expression has no `$secret` to put them in.
    UnusedKeys,
    /// The expression contains no secret at all (neither `$secret` nor literal text), so
    /// anyone could compute it.
    NoSecret,
    /// The expression uses `$secure_link_expires` and no expiry argument is configured.
    ExpiresWithoutArg,
    /// A token policy needs at least one key.
    NoTokenKeys,
    /// A query argument name that cannot appear in a query as itself.
    BadArgName(String),
    /// A cookie name that is not an RFC 6265 token.
    BadCookieName(String),
    /// A token policy with neither a query argument nor a cookie to read tokens from.
    NoCarrier,
    /// The clock leeway is above `token::MAX_LEEWAY` seconds.
    Leeway(u64),
}

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PolicyError::Key(e) => e.fmt(f),
            PolicyError::DuplicateKey(id) => write!(f, "key `{id}`: the id is used by another key"),
            PolicyError::ShortSecret { id, len } => write!(
                f,
                "key `{id}`: secret is {len} bytes; HMAC-SHA256 keys must be at least {} bytes (32 random bytes recommended)",
                token::MIN_SECRET_BYTES
            ),
            PolicyError::Expression(e) => write!(f, "expression: {e}"),
            PolicyError::NoKeys => write!(f, "the expression uses `$secret` but no key is configured"),
            PolicyError::UnusedKeys => {
                write!(f, "keys are configured but the expression has no `$secret` to put them in")
            }
            PolicyError::NoSecret => write!(
                f,
                "the expression holds no secret (neither `$secret` nor literal text): anyone could compute it"
            ),
            PolicyError::ExpiresWithoutArg => {
                write!(f, "the expression uses `$secure_link_expires` but no expiry argument is configured")
            }
            PolicyError::NoTokenKeys => write!(f, "a token policy needs at least one key"),
            PolicyError::BadArgName(name) => write!(
                f,
                "query argument name `{name}`: must be 1 to 64 of the characters A-Z a-z 0-9 - . _ ~"
            ),
            PolicyError::BadCookieName(name) => {
                write!(f, "cookie name `{name}`: must be 1 to 64 characters of an RFC 6265 token")
            }
            PolicyError::NoCarrier => write!(f, "tokens must be read from a query argument, a cookie, or both"),
            PolicyError::Leeway(secs) => {
                write!(f, "leeway of {secs} s is out of range; must be at most {} s", token::MAX_LEEWAY)
            }
        }
    }
}

impl std::error::Error for PolicyError {}

impl From<KeyError> for PolicyError {
    fn from(e: KeyError) -> Self {
        PolicyError::Key(e)
    }
}

impl From<ExpressionError> for PolicyError {
    fn from(e: ExpressionError) -> Self {
        PolicyError::Expression(e)
    }
}

/// Parses a Unix time written as ASCII digits only (no sign, no spaces), as nginx's
/// `ngx_atotm` does; `None` when empty, not digits, or beyond `u64`.
fn parse_unix(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 20 {
        return None;
    }
    text.iter().try_fold(0u64, |acc, &b| {
        if b.is_ascii_digit() {
            acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_cover_every_verdict() {
        let mut labels: Vec<&str> = Reason::ALL.iter().map(|r| Verdict::Deny(*r).label()).collect();
        labels.push(Verdict::Allow.label());
        labels.push(Verdict::Expired.label());
        labels.sort_unstable();
        let mut all = Verdict::LABELS.to_vec();
        all.sort_unstable();
        assert_eq!(labels, all);
    }

    #[test]
    fn indexes_follow_labels() {
        let all = [Verdict::Allow, Verdict::Expired].into_iter().chain(Reason::ALL.map(Verdict::Deny));
        for (i, verdict) in all.enumerate() {
            assert_eq!(verdict.index(), i);
            assert_eq!(Verdict::LABELS[i], verdict.label());
        }
    }

    #[test]
    fn statuses() {
        assert_eq!(Verdict::Allow.status(), None);
        assert_eq!(Verdict::Expired.status(), Some(410));
        for reason in Reason::ALL {
            assert_eq!(Verdict::Deny(reason).status(), Some(403), "{reason:?}");
        }
    }

    #[test]
    fn ranks_put_expired_above_every_denial() {
        for reason in Reason::ALL {
            assert!(Verdict::Expired.rank() > Verdict::Deny(reason).rank());
        }
        assert!(Verdict::Deny(Reason::PathNotCovered).rank() > Verdict::Deny(Reason::BadSignature).rank());
    }

    #[test]
    fn unix_times() {
        assert_eq!(parse_unix(b"1700000000"), Some(1_700_000_000));
        assert_eq!(parse_unix(b"0001"), Some(1));
        assert_eq!(parse_unix(b"18446744073709551615"), Some(u64::MAX));
        for bad in [&b""[..], b"18446744073709551616", b"+1", b"-1", b" 1", b"1 ", b"1e9", b"0x10"] {
            assert_eq!(parse_unix(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
