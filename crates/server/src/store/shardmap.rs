//! The shard map of a compacted journal (`index.shards`): where each shard's
//! records start in it, so that a start reads only what a lookup needs.
//!
//! Compaction writes the live records shard by shard, so each shard's are one
//! block of lines. The map names the journal it describes (device, inode, and
//! a token the journal's first record repeats), the end of the compacted part,
//! its lines, its highest sequence number and the blocks' offsets:
//!
//! ```text
//! linerate-shard-map 2 <dev> <ino> <token> <sorted_end> <lines> <max_seq> <offset>×(SHARDS+1) <checksum>
//! ```
//!
//! At open, a map that matches its journal lets the store serve at once: the
//! records appended after the compacted part are read, and each shard's block
//! is read when a lookup first needs it (or by a background pass). A map that
//! does not match (the journal was rewritten by a build without maps, or a
//! crash fell between the journal's rename and the map's) is ignored and the
//! whole journal is read, as without one. The map is written after its journal
//! is in place, so it never names a journal that is not complete.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::journal::{self, Record};
use super::{KeyHash, SHARDS};

const MAGIC: &str = "linerate-shard-map 2";

/// The map of one compacted journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ShardMap {
    pub dev: u64,
    pub ino: u64,
    /// Also the key of the journal's first record (`D 0 <token>`).
    pub token: KeyHash,
    /// The end of the compacted part: appends follow it.
    pub sorted_end: u64,
    /// Lines in the compacted part (past the header).
    pub lines: u64,
    /// The highest sequence number in the compacted part.
    pub max_seq: u64,
    /// Shard `k`'s block is `offsets[k]..offsets[k + 1]`.
    pub offsets: Vec<u64>,
}

pub(super) fn path(dir: &Path) -> PathBuf {
    dir.join("index.shards")
}

/// The record a compacted journal starts with: replayed, it drops an object
/// nobody has (a no-op, also for builds that know no maps).
pub(super) fn token_record(token: KeyHash) -> Record {
    Record::DropObject { seq: 0, key: token }
}

impl ShardMap {
    fn encode(&self) -> Vec<u8> {
        let mut out = format!(
            "{MAGIC} {} {} {} {} {} {}",
            self.dev,
            self.ino,
            journal::hex(&self.token),
            self.sorted_end,
            self.lines,
            self.max_seq
        );
        for o in &self.offsets {
            out.push_str(&format!(" {o}"));
        }
        let sum = journal::fnv1a(out.as_bytes());
        out.push_str(&format!(" {sum:016x}\n"));
        out.into_bytes()
    }

    fn decode(text: &[u8]) -> Option<ShardMap> {
        let text = std::str::from_utf8(text).ok()?.strip_suffix('\n')?;
        let (body, sum) = text.rsplit_once(' ')?;
        if u64::from_str_radix(sum, 16).ok()? != journal::fnv1a(body.as_bytes()) {
            return None;
        }
        let mut f = body.strip_prefix(MAGIC)?.strip_prefix(' ')?.split(' ');
        let mut num = || f.next()?.parse::<u64>().ok();
        let (dev, ino) = (num()?, num()?);
        let token = journal::parse_key(f.next()?)?;
        let mut num = || f.next()?.parse::<u64>().ok();
        let (sorted_end, lines, max_seq) = (num()?, num()?, num()?);
        let offsets: Vec<u64> = f.map(|o| o.parse().ok()).collect::<Option<_>>()?;
        let map = ShardMap { dev, ino, token, sorted_end, lines, max_seq, offsets };
        let ordered = map.offsets.windows(2).all(|w| w[0] <= w[1]);
        let bounds = map.offsets.first().is_some_and(|&o| o > journal::HEADER.len() as u64)
            && map.offsets.last() == Some(&sorted_end);
        (map.offsets.len() == SHARDS + 1 && ordered && bounds).then_some(map)
    }

    /// Whether this map describes `file` as it is now: the same file, at least as
    /// long, starting with the map's token record.
    pub(super) fn matches(&self, file: &File) -> bool {
        let Ok(m) = file.metadata() else { return false };
        if m.dev() != self.dev || m.ino() != self.ino || m.len() < self.sorted_end {
            return false;
        }
        let first = journal::HEADER.len() as u64;
        let mut line = vec![0; (self.offsets[0] - first) as usize];
        if file.read_exact_at(&mut line, first).is_err() || line.pop() != Some(b'\n') {
            return false;
        }
        Record::decode(&line) == Some(token_record(self.token))
    }

    /// Reads the map at `path`; `None` if there is none or it is damaged.
    pub(super) fn read(path: &Path) -> Option<ShardMap> {
        // A map is about 10 KB (1,025 offsets); anything much larger is not one.
        let text = std::fs::read(path).ok().filter(|t| t.len() < 64 * 1024)?;
        ShardMap::decode(&text)
    }

    /// Writes the map next to its journal (a temporary file renamed into place).
    pub(super) fn write(&self, path: &Path, tmp: &Path) -> io::Result<()> {
        let result = (|| {
            let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(tmp)?;
            f.write_all(&self.encode())?;
            f.sync_all()?;
            std::fs::rename(tmp, path)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(tmp);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> ShardMap {
        let offsets = (0..=SHARDS as u64).map(|k| 100 + k * 10).collect();
        ShardMap {
            dev: 3,
            ino: 77,
            token: [7; 16],
            sorted_end: 100 + SHARDS as u64 * 10,
            lines: 9,
            max_seq: 42,
            offsets,
        }
    }

    #[test]
    fn a_map_reads_back_as_written_and_a_damaged_one_does_not() {
        let m = map();
        let text = m.encode();
        assert_eq!(ShardMap::decode(&text), Some(m.clone()));
        let mut bad = text.clone();
        bad[25] ^= 1;
        assert_eq!(ShardMap::decode(&bad), None, "checksum");
        assert_eq!(ShardMap::decode(&text[..text.len() - 1]), None, "cut short");
        let mut short = m.clone();
        short.offsets.pop();
        short.sorted_end = *short.offsets.last().unwrap();
        assert_eq!(ShardMap::decode(&short.encode()), None, "one offset missing");
        let mut unordered = m;
        unordered.offsets.swap(3, 4);
        assert_eq!(ShardMap::decode(&unordered.encode()), None, "offsets out of order");
    }

    #[test]
    fn a_map_of_another_format_is_not_read() {
        // Version 1 had 64 shards: a map it wrote is ignored here and the whole
        // journal is read (a build of version 1 ignores this one's by its name).
        let as_version = |m: &ShardMap, magic: &str| {
            let text = String::from_utf8(m.encode()).unwrap().replacen(MAGIC, magic, 1);
            let body = &text[..text.rfind(' ').unwrap()];
            format!("{body} {:016x}\n", journal::fnv1a(body.as_bytes())).into_bytes()
        };
        assert_eq!(ShardMap::decode(&as_version(&map(), MAGIC)), Some(map()), "the test's own rewrite");
        let mut v1 = map();
        v1.offsets.truncate(65);
        v1.sorted_end = *v1.offsets.last().unwrap();
        assert_eq!(ShardMap::decode(&as_version(&v1, "linerate-shard-map 1")), None, "version 1");
        assert_eq!(ShardMap::decode(&as_version(&v1, MAGIC)), None, "64 shards");
        assert_eq!(ShardMap::decode(&as_version(&map(), "linerate-shard-map 1")), None, "the old name");
    }
}
