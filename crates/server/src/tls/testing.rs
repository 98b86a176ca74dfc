//! Test helpers for the TLS modules: certificates and in-memory sessions.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::aws_lc_rs::cipher_suite as cs;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, ClientConnection, ExtractedSecrets, ServerConfig, ServerConnection, SupportedCipherSuite};

use super::record::Protocol;

/// Every suite the server offers, with its protocol version.
pub const ALL_SUITES: &[(SupportedCipherSuite, Protocol)] = &[
    (cs::TLS13_AES_128_GCM_SHA256, Protocol::Tls13),
    (cs::TLS13_AES_256_GCM_SHA384, Protocol::Tls13),
    (cs::TLS13_CHACHA20_POLY1305_SHA256, Protocol::Tls13),
    (cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, Protocol::Tls12),
    (cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, Protocol::Tls12),
    (cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, Protocol::Tls12),
];

/// Writes a self-signed ECDSA P-256 certificate for `names`, valid from
/// `from_days` to `until_days` relative to now, as `<stem>.pem` and `<stem>.key`.
pub fn write_cert(dir: &Path, stem: &str, names: &[&str], from_days: i64, until_days: i64) -> (PathBuf, PathBuf) {
    let mut params = rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now + time::Duration::days(from_days);
    params.not_after = now + time::Duration::days(until_days);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let (c, k) = (dir.join(format!("{stem}.pem")), dir.join(format!("{stem}.key")));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

/// A completed in-memory handshake with `suite`: the client side, and the server
/// side's extracted secrets (what the transports start from).
pub fn establish(suite: SupportedCipherSuite) -> (ClientConnection, ExtractedSecrets) {
    let (server_config, client_config) = configs(suite);
    let mut client = ClientConnection::new(client_config, "localhost".try_into().unwrap()).unwrap();
    let mut server = ServerConnection::new(server_config).unwrap();
    while client.is_handshaking() || server.is_handshaking() || client.wants_write() || server.wants_write() {
        let mut buf = Vec::new();
        client.write_tls(&mut buf).unwrap();
        server.read_tls(&mut &buf[..]).unwrap();
        server.process_new_packets().unwrap();
        let mut buf = Vec::new();
        server.write_tls(&mut buf).unwrap();
        client.read_tls(&mut &buf[..]).unwrap();
        client.process_new_packets().unwrap();
    }
    assert_eq!(server.negotiated_cipher_suite(), Some(suite));
    #[allow(deprecated)] // the buffered API is fine for an in-memory test session
    let secrets = server.dangerous_extract_secrets().unwrap();
    (client, secrets)
}

/// A server configuration (a fresh self-signed certificate for "localhost", secret
/// extraction on) and a client configuration that trusts it and offers only `suite`.
pub fn configs(suite: SupportedCipherSuite) -> (Arc<ServerConfig>, Arc<ClientConfig>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap().self_signed(&key).unwrap();
    let cert_der = CertificateDer::from(cert.der().to_vec());
    let key_der = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();

    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut server_config = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert_der.clone()], key_der)
        .unwrap();
    server_config.enable_secret_extraction = true;
    server_config.send_tls13_tickets = 0;

    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert_der).unwrap();
    let client_provider =
        Arc::new(rustls::crypto::CryptoProvider { cipher_suites: vec![suite], ..(*provider).clone() });
    let version = suite.version();
    let client_config = ClientConfig::builder_with_provider(client_provider)
        .with_protocol_versions(&[version])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (Arc::new(server_config), Arc::new(client_config))
}
