//! `linerate tune --apply` / `--revert` for real, on a copy of a fixture tree
//! (never on the host's own settings): values change, the state file records the
//! old ones, and a revert restores every file byte for byte.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::BIN;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tune").join(name)
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

fn snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p.strip_prefix(root).unwrap().to_path_buf(), std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn tune(root: &Path, extra: &[&str]) -> Output {
    Command::new(BIN).arg("tune").arg("--sysroot").arg(root).args(extra).output().expect("run linerate tune")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn read(root: &Path, rel: &str) -> String {
    std::fs::read_to_string(root.join(rel)).unwrap().trim_end().to_string()
}

#[test]
fn dry_run_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&fixture("board4"), dir.path());
    let before = snapshot(dir.path());
    let out = tune(dir.path(), &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("would write \"8\" to /proc/irq/50/smp_affinity_list"), "{}", text(&out));
    assert_eq!(snapshot(dir.path()), before);
}

#[test]
fn apply_then_revert_restores_every_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    copy_tree(&fixture("board4"), root);
    let before = snapshot(root);

    let out = tune(root, &["--apply"]);
    assert!(out.status.success(), "{}", text(&out));
    let log = text(&out);
    assert_eq!(read(root, "proc/irq/50/smp_affinity_list"), "8");
    assert_eq!(read(root, "proc/irq/53/smp_affinity_list"), "11");
    assert_eq!(read(root, "proc/sys/vm/watermark_scale_factor"), "100");
    assert_eq!(read(root, "sys/class/net/eth1/queues/tx-2/xps_cpus"), "4444");
    assert!(read(root, "ethtool/eth1.features").contains("generic-receive-offload: on"));
    assert!(read(root, "ethtool/eth0.features").contains("tls-hw-tx-offload: on"));
    // Modules can only be loaded on the live root; a snapshot says so and goes on.
    assert!(log.contains("skipped: modprobe tls"), "{log}");
    let state = read(root, "var/lib/linerate/tune-state.toml");
    assert!(state.contains("previous = \"1024\""), "{state}");

    // A second check sees the changes made: only what was skipped is left.
    let again = text(&tune(root, &[]));
    assert!(again.contains("[ok] irq-affinity: eth1"), "{again}");
    assert!(again.contains("[ok] gro: eth1"), "{again}");

    // Applying twice keeps the first original values.
    assert!(tune(root, &["--apply"]).status.success());

    let out = tune(root, &["--revert"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(snapshot(root), before, "revert must restore every file exactly");

    let out = tune(root, &["--revert"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("nothing was applied"), "{}", text(&out));
}

#[test]
fn a_state_file_from_another_root_is_refused() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    copy_tree(&fixture("laptop1"), a.path());
    copy_tree(&fixture("laptop1"), b.path());
    let state = a.path().join("state.toml");
    let state_arg = state.to_str().unwrap();
    assert!(tune(a.path(), &["--apply", "--state-file", state_arg]).status.success());
    let out = tune(b.path(), &["--revert", "--state-file", state_arg]);
    assert!(!out.status.success());
    assert!(text(&out).contains("records changes under"), "{}", text(&out));
    assert!(tune(a.path(), &["--revert", "--state-file", state_arg]).status.success());
}

#[test]
fn a_missing_sysroot_is_a_clear_error() {
    let out = tune(Path::new("/nonexistent/linerate-root"), &[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("--sysroot /nonexistent/linerate-root"), "{}", text(&out));
}
