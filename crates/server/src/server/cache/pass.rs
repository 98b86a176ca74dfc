//! Passing a response through: for an object that may not be stored for every
//! viewer (`no-store`, `private`, `Set-Cookie`, `Vary`, no length, an origin that
//! ignores ranges), each viewer gets an origin request of its own, and the answer
//! is streamed to it through a file in memory, never kept.

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use http::header::{self, HeaderName, HeaderValue};
use tokio::sync::{oneshot, watch};

use super::fill::memory_file;
use super::{Cache, Failure, FillState, Key};
use crate::origin::OriginRequest;

/// The fields of an origin's answer a passed-through response carries on.
const RELAYED: [HeaderName; 10] = [
    header::CONTENT_TYPE,
    header::CONTENT_RANGE,
    header::ETAG,
    header::LAST_MODIFIED,
    header::CACHE_CONTROL,
    header::AGE,
    header::EXPIRES,
    header::SET_COOKIE,
    header::VARY,
    header::ACCEPT_RANGES,
];

/// A passed-through answer: its head, and its body as it arrives.
pub(crate) struct Passed {
    pub status: u16,
    pub fields: Vec<(HeaderName, HeaderValue)>,
    /// The body's length, when the origin said (else it ends with the connection).
    pub len: Option<u64>,
    pub body: watch::Receiver<FillState>,
}

impl Cache {
    /// Asks table `table`'s origin for `key` on behalf of one viewer: HEAD or GET,
    /// with the viewer's single `range` if it has one, and `forwarded` fields.
    pub(crate) async fn pass(
        self: &Arc<Cache>,
        table: usize,
        key: &Arc<Key>,
        head: bool,
        range: Option<(u64, u64)>,
        forwarded: Vec<(String, Vec<u8>)>,
    ) -> Result<Passed, Failure> {
        let (head_tx, head_rx) = oneshot::channel();
        let (tx, rx) = watch::channel(FillState::default());
        let (cache, key) = (self.clone(), key.clone());
        self.origins.spawn(async move {
            let req = OriginRequest {
                head,
                path: key.origin_path.clone(),
                query: key.origin_query.clone(),
                via: key.via.clone(),
                range,
                forwarded,
                hold: key.hold,
                ..OriginRequest::default()
            };
            let mut response = match cache.origins.fetch(table, &req).await {
                Ok(r) => r,
                Err(e) => {
                    let _ = head_tx.send(Err(Failure::origin(e)));
                    return;
                }
            };
            let fields: Vec<(HeaderName, HeaderValue)> = RELAYED
                .iter()
                .flat_map(|name| response.headers.get_all(name).iter().map(move |v| (name.clone(), v.clone())))
                .collect();
            let len = super::meta::field(&response.headers, header::CONTENT_LENGTH)
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
                .filter(|_| !head);
            let file = Arc::new(memory_file());
            tx.send_modify(|s| s.file = Some(file.clone()));
            let _ = head_tx.send(Ok((response.status, fields, len)));
            let mut written = 0u64;
            let end = loop {
                if head {
                    break Ok(());
                }
                match response.chunk().await {
                    Ok(Some(chunk)) => {
                        if let Err(e) = file.write_all_at(&chunk, written) {
                            break Err(Failure::BadResponse(format!("memory: {e}")));
                        }
                        written += chunk.len() as u64;
                        cache.stats.origin_bytes.add(chunk.len() as u64);
                        tx.send_modify(|s| s.written = written);
                    }
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(Failure::origin(e)),
                }
            };
            tx.send_modify(|s| s.end = Some(end));
        });
        let (status, fields, len) =
            head_rx.await.map_err(|_| Failure::BadResponse("the origin request was lost".into()))??;
        Ok(Passed { status, fields, len, body: rx })
    }
}
