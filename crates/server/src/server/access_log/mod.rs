//! Access logs: one record per response, never written by a worker.
//!
//! A worker formats each record (JSON lines or nginx's `combined` format) into its
//! own buffer ([`WorkerLog`]); a full buffer, or one that has waited a second, is
//! handed as one batch to the writer thread ([`AccessLog`]), which owns the file and
//! appends batches to it. The hand-over never blocks: when the writer is behind (a
//! slow or full disk) and its queue is full, the batch is dropped and its records
//! are counted in `linerate_access_log_dropped_records_total`, so a bad disk costs
//! log lines, not viewers. `SIGUSR1` makes the writer reopen the file (the logrotate
//! convention): rotate by renaming the file, then send the signal.
//!
//! What is logged about the target: its path without the query (whether there was
//! one is a field of its own), with control bytes, non-ASCII bytes, quotes and
//! backslashes escaped as `\xHH`. Query strings carry signed-URL tokens and are never
//! written, the Referer's neither (a segment's Referer can be its manifest's signed
//! URL); the signed-URL verdict is a field of its own.
//!
//! The pieces, one file each:
//! - `worker_log`: the worker's side, [`WorkerLog`]: sampling, dating records from
//!   the monotonic clock, the per-worker buffer and the hand-over of batches;
//! - `writer`: [`AccessLog`], the writer thread that appends batches, reopens the
//!   file and finishes at shutdown, and the `LogCounters` both sides count in;
//! - `record`: [`Record`] and its two formats, JSON lines and nginx's `combined`
//!   (timestamps come from `linerate_http::date::Timestamps`);
//! - `escape`: the `\xHH` escaping of request bytes;
//! - `numerals`: addresses and numbers written as text without `core::fmt`.

mod escape;
mod numerals;
mod record;
#[cfg(test)]
mod testing;
mod worker_log;
mod writer;

pub(crate) use crate::config::AccessLogFormat as Format;
pub(crate) use record::Record;
pub(crate) use worker_log::WorkerLog;
pub(crate) use writer::AccessLog;
