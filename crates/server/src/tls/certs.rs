//! Certificates: loading, checking, and choosing one by SNI.
//!
//! Every problem a certificate can have is found at start-up (or reload), not at
//! the first handshake: an unreadable file, a file with no certificate or no key, a
//! key of a type the provider cannot sign with, a key that does not belong to the
//! certificate, a certificate that is expired or not yet valid.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// A certificate problem, naming the configuration key and the file.
#[derive(Debug)]
pub struct CertError {
    pub key: String,
    pub path: PathBuf,
    pub problem: String,
}

impl fmt::Display for CertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key `{}` ({}): {}", self.key, self.path.display(), self.problem)
    }
}

impl std::error::Error for CertError {}

/// A usable certificate: the chain with its signing key, and the DNS names it covers.
#[derive(Debug)]
pub struct LoadedCert {
    pub certified: Arc<CertifiedKey>,
    /// Lower-case DNS names from the subjectAltName extension (`*.example.com` allowed).
    pub names: Vec<String>,
    /// Seconds until the leaf certificate expires.
    pub expires_in_secs: i64,
    /// When it expires (Unix seconds), and where it came from: for the expiry
    /// warnings and metrics.
    pub expiry: CertExpiry,
}

/// A loaded certificate's end of validity, and which one it is.
#[derive(Clone, Debug, PartialEq)]
pub struct CertExpiry {
    /// The configuration key: `tls` or `tls.certificates[N]`.
    pub key: String,
    pub file: PathBuf,
    /// Its first DNS name, or empty.
    pub name: String,
    /// Unix seconds.
    pub not_after: i64,
}

/// A certificate within this many days of its end is warned about (at load, and
/// daily while it runs) so that a renewal that did not run is noticed in time.
pub const EXPIRY_WARNING_DAYS: i64 = 14;

impl CertExpiry {
    /// Whole days left at `now` (Unix seconds); negative once expired.
    pub fn days_left(&self, now: i64) -> i64 {
        (self.not_after - now).div_euclid(86400)
    }

    /// Logs a warning when it is within [`EXPIRY_WARNING_DAYS`]; says whether it did.
    pub fn warn_if_expiring(&self, now: i64) -> bool {
        let days = self.days_left(now);
        if days >= EXPIRY_WARNING_DAYS {
            return false;
        }
        let until = http_date(self.not_after);
        if self.not_after <= now {
            tracing::error!(key = %self.key, file = %self.file.display(), name = %self.name, "certificate expired on {until}: renew it and reload (kill -HUP)");
        } else {
            tracing::warn!(key = %self.key, file = %self.file.display(), name = %self.name, days_left = days, "certificate expires in {days} days ({until}): has its renewal run?");
        }
        true
    }
}

/// Now, in Unix seconds.
pub fn unix_now() -> i64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// Loads and checks one certificate and key. `key_prefix` is the configuration key
/// they came from (`tls` or `tls.certificates[1]`), for error messages.
pub fn load(cert: &Path, key: &Path, key_prefix: &str, provider: &CryptoProvider) -> Result<LoadedCert, CertError> {
    let cert_err = |problem: String| CertError { key: format!("{key_prefix}.cert"), path: cert.to_owned(), problem };
    let key_err = |problem: String| CertError { key: format!("{key_prefix}.key"), path: key.to_owned(), problem };

    let pem = std::fs::read(cert).map_err(|e| cert_err(format!("cannot read: {e}")))?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| cert_err(format!("not a PEM certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err(cert_err("contains no certificate".into()));
    }
    let pem = std::fs::read(key).map_err(|e| key_err(format!("cannot read: {e}")))?;
    let private =
        PrivateKeyDer::from_pem_slice(&pem).map_err(|e| key_err(format!("no usable PEM private key: {e}")))?;
    let signing = provider
        .key_provider
        .load_private_key(private)
        .map_err(|e| key_err(format!("unsupported private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|_| key_err(format!("does not match the certificate in {}", cert.display())))?;

    let (names, not_before, not_after) = inspect_leaf(&certified.cert[0]).map_err(cert_err)?;
    let now = unix_now();
    if now < not_before {
        return Err(cert_err(format!("not valid before {}", http_date(not_before))));
    }
    if now > not_after {
        return Err(cert_err(format!("expired on {}", http_date(not_after))));
    }
    let expiry = CertExpiry {
        key: key_prefix.to_string(),
        file: cert.to_owned(),
        name: names.first().cloned().unwrap_or_default(),
        not_after,
    };
    Ok(LoadedCert { certified: Arc::new(certified), names, expires_in_secs: not_after - now, expiry })
}

fn http_date(secs: i64) -> String {
    let mut buf = [0u8; linerate_http::date::HTTP_DATE_LEN];
    linerate_http::date::format_secs(secs, &mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// The leaf's DNS names (subjectAltName, else the subject CN) and validity.
fn inspect_leaf(der: &CertificateDer<'_>) -> Result<(Vec<String>, i64, i64), String> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der.as_ref()).map_err(|e| format!("cannot parse the certificate: {e}"))?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(n) = name {
                names.push(n.to_ascii_lowercase());
            }
        }
    }
    if names.is_empty() {
        if let Some(cn) = cert.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()) {
            names.push(cn.to_ascii_lowercase());
        }
    }
    let validity = cert.validity();
    Ok((names, validity.not_before.timestamp(), validity.not_after.timestamp()))
}

/// Chooses the certificate for a handshake: an exact SNI match, then a wildcard
/// match (`*.example.com` covers `a.example.com`), then the default certificate.
/// Clients without SNI (or with a name nothing covers) get the default, as nginx's
/// default server does.
pub struct SniResolver {
    default: Arc<CertifiedKey>,
    exact: HashMap<String, Arc<CertifiedKey>>,
    wildcard: HashMap<String, Arc<CertifiedKey>>,
}

impl SniResolver {
    /// `certs[0]` is the default. Earlier certificates win when names collide.
    pub fn new(certs: &[LoadedCert]) -> SniResolver {
        let mut exact = HashMap::new();
        let mut wildcard = HashMap::new();
        for c in certs {
            for name in &c.names {
                match name.strip_prefix("*.") {
                    Some(suffix) => wildcard.entry(suffix.to_string()).or_insert_with(|| c.certified.clone()),
                    None => exact.entry(name.clone()).or_insert_with(|| c.certified.clone()),
                };
            }
        }
        SniResolver { default: certs[0].certified.clone(), exact, wildcard }
    }

    fn choose(&self, server_name: Option<&str>) -> Arc<CertifiedKey> {
        let Some(name) = server_name else { return self.default.clone() };
        let name = name.to_ascii_lowercase();
        if let Some(c) = self.exact.get(&name) {
            return c.clone();
        }
        if let Some((_, parent)) = name.split_once('.') {
            if let Some(c) = self.wildcard.get(parent) {
                return c.clone();
            }
        }
        self.default.clone()
    }
}

impl fmt::Debug for SniResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SniResolver")
            .field("names", &self.exact.keys().collect::<Vec<_>>())
            .field("wildcards", &self.wildcard.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        SEEN_SNI.with(|seen| *seen.borrow_mut() = hello.server_name().map(Box::from));
        Some(self.choose(hello.server_name()))
    }
}

thread_local! {
    /// The server name of the ClientHello the resolver saw last on this thread.
    static SEEN_SNI: std::cell::RefCell<Option<Box<str>>> = const { std::cell::RefCell::new(None) };
}

/// The server name the resolver saw during the last call into rustls on this
/// thread, taken (rustls has no accessor for it on an unbuffered connection). Sound
/// because the resolver runs synchronously inside `process_tls_records`, and the
/// handshake takes the name right after that call, before any await lets another
/// connection's handshake run on the same worker thread.
pub fn take_seen_sni() -> Option<Box<str>> {
    SEEN_SNI.with(|seen| seen.borrow_mut().take())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::testing::write_cert;

    fn provider() -> CryptoProvider {
        rustls::crypto::aws_lc_rs::default_provider()
    }

    #[test]
    fn loads_and_checks() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = write_cert(dir.path(), "a", &["a.example", "*.wild.example"], 0, 365);
        let loaded = load(&cert, &key, "tls", &provider()).unwrap();
        assert_eq!(loaded.names, ["a.example", "*.wild.example"]);
        assert!(loaded.expires_in_secs > 300 * 86400);
        assert_eq!(loaded.expiry.key, "tls");
        assert_eq!(loaded.expiry.name, "a.example");
        assert!((364..=365).contains(&loaded.expiry.days_left(unix_now())), "{:?}", loaded.expiry);
        assert!(!loaded.expiry.warn_if_expiring(unix_now()));
        let (soon, soon_key) = write_cert(dir.path(), "soon", &["soon.example"], -80, 10);
        let soon = load(&soon, &soon_key, "tls.certificates[2]", &provider()).unwrap();
        assert!((9..=10).contains(&soon.expiry.days_left(unix_now())), "{:?}", soon.expiry);
        assert!(soon.expiry.warn_if_expiring(unix_now()));
        assert_eq!(soon.expiry.days_left(soon.expiry.not_after + 1), -1, "expired: negative");

        // Mismatched key.
        let (_, other_key) = write_cert(dir.path(), "b", &["b.example"], 0, 365);
        let e = load(&cert, &other_key, "tls", &provider()).unwrap_err();
        assert_eq!(e.key, "tls.key");
        assert!(e.problem.contains("does not match"), "{e}");
        // Expired and not yet valid.
        let (old, old_key) = write_cert(dir.path(), "old", &["old.example"], -30, -1);
        let e = load(&old, &old_key, "tls.certificates[0]", &provider()).unwrap_err();
        assert_eq!(e.key, "tls.certificates[0].cert");
        assert!(e.problem.contains("expired on"), "{e}");
        let (new, new_key) = write_cert(dir.path(), "new", &["new.example"], 10, 20);
        assert!(load(&new, &new_key, "tls", &provider()).unwrap_err().problem.contains("not valid before"));
        // Unreadable and empty files.
        let e = load(&dir.path().join("missing.pem"), &key, "tls", &provider()).unwrap_err();
        assert!(e.problem.contains("cannot read"), "{e}");
        std::fs::write(dir.path().join("empty.pem"), "").unwrap();
        let e = load(&dir.path().join("empty.pem"), &key, "tls", &provider()).unwrap_err();
        assert!(e.problem.contains("no certificate"), "{e}");
        let e = load(&cert, &cert, "tls", &provider()).unwrap_err();
        assert_eq!(e.key, "tls.key", "{e}");
    }

    #[test]
    fn sni_choice() {
        let dir = tempfile::tempdir().unwrap();
        let (c1, k1) = write_cert(dir.path(), "d", &["default.example"], 0, 30);
        let (c2, k2) = write_cert(dir.path(), "v", &["video.example", "*.cdn.example"], 0, 30);
        let certs = vec![load(&c1, &k1, "tls", &provider()).unwrap(), load(&c2, &k2, "tls", &provider()).unwrap()];
        let r = SniResolver::new(&certs);
        let is = |name: Option<&str>, want: usize| Arc::ptr_eq(&r.choose(name), &certs[want].certified);
        assert!(is(None, 0));
        assert!(is(Some("VIDEO.example"), 1));
        assert!(is(Some("edge1.cdn.example"), 1));
        assert!(is(Some("a.b.cdn.example"), 0), "a wildcard covers one label only");
        assert!(is(Some("unknown.example"), 0));
    }
}
