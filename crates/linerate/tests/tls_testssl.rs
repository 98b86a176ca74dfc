//! testssl.sh against the HTTPS listener: protocols, cipher lists, each cipher per
//! protocol, and the known vulnerabilities. Any "NOT ok" finding fails the test.

use crate::common;
use crate::common::tls::TestCa;
use crate::common::*;

#[test]
fn testssl_finds_nothing_wrong() {
    let ca = TestCa::new();
    let content = Content::new();
    content.write("index.html", b"<html></html>");
    let s = common::tls::start_server(&ca, content.path(), &[]);
    let target = format!("127.0.0.1:{}", s.tls_addrs[0].port());
    let out = tool("timeout")
        .args(["600", "testssl", "--quiet", "--color", "0", "--warnings", "off", "--ip", "one"])
        .args(["-p", "-s", "-E", "-U", &target])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains("TLS 1.3    offered (OK)"),
        "testssl did not run to the end:\n{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(report.contains("Done "), "{report}");
    let bad: Vec<&str> = report.lines().filter(|l| l.contains("NOT ok") || l.contains("VULNERABLE")).collect();
    assert!(bad.is_empty(), "testssl findings:\n{}\n\nfull report:\n{report}", bad.join("\n"));
    for weak in ["SSLv3      offered", "TLS 1      offered", "TLS 1.1    offered"] {
        assert!(!report.contains(weak), "{weak}");
    }
}
