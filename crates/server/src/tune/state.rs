//! `--apply` and `--revert`: every change is recorded with the value it replaced
//! in a state file, written after each step, so a revert restores the host as it
//! was even if an apply stopped half way.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::checks::Action;
use super::features::Features;
use crate::sysfs::Host;

/// One applied change and what it replaced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub(super) enum Entry {
    Write { path: String, previous: String, value: String },
    Feature { iface: String, name: String, previous: bool, value: bool },
    Module { name: String },
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct State {
    /// The root the changes were made under; a revert must use the same one.
    pub root: PathBuf,
    #[serde(default, rename = "entry")]
    pub entries: Vec<Entry>,
}

impl State {
    pub(super) fn load(path: &Path) -> anyhow::Result<Option<State>> {
        match std::fs::read_to_string(path) {
            Ok(s) => Ok(Some(toml::from_str(&s).with_context(|| format!("state file {}", path.display()))?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("state file {}", path.display())),
        }
    }

    pub(super) fn save(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let text = toml::to_string(self).context("encoding the state")?;
        // Write then rename, so a crash never leaves a half-written state file.
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
    }

    /// True when this state already saved the original value of what `action` touches.
    fn covers(&self, action: &Action) -> bool {
        self.entries.iter().any(|e| match (e, action) {
            (Entry::Write { path, .. }, Action::Write { path: p, .. }) => path == p,
            (Entry::Feature { iface, name, .. }, Action::Feature { iface: i, name: n, .. }) => iface == i && name == n,
            (Entry::Module { name }, Action::LoadModule { name: n }) => name == n,
            _ => false,
        })
    }
}

/// What happened to one action.
pub(super) enum Outcome {
    Done,
    Skipped(String),
    Failed(anyhow::Error),
}

/// Performs `actions` in order, saving `state_path` after each. Returns one outcome
/// per action.
pub(super) fn apply(
    host: &Host,
    features: &dyn Features,
    actions: &[Action],
    state_path: &Path,
) -> anyhow::Result<Vec<Outcome>> {
    let mut state =
        State::load(state_path)?.unwrap_or_else(|| State { root: host.root().to_path_buf(), entries: vec![] });
    anyhow::ensure!(
        state.root == host.root(),
        "state file {} records changes under {}, not {}; revert those first",
        state_path.display(),
        state.root.display(),
        host.root().display()
    );
    let mut outcomes = Vec::new();
    for action in actions {
        let first_time = !state.covers(action);
        let result = perform(host, features, action);
        let outcome = match result {
            Ok(Some(entry)) => {
                if first_time {
                    state.entries.push(entry);
                    state.save(state_path)?;
                }
                Outcome::Done
            }
            Ok(None) => Outcome::Skipped("only possible on the live root (/)".into()),
            Err(e) => Outcome::Failed(e),
        };
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

fn perform(host: &Host, features: &dyn Features, action: &Action) -> anyhow::Result<Option<Entry>> {
    match action {
        Action::Write { path, value } => {
            let previous = host.read(path).with_context(|| format!("reading /{path}"))?;
            host.write(path, value).with_context(|| format!("writing {value:?} to /{path}"))?;
            Ok(Some(Entry::Write { path: path.clone(), previous, value: value.clone() }))
        }
        Action::Feature { iface, name, on } => {
            let previous = features
                .features(iface)
                .with_context(|| format!("reading features of {iface}"))?
                .get(name)
                .map(|f| f.active)
                .with_context(|| format!("{iface} has no feature {name}"))?;
            features.set(iface, name, *on).with_context(|| format!("setting {name} on {iface}"))?;
            Ok(Some(Entry::Feature { iface: iface.clone(), name: name.clone(), previous, value: *on }))
        }
        Action::LoadModule { name } => {
            if !host.is_live() {
                return Ok(None);
            }
            run_modprobe(&[name])?;
            Ok(Some(Entry::Module { name: name.clone() }))
        }
    }
}

fn run_modprobe(args: &[&str]) -> anyhow::Result<()> {
    let out = std::process::Command::new("modprobe").args(args).output().context("running modprobe")?;
    anyhow::ensure!(
        out.status.success(),
        "modprobe {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Undoes everything in the state file, newest first. Entries that fail stay in
/// the file (and the error is returned); the file is removed when all succeed.
pub(super) fn revert(
    host: &Host,
    features: &dyn Features,
    state_path: &Path,
) -> anyhow::Result<Vec<(Entry, anyhow::Result<()>)>> {
    let Some(state) = State::load(state_path)? else {
        anyhow::bail!("no state file at {}: nothing was applied (or it was already reverted)", state_path.display());
    };
    anyhow::ensure!(
        state.root == host.root(),
        "state file {} records changes under {}, not {}",
        state_path.display(),
        state.root.display(),
        host.root().display()
    );
    let mut results = Vec::new();
    let mut left = Vec::new();
    for entry in state.entries.iter().rev() {
        let r = match entry {
            Entry::Write { path, previous, .. } => {
                host.write(path, previous).with_context(|| format!("restoring /{path}"))
            }
            Entry::Feature { iface, name, previous, .. } => {
                features.set(iface, name, *previous).with_context(|| format!("restoring {name} on {iface}"))
            }
            Entry::Module { name } => run_modprobe(&["-r", name]),
        };
        if r.is_err() {
            left.push(entry.clone());
        }
        results.push((entry.clone(), r));
    }
    if left.is_empty() {
        std::fs::remove_file(state_path).with_context(|| format!("removing {}", state_path.display()))?;
    } else {
        left.reverse();
        State { root: state.root, entries: left }.save(state_path)?;
    }
    Ok(results)
}
