//! HMAC-SHA256 tokens in the layout of Akamai's EdgeAuth:
//!
//! ```text
//! [ip=<addr>~][st=<unix>~]exp=<unix>~acl=<pattern>[!<pattern>...][~id=<text>][~data=<text>][~kid=<key id>]~hmac=<64 lowercase hex>
//! ```
//!
//! `hmac` is HMAC-SHA256, under the key named by `kid`, of every byte before `~hmac=`,
//! exactly as sent. Fields other than `hmac` may come in any order, each at most once.
//! A token without `kid` is tried against every key (EdgeAuth's own signer writes none).
//! `id` and `data` are EdgeAuth's session id and payload: covered by the HMAC, not
//! interpreted. The ACL syntax is in the `acl` module.

use std::net::IpAddr;

use hmac::{Hmac, Mac as _};
use sha2::Sha256;
use subtle::ConstantTimeEq as _;

use crate::args::{cookies, query_arg, valid_arg_name, valid_cookie_name};
use crate::key::{duplicate_id, Key};
use crate::{acl, parse_unix, PolicyError, Reason, Request, Verdict};

/// Shortest secret accepted for a token key.
pub(crate) const MIN_SECRET_BYTES: usize = 16;
/// Largest clock leeway accepted, in seconds (one hour).
pub(crate) const MAX_LEEWAY: u64 = 3600;
/// Longest token looked at; longer ones are malformed.
pub(crate) const MAX_TOKEN_BYTES: usize = 4096;
/// Most tokens tried for one request (the query argument and cookies together): each
/// costs an HMAC, and a request may carry many cookies.
pub(crate) const MAX_CANDIDATES: usize = 8;

const HMAC_FIELD: &[u8] = b"~hmac=";
const HMAC_HEX: usize = 64;

/// What a [`TokenAuth`] policy is built from.
#[derive(Clone, Debug)]
pub struct TokenSpec {
    /// Keys tokens may be signed with (at least one; secrets of 16 bytes or more).
    pub keys: Vec<Key>,
    /// Query argument carrying the token: `__token__`. `None`: not read from the query.
    pub query_arg: Option<String>,
    /// Cookie carrying the token: `__token__`. `None`: not read from cookies.
    pub cookie: Option<String>,
    /// Deny tokens without `ip=` (a token with `ip=` is bound to it either way).
    pub require_client_address: bool,
    /// Seconds of clock difference with the signer tolerated on `st` and `exp`.
    pub leeway: u64,
}

impl Default for TokenSpec {
    fn default() -> Self {
        TokenSpec {
            keys: Vec::new(),
            query_arg: Some("__token__".into()),
            cookie: Some("__token__".into()),
            require_client_address: false,
            leeway: 0,
        }
    }
}

/// A key ready to verify: the HMAC state after the key is absorbed, cloned per token.
#[derive(Clone)]
struct TokenKey {
    key: Key,
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.key.fmt(f)
    }
}

/// An HMAC-SHA256 token policy.
#[derive(Clone, Debug)]
pub struct TokenAuth {
    keys: Vec<TokenKey>,
    query_arg: Option<Box<str>>,
    cookie: Option<Box<str>>,
    require_client_address: bool,
    leeway: u64,
}

/// A token's fields, borrowed from it.
#[derive(Debug, PartialEq, Eq)]
struct Parsed<'t> {
    /// Everything before `~hmac=`: what the HMAC covers.
    signed: &'t [u8],
    hmac: [u8; 32],
    ip: Option<IpAddr>,
    st: Option<u64>,
    exp: u64,
    acl: &'t [u8],
    kid: Option<&'t [u8]>,
}

impl TokenAuth {
    pub fn new(spec: TokenSpec) -> Result<TokenAuth, PolicyError> {
        if spec.keys.is_empty() {
            return Err(PolicyError::NoTokenKeys);
        }
        if let Some(id) = duplicate_id(&spec.keys) {
            return Err(PolicyError::DuplicateKey(id.to_string()));
        }
        if let Some(key) = spec.keys.iter().find(|k| k.secret().len() < MIN_SECRET_BYTES) {
            return Err(PolicyError::ShortSecret { id: key.id().to_string(), len: key.secret().len() });
        }
        if let Some(name) = spec.query_arg.as_ref().filter(|n| !valid_arg_name(n)) {
            return Err(PolicyError::BadArgName(name.clone()));
        }
        if let Some(name) = spec.cookie.as_ref().filter(|n| !valid_cookie_name(n)) {
            return Err(PolicyError::BadCookieName(name.clone()));
        }
        if spec.query_arg.is_none() && spec.cookie.is_none() {
            return Err(PolicyError::NoCarrier);
        }
        if spec.leeway > MAX_LEEWAY {
            return Err(PolicyError::Leeway(spec.leeway));
        }
        let keys = spec
            .keys
            .into_iter()
            .map(|key| {
                let mac = Hmac::<Sha256>::new_from_slice(key.secret()).expect("HMAC takes keys of any length");
                TokenKey { key, mac }
            })
            .collect();
        Ok(TokenAuth {
            keys,
            query_arg: spec.query_arg.map(Into::into),
            cookie: spec.cookie.map(Into::into),
            require_client_address: spec.require_client_address,
            leeway: spec.leeway,
        })
    }

    pub fn query_arg(&self) -> Option<&str> {
        self.query_arg.as_deref()
    }

    pub fn cookie(&self) -> Option<&str> {
        self.cookie.as_deref()
    }

    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.keys.iter().map(|k| &k.key)
    }

    pub(crate) fn check(&self, request: &Request<'_>) -> Verdict {
        let from_query = self
            .query_arg
            .as_ref()
            .and_then(|name| query_arg(request.query.unwrap_or_default(), name.as_bytes()))
            .filter(|v| !v.is_empty());
        let from_cookies = self
            .cookie
            .as_ref()
            .into_iter()
            .flat_map(|name| cookies(request.cookies, name.as_bytes()))
            .filter(|v| !v.is_empty());
        let mut best = Verdict::Deny(Reason::Missing);
        for token in from_query.into_iter().chain(from_cookies).take(MAX_CANDIDATES) {
            let verdict = self.check_one(token, request);
            if verdict == Verdict::Allow {
                return verdict;
            }
            if verdict.rank() > best.rank() {
                best = verdict;
            }
        }
        best
    }

    fn check_one(&self, token: &[u8], request: &Request<'_>) -> Verdict {
        let Some(t) = parse(token) else {
            return Verdict::Deny(Reason::Malformed);
        };
        let genuine = match t.kid {
            Some(kid) => match self.keys.iter().find(|k| k.key.id().as_bytes() == kid) {
                Some(key) => verify(key, &t),
                None => return Verdict::Deny(Reason::UnknownKey),
            },
            // Every key is tried, so the time taken does not tell which one matched.
            None => self.keys.iter().fold(subtle::Choice::from(0), |acc, key| acc | verify(key, &t)),
        };
        if !bool::from(genuine) {
            return Verdict::Deny(Reason::BadSignature);
        }
        if !acl::covers(t.acl, request.path) {
            return Verdict::Deny(Reason::PathNotCovered);
        }
        match t.ip {
            Some(ip) if ip.to_canonical() != request.client.to_canonical() => {
                return Verdict::Deny(Reason::AddressMismatch)
            }
            None if self.require_client_address => return Verdict::Deny(Reason::AddressRequired),
            _ => {}
        }
        if t.st.is_some_and(|st| request.now.saturating_add(self.leeway) < st) {
            return Verdict::Deny(Reason::NotYetValid);
        }
        if request.now > t.exp.saturating_add(self.leeway) {
            return Verdict::Expired;
        }
        Verdict::Allow
    }
}

fn verify(key: &TokenKey, t: &Parsed<'_>) -> subtle::Choice {
    let mut mac = key.mac.clone();
    mac.update(t.signed);
    let tag: [u8; 32] = mac.finalize().into_bytes().into();
    tag.ct_eq(&t.hmac)
}

/// Splits a token into its fields; `None` when it is not well formed.
fn parse(token: &[u8]) -> Option<Parsed<'_>> {
    if token.len() > MAX_TOKEN_BYTES || token.len() < HMAC_FIELD.len() + HMAC_HEX + 1 {
        return None;
    }
    let (signed, tail) = token.split_at(token.len() - HMAC_FIELD.len() - HMAC_HEX);
    let hex = tail.strip_prefix(HMAC_FIELD)?;
    let mut hmac = [0u8; 32];
    for (out, pair) in hmac.iter_mut().zip(hex.chunks_exact(2)) {
        *out = lower_hex(pair[0])? << 4 | lower_hex(pair[1])?;
    }
    let (mut ip, mut st, mut exp, mut acl_field, mut kid, mut id, mut data) =
        (None, None, None, None, None, None, None);
    for field in signed.split(|&b| b == b'~') {
        let eq = field.iter().position(|&b| b == b'=')?;
        let (name, value) = (&field[..eq], &field[eq + 1..]);
        let slot = match name {
            b"ip" => &mut ip,
            b"st" => &mut st,
            b"exp" => &mut exp,
            b"acl" => &mut acl_field,
            b"kid" => &mut kid,
            b"id" => &mut id,
            b"data" => &mut data,
            _ => return None,
        };
        if slot.replace(value).is_some() {
            return None;
        }
    }
    let acl = acl_field.filter(|a| acl::valid(a))?;
    let ip = match ip {
        Some(text) => Some(std::str::from_utf8(text).ok()?.parse::<IpAddr>().ok()?),
        None => None,
    };
    let st = match st {
        Some(text) => Some(parse_unix(text)?),
        None => None,
    };
    let exp = parse_unix(exp?)?;
    if kid.is_some_and(|k| !crate::key::valid_id(k)) {
        return None;
    }
    Some(Parsed { signed, hmac, ip, st, exp, acl, kid })
}

/// Lowercase hex only: an uppercase digit would be a second spelling of the same token.
fn lower_hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "93c62bd8f8ae89aed805e5891dadeed41d3a216e4729a9ed8d3642a8fe9798a7";

    fn with_hmac(signed: &str) -> Vec<u8> {
        format!("{signed}~hmac={HEX}").into_bytes()
    }

    #[test]
    fn parses_fields_in_any_order() {
        let token = with_hmac("kid=k1~acl=/a/*!/b.mp4~exp=20~st=10~ip=2001:db8::1~id=s~data=x");
        let t = parse(&token).unwrap();
        assert_eq!(t.signed, &token[..token.len() - 70]);
        assert_eq!(t.hmac[0], 0x93);
        assert_eq!(t.hmac[31], 0xa7);
        assert_eq!(t.ip, Some("2001:db8::1".parse().unwrap()));
        assert_eq!((t.st, t.exp, t.acl, t.kid), (Some(10), 20, &b"/a/*!/b.mp4"[..], Some(&b"k1"[..])));
        let token = with_hmac("exp=20~acl=/*");
        let t = parse(&token).unwrap();
        assert_eq!((t.ip, t.st, t.kid), (None, None, None));
    }

    #[test]
    fn refuses_malformed_tokens() {
        for signed in [
            "acl=/*",                 // no exp
            "exp=20",                 // no acl
            "exp=20~acl=/*~exp=21",   // repeated
            "exp=20~acl=/*~hmac=00",  // hmac twice
            "exp=20~acl=/*~url=/a",   // unknown field
            "exp=20~acl=/*~",         // empty field
            "exp=20~~acl=/*",         // empty field
            "exp=20~acl",             // no `=`
            "exp=-1~acl=/*",          // not digits
            "exp=20~st=1e3~acl=/*",   // not digits
            "exp=20~acl=a/*",         // pattern without `/`
            "exp=20~acl=/a%2",        // bad escape
            "exp=20~acl=/*~ip=1.2.3", // bad address
            "exp=20~acl=/*~kid=",     // empty key id
            "exp=20~acl=/*~kid=a b",  // bad key id
            "EXP=20~acl=/*",          // names are lowercase
        ] {
            assert_eq!(parse(&with_hmac(signed)), None, "{signed}");
        }
        let good = with_hmac("exp=20~acl=/*");
        let upper = String::from_utf8(good.clone()).unwrap().replace("93c6", "93C6");
        assert_eq!(parse(upper.as_bytes()), None, "uppercase hex");
        assert_eq!(parse(&good[..good.len() - 1]), None, "short hex");
        assert_eq!(parse(&[&good[..], b"0"].concat()), None, "long hex");
        assert_eq!(parse(&good[good.len() - 70..]), None, "hmac alone");
        assert_eq!(parse(format!("exp=20~acl=/*~hmac:{HEX}").as_bytes()), None);
        let long = with_hmac(&format!("exp=20~acl=/{}", "a".repeat(MAX_TOKEN_BYTES)));
        assert_eq!(parse(&long), None, "too long");
    }

    #[test]
    fn policy_validation() {
        let key = |id: &str, len: usize| Key::new(id, vec![7u8; len]).unwrap();
        let spec = |keys| TokenSpec { keys, ..Default::default() };
        assert!(TokenAuth::new(spec(vec![key("a", 16), key("b", 64)])).is_ok());
        assert_eq!(TokenAuth::new(spec(vec![])).unwrap_err(), PolicyError::NoTokenKeys);
        assert_eq!(
            TokenAuth::new(spec(vec![key("a", 32), key("b", 15)])).unwrap_err(),
            PolicyError::ShortSecret { id: "b".into(), len: 15 }
        );
        assert_eq!(
            TokenAuth::new(spec(vec![key("a", 32), key("a", 32)])).unwrap_err(),
            PolicyError::DuplicateKey("a".into())
        );
        let none = TokenSpec { query_arg: None, cookie: None, ..spec(vec![key("a", 32)]) };
        assert_eq!(TokenAuth::new(none).unwrap_err(), PolicyError::NoCarrier);
        let bad = TokenSpec { cookie: Some("a;b".into()), ..spec(vec![key("a", 32)]) };
        assert_eq!(TokenAuth::new(bad).unwrap_err(), PolicyError::BadCookieName("a;b".into()));
        let bad = TokenSpec { query_arg: Some("a=b".into()), ..spec(vec![key("a", 32)]) };
        assert_eq!(TokenAuth::new(bad).unwrap_err(), PolicyError::BadArgName("a=b".into()));
        let bad = TokenSpec { leeway: MAX_LEEWAY + 1, ..spec(vec![key("a", 32)]) };
        assert_eq!(TokenAuth::new(bad).unwrap_err(), PolicyError::Leeway(MAX_LEEWAY + 1));
        let message = PolicyError::ShortSecret { id: "b".into(), len: 15 }.to_string();
        assert!(message.starts_with("key `b`: secret is 15 bytes"), "{message}");
    }

    #[test]
    fn debug_hides_secrets() {
        let auth = TokenAuth::new(TokenSpec {
            keys: vec![Key::new("k1", b"do-not-print-this-secret".to_vec()).unwrap()],
            ..Default::default()
        })
        .unwrap();
        let shown = format!("{auth:?}");
        assert!(shown.contains("k1") && !shown.contains("do-not-print"), "{shown}");
    }
}
