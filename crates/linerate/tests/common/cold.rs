//! A cold disk for the cold-catalogue tests: a blkio cgroup that throttles reads
//! of the disk holding the test content, page-cache eviction, and a wrapper that
//! starts the server inside the cgroup. Everything is removed on drop.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where cgroup v1's blkio controller is mounted.
const BLKIO: &str = "/sys/fs/cgroup/blkio";

/// A child blkio cgroup with a read-rate limit on one disk.
pub struct Throttle {
    pub dir: PathBuf,
    /// `MAJ:MIN` of the whole disk.
    pub disk: String,
}

impl Throttle {
    /// Limits reads of the disk holding `content` to `bytes_per_sec` for the
    /// processes started through [`Throttle::wrapper`]. Panics with the reason when
    /// the machine offers no blkio cgroup (cgroup v1) or the test is not root.
    pub fn new(content: &Path, bytes_per_sec: u64) -> Throttle {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        assert!(
            Path::new(BLKIO).join("blkio.throttle.read_bps_device").exists(),
            "these tests need cgroup v1's blkio controller at {BLKIO} (and root) to make a slow disk"
        );
        let disk = whole_disk_of(content);
        let dir = Path::new(BLKIO).join(format!(
            "linerate-test-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let t = Throttle { dir, disk };
        std::fs::write(t.dir.join("blkio.throttle.read_bps_device"), format!("{} {bytes_per_sec}", t.disk))
            .expect("set blkio.throttle.read_bps_device");
        t
    }

    /// A `Server::start_wrapped` wrapper that moves the server into the cgroup
    /// before it starts any thread.
    pub fn wrapper(&self) -> Vec<String> {
        vec![
            "sh".into(),
            "-c".into(),
            format!("echo $$ > {}/cgroup.procs && shift && exec \"$@\"", self.dir.display()),
            "sh".into(),
        ]
    }

    /// Bytes the cgroup's processes read from the throttled disk so far.
    pub fn read_bytes(&self) -> u64 {
        let text = std::fs::read_to_string(self.dir.join("blkio.throttle.io_service_bytes")).unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                (f.next()? == self.disk && f.next()? == "Read").then(|| f.next()?.parse::<u64>().ok())?
            })
            .sum()
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        // The server (dropped first, being declared later) is gone; a cgroup with
        // no task can be removed. Retry briefly while the kernel lets go of it.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

/// `MAJ:MIN` of the whole disk that holds `path` (the parent of a partition).
pub fn whole_disk_of(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).unwrap().dev();
    let (major, minor) = ((dev >> 8) & 0xfff | ((dev >> 32) & !0xfff), (dev & 0xff) | ((dev >> 12) & !0xff));
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if sys.join("partition").exists() {
        let parent = std::fs::canonicalize(&sys).unwrap().parent().unwrap().join("dev");
        return std::fs::read_to_string(parent).unwrap().trim().to_string();
    }
    format!("{major}:{minor}")
}

/// Drops the (written back) pages of `file` from the page cache and checks it.
pub fn evict(file: &Path) {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "sync -d '{0}' && dd if='{0}' iflag=nocache count=0 status=none && fincore -nb -o RES '{0}'",
            file.display()
        ))
        .output()
        .unwrap();
    let resident: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(u64::MAX);
    assert_eq!(resident, 0, "could not evict {}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
}

/// Bytes of `file` in the page cache (`fincore`).
pub fn resident_bytes(file: &Path) -> u64 {
    let out = std::process::Command::new("fincore").args(["-nb", "-o", "RES"]).arg(file).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or_else(|_| panic!("fincore: {out:?}"))
}

/// Reads `len` bytes of `file` at `offset` through the page cache (makes them resident).
pub fn warm(file: &Path, offset: u64, len: u64) {
    use std::io::{Read, Seek};
    let mut f = std::fs::File::open(file).unwrap();
    f.seek(std::io::SeekFrom::Start(offset)).unwrap();
    let mut buf = vec![0u8; len as usize];
    f.read_exact(&mut buf).unwrap();
}

/// Keeps a file's pages in the page cache until dropped: a helper process maps the
/// file and `mlock`s it. Without it the machine may evict a "hot" file in the middle
/// of a test (memory reclaim, or a proactive pageout such as a DAMON scheme, which
/// can take page-cache pages it sees no access to), and a test of hot requests would
/// measure the disk instead. The helper is killed on drop.
pub struct Pinned(std::process::Child);

impl Pinned {
    pub fn new(file: &Path) -> Pinned {
        use std::io::BufRead;
        const LOCK: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open(sys.argv[1], os.O_RDONLY)
n = os.fstat(fd).st_size
addr = libc.mmap(None, n, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED: the page-cache pages themselves
if addr in (None, ctypes.c_void_p(-1).value) or libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(n)) != 0:
    sys.exit("cannot lock %s: errno %d" % (sys.argv[1], ctypes.get_errno()))
print("locked", flush=True)
sys.stdin.read()
"#;
        let mut child = std::process::Command::new("python3")
            .args(["-c", LOCK])
            .arg(file)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        if line.trim() != "locked" {
            let _ = child.kill();
            let status = child.wait();
            panic!("could not lock {} in the page cache: {status:?}", file.display());
        }
        Pinned(child)
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A content directory on the disk the repository is on (not a tmpfs /tmp),
/// so that its files can be evicted and read back from a real disk.
pub fn content_on_disk() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// `tests/fixtures/faultyfs.py` mounted over a directory: reads of `eio*` files
/// past 1 MiB fail with EIO, reads of `slow*` files take 5 s. Unmounted on drop.
pub struct FaultyFs {
    child: std::process::Child,
    pub mountpoint: PathBuf,
}

impl FaultyFs {
    pub fn mount(source: &Path, mountpoint: &Path) -> FaultyFs {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/faultyfs.py");
        let child = std::process::Command::new("/usr/bin/python3")
            .arg(script)
            .arg(source)
            .arg(mountpoint)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start faultyfs.py (needs Debian's python3-fusepy and /dev/fuse)");
        let fs = FaultyFs { child, mountpoint: mountpoint.to_owned() };
        let mounted = super::eventually(std::time::Duration::from_secs(10), || {
            std::fs::read_to_string("/proc/self/mounts")
                .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(1) == mountpoint.to_str()))
        });
        assert!(mounted, "faultyfs did not mount on {}", mountpoint.display());
        fs
    }
}

impl Drop for FaultyFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.mountpoint).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
