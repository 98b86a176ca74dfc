//! `linerate serve`, in layers, each a folder that imports only from those below it:
//!
//! - **process** — `supervisor`: start-up, the event loop (reload, log reopen,
//!   binary upgrade, shutdown), the exit status; `listen`: the listening
//!   sockets and the steering program that picks a worker for each connection.
//! - **worker** — `worker`: one thread per CPU with its event loop, accepting
//!   and serving connections; the per-client limits at accept.
//! - **connection** — `conn`: one connection's requests and responses, generic
//!   over its transport and its page cache.
//! - **content** — `files`: the per-worker open-file cache under the root;
//!   `pagecache`: sending a range of a file that may not be in memory, with the
//!   fill pool behind it; `access_log`: records handed to a writer thread.
//!
//! `settings` is the validated configuration as every layer reads it.

pub(crate) mod access_log;
pub(crate) mod cache;
mod conn;
mod files;
mod listen;
pub(crate) mod pagecache;
pub(crate) mod prefill;
pub(crate) mod settings;
mod supervisor;
mod worker;

use std::path::PathBuf;

use crate::config::{Config, Overrides};

pub use supervisor::upgrade;

/// What `serve` needs besides the configuration.
pub struct ServeOptions {
    pub config_file: Option<PathBuf>,
    pub overrides: Overrides,
}

/// Serves until SIGTERM or SIGINT (exit status 0), a completed binary upgrade
/// (0: the new process serves), or a worker that stops on its own (an error).
pub fn run(config: Config, opts: ServeOptions) -> anyhow::Result<()> {
    let mut running = supervisor::start(config, opts)?;
    let stop = running.supervise();
    running.shut_down(stop)
}
