//! A test certificate authority and a rustls client, for the HTTPS tests.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

pub struct TestCa {
    pub dir: tempfile::TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
    /// The CA certificate, for `curl --cacert` and `openssl -CAfile`.
    pub ca_pem: PathBuf,
}

impl TestCa {
    pub fn new() -> TestCa {
        let dir = tempfile::tempdir().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "linerate test CA");
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let ca_pem = dir.path().join("ca.pem");
        std::fs::write(&ca_pem, ca.pem()).unwrap();
        TestCa { dir, ca, ca_pem }
    }

    /// Issues an ECDSA P-256 certificate for `names`, valid from `from_days` to
    /// `until_days` around now; writes `<stem>.pem` and `<stem>.key` and returns them.
    pub fn issue(&self, stem: &str, names: &[&str], from_days: i64, until_days: i64) -> (PathBuf, PathBuf) {
        let mut params = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, names[0]);
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now + time::Duration::days(from_days);
        params.not_after = now + time::Duration::days(until_days);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let (c, k) = (self.dir.path().join(format!("{stem}.pem")), self.dir.path().join(format!("{stem}.key")));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    pub fn ca_arg(&self) -> &str {
        self.ca_pem.to_str().unwrap()
    }
}

/// Starts linerate with one HTTPS listener on a certificate for `localhost` from
/// `ca`, serving `root`; `extra` are more `serve` arguments.
pub fn start_server(ca: &TestCa, root: &Path, extra: &[&str]) -> super::Server {
    let (cert, key) = ca.issue("localhost", &["localhost"], -1, 30);
    let mut args = vec!["--root", root.to_str().unwrap(), "--tls-listen", "127.0.0.1:0"];
    args.extend(["--cert", cert.to_str().unwrap(), "--key", key.to_str().unwrap()]);
    args.extend_from_slice(extra);
    super::Server::start(&args)
}

/// A rustls client connection to `addr`, verifying `name` against the CA at `ca`.
pub fn connect(addr: SocketAddr, name: &str, ca: &Path) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    connect_with(addr, name, ca, None)
}

/// [`connect`] with the client socket's receive buffer set to `rcvbuf` bytes first
/// (a small one makes the server's send buffer fill quickly).
pub fn connect_with(
    addr: SocketAddr,
    name: &str,
    ca: &Path,
    rcvbuf: Option<usize>,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let conn = rustls::ClientConnection::new(Arc::new(config), name.to_string().try_into().unwrap()).unwrap();
    let sock = match rcvbuf {
        None => TcpStream::connect(addr).unwrap(),
        Some(bytes) => {
            let s = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None).unwrap();
            s.set_recv_buffer_size(bytes).unwrap();
            s.connect(&addr.into()).unwrap();
            s.into()
        }
    };
    sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    rustls::StreamOwned::new(conn, sock)
}

/// Writes `request` and reads until the server closes (close_notify or EOF).
pub fn exchange(tls: &mut rustls::StreamOwned<rustls::ClientConnection, TcpStream>, request: &[u8]) -> Vec<u8> {
    tls.write_all(request).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match super::read_some(tls, &mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => panic!("TLS read: {e}"),
        }
    }
    out
}
