//! The rustls client configuration: which certificates the bench trusts.
//!
//! By default the system's trust store (`rustls-native-certs`); `--cacert FILE` trusts
//! the PEM certificates in FILE instead (a test CA, a self-signed edge); `--insecure`
//! accepts any certificate for any name. Even then the handshake signature is still
//! checked against the presented certificate, so the bench does the same
//! cryptographic work per handshake as a verifying client would.
//!
//! Session resumption is on by default, as in browsers and players: each session (one
//! viewer) keeps an in-memory session store ([`with_resumption`]) for its
//! connections, so its second connection to an origin resumes with a TLS 1.3 ticket
//! or a TLS 1.2 ticket or session ID. `--no-resume` makes every handshake a full one.
//!
//! One store per viewer rather than one per worker: rustls's store keeps at most 8
//! TLS 1.3 tickets per server, each used once, so a worker whose many connections
//! end together (a server answering them in one batch) and reconnect together
//! would find tickets for 8 of them only, and report full handshakes that no real
//! viewer would make.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{Resumption, Tls12Resumption};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// Where trust comes from.
pub(crate) enum Trust<'a> {
    System,
    CaFile(&'a Path),
    AnyCertificate,
}

/// A client configuration for HTTP/1.1 over TLS 1.2/1.3 with the aws-lc-rs provider.
pub(crate) fn client_config(trust: Trust<'_>) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let mut config = match trust {
        Trust::AnyCertificate => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
            .with_no_client_auth(),
        Trust::CaFile(path) => {
            let mut roots = rustls::RootCertStore::empty();
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .and_then(|it| it.collect::<Result<_, _>>())
                .with_context(|| format!("reading certificates from {}", path.display()))?;
            anyhow::ensure!(!certs.is_empty(), "{} holds no PEM certificate", path.display());
            for cert in certs {
                roots.add(cert).with_context(|| format!("a certificate in {} is not usable", path.display()))?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        Trust::System => {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = rustls::RootCertStore::empty();
            let (added, _ignored) = roots.add_parsable_certificates(found.certs);
            anyhow::ensure!(
                added > 0,
                "no trusted certificates found in the system store; use --cacert FILE or --insecure"
            );
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Size of one viewer's store: rustls keeps 8 TLS 1.3 tickets (and one TLS 1.2
/// session) per server name, so this remembers 8 origins.
const STORE_SIZE: usize = 64;

/// A copy of `config` for one viewer: with its own in-memory session store (tickets
/// and TLS 1.2 session IDs) when `resume`, without resumption otherwise. That
/// viewer's connections share it; each viewer starts cold.
pub(crate) fn with_resumption(config: &rustls::ClientConfig, resume: bool) -> Arc<rustls::ClientConfig> {
    let mut config = config.clone();
    config.resumption = if resume {
        Resumption::in_memory_sessions(STORE_SIZE).tls12_resumption(Tls12Resumption::SessionIdOrTickets)
    } else {
        Resumption::disabled()
    };
    Arc::new(config)
}

/// Accepts any certificate, for test servers with self-signed certificates
/// (`--insecure`). Signatures are still verified.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
