//! The index journal of one cache directory (`index.journal`): what the store
//! knows, as lines appended one `write` each, replayed at open.
//!
//! A line is a record's fields separated by spaces, then its FNV-1a checksum:
//!
//! ```text
//! M <seq> <key> <gen> <status> <size> <dated_at_ms> <fresh_until_ms> <swr_until_ms> <sie_until_ms> <etag> <last_modified> <content_type> <full key>
//! S <seq> <key> <gen> <index> <len> <dev> <ino> <mtime_ns>
//! s <seq> <key> <gen> <index>
//! D <seq> <key>
//! ```
//!
//! `M` records an object's metadata, `S` a committed slice, `s` a dropped slice,
//! `D` a dropped object. `dated_at_ms` is when the object's age was zero
//! (`ObjectMeta::dated_at_ms`); it and the three deadlines are Unix milliseconds.
//! Journals written before milliseconds hold `O` records instead, the same fields
//! in seconds, the first of them the time the object was stored (read as an age
//! of zero on arrival): they are still
//! read (a restart after an upgrade keeps the cache), and never written. Keys are
//! hex; byte strings are `-` (none) or `x` and hex.
//! Text rather than binary: a journal is read with `less` when a cache misbehaves.
//! Decoding costs more than reading (docs/performance/origin.md, "Restart"):
//! `read` spreads it over a few threads, overlapped with the reading.
//!
//! A crash can cut the last line short, and a failed write (`ENOSPC`) one in the
//! middle: such a line fails its checksum and is skipped; the writer starts its
//! next line on a new one. Skipping a record is safe: a slice record lost makes an
//! orphan the sweep removes; a drop record lost brings back a record whose file is
//! gone or not the one recorded, which the lookup's `stat` catches.
//!
//! Every record carries a sequence number, unique across the directories of a
//! store and increasing: replay applies the records of every journal in that
//! order, so an object that moved directories ends as its newest record says.

use std::fs::File;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use linerate_http::path::hex_digit;

use super::shardmap::ShardMap;
use super::{KeyHash, ObjectMeta};

/// The first line of every journal: the format and its version.
pub(super) const HEADER: &[u8] = b"linerate-slice-store 1\n";

/// One line of a journal.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Record {
    /// New or refreshed metadata. `gen` names the version of the object: the seq
    /// of the record that began it. Slices belong to one version; a record with
    /// another `gen` replaces the object and leaves its old slices behind.
    Object { seq: u64, key: KeyHash, gen: u64, meta: Arc<ObjectMeta> },
    /// A committed slice and the identity of its file.
    Slice { seq: u64, key: KeyHash, gen: u64, index: u64, file: SliceFile },
    /// A slice evicted, forgotten or found damaged.
    DropSlice { seq: u64, key: KeyHash, gen: u64, index: u64 },
    /// An object and all its slices dropped.
    DropObject { seq: u64, key: KeyHash },
}

/// What a slice file was when it was committed: a file that differs in any of
/// these is not that slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SliceFile {
    pub len: u64,
    pub dev: u64,
    pub ino: u64,
    pub mtime_ns: i64,
}

impl Record {
    pub(super) fn seq(&self) -> u64 {
        match self {
            Record::Object { seq, .. }
            | Record::Slice { seq, .. }
            | Record::DropSlice { seq, .. }
            | Record::DropObject { seq, .. } => *seq,
        }
    }

    pub(super) fn key(&self) -> &KeyHash {
        match self {
            Record::Object { key, .. }
            | Record::Slice { key, .. }
            | Record::DropSlice { key, .. }
            | Record::DropObject { key, .. } => key,
        }
    }

    /// Appends the record as one line, checksum and newline included.
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        // Writing into a Vec cannot fail.
        let _ = match self {
            Record::Object { seq, key, gen, meta } => {
                let _ = write!(
                    out,
                    "M {seq} {} {gen} {} {} {} {} {} {} ",
                    hex(key),
                    meta.status,
                    meta.size,
                    meta.dated_at_ms,
                    meta.fresh_until_ms,
                    meta.stale_while_revalidate_until_ms,
                    meta.stale_if_error_until_ms
                );
                for field in [&meta.etag, &meta.last_modified, &meta.content_type] {
                    encode_bytes(field.as_deref(), out);
                    out.push(b' ');
                }
                encode_bytes(Some(&meta.key), out);
                Ok(())
            }
            Record::Slice { seq, key, gen, index, file } => write!(
                out,
                "S {seq} {} {gen} {index} {} {} {} {}",
                hex(key),
                file.len,
                file.dev,
                file.ino,
                file.mtime_ns
            ),
            Record::DropSlice { seq, key, gen, index } => write!(out, "s {seq} {} {gen} {index}", hex(key)),
            Record::DropObject { seq, key } => write!(out, "D {seq} {}", hex(key)),
        };
        let sum = fnv1a(&out[start..]);
        let _ = writeln!(out, " {sum:016x}");
    }

    /// Reads one line (without its newline); `None` if it is cut short, damaged
    /// or of an unknown kind. Works on the bytes (a record is ASCII), allocating
    /// only what the record keeps: `open` decodes one line per record.
    pub(super) fn decode(line: &[u8]) -> Option<Record> {
        let split = line.len().checked_sub(17)?;
        let (body, sum) = (&line[..split], &line[split..]);
        if sum[0] != b' ' || parse_hex_u64(&sum[1..])? != fnv1a(body) {
            return None;
        }
        let mut f = Fields::new(body);
        let kind = f.next()?;
        let seq = f.num()?;
        let key = parse_key_bytes(f.next()?)?;
        let record = match kind {
            b"M" | b"O" => {
                // `O`: the format before milliseconds, times in seconds.
                let unit: i64 = if kind == b"O" { 1000 } else { 1 };
                let gen = f.num()?;
                let status = u16::try_from(f.num()?).ok()?;
                let size = f.num()?;
                let dated_at_ms = f.signed()?.saturating_mul(unit);
                let fresh_until_ms = f.signed()?.saturating_mul(unit);
                let stale_while_revalidate_until_ms = f.signed()?.saturating_mul(unit);
                let stale_if_error_until_ms = f.signed()?.saturating_mul(unit);
                let etag = decode_bytes(f.next()?)?;
                let last_modified = decode_bytes(f.next()?)?;
                let content_type = decode_bytes(f.next()?)?;
                let full_key = decode_bytes(f.next()?)??;
                let meta = ObjectMeta {
                    key: full_key,
                    status,
                    size,
                    etag,
                    last_modified,
                    content_type,
                    dated_at_ms,
                    fresh_until_ms,
                    stale_while_revalidate_until_ms,
                    stale_if_error_until_ms,
                };
                Record::Object { seq, key, gen, meta: Arc::new(meta) }
            }
            b"S" => {
                let gen = f.num()?;
                let index = f.num()?;
                let file = SliceFile { len: f.num()?, dev: f.num()?, ino: f.num()?, mtime_ns: f.signed()? };
                Record::Slice { seq, key, gen, index, file }
            }
            b"s" => Record::DropSlice { seq, key, gen: f.num()?, index: f.num()? },
            b"D" => Record::DropObject { seq, key },
            _ => return None,
        };
        f.next().is_none().then_some(record)
    }
}

/// The space-separated fields of a record's body, as `split(b' ')` gives them.
struct Fields<'a>(Option<&'a [u8]>);

impl<'a> Fields<'a> {
    fn new(body: &'a [u8]) -> Fields<'a> {
        Fields(Some(body))
    }

    /// The next field; `None` past the last.
    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = self.0?;
        match rest.iter().position(|&b| b == b' ') {
            Some(at) => {
                self.0 = Some(&rest[at + 1..]);
                Some(&rest[..at])
            }
            None => self.0.take(),
        }
    }

    /// The next field as a decimal `u64`.
    fn num(&mut self) -> Option<u64> {
        parse_u64(self.next()?)
    }

    /// The next field as a decimal `i64`, `-` allowed.
    fn signed(&mut self) -> Option<i64> {
        let field = self.next()?;
        match field.strip_prefix(b"-") {
            Some(digits) => 0i64.checked_sub_unsigned(parse_u64(digits)?),
            None => i64::try_from(parse_u64(field)?).ok(),
        }
    }
}

/// Decimal digits only, at least one, no overflow.
fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        let d = d.wrapping_sub(b'0');
        (d < 10).then_some(())?;
        n.checked_mul(10)?.checked_add(d as u64)
    })
}

/// Exactly 16 hex digits.
fn parse_hex_u64(digits: &[u8]) -> Option<u64> {
    if digits.len() != 16 {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| Some(n << 4 | hex_digit(d)? as u64))
}

/// A journal read back.
#[derive(Debug, Default)]
pub(super) struct Replay {
    /// A compacted part with a matching shard map: its records are not in
    /// `records` (only those appended after it are), but read shard by shard
    /// when needed ([`read_block`]).
    pub sorted: Option<Sorted>,
    pub records: Vec<Record>,
    /// Lines past the header, good or not: what compaction weighs against the
    /// live records.
    pub lines: u64,
    /// Lines skipped because they were cut short or damaged.
    pub damaged: u64,
    /// Whether the file ends in the middle of a line (the next append starts a
    /// new one).
    pub torn_tail: bool,
}

/// The compacted part of a journal, described by its shard map.
#[derive(Debug)]
pub(super) struct Sorted {
    pub file: Arc<File>,
    pub map: ShardMap,
}

/// Reads a journal; `Ok(None)` when there is none yet. With a shard `map` that
/// matches it, only what follows the compacted part is read (see [`shardmap`]).
///
/// At open the index is all the cache waits for, and decoding costs more than
/// reading: the journal is read in parts of whole lines, each decoded on one of
/// a few threads while the next is read (the kernel asked to read it all ahead).
///
/// [`shardmap`]: super::shardmap
pub(super) fn read(path: &Path, map: Option<ShardMap>) -> io::Result<Option<Replay>> {
    read_in_parts(path, map, PART_BYTES)
}

fn read_in_parts(path: &Path, map: Option<ShardMap>, part_bytes: usize) -> io::Result<Option<Replay>> {
    let file = match File::open(path) {
        Ok(f) => Arc::new(f),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let map = map.filter(|m| m.matches(&file));
    // Advice only: without it the reads below still read ahead, in smaller steps.
    // With a map, only for what follows the compacted part: its blocks are read
    // when first needed, and reading them all ahead would queue the first
    // lookups' reads behind the whole journal's.
    let _ = linerate_sys::pagecache::fadvise(
        std::os::fd::AsFd::as_fd(&*file),
        map.as_ref().map_or(0, |m| m.sorted_end),
        0,
        linerate_sys::pagecache::Advice::WillNeed,
    );
    if let Some(map) = map {
        return read_tail(file, map, part_bytes).map(Some);
    }
    let mut parts = Parts { file, part_bytes, carry: Vec::new(), ended: false, read: 0, last: None };
    let mut first = parts.next()?.unwrap_or_default();
    if !first.starts_with(HEADER) {
        let line = first.split(|&b| b == b'\n').next().unwrap_or_default();
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: not a slice-store journal of this version (first line {:?})",
                path.display(),
                String::from_utf8_lossy(&line[..line.len().min(64)])
            ),
        ));
    }
    first.drain(..HEADER.len());
    let decoded = decode_all(first, &mut parts)?;
    let torn_tail = parts.read > HEADER.len() as u64 && parts.last != Some(b'\n');
    Ok(Some(joined(decoded, torn_tail)))
}

/// The records appended after a journal's compacted part, and the part itself
/// left to [`read_block`].
fn read_tail(file: Arc<File>, map: ShardMap, part_bytes: usize) -> io::Result<Replay> {
    (&*file).seek(SeekFrom::Start(map.sorted_end))?;
    let mut parts = Parts { file: file.clone(), part_bytes, carry: Vec::new(), ended: false, read: 0, last: None };
    let first = parts.next()?.unwrap_or_default();
    let decoded = decode_all(first, &mut parts)?;
    // The compacted part ends with a whole line.
    let torn_tail = parts.read > 0 && parts.last != Some(b'\n');
    let mut replay = joined(decoded, torn_tail);
    replay.lines += map.lines;
    replay.sorted = Some(Sorted { file, map });
    Ok(replay)
}

/// Decodes one shard's block of a compacted journal: `start..end` of `file`.
pub(super) fn read_block(file: &File, start: u64, end: u64) -> io::Result<Replay> {
    let mut bytes = vec![0; end.saturating_sub(start) as usize];
    file.read_exact_at(&mut bytes, start)?;
    Ok(decode_part(&bytes))
}

/// The parts' results as one, in order.
fn joined(mut decoded: Vec<Replay>, torn_tail: bool) -> Replay {
    let mut replay = Replay { torn_tail, ..Replay::default() };
    replay.records.reserve_exact(decoded.iter().map(|d| d.records.len()).sum());
    for d in &mut decoded {
        replay.records.append(&mut d.records);
        replay.lines += d.lines;
        replay.damaged += d.damaged;
    }
    replay
}

/// Decodes `first` and the parts after it: on this thread when `first` was all
/// there is, else on a few.
fn decode_all(first: Vec<u8>, parts: &mut Parts) -> io::Result<Vec<Replay>> {
    if parts.ended && parts.carry.is_empty() {
        Ok(vec![decode_part(&first)])
    } else {
        decode_parts(first, parts)
    }
}

/// At most this many threads decode one journal.
const MAX_DECODERS: usize = 8;
/// The size of a part read at once (a part ends after its last whole line).
const PART_BYTES: usize = 4 << 20;

/// The rest of a journal read and decoded by a few threads, `first` (past the
/// header) already read; the parts' results in the journal's order.
fn decode_parts(first: Vec<u8>, parts: &mut Parts) -> io::Result<Vec<Replay>> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, MAX_DECODERS);
    let (tx, rx) = std::sync::mpsc::sync_channel::<(usize, Vec<u8>)>(threads * 2);
    let rx = std::sync::Mutex::new(rx);
    let mut decoded = std::thread::scope(|scope| -> io::Result<Vec<(usize, Replay)>> {
        let decoders: Vec<_> = (0..threads)
            .filter_map(|_| {
                let decode = || {
                    let mut out = Vec::new();
                    loop {
                        let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                        let Ok((i, part)) = next else { return out };
                        out.push((i, decode_part(&part)));
                    }
                };
                std::thread::Builder::new().name("linerate-journal".into()).spawn_scoped(scope, decode).ok()
            })
            .collect();
        // With no decoder started, every part is decoded here (a send would
        // block once the channel is full: nobody receives).
        let mut here = Vec::new();
        let mut part = Some(first);
        let mut i = 0;
        let result = loop {
            let Some(p) = part.take() else { break Ok(()) };
            if decoders.is_empty() {
                here.push((i, decode_part(&p)));
            } else if let Err(std::sync::mpsc::SendError((i, p))) = tx.send((i, p)) {
                here.push((i, decode_part(&p)));
            }
            i += 1;
            match parts.next() {
                Ok(next) => part = next,
                Err(e) => break Err(e),
            }
        };
        drop(tx);
        for d in decoders {
            here.extend(d.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        }
        result.map(|()| here)
    })?;
    decoded.sort_unstable_by_key(|(i, _)| *i);
    Ok(decoded.into_iter().map(|(_, r)| r).collect())
}

/// A journal file read in parts of whole lines (the last part may end without
/// a newline: a torn tail).
struct Parts {
    file: Arc<File>,
    part_bytes: usize,
    /// The start of a line the last part did not end.
    carry: Vec<u8>,
    ended: bool,
    /// Bytes read so far, and the last of them.
    read: u64,
    last: Option<u8>,
}

impl Parts {
    fn next(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut buf = std::mem::take(&mut self.carry);
        while !self.ended {
            buf.reserve(self.part_bytes);
            let n = io::Read::read_to_end(&mut io::Read::take(&*self.file, self.part_bytes as u64), &mut buf)?;
            self.read += n as u64;
            if n > 0 {
                self.last = buf.last().copied();
            }
            self.ended = n < self.part_bytes;
            if self.ended {
                break;
            }
            if let Some(nl) = memchr::memrchr(b'\n', &buf) {
                self.carry = buf.split_off(nl + 1);
                return Ok(Some(buf));
            }
            // A line longer than a part: read on.
        }
        Ok(Some(buf).filter(|b| !b.is_empty()))
    }
}

/// Decodes the lines of one part of a journal (empty lines are skipped).
fn decode_part(part: &[u8]) -> Replay {
    let mut replay = Replay::default();
    let mut rest = part;
    while !rest.is_empty() {
        let (line, tail) = match memchr::memchr(b'\n', rest) {
            Some(nl) => (&rest[..nl], &rest[nl + 1..]),
            None => (rest, &rest[rest.len()..]),
        };
        rest = tail;
        if line.is_empty() {
            continue;
        }
        replay.lines += 1;
        match Record::decode(line) {
            Some(r) => replay.records.push(r),
            None => replay.damaged += 1,
        }
    }
    replay
}

/// The open end of a journal, appended to one record per `write`.
#[derive(Debug)]
pub(super) struct Journal {
    pub path: PathBuf,
    /// Where a new journal is written before it is renamed to `path`.
    pub tmp: PathBuf,
    /// `None` until the journal could be opened (a directory unwritable at start).
    file: Option<File>,
    /// Lines in the file past the header.
    pub lines: u64,
    /// Of those, the lines of the compacted part a shard map describes (0: none):
    /// the rest were appended since, and a start reads them all.
    pub sorted_lines: u64,
    /// The last write may have left a partial line: start the next one afresh.
    torn: bool,
}

impl Journal {
    pub(super) fn new(path: PathBuf, tmp: PathBuf, lines: u64, sorted_lines: u64, torn: bool) -> Journal {
        Journal { path, tmp, file: None, lines, sorted_lines, torn }
    }

    /// Appends one encoded record. No user-space buffer: once this returns, a
    /// crash of the process does not lose the line (a power loss may, unless
    /// `fsync`).
    pub(super) fn append(&mut self, line: &[u8], fsync: bool) -> io::Result<()> {
        if self.file.is_none() {
            self.file = Some(match open_append(&self.path) {
                // A directory that was not writable at open, or emptied since.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    if let Some(tmp_dir) = self.tmp.parent() {
                        std::fs::create_dir_all(tmp_dir)?;
                    }
                    let _ = std::fs::remove_file(&self.tmp);
                    Rewrite::create(self.tmp.clone())?.finish(&self.path)?;
                    self.lines = 0;
                    self.sorted_lines = 0;
                    self.torn = false;
                    open_append(&self.path)?
                }
                r => r?,
            });
        }
        let file = self.file.as_mut().expect("opened above");
        let result = if self.torn {
            let mut fresh = Vec::with_capacity(line.len() + 1);
            fresh.push(b'\n');
            fresh.extend_from_slice(line);
            file.write_all(&fresh)
        } else {
            file.write_all(line)
        };
        // A failed write may have left part of the line: the next starts anew.
        self.torn = result.is_err();
        result?;
        self.lines += 1;
        if fsync {
            file.sync_data()?;
        }
        Ok(())
    }

    /// Forgets the open file: the next append opens `path` again.
    #[cfg(test)]
    pub(super) fn reopen(&mut self) {
        self.file = None;
    }

    /// After a new journal of `lines` lines was renamed over the old one
    /// (`sorted_lines` of them described by a shard map).
    pub(super) fn replaced(&mut self, lines: u64, sorted_lines: u64) {
        self.file = None;
        self.lines = lines;
        self.sorted_lines = sorted_lines;
        self.torn = false;
    }
}

fn open_append(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new().append(true).open(path)
}

/// A journal written whole into a temporary file, then renamed over the old one:
/// a new directory's empty journal, or a compacted one.
pub(super) struct Rewrite {
    out: BufWriter<File>,
    tmp: PathBuf,
    line: Vec<u8>,
    pub lines: u64,
    /// Bytes written so far, the header included: where the next record starts.
    pub bytes: u64,
}

impl Rewrite {
    pub(super) fn create(tmp: PathBuf) -> io::Result<Rewrite> {
        let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        if let Err(e) = out.write_all(HEADER) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(Rewrite { out, tmp, line: Vec::with_capacity(256), lines: 0, bytes: HEADER.len() as u64 })
    }

    pub(super) fn push(&mut self, record: &Record) -> io::Result<()> {
        self.line.clear();
        record.encode(&mut self.line);
        self.lines += 1;
        self.bytes += self.line.len() as u64;
        self.out.write_all(&self.line)
    }

    /// Syncs the new journal and renames it over `path`, then syncs the directory.
    /// Always synced, `fsync` or not: the rename replaces every record at once,
    /// and a power loss that kept the rename but not the data would lose the
    /// whole index rather than its last lines.
    pub(super) fn finish(self, path: &Path) -> io::Result<u64> {
        let Rewrite { out, tmp, lines, .. } = self;
        let result = (|| {
            let file = out.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
            std::fs::rename(&tmp, path)?;
            sync_dir(path.parent().unwrap_or(Path::new(".")))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result.map(|()| lines)
    }

    /// The device and inode of the new journal (kept by the rename).
    pub(super) fn file_id(&self) -> io::Result<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        let m = self.out.get_ref().metadata()?;
        Ok((m.dev(), m.ino()))
    }

    /// Gives up: removes the temporary file.
    pub(super) fn abandon(self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// `fsync` of a directory, so that a rename into it survives a power loss.
pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// FNV-1a, 64 bits: catches a cut or garbled line; nobody forges a journal.
pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

pub(super) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(b"0123456789abcdef"[(b >> 4) as usize]));
        s.push(char::from(b"0123456789abcdef"[(b & 15) as usize]));
    }
    s
}

fn unhex(s: &[u8]) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() / 2);
    for p in s.chunks_exact(2) {
        out.push(hex_digit(p[0])? << 4 | hex_digit(p[1])?);
    }
    Some(out)
}

pub(super) fn parse_key(s: &str) -> Option<KeyHash> {
    parse_key_bytes(s.as_bytes())
}

fn parse_key_bytes(s: &[u8]) -> Option<KeyHash> {
    let mut key = KeyHash::default();
    if s.len() != key.len() * 2 {
        return None;
    }
    for (k, p) in key.iter_mut().zip(s.chunks_exact(2)) {
        *k = hex_digit(p[0])? << 4 | hex_digit(p[1])?;
    }
    Some(key)
}

fn encode_bytes(b: Option<&[u8]>, out: &mut Vec<u8>) {
    match b {
        None => out.push(b'-'),
        Some(b) => {
            out.push(b'x');
            out.extend_from_slice(hex(b).as_bytes());
        }
    }
}

/// `Some(None)` for `-`, `Some(Some(bytes))` for `x…`, `None` if malformed.
fn decode_bytes(s: &[u8]) -> Option<Option<Vec<u8>>> {
    if s == b"-" {
        return Some(None);
    }
    unhex(s.strip_prefix(b"x")?).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> ObjectMeta {
        ObjectMeta {
            key: b"/vod/a b\n.mp4?x=1".to_vec(),
            status: 200,
            size: 10 << 20,
            etag: Some(b"\"e 1\"".to_vec()),
            last_modified: None,
            content_type: Some(Vec::new()),
            dated_at_ms: 1_700_000_000_000,
            fresh_until_ms: 1_700_000_600_250,
            stale_while_revalidate_until_ms: -1,
            stale_if_error_until_ms: 0,
        }
    }

    fn records() -> Vec<Record> {
        let key = [7; 16];
        vec![
            Record::Object { seq: 1, key, gen: 1, meta: Arc::new(meta()) },
            Record::Slice {
                seq: 2,
                key,
                gen: 1,
                index: 3,
                file: SliceFile { len: 4096, dev: 2049, ino: 77, mtime_ns: -5 },
            },
            Record::DropSlice { seq: 3, key, gen: 1, index: 3 },
            Record::DropObject { seq: u64::MAX, key },
        ]
    }

    #[test]
    fn every_record_reads_back_as_written() {
        for r in records() {
            let mut line = Vec::new();
            r.encode(&mut line);
            assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1, "one line: {line:?}");
            assert_eq!(Record::decode(&line[..line.len() - 1]), Some(r));
        }
    }

    /// Written by the format before milliseconds (deadlines in seconds, kind `O`):
    /// read with the deadlines in milliseconds, and written back as `M`.
    #[test]
    fn records_of_the_format_in_seconds_are_still_read() {
        let body = format!(
            "O 5 {} 5 200 1048576 1700000000 1700000600 1700000630 1700003600 x22653122 - x766964656f2f6d7034 x2f766f642f612e6d7034",
            hex(&[9; 16])
        );
        let line = format!("{body} {:016x}", fnv1a(body.as_bytes()));
        let Some(Record::Object { seq, key, gen, meta }) = Record::decode(line.as_bytes()) else {
            panic!("an O record is read: {line}");
        };
        assert_eq!((seq, key, gen), (5, [9; 16], 5));
        assert_eq!((meta.status, meta.size, meta.dated_at_ms), (200, 1 << 20, 1_700_000_000_000));
        assert_eq!(
            (meta.fresh_until_ms, meta.stale_while_revalidate_until_ms, meta.stale_if_error_until_ms),
            (1_700_000_600_000, 1_700_000_630_000, 1_700_003_600_000)
        );
        assert_eq!(
            (meta.etag.as_deref(), meta.last_modified.as_deref(), meta.content_type.as_deref(), meta.key.as_slice()),
            (Some(&b"\"e1\""[..]), None, Some(&b"video/mp4"[..]), &b"/vod/a.mp4"[..])
        );
        let mut again = Vec::new();
        Record::Object { seq, key, gen, meta: meta.clone() }.encode(&mut again);
        assert!(again.starts_with(b"M 5 "), "written in the new format: {}", String::from_utf8_lossy(&again));
        assert_eq!(Record::decode(&again[..again.len() - 1]), Some(Record::Object { seq, key, gen, meta }));
    }

    #[test]
    fn a_cut_or_garbled_line_is_refused() {
        let mut line = Vec::new();
        records()[1].encode(&mut line);
        line.pop();
        for cut in 0..line.len() {
            assert_eq!(Record::decode(&line[..cut]), None, "cut at {cut}");
        }
        for i in 0..line.len() {
            let mut bad = line.clone();
            bad[i] ^= 0x01;
            assert_eq!(Record::decode(&bad), None, "byte {i} flipped");
        }
    }

    #[test]
    fn replay_skips_damaged_lines_and_notes_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.journal");
        assert!(read(&path, None).unwrap().is_none());
        let mut bytes = HEADER.to_vec();
        let rs = records();
        rs[0].encode(&mut bytes);
        bytes.extend_from_slice(b"S 9 garbage\n\n");
        rs[1].encode(&mut bytes);
        let mut last = Vec::new();
        rs[2].encode(&mut last);
        bytes.extend_from_slice(&last[..10]);
        std::fs::write(&path, &bytes).unwrap();
        let replay = read(&path, None).unwrap().unwrap();
        assert_eq!(replay.records, rs[..2]);
        assert_eq!((replay.lines, replay.damaged, replay.torn_tail), (4, 2, true));
        // The next append starts on a line of its own.
        let mut j = Journal::new(path.clone(), dir.path().join("j.tmp"), replay.lines, 0, replay.torn_tail);
        j.append(&last, false).unwrap();
        let replay = read(&path, None).unwrap().unwrap();
        assert_eq!(replay.records, rs[..3]);
        assert!(!replay.torn_tail);
        // A journal removed is made anew.
        std::fs::remove_file(&path).unwrap();
        j.reopen();
        j.append(&last, false).unwrap();
        assert_eq!(read(&path, None).unwrap().unwrap().records, rs[2..3]);
        std::fs::write(&path, b"something else\n").unwrap();
        assert_eq!(read(&path, None).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }

    /// Read in parts of 512 bytes on several threads: every record in the
    /// journal's order, a line longer than a part whole, damage and a torn tail
    /// found where they are.
    #[test]
    fn a_journal_read_in_parts_reads_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.journal");
        let mut bytes = HEADER.to_vec();
        let mut written = Vec::new();
        for i in 0..400u64 {
            let mut m = meta();
            if i == 150 {
                m.key = vec![b'k'; 2000];
            }
            let key = [(i % 251) as u8; 16];
            let rs = [
                Record::Object { seq: 2 * i, key, gen: i, meta: Arc::new(m) },
                Record::Slice {
                    seq: 2 * i + 1,
                    key,
                    gen: i,
                    index: i,
                    file: SliceFile { len: i, dev: 1, ino: i, mtime_ns: 5 },
                },
            ];
            for r in rs {
                r.encode(&mut bytes);
                written.push(r);
            }
            if i == 300 {
                bytes.extend_from_slice(b"S 1 damaged\n");
            }
        }
        let mut last = Vec::new();
        Record::DropObject { seq: 900, key: [1; 16] }.encode(&mut last);
        bytes.extend_from_slice(&last[..last.len() - 3]);
        assert!(bytes.len() > 100 * 512, "{} bytes", bytes.len());
        std::fs::write(&path, &bytes).unwrap();
        let read = |path| read_in_parts(path, None, 512);
        let replay = read(&path).unwrap().unwrap();
        assert_eq!(replay.records.len(), written.len());
        assert!(replay.records == written, "every record, in order");
        assert_eq!((replay.lines, replay.damaged, replay.torn_tail), (802, 2, true));
        bytes.truncate(bytes.len() - (last.len() - 3));
        std::fs::write(&path, &bytes).unwrap();
        let replay = read(&path).unwrap().unwrap();
        assert_eq!((replay.records.len(), replay.lines, replay.damaged, replay.torn_tail), (800, 801, 1, false));
        // The header alone, and an empty file.
        std::fs::write(&path, HEADER).unwrap();
        let replay = read(&path).unwrap().unwrap();
        assert_eq!((replay.records.len(), replay.lines, replay.torn_tail), (0, 0, false));
        std::fs::write(&path, b"").unwrap();
        assert_eq!(read(&path).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn a_rewrite_replaces_the_journal_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.journal");
        std::fs::write(&path, b"old").unwrap();
        let mut w = Rewrite::create(dir.path().join("new")).unwrap();
        for r in records() {
            w.push(&r).unwrap();
        }
        assert_eq!(w.finish(&path).unwrap(), 4);
        assert_eq!(read(&path, None).unwrap().unwrap().records, records());
        assert!(!dir.path().join("new").exists());
    }
}
