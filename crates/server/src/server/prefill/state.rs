//! The prefill job's state: each title's progress, what `/prefill` and `/status`
//! show, and the file that carries the job across restarts (written whole to a
//! temporary file and renamed over the old one, so a crash leaves one or the
//! other).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::manifest::Manifest;

/// The state file's name in the state directory.
pub(crate) const FILE: &str = "prefill.json";

/// Where a title is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum TitleState {
    Pending,
    Done,
    Failed,
}

/// One title of the manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Title {
    pub state: TitleState,
    /// Its size, once its head is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What is saved: the manifest and each title's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Saved {
    pub manifest: Manifest,
    pub titles: Vec<Title>,
}

impl Saved {
    pub(crate) fn new(manifest: Manifest) -> Saved {
        let titles = vec![Title { state: TitleState::Pending, bytes: None, error: None }; manifest.paths.len()];
        Saved { manifest, titles }
    }

    /// Reads the state file in `dir`: `None` when there is none.
    pub(crate) fn load(dir: &Path) -> Result<Option<Saved>, String> {
        let path = dir.join(FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let saved: Saved = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if saved.titles.len() != saved.manifest.paths.len() {
            return Err(format!(
                "{}: {} titles for {} paths",
                path.display(),
                saved.titles.len(),
                saved.manifest.paths.len()
            ));
        }
        Ok(Some(saved))
    }

    /// Writes it into `dir` atomically (a temporary file renamed over the old).
    pub(crate) fn save(&self, dir: &Path) -> std::io::Result<()> {
        let tmp: PathBuf = dir.join(format!("{FILE}.tmp"));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(self).map_err(std::io::Error::other)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(FILE))
    }
}

/// What the filler is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Phase {
    /// No manifest.
    Idle,
    /// Outside `prefill.window`: resumes when it opens.
    WaitingForWindow,
    /// Viewer misses are under way (`prefill.busy_fills`): they go first.
    Yielding,
    Filling,
    /// Every title is done (or failed); the titles stay pinned until `expires`.
    Done,
    /// The manifest's lifetime is over: nothing pinned any more.
    Expired,
}

impl Phase {
    pub(crate) const ALL: [Phase; 6] =
        [Phase::Idle, Phase::WaitingForWindow, Phase::Yielding, Phase::Filling, Phase::Done, Phase::Expired];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::WaitingForWindow => "waiting-for-window",
            Phase::Yielding => "yielding",
            Phase::Filling => "filling",
            Phase::Done => "done",
            Phase::Expired => "expired",
        }
    }
}

/// Progress, as `/prefill` and `/status` show it.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Progress {
    pub state: Phase,
    /// `prefill.window`, or null (at any time).
    pub window: Option<String>,
    pub rate_bits_per_second: u64,
    pub titles_total: usize,
    pub titles_done: usize,
    pub titles_failed: usize,
    /// Bytes of the manifest's titles in the store (complete titles, and the
    /// slices of the one being filled).
    pub bytes_done: u64,
    /// Sizes of the titles whose head is known so far.
    pub bytes_known: u64,
    /// Origin body bytes the filler has read since the server started.
    pub bytes_fetched: u64,
    /// The title being filled (its rank and path).
    pub current: Option<(usize, String)>,
    pub submitted: Option<i64>,
    pub expires: Option<i64>,
    /// The first failures (rank, path, why).
    pub errors: Vec<(usize, String, String)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_file_round_trips_and_is_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Saved::load(dir.path()).unwrap(), None);
        let m = Manifest { paths: vec!["/v/a".into(), "/v/b".into()], submitted: 1, expires: 2 };
        let mut s = Saved::new(m);
        s.titles[0] = Title { state: TitleState::Done, bytes: Some(10), error: None };
        s.save(dir.path()).unwrap();
        assert_eq!(Saved::load(dir.path()).unwrap(), Some(s.clone()));
        s.titles[1].state = TitleState::Failed;
        s.save(dir.path()).unwrap();
        assert_eq!(Saved::load(dir.path()).unwrap().unwrap().titles[1].state, TitleState::Failed);
        assert!(!dir.path().join("prefill.json.tmp").exists());
        std::fs::write(dir.path().join(FILE), "{").unwrap();
        assert!(Saved::load(dir.path()).unwrap_err().contains("prefill.json"));
    }
}
