//! The sweep: after `open` has returned, removes what a crash left in the cache
//! directories and the index does not know: slice files renamed into place
//! whose record was never written (or belongs to a replaced version), and
//! temporary files of earlier runs.
//!
//! It runs once, on its own thread, so that `open` never walks the slice files.
//! A file is removed under its shard's lock after checking that the index does
//! not hold it and that no writer is committing to its path, so a fill running
//! meanwhile is never hurt.

use std::path::Path;

use super::journal::parse_key;
use super::{KeyHash, Shared};

/// What one sweep removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Swept {
    pub orphans: u64,
    pub tmp_files: u64,
}

/// Sweeps every directory whose journal was read at open (in one that could not
/// be read, every file would look unknown).
pub(super) fn sweep(s: &Shared) -> Swept {
    let mut swept = Swept::default();
    if s.load_failed.load(std::sync::atomic::Ordering::Acquire) {
        tracing::warn!("cache sweep skipped: part of the index could not be read");
        return swept;
    }
    for (i, d) in s.dirs.iter().enumerate() {
        if !d.replayed {
            continue;
        }
        let before = swept;
        sweep_tmp(s, &d.tmp(), &mut swept);
        if let Ok(subdirs) = std::fs::read_dir(d.slices()) {
            for sub in subdirs.flatten() {
                if s.stopping() {
                    return swept;
                }
                sweep_slices(s, i, &sub.path(), &mut swept);
            }
        }
        if swept != before {
            tracing::info!(
                dir = %d.path.display(),
                "removed {} slice files the index does not know and {} temporary files, left by a crash",
                swept.orphans - before.orphans,
                swept.tmp_files - before.tmp_files
            );
        }
    }
    swept
}

/// Removes the temporary files of earlier runs (this run's are named after it).
fn sweep_tmp(s: &Shared, tmp: &Path, swept: &mut Swept) {
    let Ok(entries) = std::fs::read_dir(tmp) else { return };
    let ours = format!("{}.", s.run);
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with(&ours) && std::fs::remove_file(e.path()).is_ok() {
            swept.tmp_files += 1;
        }
    }
}

/// `<key>.<gen>.<index>`.
fn parse_name(name: &str) -> Option<(KeyHash, u64, u64)> {
    let mut parts = name.split('.');
    let key = parse_key(parts.next()?)?;
    let gen = parts.next()?.parse().ok()?;
    let index = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((key, gen, index))
}

fn sweep_slices(s: &Shared, dir: usize, sub: &Path, swept: &mut Swept) {
    let Ok(entries) = std::fs::read_dir(sub) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some((key, gen, index)) = parse_name(&name.to_string_lossy()) else { continue };
        // By name only: a file at a slice's place that is not the one recorded
        // is the lookup's to catch (with the `stat` it makes anyway), and a
        // readdir's inode number is not always the file's (overlayfs).
        let shard = s.shard(&key);
        let known =
            shard.objects.get(&key).is_some_and(|o| o.dir == dir && o.gen == gen && o.slices.contains_key(&index));
        if !known && !shard.writing.contains_key(&(key, index)) && std::fs::remove_file(e.path()).is_ok() {
            swept.orphans += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_names_parse_back() {
        let key = [0xab; 16];
        let name = format!("{}.12.3", super::super::journal::hex(&key));
        assert_eq!(parse_name(&name), Some((key, 12, 3)));
        for bad in ["", "x.1.2", &format!("{name}.4"), &name[2..], &name.replace(".12.", ".-1.")] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
    }
}
