//! Helpers for the `linerate bench` tests: run the bench with a time limit and read
//! its JSON, and start nginx (plain or TLS with a certificate made for the test).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{share, tool, Guarded, BIN};

/// What a bench run left behind.
pub struct BenchRun {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl BenchRun {
    pub fn json(&self) -> serde_json::Value {
        assert!(self.success, "bench failed:\n{}\n{}", self.stdout, self.stderr);
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("bench printed no JSON ({e}):\n{}", self.stdout))
    }
}

/// Runs `linerate bench <args>`; fails the test if it is still running after `limit`.
pub fn bench(args: &[&str], limit: Duration) -> BenchRun {
    // Taken before the clock starts: it may wait for a test that runs alone.
    let _share = share();
    let started = Instant::now();
    let mut child =
        Guarded::spawn(Command::new(BIN).arg("bench").args(args).stdout(Stdio::piped()).stderr(Stdio::piped()));
    let out_pipe = child.stdout.take().unwrap();
    let err_pipe = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || std::io::read_to_string(out_pipe).unwrap_or_default());
    let err = std::thread::spawn(move || std::io::read_to_string(err_pipe).unwrap_or_default());
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > limit {
            panic!("linerate bench {args:?} did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    BenchRun {
        success: status.success(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
        elapsed: started.elapsed(),
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A test CA and a server certificate it signed for 127.0.0.1 and localhost, made
/// with openssl (webpki refuses a self-signed CA certificate as a server's).
pub struct TestCerts {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub fn test_certs(dir: &Path) -> TestCerts {
    let p = |name: &str| dir.join(name);
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    let run = |args: Vec<&std::ffi::OsStr>| {
        let out = tool("openssl").args(args).output().unwrap();
        assert!(out.status.success(), "openssl failed: {}", String::from_utf8_lossy(&out.stderr));
    };
    let os = |s: &'static str| std::ffi::OsStr::new(s);
    let (ca, ca_key, csr, cert, key, ext) =
        (p("ca.pem"), p("ca.key"), p("server.csr"), p("cert.pem"), p("key.pem"), p("ext.cnf"));
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    let mut a: Vec<&std::ffi::OsStr> = vec![os("req"), os("-x509")];
    a.extend(ec.iter().map(|s| os(s)));
    a.extend([os("-days"), os("2"), os("-subj"), os("/CN=linerate test CA"), os("-keyout"), ca_key.as_os_str()]);
    a.extend([os("-out"), ca.as_os_str()]);
    run(a);
    let mut a: Vec<&std::ffi::OsStr> = vec![os("req")];
    a.extend(ec.iter().map(|s| os(s)));
    a.extend([os("-subj"), os("/CN=localhost"), os("-keyout"), key.as_os_str(), os("-out"), csr.as_os_str()]);
    run(a);
    run(vec![
        os("x509"),
        os("-req"),
        os("-in"),
        csr.as_os_str(),
        os("-CA"),
        ca.as_os_str(),
        os("-CAkey"),
        ca_key.as_os_str(),
        os("-CAcreateserial"),
        os("-days"),
        os("2"),
        os("-extfile"),
        ext.as_os_str(),
        os("-out"),
        cert.as_os_str(),
    ]);
    TestCerts { ca, cert, key }
}

/// Debian's nginx serving `root`, with TLS if a certificate and key are given.
pub struct Nginx {
    _child: Guarded,
    _dir: tempfile::TempDir,
    pub port: u16,
}

impl Nginx {
    pub fn start(root: &Path, tls: Option<(&Path, &Path)>) -> Nginx {
        Nginx::start_with(root, tls, "")
    }

    /// As [`Nginx::start`], with more `directives` in the `server { }` block.
    pub fn start_with(root: &Path, tls: Option<(&Path, &Path)>, directives: &str) -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let listen = match tls {
            Some((cert, key)) => format!(
                "listen 127.0.0.1:{port} ssl; ssl_certificate {}; ssl_certificate_key {};",
                cert.display(),
                key.display()
            ),
            None => format!("listen 127.0.0.1:{port};"),
        };
        let d = dir.path().display();
        let conf = format!(
            "worker_processes 1; daemon off; master_process off; pid {d}/nginx.pid; error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{ access_log off; sendfile on; keepalive_requests 100000;
  client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d}; uwsgi_temp_path {d}; scgi_temp_path {d};
  types {{ application/octet-stream bin; }}
  server {{ {listen} root {}; {directives} }} }}\n",
            root.display()
        );
        let conf_path = dir.path().join("nginx.conf");
        std::fs::write(&conf_path, conf).unwrap();
        // Killed even if it never starts listening.
        let child = Guarded::spawn(
            tool("nginx")
                .arg("-c")
                .arg(&conf_path)
                .arg("-p")
                .arg(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "nginx did not start listening on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Nginx { _child: child, _dir: dir, port }
    }
}

/// A number field of the bench JSON.
pub fn num(v: &serde_json::Value, path: &str) -> f64 {
    path.split('.').fold(v, |v, k| &v[k]).as_f64().unwrap_or_else(|| panic!("no number at {path} in {v:#}"))
}
