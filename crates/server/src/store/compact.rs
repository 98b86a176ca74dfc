//! Compaction: a journal appended to for long holds mostly records of slices
//! since evicted and metadata since refreshed. Once it holds more than twice
//! its directory's live records, it is rewritten with only those (in a
//! temporary file, synced, renamed over it), so that replay at open stays
//! proportional to what the store holds.
//!
//! The rewrite holds the journal's lock throughout: appends to that directory
//! (fills, not hits) wait for it. Changes to the index take a shard lock and
//! then append, never the other way round, so a change is either in the index
//! the rewrite walks or appended after it; both at worst (a duplicate, which
//! replay applies twice to the same effect).

use super::journal::{Record, Rewrite};
use super::{lock, Shared, StoreError};

/// Journals shorter than this are left alone: rewriting them gains nothing.
const MIN_LINES: u64 = 1024;

/// Whether a journal of `lines` lines whose directory holds `live` records
/// should be rewritten.
pub(super) fn needed(lines: u64, live: u64) -> bool {
    lines > 2 * live && lines >= MIN_LINES
}

/// Rewrites directory `dir`'s journal when [`needed`] (or always, when
/// `force`); returns its lines when it did.
pub(super) fn compact(s: &Shared, dir: usize, force: bool) -> Result<Option<u64>, StoreError> {
    let d = &s.dirs[dir];
    if !d.writable(s.now_ms()) {
        return Ok(None);
    }
    let mut journal = lock(&d.journal);
    if !force && !needed(journal.lines, d.live_records()) {
        return Ok(None);
    }
    let failed = |e| d.failed(e, s.now_ms(), s.retry);
    // A leftover of this run's last failed attempt.
    let _ = std::fs::remove_file(&journal.tmp);
    let mut w = Rewrite::create(journal.tmp.clone()).map_err(failed)?;
    for shard in &s.shards {
        let shard = lock(shard);
        for (key, e) in shard.objects.iter().filter(|(_, e)| e.dir == dir) {
            let object = Record::Object { seq: e.seq, key: *key, gen: e.gen, meta: e.meta.clone() };
            let slices = e.slices.iter().map(|(&index, sl)| Record::Slice {
                seq: sl.seq,
                key: *key,
                gen: e.gen,
                index,
                file: sl.file,
            });
            for r in std::iter::once(object).chain(slices) {
                if let Err(e) = w.push(&r) {
                    w.abandon();
                    return Err(failed(e));
                }
            }
        }
    }
    let before = journal.lines;
    let lines = w.finish(&journal.path).map_err(failed)?;
    journal.replaced(lines);
    tracing::debug!(dir = %d.path.display(), "journal compacted from {before} to {lines} lines");
    Ok(Some(lines))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_is_rewritten_past_twice_its_live_records() {
        assert!(!needed(2048, 1024), "exactly twice");
        assert!(needed(2049, 1024));
        assert!(needed(1024, 0));
        assert!(!needed(1023, 0), "too short to bother");
    }
}
