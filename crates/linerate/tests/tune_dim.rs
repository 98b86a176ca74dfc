//! `linerate tune dim` against real interfaces of this machine, on the paths that
//! change nothing: argument errors, interfaces without coalescing settings (the
//! ioctl's real answer), unknown interfaces. Driving real coalescing needs a NIC
//! with coalescing, which the qemu guest has (VM scenarios `dim` and `dim-traffic`).

use std::process::{Command, Output};

use crate::common::{tool, BIN};

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn refuses_to_run_without_a_bound() {
    let out = Command::new(BIN).args(["tune", "dim", "--iface", "lo"]).output().unwrap();
    assert!(!out.status.success());
    assert!(text(&out).contains("give --duration or --count"), "{}", text(&out));
}

#[test]
fn loopback_has_no_coalescing_and_is_left_alone() {
    let out = Command::new(BIN).args(["tune", "dim", "--iface", "lo", "--count", "3"]).output().unwrap();
    assert!(!out.status.success());
    assert!(text(&out).contains("lo: driver (unknown) has no interrupt coalescing settings"), "{}", text(&out));
}

#[test]
fn unknown_interfaces_are_named() {
    let out = Command::new(BIN).args(["tune", "dim", "--iface", "nosuch9", "--duration", "1s"]).output().unwrap();
    assert!(!out.status.success());
    assert!(text(&out).contains("nosuch9: no such interface"), "{}", text(&out));
}

/// A veth pair in a namespace of our own: the kernel's veth driver rejects
/// coalescing, and the controller says which driver and why.
#[test]
fn veth_in_a_namespace_reports_the_driver() {
    let ns = format!("lr-dim-{}", std::process::id());
    let ip = |args: &[&str]| {
        let out = tool("ip").args(args).output().expect("ip (iproute2) is required for this test");
        assert!(out.status.success(), "ip {args:?}: {}", text(&out));
    };
    ip(&["netns", "add", &ns]);
    struct Cleanup(String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _cleanup = Cleanup(ns.clone());
    ip(&["-n", &ns, "link", "add", "v0", "type", "veth", "peer", "name", "v1"]);
    let out =
        tool("ip").args(["netns", "exec", &ns, BIN, "tune", "dim", "--iface", "v0", "--count", "2"]).output().unwrap();
    assert!(!out.status.success());
    assert!(text(&out).contains("v0: driver veth has no interrupt coalescing settings"), "{}", text(&out));
}
