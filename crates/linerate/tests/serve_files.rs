//! Bodies: a whole 256 MiB file byte for byte, zero-copy sending (strace), and files
//! replaced or truncated while they are being sent.

use std::io::Read;
use std::time::Duration;

use crate::common::*;

#[test]
fn large_file_arrives_intact() {
    let c = Content::new();
    let data = c.write_random("big.bin", 256 << 20, 21);
    let want = sha256_hex(&data);
    drop(data);
    let s = Server::start(&["--root", &c.root_arg()]);
    let out = tool("sh").args(["-c", &format!("curl -sS --fail {} | sha256sum", s.url("/big.bin"))]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got = String::from_utf8_lossy(&out.stdout);
    assert_eq!(got.split_whitespace().next(), Some(want.as_str()));
}

/// The body goes out with sendfile: strace sees sendfile move the file's bytes and
/// no read of file data into user space.
#[test]
fn bodies_are_sent_without_copying_through_user_space() {
    let c = Content::new();
    let size = 32 << 20;
    c.write_random("big.bin", size, 22);
    let trace_dir = tempfile::tempdir().unwrap();
    let trace = trace_dir.path().join("trace");
    let s = Server::start_wrapped(
        &[
            "strace",
            "-f",
            "-qq",
            "-e",
            "trace=read,readv,pread64,preadv,preadv2,recvfrom,recvmsg,sendfile,mmap",
            "-o",
            trace.to_str().unwrap(),
        ],
        &["--root", &c.root_arg(), "--workers", "1"],
    );
    for range in ["", "-r0-9999999"] {
        let mut args = vec!["--fail", "-o", "/dev/null"];
        if !range.is_empty() {
            args.push(range);
        }
        let url = s.url("/big.bin");
        args.push(&url);
        assert!(curl(&args).status.success());
    }
    drop(s);
    let log = std::fs::read_to_string(&trace).unwrap();
    let mut sendfile_bytes = 0u64;
    let mut read_bytes = 0u64;
    for line in log.lines() {
        let ret = line.rsplit_once(" = ").and_then(|(_, r)| r.split_whitespace().next()?.parse::<i64>().ok());
        let Some(ret) = ret.filter(|r| *r > 0) else { continue };
        let call = line.split_whitespace().nth(1).unwrap_or("");
        if call.starts_with("sendfile") {
            sendfile_bytes += ret as u64;
        } else if call.starts_with("read") || call.starts_with("pread") || call.starts_with("recv") {
            read_bytes += ret as u64;
        }
    }
    assert_eq!(sendfile_bytes, size as u64 + 10_000_000, "sendfile carried every body byte");
    // Only request heads (and process start-up reads of small files) were read.
    assert!(read_bytes < 256 * 1024, "{read_bytes} bytes read into user space");
}

#[test]
fn file_replaced_by_rename_keeps_sending_the_old_inode() {
    let c = Content::new();
    let old = c.write_random("movie.mp4", 32 << 20, 31);
    let s = Server::start(&["--root", &c.root_arg()]);
    let mut dl = download_past(&s.url("/movie.mp4"), "16M", 1 << 20);
    let new = c.write_random("movie.mp4.tmp", 1 << 20, 32);
    std::fs::rename(c.path().join("movie.mp4.tmp"), c.path().join("movie.mp4")).unwrap();
    assert!(dl.curl.wait().unwrap().success());
    assert_eq!(sha256_hex(&std::fs::read(&dl.out).unwrap()), sha256_hex(&old), "in-flight transfer switched files");
    // New requests see the new file at once.
    let r = get(&s.url("/movie.mp4"), &[]);
    assert_eq!(r.body.len(), new.len());
    assert!(r.body == new);
}

#[test]
fn file_truncated_during_transfer_ends_the_connection() {
    let c = Content::new();
    let data = c.write_random("movie.mp4", 64 << 20, 41);
    let s = Server::start(&["--root", &c.root_arg()]);
    // Truncate once the transfer is under way (its Content-Length is the full size).
    let mut dl = download_past(&s.url("/movie.mp4"), "16M", 1 << 20);
    // Well beyond what can have been sent by now at 16 MB/s plus socket buffers.
    let keep = 40 << 20;
    std::fs::OpenOptions::new().write(true).open(c.path().join("movie.mp4")).unwrap().set_len(keep as u64).unwrap();
    let status = dl.curl.wait_timeout_or_kill(Duration::from_secs(20));
    let mut report = String::new();
    dl.curl.stdout.take().unwrap().read_to_string(&mut report).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(18), "curl: {report} (18 = transfer closed with data outstanding)");
    let got = std::fs::read(&dl.out).unwrap();
    // Everything the file still holds, then the close: no padding, no hang.
    assert_eq!(got.len(), keep, "received {} bytes of a file now {keep} long", got.len());
    assert!(got == data[..keep], "received bytes differ from the file's");
    // The server carries on.
    assert_eq!(get(&s.url("/movie.mp4"), &["-I"]).header("content-length"), Some(keep.to_string()));
}

trait WaitTimeout {
    fn wait_timeout_or_kill(&mut self, limit: Duration) -> Option<std::process::ExitStatus>;
}

impl WaitTimeout for std::process::Child {
    fn wait_timeout_or_kill(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            if let Some(s) = self.try_wait().unwrap() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.kill();
        None
    }
}
