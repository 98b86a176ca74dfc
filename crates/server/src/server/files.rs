//! The per-worker open-file cache.
//!
//! A popular title is requested by thousands of connections; opening it once per
//! worker and sharing the descriptor saves an `open`/`fstat`/`close` per request and,
//! more importantly with a 20,000-descriptor limit, keeps the number of open files
//! independent of the number of connections.
//!
//! Each worker owns its cache (no locks). An entry is revalidated with one `fstatat`
//! of its path when it is older than `open_file_cache.valid` (default: every use): if
//! the path now names a different inode, size, mtime or ctime, the file is reopened.
//! Responses in flight hold an `Rc` to the entry they started with, so a file
//! replaced by rename keeps being sent from the old inode until those responses end.
//!
//! Entries are keyed by the [`Settings`] they were opened under as well as by path:
//! after a reload, connections accepted before it still look files up under the old
//! root and rules, and must neither be served nor leave behind files of the other.
//!
//! Confinement: files are opened with `openat2(RESOLVE_BENEATH)` relative to the
//! root descriptor, so no symlink can lead outside the root. A revalidation by path
//! that finds the same inode is safe by construction: it is the file that was opened
//! beneath the root.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use linerate_sys::{FileKind, FileStat};

use super::pagecache::residency::Memo;
use super::pagecache::{FileId, FilePages};
use super::settings::Settings;

/// An open regular file and the validators derived from it.
pub(super) struct OpenFile {
    pub file: File,
    pub stat: FileStat,
    /// Strong entity tag, quotes included.
    pub etag: Vec<u8>,
    /// Windows of it found in the page cache lately (`pagecache::residency`).
    pub resident: Memo,
    checked_at: std::cell::Cell<Instant>,
}

impl FilePages for OpenFile {
    fn file(&self) -> &File {
        &self.file
    }

    fn id(&self) -> FileId {
        (self.stat.dev, self.stat.ino)
    }

    fn size_bytes(&self) -> u64 {
        self.stat.size_bytes
    }

    fn memo(&self) -> &Memo {
        &self.resident
    }
}

pub(super) enum Lookup {
    File(Rc<OpenFile>),
    Directory,
}

#[derive(Debug)]
pub(super) enum LookupError {
    NotFound,
    /// Exists but may not be served: permissions, a symlink out of the root, a FIFO...
    Forbidden,
    /// Out of file descriptors (EMFILE/ENFILE): 503, try later.
    Unavailable,
    Io(io::Error),
}

impl From<io::Error> for LookupError {
    fn from(e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ENOENT | libc::ENOTDIR | libc::ENAMETOOLONG) => LookupError::NotFound,
            Some(libc::EACCES | libc::EPERM | libc::EXDEV | libc::ELOOP) => LookupError::Forbidden,
            Some(libc::EMFILE | libc::ENFILE) => LookupError::Unavailable,
            _ => LookupError::Io(e),
        }
    }
}

pub(super) struct FileCache {
    /// Keyed by the settings' generation (8 bytes) followed by the relative path.
    entries: lru::LruCache<Vec<u8>, Rc<OpenFile>>,
    enabled: bool,
    valid: Duration,
    /// Where the key of the current lookup is built, reused.
    key: Vec<u8>,
}

impl FileCache {
    pub(super) fn new(capacity: usize, valid: Duration) -> FileCache {
        let cap = std::num::NonZeroUsize::new(capacity.max(1)).expect("non-zero");
        FileCache { entries: lru::LruCache::new(cap), enabled: capacity > 0, valid, key: Vec::new() }
    }

    /// Finds the file at `rel` (relative to the root, already normalised).
    pub(super) fn open(&mut self, settings: &Settings, rel: &[u8]) -> Result<Lookup, LookupError> {
        if rel.is_empty() {
            return Ok(Lookup::Directory);
        }
        let path = Path::new(std::ffi::OsStr::from_bytes(rel));
        self.key.clear();
        self.key.extend_from_slice(&settings.generation.to_ne_bytes());
        self.key.extend_from_slice(rel);
        let key = &self.key[..];
        if let Some(entry) = self.entries.get(key) {
            let now = Instant::now();
            if now.duration_since(entry.checked_at.get()) < self.valid && !self.valid.is_zero() {
                return Ok(Lookup::File(entry.clone()));
            }
            match linerate_sys::stat_at(settings.root.as_fd(), path) {
                Ok(st) if same_file(&st, &entry.stat) => {
                    entry.checked_at.set(now);
                    return Ok(Lookup::File(entry.clone()));
                }
                Ok(_) => {} // replaced or changed: reopen below
                Err(e) => {
                    self.entries.pop(key);
                    return Err(e.into());
                }
            }
            self.entries.pop(key);
        }
        let file = File::from(open_confined(settings, path)?);
        let stat = linerate_sys::fstat(file.as_fd())?;
        match stat.kind {
            FileKind::Directory => return Ok(Lookup::Directory),
            FileKind::Other => return Err(LookupError::Forbidden),
            FileKind::Regular => {}
        }
        linerate_sys::set_blocking(file.as_fd())?;
        if settings.config.fill.enabled {
            // The fill pool does all disk reading for this file: no kernel
            // read-ahead from the worker's sends, whose pages in flight would look
            // resident to `cachestat` and make a later send wait (server::pagecache).
            let _ = linerate_sys::pagecache::fadvise(file.as_fd(), 0, 0, linerate_sys::pagecache::Advice::Random);
        }
        let entry = Rc::new(OpenFile {
            etag: etag(&stat),
            file,
            stat,
            resident: Default::default(),
            checked_at: std::cell::Cell::new(Instant::now()),
        });
        if self.enabled {
            self.entries.put(key.to_vec(), entry.clone());
        }
        Ok(Lookup::File(entry))
    }
}

fn open_confined(settings: &Settings, path: &Path) -> Result<std::os::fd::OwnedFd, LookupError> {
    let root = settings.root.as_fd();
    if settings.confine_with_openat2 {
        return Ok(linerate_sys::open_beneath(root, path)?);
    }
    let fd = linerate_sys::open_at(root, path)?;
    if !settings.config.follow_symlinks_outside_root {
        // No openat2 on this kernel: check where the descriptor really points.
        let real = std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd)))?;
        if !real.starts_with(&settings.root_path) {
            return Err(LookupError::Forbidden);
        }
    }
    Ok(fd)
}

fn same_file(a: &FileStat, b: &FileStat) -> bool {
    a.ino == b.ino
        && a.dev == b.dev
        && a.size_bytes == b.size_bytes
        && a.mtime_ns == b.mtime_ns
        && a.ctime_ns == b.ctime_ns
}

/// `"inode-size-mtime"` in hex: changes when the file is replaced or modified.
fn etag(st: &FileStat) -> Vec<u8> {
    format!("\"{:x}-{:x}-{:x}\"", st.ino, st.size_bytes, st.mtime_ns as u64).into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn settings(root: &Path) -> Settings {
        Settings::new(Config { root: Some(root.to_owned()), ..Config::default() }, 1, 1024, None).unwrap()
    }

    fn file_of(l: Result<Lookup, LookupError>) -> Rc<OpenFile> {
        match l {
            Ok(Lookup::File(f)) => f,
            Ok(Lookup::Directory) => panic!("directory"),
            Err(e) => panic!("{e:?}"),
        }
    }

    fn contents(f: &OpenFile) -> String {
        let mut buf = vec![0u8; f.stat.size_bytes as usize];
        std::os::unix::fs::FileExt::read_exact_at(&f.file, &mut buf, 0).unwrap();
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn a_reload_that_changes_the_root_never_serves_the_old_roots_files() {
        // Connections accepted before a reload keep the old settings and share the
        // worker's cache with connections accepted after it.
        let old_root = tempfile::tempdir().unwrap();
        let new_root = tempfile::tempdir().unwrap();
        std::fs::write(old_root.path().join("movie.mp4"), b"old root").unwrap();
        std::fs::write(new_root.path().join("movie.mp4"), b"new root!").unwrap();
        let (old, new) = (settings(old_root.path()), settings(new_root.path()));
        // Revalidated on every use, and trusted for a minute.
        for valid in [Duration::ZERO, Duration::from_secs(60)] {
            let mut cache = FileCache::new(8, valid);
            for _ in 0..2 {
                assert_eq!(contents(&file_of(cache.open(&old, b"movie.mp4"))), "old root", "{valid:?}");
                assert_eq!(contents(&file_of(cache.open(&new, b"movie.mp4"))), "new root!", "{valid:?}");
            }
        }
    }

    #[test]
    fn a_reload_that_forbids_escaping_symlinks_never_serves_a_cached_escape() {
        // The same root with a stricter policy: a file reached through a symlink out
        // of the root, cached while that was allowed, is not served under the new one.
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(dir.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink("../secret", root.join("escape")).unwrap();
        let mut config = Config { root: Some(root.clone()), ..Config::default() };
        config.follow_symlinks_outside_root = true;
        let lax = Settings::new(config, 1, 1024, None).unwrap();
        let strict = settings(&root);
        let mut cache = FileCache::new(8, Duration::ZERO);
        assert_eq!(contents(&file_of(cache.open(&lax, b"escape"))), "s");
        assert!(matches!(cache.open(&strict, b"escape"), Err(LookupError::Forbidden)));
    }

    #[test]
    fn caches_and_notices_replacement() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), b"one").unwrap();
        let s = settings(dir.path());
        let mut cache = FileCache::new(8, Duration::ZERO);
        let first = file_of(cache.open(&s, b"a"));
        let again = file_of(cache.open(&s, b"a"));
        assert!(Rc::ptr_eq(&first, &again));
        std::fs::write(dir.path().join("a.new"), b"two!").unwrap();
        std::fs::rename(dir.path().join("a.new"), dir.path().join("a")).unwrap();
        let replaced = file_of(cache.open(&s, b"a"));
        assert!(!Rc::ptr_eq(&first, &replaced));
        assert_eq!(replaced.stat.size_bytes, 4);
        // The old entry still reads the old inode.
        assert_eq!(first.stat.size_bytes, 3);
        assert_ne!(first.etag, replaced.etag);
        std::fs::remove_file(dir.path().join("a")).unwrap();
        assert!(matches!(cache.open(&s, b"a"), Err(LookupError::NotFound)));
    }

    #[test]
    fn classifies_what_it_finds() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(dir.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink("../secret", root.join("escape")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("abs")).unwrap();
        let s = settings(&root);
        let mut cache = FileCache::new(8, Duration::ZERO);
        assert!(matches!(cache.open(&s, b"sub"), Ok(Lookup::Directory)));
        assert!(matches!(cache.open(&s, b""), Ok(Lookup::Directory)));
        assert!(matches!(cache.open(&s, b"missing"), Err(LookupError::NotFound)));
        assert!(matches!(cache.open(&s, b"sub/x/y"), Err(LookupError::NotFound)));
        assert!(matches!(cache.open(&s, b"escape"), Err(LookupError::Forbidden)));
        assert!(matches!(cache.open(&s, b"abs"), Err(LookupError::Forbidden)));
        // A FIFO is refused without blocking.
        let fifo = root.join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        assert!(matches!(cache.open(&s, b"fifo"), Err(LookupError::Forbidden)));
        // Allowed when configured.
        let mut config = Config { root: Some(root.clone()), ..Config::default() };
        config.follow_symlinks_outside_root = true;
        let open = Settings::new(config, 1, 1024, None).unwrap();
        assert_eq!(file_of(cache.open(&open, b"escape")).stat.size_bytes, 1);
    }
}
