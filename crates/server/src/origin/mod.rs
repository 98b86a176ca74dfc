//! The origin client: HTTP/1.1 requests from the pull-through cache to the
//! origins of the `[[origin]]` tables.
//!
//! **A request** is built by linerate, never copied from the viewer's
//! ([`OriginRequest`]): the method (GET, or HEAD), the URL's path followed by the
//! rest of the viewer's path (percent-encoded) and the query the cache keys on,
//! `Host` (the URL's host, with `:port` unless it is the scheme's default),
//! `User-Agent: linerate/<version>`, `Accept-Encoding: identity` (bytes are cached
//! as the origin stores them), `Range`, `If-None-Match`, `If-Modified-Since`, and
//! the viewer fields the table's `forward_headers` names. Nothing else.
//!
//! **Routing.** A request path belongs to the table whose prefix is its longest
//! prefix ([`Origins::route`]); what follows the prefix goes after the origin
//! URL's path.
//!
//! **The runtime.** Every origin request and every fill task runs on the origin
//! threads ([`Origins::spawn`]; see `runtime`); a worker never waits on the
//! network for an origin, it awaits a channel fed from there.

mod content_range;
mod request;
mod runtime;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::sync::Arc;

// Wired into the cache in the next step (until then, only the tests use these).
#[allow(unused_imports)]
pub use self::{content_range::ContentRange, request::OriginRequest};

use runtime::Runtime;

/// The origin client of every `[[origin]]` table, and the threads it runs on.
pub struct Origins {
    tables: Vec<Table>,
    /// Table indexes, longest prefix first.
    by_prefix: Vec<usize>,
    runtime: Runtime,
}

struct Table {
    config: crate::config::Origin,
}

impl Origins {
    /// Starts the origin runtime for the `[[origin]]` tables: `threads` OS threads
    /// (at least one, named `linerate-origin{n}`), on which every origin request
    /// and every fill task runs; workers never wait on the network themselves
    /// (they await channels fed from here).
    pub fn start(tables: &[crate::config::Origin], threads: usize) -> anyhow::Result<Arc<Origins>> {
        let built: Vec<Table> = tables.iter().map(|config| Table { config: config.clone() }).collect();
        let mut by_prefix: Vec<usize> = (0..built.len()).collect();
        by_prefix.sort_by_key(|&i| std::cmp::Reverse(built[i].config.prefix.len()));
        let runtime = Runtime::start(threads)?;
        Ok(Arc::new(Origins { tables: built, by_prefix, runtime }))
    }

    /// The table whose prefix is the longest prefix of `path` (a normalised
    /// absolute path such as `/vod/a/b.mp4`) and the rest of the path after that
    /// prefix (`a/b.mp4`).
    pub fn route<'p>(&self, path: &'p [u8]) -> Option<(usize, &'p [u8])> {
        self.by_prefix.iter().find_map(|&i| {
            let prefix = self.tables[i].config.prefix.as_bytes();
            path.strip_prefix(prefix).map(|rest| (i, rest))
        })
    }

    pub fn table(&self, table: usize) -> &crate::config::Origin {
        &self.tables[table].config
    }

    /// Runs `fut` on the origin runtime.
    pub fn spawn<F: Future<Output = ()> + Send + 'static>(&self, fut: F) {
        self.runtime.spawn(fut);
    }
}
