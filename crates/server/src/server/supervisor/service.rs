//! What the server tells its service manager and operator about its state: systemd
//! notifications (`sd_notify`, through the sd-notify crate; nothing is sent when
//! `NOTIFY_SOCKET` is unset) and the pid file.
//!
//! - `READY=1` once every worker accepts (and `MAINPID` with it: after an upgrade the
//!   new process is the main one);
//! - `RELOADING=1` with `MONOTONIC_USEC` when SIGHUP arrives, `READY=1` when the
//!   reload is done or refused;
//! - `STOPPING=1` when shutdown begins (never by a process that handed over to a new
//!   binary: the service goes on);
//! - `STATUS=` lines saying what happened last.

use std::path::{Path, PathBuf};

use sd_notify::NotifyState;

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("cannot notify the service manager: {e}");
    }
}

pub(crate) fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::MainPid(std::process::id()), NotifyState::Status(status)]);
}

pub(crate) fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now, NotifyState::Status("reloading the configuration")]),
        Err(e) => tracing::warn!("cannot read the monotonic clock for the service manager: {e}"),
    }
}

pub(crate) fn reloaded(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

pub(crate) fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("draining transfers")]);
}

/// After a hand-over: the new process is the main one now.
pub(crate) fn handed_over(new_pid: u32) {
    send(&[NotifyState::MainPid(new_pid), NotifyState::Status("handed over to a new binary; draining")]);
}

pub(crate) fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

/// The pid file, when one is configured: written (atomically, by rename) once the
/// server serves, rewritten when an upgrade fails (so `linerate upgrade` sees the
/// outcome), removed at exit unless a new process has taken it over.
pub(crate) struct PidFile {
    path: Option<PathBuf>,
}

impl PidFile {
    pub(crate) fn new(path: Option<PathBuf>) -> PidFile {
        PidFile { path }
    }

    /// Writes this process's pid.
    pub(crate) fn write(&self) {
        let Some(path) = &self.path else { return };
        if let Err(e) = write_atomically(path, &format!("{}\n", std::process::id())) {
            tracing::error!(path = %path.display(), "cannot write the pid file: {e}");
        }
    }

    /// Removes the file if it still names this process.
    pub(crate) fn remove(&self) {
        let Some(path) = &self.path else { return };
        if read_pid(path).ok() == Some(std::process::id()) {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut tmp, text.as_bytes())?;
    let perms = std::os::unix::fs::PermissionsExt::from_mode(0o644);
    tmp.as_file().set_permissions(perms)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// The pid a pid file names.
pub(crate) fn read_pid(path: &Path) -> std::io::Result<u32> {
    let text = std::fs::read_to_string(path)?;
    text.trim().parse().map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{} does not hold a pid", path.display()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_file_is_written_and_removed_only_while_ours() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("linerate.pid");
        let f = PidFile::new(Some(path.clone()));
        f.write();
        assert_eq!(read_pid(&path).unwrap(), std::process::id());
        // Taken over by another process: left alone.
        std::fs::write(&path, "1\n").unwrap();
        f.remove();
        assert_eq!(read_pid(&path).unwrap(), 1);
        f.write();
        f.remove();
        assert!(!path.exists());
    }
}
