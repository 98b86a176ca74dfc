//! HTTPS: rustls for the handshake, then kernel TLS or the user-space record layer.
//!
//! A TLS connection's life:
//!
//! 1. **Handshake** ([`handshake`]): rustls's unbuffered server connection, fed one
//!    whole record at a time, so that when the handshake ends not a byte past the
//!    client's Finished has been read from the socket. Session tickets are sent as
//!    part of the handshake flight.
//! 2. **Hand-over**: `dangerous_into_kernel_connection` gives the traffic secrets and
//!    sequence numbers of both directions, plus a [`rustls::kernel::KernelConnection`]
//!    that keeps the key schedule for TLS 1.3 key updates.
//! 3. **Record protection**, chosen once per connection:
//!    - kernel TLS (`transport::ktls`) when the start-up probe found that the kernel
//!      takes this version and cipher for both directions: the keys go to the socket
//!      (`TCP_ULP "tls"`, `TLS_TX`, `TLS_RX`), heads are sent with `send`, bodies with
//!      `sendfile`, exactly as for plain TCP;
//!    - otherwise the user-space record layer (`transport::usertls`, [`record`]):
//!      file data is read with one `preadv` straight into the payload slots of a
//!      batch of records, sealed in place, and written with one `write`.
//!
//!    Both handle close_notify and alerts; TLS 1.3 key updates are followed in user
//!    space, and end the connection under kernel TLS (whose rekeying depends on the
//!    kernel version). Both stop before the AEAD confidentiality limit.
//!
//! Why not rustls's own writer for the fallback: it copies every record's plaintext
//! into a new allocation before sealing it. Why not the `ktls` crate: it is built on
//! tokio-rustls streams and does not build for musl here; the kernel hand-over is a
//! few setsockopts (`linerate_sys::ktls`) and rustls's `kernel` API gives key updates.

pub mod certs;
pub mod control;
pub mod handshake;
pub mod inbound;
pub mod kernel;
pub mod record;
#[cfg(test)]
pub mod testing;

use std::sync::Arc;

use rustls::crypto::aws_lc_rs::cipher_suite as cs;
use rustls::crypto::CryptoProvider;
use rustls::server::ProducesTickets;
use rustls::ServerConfig;

use crate::config::{self, TlsVersion};
pub use control::Control;
use kernel::KernelProbe;

/// What TLS needs beyond the configuration file, made once per process: the kernel
/// probe and the session ticket keys (kept across reloads so that tickets issued
/// before a reload still resume after it).
pub struct TlsRuntime {
    pub kernel: KernelProbe,
    pub ticketer: Arc<dyn ProducesTickets>,
}

impl TlsRuntime {
    pub fn new(kernel_tls: config::KernelTls) -> anyhow::Result<TlsRuntime> {
        let kernel = match kernel_tls {
            config::KernelTls::Auto => kernel::probe(),
            config::KernelTls::Off => {
                KernelProbe::disabled("kernel TLS is turned off in the configuration (tls.kernel_tls = \"off\")")
            }
        };
        let ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()?;
        Ok(TlsRuntime { kernel, ticketer })
    }
}

/// The TLS part of the settings: immutable, shared by all workers.
pub struct TlsSettings {
    pub server_config: Arc<ServerConfig>,
    pub zerocopy_sendfile: bool,
    /// What the kernel takes (from the start-up probe).
    pub kernel: KernelProbe,
    /// When each certificate expires (the default first).
    pub expiry: Vec<certs::CertExpiry>,
}

/// The cipher suites offered, in the server's order of preference: AES-GCM first
/// (every kernel with kTLS takes it, and CPUs accelerate it), ChaCha20-Poly1305 for
/// clients without AES hardware. ECDHE key exchange only; no CBC, no RSA key transport.
pub fn provider() -> CryptoProvider {
    CryptoProvider {
        cipher_suites: vec![
            cs::TLS13_AES_128_GCM_SHA256,
            cs::TLS13_AES_256_GCM_SHA384,
            cs::TLS13_CHACHA20_POLY1305_SHA256,
            cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        ],
        ..rustls::crypto::aws_lc_rs::default_provider()
    }
}

impl TlsSettings {
    /// Loads the certificates and builds the rustls configuration.
    pub fn new(tls: &config::Tls, runtime: &TlsRuntime) -> Result<TlsSettings, certs::CertError> {
        let provider = Arc::new(provider());
        let mut loaded = Vec::new();
        let (cert, key) = (tls.cert.as_deref(), tls.key.as_deref());
        let (Some(cert), Some(key)) = (cert, key) else {
            return Err(certs::CertError {
                key: "tls.cert".into(),
                path: Default::default(),
                problem: "HTTPS needs tls.cert and tls.key".into(),
            });
        };
        loaded.push(certs::load(cert, key, "tls", &provider)?);
        for (i, extra) in tls.certificates.iter().enumerate() {
            loaded.push(certs::load(&extra.cert, &extra.key, &format!("tls.certificates[{i}]"), &provider)?);
        }
        let now = certs::unix_now();
        for c in &loaded {
            c.expiry.warn_if_expiring(now);
        }
        let versions: &[&rustls::SupportedProtocolVersion] = match tls.min_version {
            TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
            TlsVersion::Tls13 => &[&rustls::version::TLS13],
        };
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .expect("the provider supports both versions")
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(certs::SniResolver::new(&loaded)));
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config.ignore_client_order = true;
        config.ticketer = runtime.ticketer.clone();
        config.session_storage = rustls::server::ServerSessionMemoryCache::new(4096);
        config.enable_secret_extraction = true;
        Ok(TlsSettings {
            server_config: Arc::new(config),
            zerocopy_sendfile: tls.zerocopy_sendfile,
            kernel: runtime.kernel.clone(),
            expiry: loaded.iter().map(|c| c.expiry.clone()).collect(),
        })
    }
}
