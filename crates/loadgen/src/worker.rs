//! A bench worker: one thread with its own current-thread tokio runtime, running
//! its share of the sessions. Nothing it writes on the hot path is shared: its
//! buffers, histograms, counters and timeline are its own; the main thread merges
//! them when the run is over and reads only the [`Live`] counters meanwhile.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use super::plan::Plan;
use super::session::{self, WorkerCtx};
use super::stats::{Live, WorkerStats};

/// How long after the planned end a worker waits for its sessions before dropping
/// them. Every wait in a session is already bounded by the end, so this is a backstop.
const BACKSTOP: Duration = Duration::from_secs(5);

/// Runs sessions `ids` to the end of the run and returns what they measured, and
/// how many had to be dropped at the backstop (0 unless something is wrong).
pub(crate) fn run(plan: Arc<Plan>, ids: Vec<u32>, live: Arc<Live>) -> std::io::Result<(WorkerStats, usize)> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
    let local = tokio::task::LocalSet::new();
    let result = local.block_on(&rt, async move {
        let ctx = Rc::new(WorkerCtx::new(plan.clone(), live));
        let handles: Vec<_> =
            ids.into_iter().map(|id| tokio::task::spawn_local(session::run(ctx.clone(), id))).collect();
        let backstop = (plan.end + BACKSTOP).into();
        let mut stuck = 0;
        for h in handles {
            if tokio::time::timeout_at(backstop, h).await.is_err() {
                stuck += 1;
            }
        }
        let stats = ctx.stats.replace(WorkerStats::new(0));
        (stats, stuck)
    });
    Ok(result)
}
