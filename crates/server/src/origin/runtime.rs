//! The threads every origin request and fill task runs on.
//!
//! One current-thread tokio runtime per thread, tasks handed out in turn: the
//! crate builds tokio without `rt-multi-thread` (every other loop here is
//! thread-per-core), and a fill task is long-lived and evenly sized, so work
//! stealing would gain little. A connection's task runs on the thread that
//! opened it, and only requests on that thread reuse it (see [`current`]).

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context as _;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// How long a stopping thread waits for its blocking tasks (name lookups) to end.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(1);

/// Tells runtimes apart (tests start several in one process).
static SERIAL: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The origin thread this is: its runtime's serial and its number there.
    static THREAD: Cell<Option<Thread>> = const { Cell::new(None) };
}

/// One origin thread: its runtime's serial, and its number in that runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Thread(usize, pub(super) usize);

/// The origin thread the caller runs on (`None` on any other thread). Work that
/// reads a connection stays on the thread that opened it: the connection's task
/// runs there, and a reader on another thread talks to it through hyper's
/// channels, two cross-thread wakes (two `eventfd` writes, two `epoll_wait`
/// returns) for every piece of the body. So a pooled connection is reused only
/// by its own thread, and a fill taking over an open's response runs on the
/// open's thread ([`Runtime::spawn_here`]).
pub(super) fn current() -> Option<Thread> {
    THREAD.with(Cell::get)
}

pub(super) struct Runtime {
    serial: usize,
    handles: Vec<Handle>,
    next: AtomicUsize,
    /// Dropped to stop the threads.
    stops: Vec<oneshot::Sender<()>>,
    threads: Vec<JoinHandle<()>>,
}

impl Runtime {
    /// Starts `threads` threads (at least one) named `linerate-origin{n}`.
    pub(super) fn start(threads: usize) -> anyhow::Result<Runtime> {
        let serial = SERIAL.fetch_add(1, Relaxed);
        let mut runtime =
            Runtime { serial, handles: Vec::new(), next: AtomicUsize::new(0), stops: Vec::new(), threads: Vec::new() };
        for n in 0..threads.max(1) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                // The blocking pool only runs getaddrinfo for the connector.
                .thread_name(format!("linerate-origin{n}.dns"))
                .build()
                .context("origin runtime")?;
            let (stop, stopped) = oneshot::channel::<()>();
            runtime.handles.push(rt.handle().clone());
            runtime.stops.push(stop);
            let thread = std::thread::Builder::new()
                .name(format!("linerate-origin{n}"))
                .spawn(move || {
                    THREAD.with(|t| t.set(Some(Thread(serial, n))));
                    rt.block_on(async {
                        let _ = stopped.await;
                    });
                    rt.shutdown_timeout(SHUTDOWN_WAIT);
                })
                .context("origin thread")?;
            runtime.threads.push(thread);
        }
        Ok(runtime)
    }

    /// Runs `fut` on the next thread in turn.
    pub(super) fn spawn<F: Future<Output = ()> + Send + 'static>(&self, fut: F) {
        let n = self.next.fetch_add(1, Relaxed) % self.handles.len();
        drop(self.handles[n].spawn(fut));
    }

    /// Runs `fut` on the calling thread when it is one of this runtime's, else
    /// as [`Runtime::spawn`] does.
    pub(super) fn spawn_here<F: Future<Output = ()> + Send + 'static>(&self, fut: F) {
        match current() {
            Some(Thread(serial, n)) if serial == self.serial => drop(self.handles[n].spawn(fut)),
            _ => self.spawn(fut),
        }
    }
}

impl Drop for Runtime {
    /// Stops every thread, and waits for those other than the calling one (the
    /// last reference may go from a task on one of them): their tasks are
    /// dropped, so their connections closed, when this returns.
    fn drop(&mut self) {
        self.stops.clear();
        let me = std::thread::current().id();
        for thread in self.threads.drain(..) {
            if thread.thread().id() != me {
                let _ = thread.join();
            }
        }
    }
}
