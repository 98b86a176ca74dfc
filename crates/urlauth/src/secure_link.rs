//! nginx `secure_link` compatible links.
//!
//! nginx:
//!
//! ```nginx
//! secure_link $arg_md5,$arg_expires;
//! secure_link_md5 "$secure_link_expires$uri$remote_addr secret";
//! if ($secure_link = "")  { return 403; }
//! if ($secure_link = "0") { return 410; }
//! ```
//!
//! The same here is an [`Expression`] `"$secure_link_expires$uri$remote_addr secret"`
//! (or `... $secret` with the secret in a [`Key`], so several can be valid at once) with
//! `hash_arg = "md5"` and `expires_arg = "expires"`. As in nginx: the hash is the
//! base64url MD5 of the expression, without padding (a trailing `==` is tolerated); the
//! expiry is a Unix time in ASCII digits, and a link is expired once the time is past it;
//! an expiry argument that is absent, empty, zero or not digits denies the request (403).
//! Stricter than nginx: a hash whose unused trailing bits are not zero (which no encoder
//! produces) is refused, so every change to the hash text is a different hash.

use std::fmt;
use std::io::Write as _;
use std::net::IpAddr;

use base64::Engine as _;
use md5::{Digest as _, Md5};
use subtle::ConstantTimeEq as _;

use crate::args::{query_arg, valid_arg_name};
use crate::key::{duplicate_id, Key};
use crate::{parse_unix, PolicyError, Reason, Request, Verdict};

/// One piece of an expression.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Literal(Box<[u8]>),
    /// `$secure_link_expires`: the expiry argument's text as sent.
    Expires,
    /// `$uri`: the decoded, normalised path.
    Uri,
    /// `$remote_addr`: the client address as text.
    RemoteAddr,
    /// `$secret`: each key's secret in turn.
    Secret,
}

/// A `secure_link_md5` expression, parsed once at configuration load.
#[derive(Clone, PartialEq, Eq)]
pub struct Expression {
    parts: Vec<Part>,
}

/// Why an expression does not parse. Offsets are byte offsets of the `$`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExpressionError {
    /// The expression is empty.
    Empty,
    /// `$` not followed by a variable name (nginx has no escape for a literal `$`).
    NoName { offset: usize },
    /// `${` without its `}`.
    Unclosed { offset: usize },
    /// A variable this server does not provide.
    Unknown { name: String, offset: usize },
}

const VARIABLES: &str = "`$secure_link_expires`, `$uri`, `$remote_addr` and `$secret`";

impl fmt::Display for ExpressionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExpressionError::Empty => write!(f, "the expression is empty"),
            ExpressionError::NoName { offset } => {
                write!(f, "`$` at byte {offset} is not followed by a variable name (supported: {VARIABLES})")
            }
            ExpressionError::Unclosed { offset } => write!(f, "`${{` at byte {offset} has no closing `}}`"),
            ExpressionError::Unknown { name, offset } => write!(
                f,
                "unknown variable `${name}` at byte {offset}; supported: {VARIABLES}, with literal text around them"
            ),
        }
    }
}

impl std::error::Error for ExpressionError {}

impl Expression {
    /// Parses nginx's syntax: literal text with `$name` or `${name}` variables, a name
    /// being letters, digits and `_`.
    pub fn parse(text: &str) -> Result<Expression, ExpressionError> {
        let bytes = text.as_bytes();
        if bytes.is_empty() {
            return Err(ExpressionError::Empty);
        }
        let mut parts = Vec::new();
        let mut literal = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] != b'$' {
                literal.push(bytes[i]);
                i += 1;
                continue;
            }
            let offset = i;
            let braced = bytes.get(i + 1) == Some(&b'{');
            let start = if braced { i + 2 } else { i + 1 };
            let len = bytes[start..].iter().take_while(|b| b.is_ascii_alphanumeric() || **b == b'_').count();
            let end = start + len;
            if braced && bytes.get(end) != Some(&b'}') {
                return Err(if len == 0 && end < bytes.len() {
                    ExpressionError::NoName { offset }
                } else {
                    ExpressionError::Unclosed { offset }
                });
            }
            if len == 0 {
                return Err(ExpressionError::NoName { offset });
            }
            let part = match &text[start..end] {
                "secure_link_expires" => Part::Expires,
                "uri" => Part::Uri,
                "remote_addr" => Part::RemoteAddr,
                "secret" => Part::Secret,
                name => return Err(ExpressionError::Unknown { name: name.to_string(), offset }),
            };
            if !literal.is_empty() {
                parts.push(Part::Literal(std::mem::take(&mut literal).into()));
            }
            parts.push(part);
            i = if braced { end + 1 } else { end };
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal.into()));
        }
        Ok(Expression { parts })
    }

    fn uses(&self, part: &Part) -> bool {
        self.parts.contains(part)
    }

    fn has_literal(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Literal(_)))
    }

    /// MD5 of the expression for one request and one secret.
    fn digest(&self, expires: &[u8], uri: &[u8], addr: &[u8], secret: &[u8]) -> [u8; 16] {
        let mut md5 = Md5::new();
        for part in &self.parts {
            md5.update(match part {
                Part::Literal(text) => text,
                Part::Expires => expires,
                Part::Uri => uri,
                Part::RemoteAddr => addr,
                Part::Secret => secret,
            });
        }
        md5.finalize().into()
    }
}

impl fmt::Debug for Expression {
    /// Shows the shape, never literal text (it usually is the secret).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut list = f.debug_list();
        for part in &self.parts {
            match part {
                Part::Literal(text) => list.entry(&format_args!("<{} literal bytes>", text.len())),
                Part::Expires => list.entry(&format_args!("$secure_link_expires")),
                Part::Uri => list.entry(&format_args!("$uri")),
                Part::RemoteAddr => list.entry(&format_args!("$remote_addr")),
                Part::Secret => list.entry(&format_args!("$secret")),
            };
        }
        list.finish()
    }
}

/// What a [`SecureLink`] policy is built from.
#[derive(Clone, Debug)]
pub struct SecureLinkSpec {
    /// The `secure_link_md5` expression.
    pub expression: String,
    /// Keys whose secrets take the place of `$secret`, each tried in turn. Empty when the
    /// secret is literal text in the expression.
    pub keys: Vec<Key>,
    /// The query argument holding the hash (nginx's `$arg_md5`): `md5`.
    pub hash_arg: String,
    /// The query argument holding the expiry (nginx's `$arg_expires`): `expires`. `None`:
    /// links never expire (nginx's `secure_link $arg_md5;`).
    pub expires_arg: Option<String>,
}

impl Default for SecureLinkSpec {
    fn default() -> Self {
        SecureLinkSpec {
            expression: String::new(),
            keys: Vec::new(),
            hash_arg: "md5".into(),
            expires_arg: Some("expires".into()),
        }
    }
}

/// An nginx `secure_link` compatible policy.
#[derive(Clone, Debug)]
pub struct SecureLink {
    expression: Expression,
    keys: Vec<Key>,
    hash_arg: Box<str>,
    expires_arg: Option<Box<str>>,
}

impl SecureLink {
    pub fn new(spec: SecureLinkSpec) -> Result<SecureLink, PolicyError> {
        let expression = Expression::parse(&spec.expression)?;
        for name in std::iter::once(&spec.hash_arg).chain(&spec.expires_arg) {
            if !valid_arg_name(name) {
                return Err(PolicyError::BadArgName(name.clone()));
            }
        }
        if let Some(id) = duplicate_id(&spec.keys) {
            return Err(PolicyError::DuplicateKey(id.to_string()));
        }
        match (expression.uses(&Part::Secret), spec.keys.is_empty()) {
            (true, true) => return Err(PolicyError::NoKeys),
            (false, false) => return Err(PolicyError::UnusedKeys),
            (false, true) if !expression.has_literal() => return Err(PolicyError::NoSecret),
            _ => {}
        }
        if expression.uses(&Part::Expires) && spec.expires_arg.is_none() {
            return Err(PolicyError::ExpiresWithoutArg);
        }
        Ok(SecureLink {
            expression,
            keys: spec.keys,
            hash_arg: spec.hash_arg.into(),
            expires_arg: spec.expires_arg.map(Into::into),
        })
    }

    pub fn hash_arg(&self) -> &str {
        &self.hash_arg
    }

    pub fn expires_arg(&self) -> Option<&str> {
        self.expires_arg.as_deref()
    }

    pub fn keys(&self) -> &[Key] {
        &self.keys
    }

    pub(crate) fn check(&self, request: &Request<'_>) -> Verdict {
        let query = request.query.unwrap_or_default();
        let Some(hash) = query_arg(query, self.hash_arg.as_bytes()).filter(|v| !v.is_empty()) else {
            return Verdict::Deny(Reason::Missing);
        };
        let (expires_text, expires) = match &self.expires_arg {
            None => (&b""[..], None),
            Some(name) => match query_arg(query, name.as_bytes()).filter(|v| !v.is_empty()) {
                None => return Verdict::Deny(Reason::Missing),
                Some(text) => match parse_unix(text) {
                    Some(t) if t > 0 => (text, Some(t)),
                    _ => return Verdict::Deny(Reason::Malformed),
                },
            },
        };
        let Some(given) = decode_hash(hash) else {
            return Verdict::Deny(Reason::Malformed);
        };
        let mut addr_buf = [0u8; 64];
        let addr = if self.expression.uses(&Part::RemoteAddr) { addr_text(request.client, &mut addr_buf) } else { &[] };
        let genuine = if self.keys.is_empty() {
            self.expression.digest(expires_text, request.path, addr, &[]).ct_eq(&given)
        } else {
            // Every key is tried, so the time taken does not tell which one matched.
            self.keys.iter().fold(subtle::Choice::from(0), |acc, key| {
                acc | self.expression.digest(expires_text, request.path, addr, key.secret()).ct_eq(&given)
            })
        };
        if !bool::from(genuine) {
            return Verdict::Deny(Reason::BadSignature);
        }
        match expires {
            Some(t) if t < request.now => Verdict::Expired,
            _ => Verdict::Allow,
        }
    }
}

/// Decodes a base64url MD5: 22 characters, or 24 ending in `==`, canonical.
fn decode_hash(text: &[u8]) -> Option<[u8; 16]> {
    let text = match text {
        [head @ .., b'=', b'='] if head.len() == 22 => head,
        _ => text,
    };
    if text.len() != 22 {
        return None;
    }
    let mut out = [0u8; 18];
    match base64::engine::general_purpose::URL_SAFE_NO_PAD.decode_slice(text, &mut out) {
        Ok(16) => Some(out[..16].try_into().expect("16 bytes")),
        _ => None,
    }
}

/// The client address as nginx's `$remote_addr` shows it: dotted IPv4, RFC 5952 IPv6.
fn addr_text(addr: IpAddr, buf: &mut [u8; 64]) -> &[u8] {
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    write!(cursor, "{}", addr.to_canonical()).expect("an address fits 64 bytes");
    let len = cursor.position() as usize;
    &buf[..len]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nginx_expressions() {
        let e = Expression::parse("$secure_link_expires$uri$remote_addr secret").unwrap();
        assert_eq!(e.parts, [Part::Expires, Part::Uri, Part::RemoteAddr, Part::Literal(b" secret".to_vec().into())]);
        let e = Expression::parse("${uri}x${secret}").unwrap();
        assert_eq!(e.parts, [Part::Uri, Part::Literal(b"x".to_vec().into()), Part::Secret]);
        let e = Expression::parse("only text").unwrap();
        assert_eq!(e.parts, [Part::Literal(b"only text".to_vec().into())]);
        assert_eq!(Expression::parse("$uri$uri").unwrap().parts, [Part::Uri, Part::Uri]);
    }

    #[test]
    fn refuses_what_it_cannot_evaluate() {
        let unknown = |name: &str, offset| Err(ExpressionError::Unknown { name: name.into(), offset });
        assert_eq!(Expression::parse("$uri$http_user_agent s"), unknown("http_user_agent", 4));
        assert_eq!(Expression::parse("${host}s"), unknown("host", 0));
        assert_eq!(Expression::parse("$1s"), unknown("1s", 0));
        assert_eq!(Expression::parse("$uris"), unknown("uris", 0), "names run as far as nginx reads them");
        assert_eq!(Expression::parse("a$"), Err(ExpressionError::NoName { offset: 1 }));
        assert_eq!(Expression::parse("a$ b"), Err(ExpressionError::NoName { offset: 1 }));
        assert_eq!(Expression::parse("${uri"), Err(ExpressionError::Unclosed { offset: 0 }));
        assert_eq!(Expression::parse("${}"), Err(ExpressionError::NoName { offset: 0 }));
        assert_eq!(Expression::parse(""), Err(ExpressionError::Empty));
        let message = Expression::parse("$uri $arg_x").unwrap_err().to_string();
        assert!(message.contains("`$arg_x`") && message.contains("$remote_addr"), "{message}");
    }

    #[test]
    fn debug_hides_literal_text() {
        let e = Expression::parse("$uri my-secret").unwrap();
        let shown = format!("{e:?}");
        assert!(shown.contains("$uri") && !shown.contains("my-secret"), "{shown}");
    }

    #[test]
    fn policy_validation() {
        let key = |id: &str| Key::new(id, b"s3cret".to_vec()).unwrap();
        let spec = |expr: &str, keys: Vec<Key>| SecureLinkSpec { expression: expr.into(), keys, ..Default::default() };
        assert!(SecureLink::new(spec("$secure_link_expires$uri secret", vec![])).is_ok());
        assert!(SecureLink::new(spec("$secure_link_expires$uri $secret", vec![key("a"), key("b")])).is_ok());
        assert_eq!(SecureLink::new(spec("$uri $secret", vec![])).unwrap_err(), PolicyError::NoKeys);
        assert_eq!(SecureLink::new(spec("$uri secret", vec![key("a")])).unwrap_err(), PolicyError::UnusedKeys);
        assert_eq!(SecureLink::new(spec("$uri$secure_link_expires", vec![])).unwrap_err(), PolicyError::NoSecret);
        assert_eq!(
            SecureLink::new(spec("$uri$secret", vec![key("a"), key("a")])).unwrap_err(),
            PolicyError::DuplicateKey("a".into())
        );
        let no_expiry = SecureLinkSpec { expires_arg: None, ..spec("$secure_link_expires$uri s", vec![]) };
        assert_eq!(SecureLink::new(no_expiry).unwrap_err(), PolicyError::ExpiresWithoutArg);
        let bad_arg = SecureLinkSpec { hash_arg: "m d5".into(), ..spec("$uri s", vec![]) };
        assert_eq!(SecureLink::new(bad_arg).unwrap_err(), PolicyError::BadArgName("m d5".into()));
        let bad_arg = SecureLinkSpec { expires_arg: Some("e&x".into()), ..spec("$uri s", vec![]) };
        assert_eq!(SecureLink::new(bad_arg).unwrap_err(), PolicyError::BadArgName("e&x".into()));
        assert!(matches!(
            SecureLink::new(spec("$uri $host", vec![])).unwrap_err(),
            PolicyError::Expression(ExpressionError::Unknown { .. })
        ));
    }

    #[test]
    fn hash_decoding() {
        // `echo -n '2147483647/s/link127.0.0.1 secret' | openssl md5 -binary | openssl base64 | tr +/ -_ | tr -d =`
        // (the example in nginx's documentation) gives `_e4Nc3iduzkWRm01TBBNYw`; the hex digest
        // (`openssl md5` without -binary) is fdee0d73789dbb3916466d354c104d63.
        let want = [0xfd, 0xee, 0x0d, 0x73, 0x78, 0x9d, 0xbb, 0x39, 0x16, 0x46, 0x6d, 0x35, 0x4c, 0x10, 0x4d, 0x63];
        assert_eq!(decode_hash(b"_e4Nc3iduzkWRm01TBBNYw"), Some(want));
        assert_eq!(decode_hash(b"_e4Nc3iduzkWRm01TBBNYw=="), Some(want), "padding tolerated");
        for bad in [
            &b"_e4Nc3iduzkWRm01TBBNYw="[..],
            b"_e4Nc3iduzkWRm01TBBNY",
            b"_e4Nc3iduzkWRm01TBBNYwA",
            b"/e4Nc3iduzkWRm01TBBNYw",
            b"_e4Nc3iduzkWRm01TBBNYx",
            b"_e4Nc3iduzkWRm01TBBNYw=A",
        ] {
            assert_eq!(decode_hash(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn addresses_as_nginx_prints_them() {
        let mut buf = [0u8; 64];
        let text =
            |s: &str, buf: &mut [u8; 64]| String::from_utf8(addr_text(s.parse().unwrap(), buf).to_vec()).unwrap();
        assert_eq!(text("127.0.0.1", &mut buf), "127.0.0.1");
        assert_eq!(text("2001:0db8:0:0:0:0:0:4", &mut buf), "2001:db8::4");
        assert_eq!(text("::ffff:192.0.2.1", &mut buf), "192.0.2.1");
        assert_eq!(
            text("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", &mut buf),
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
        );
    }
}
