//! Playlists compressed with gzip for viewers that accept it (Apple's HLS
//! authoring specification asks that low-latency playlists be compressed).
//!
//! Only a stored object of a playlist media type (HLS, DASH) of at most
//! [`GZIP_MAX_BYTES`], whole in one stored slice, is compressed: in memory, once
//! per version, off the workers (on the origin runtime, which reads the stored
//! slice and writes the result into a file in memory a worker sends as any
//! body). Everything else, segments first, is sent as stored, zero-copy.
//!
//! The compressed answer is another representation: its `ETag` is the stored
//! one with `-gzip` inside the quotes, its length its own, and every answer of a
//! playlist type, compressed or not, carries `Vary: Accept-Encoding`. A request
//! with `Range` gets the uncompressed representation (with its ranges): which
//! representation to send is the server's choice (RFC 9110 section 12.5.3), and
//! ranges of the compressed bytes are of no use to a player.

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::Arc;

use tokio::sync::watch;

use super::{lock, Cache, Key};
use crate::store::{KeyHash, ObjectMeta};

/// The largest playlist compressed.
pub(crate) const GZIP_MAX_BYTES: u64 = 256 * 1024;

/// Compressed playlists kept (one version per key); past it the table starts
/// again empty.
const KEPT: usize = 4096;

/// The media types compressed (compared without parameters, ignoring case).
const PLAYLIST_TYPES: [&[u8]; 4] =
    [b"application/vnd.apple.mpegurl", b"application/x-mpegurl", b"audio/mpegurl", b"application/dash+xml"];

/// A playlist's compressed bytes, in a file in memory.
pub(crate) struct Gzipped {
    pub file: std::fs::File,
    pub len: u64,
}

/// A compression under way (`None` inside until done), or its result (`None`:
/// not possible, for instance the slice not stored).
type Slot = watch::Receiver<Option<Option<Arc<Gzipped>>>>;

/// The compressed playlists, by key, each with the version it was made from.
#[derive(Default)]
pub(crate) struct GzipTable(std::sync::Mutex<HashMap<KeyHash, (Arc<ObjectMeta>, Slot)>>);

/// Whether a body of `content_type` is a playlist (whatever its size).
pub(crate) fn is_playlist(content_type: &[u8]) -> bool {
    let essence = content_type.split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
    PLAYLIST_TYPES.iter().any(|t| t.eq_ignore_ascii_case(essence))
}

/// Whether a playlist of `size` bytes is compressed.
pub(crate) fn compressible(content_type: &[u8], size: u64) -> bool {
    size > 0 && size <= GZIP_MAX_BYTES && is_playlist(content_type)
}

/// Whether an `Accept-Encoding` value accepts gzip (RFC 9110 section 12.5.3):
/// `gzip` or `x-gzip` with a weight above 0, or `*` above 0 when gzip is not
/// named.
pub(crate) fn accepts_gzip(value: &[u8]) -> bool {
    let mut star = false;
    for member in value.split(|&b| b == b',') {
        let mut parts = member.split(|&b| b == b';');
        let coding = parts.next().unwrap_or_default().trim_ascii();
        let weight_zero = parts.any(|p| {
            let p = p.trim_ascii();
            let Some(q) = p.strip_prefix(b"q=").or_else(|| p.strip_prefix(b"Q=")) else { return false };
            std::str::from_utf8(q).ok().and_then(|q| q.trim().parse::<f32>().ok()).is_some_and(|q| q <= 0.0)
        });
        if coding.eq_ignore_ascii_case(b"gzip") || coding.eq_ignore_ascii_case(b"x-gzip") {
            return !weight_zero;
        }
        if coding == b"*" {
            star = !weight_zero;
        }
    }
    star
}

/// The `ETag` of the compressed representation: `"abc"` → `"abc-gzip"`,
/// `W/"abc"` → `W/"abc-gzip"`.
pub(crate) fn gzip_etag(etag: &[u8]) -> Vec<u8> {
    match etag.strip_suffix(b"\"") {
        Some(open) => [open, b"-gzip\""].concat(),
        None => [etag, b"-gzip"].concat(),
    }
}

/// `body` compressed.
fn compress(body: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut e = flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 4 + 64), flate2::Compression::new(6));
    e.write_all(body)?;
    e.finish()
}

impl Cache {
    /// The compressed representation of the stored playlist `meta` (which must be
    /// [`compressible`]), made once per version on the origin runtime; `None`
    /// when it cannot be had (its slice not stored yet, being filled: the
    /// viewer gets the stored bytes, and a later request tries again).
    pub(crate) async fn gzipped(self: &Arc<Cache>, key: &Arc<Key>, meta: &Arc<ObjectMeta>) -> Option<Arc<Gzipped>> {
        if meta.size > self.slice_bytes {
            return None;
        }
        let mut rx = {
            let mut table = lock(&self.gzipped.0);
            match table.get(&key.hash) {
                Some((version, rx)) if version.same_version(meta) && version.size == meta.size => rx.clone(),
                _ => {
                    if table.len() >= KEPT {
                        table.clear();
                    }
                    let (tx, rx) = watch::channel(None);
                    table.insert(key.hash, (meta.clone(), rx.clone()));
                    let (cache, key, meta) = (self.clone(), key.clone(), meta.clone());
                    self.origins.spawn(async move {
                        let made = cache.make_gzipped(&key, &meta).await;
                        if made.is_none() {
                            // Not stored yet: the next request tries again.
                            let mut table = lock(&cache.gzipped.0);
                            if table.get(&key.hash).is_some_and(|(v, _)| Arc::ptr_eq(v, &meta)) {
                                table.remove(&key.hash);
                            }
                        }
                        let _ = tx.send(Some(made));
                    });
                    rx
                }
            }
        };
        loop {
            if let Some(made) = rx.borrow_and_update().clone() {
                return made;
            }
            rx.changed().await.ok()?;
        }
    }

    /// Reads the slice of `meta`, stored or once its fill has ended (the herd
    /// that caused it gets it compressed too), and compresses it into a file in
    /// memory (on a blocking thread of the origin runtime).
    async fn make_gzipped(&self, key: &Key, meta: &ObjectMeta) -> Option<Arc<Gzipped>> {
        let size = meta.size;
        let from = match self.store.slice(&key.hash, meta, 0) {
            Some(slice) => Err(slice.path),
            None => Ok(self.filled(key, meta).await?),
        };
        tokio::task::spawn_blocking(move || {
            let body = match from {
                Err(path) => std::fs::read(path).ok()?,
                Ok(file) => {
                    let mut body = vec![0; size as usize];
                    std::os::unix::fs::FileExt::read_exact_at(&*file, &mut body, 0).ok()?;
                    body
                }
            };
            let body = Some(body).filter(|b| b.len() as u64 == size)?;
            let packed = compress(&body).ok()?;
            let mut file = linerate_sys::memfd("linerate-gzip").ok()?;
            file.write_all(&packed).ok()?;
            Some(Arc::new(Gzipped { file, len: packed.len() as u64 }))
        })
        .await
        .ok()
        .flatten()
    }
}

impl Cache {
    /// The file slice 0 of `meta` is being filled into, once the fill ended
    /// well; `None` when no fill of this version is under way, or it failed.
    async fn filled(&self, key: &Key, meta: &ObjectMeta) -> Option<Arc<std::fs::File>> {
        let mut rx = {
            let fills = lock(&self.fills);
            let (version, rx, _) = fills.get(&(key.hash, 0))?;
            if !version.same_version(meta) {
                return None;
            }
            rx.clone()
        };
        loop {
            {
                let state = rx.borrow_and_update();
                match &state.end {
                    Some(Ok(())) => return state.file.clone(),
                    Some(Err(_)) => return None,
                    None => {}
                }
            }
            rx.changed().await.ok()?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_playlists_up_to_the_bound_are_compressed() {
        assert!(compressible(b"application/vnd.apple.mpegurl", 1000));
        assert!(compressible(b"Application/X-MpegURL; charset=utf-8", 1000));
        assert!(compressible(b"audio/mpegurl", GZIP_MAX_BYTES));
        assert!(compressible(b"application/dash+xml", 10));
        assert!(!compressible(b"application/dash+xml", GZIP_MAX_BYTES + 1), "too large");
        assert!(!compressible(b"application/vnd.apple.mpegurl", 0), "empty");
        assert!(!compressible(b"video/mp2t", 1000), "a segment");
        assert!(!compressible(b"video/mp4", 1000));
        assert!(!compressible(b"application/vnd.apple.mpegurlx", 1000));
        assert!(is_playlist(b"application/vnd.apple.mpegurl"));
        assert!(!is_playlist(b"text/plain"));
    }

    #[test]
    fn accept_encoding_is_read_with_its_weights() {
        for yes in [&b"gzip"[..], b"gzip, deflate, br", b"br;q=1.0, GZIP;q=0.5", b"x-gzip", b"*", b"deflate, *;q=0.1"] {
            assert!(accepts_gzip(yes), "{}", String::from_utf8_lossy(yes));
        }
        for no in [&b""[..], b"identity", b"gzip;q=0", b"gzip; q=0.0, *", b"br", b"*;q=0", b"gzipx"] {
            assert!(!accepts_gzip(no), "{}", String::from_utf8_lossy(no));
        }
    }

    #[test]
    fn the_compressed_representation_has_its_own_etag() {
        assert_eq!(gzip_etag(b"\"5f-1a\""), b"\"5f-1a-gzip\"");
        assert_eq!(gzip_etag(b"W/\"x\""), b"W/\"x-gzip\"");
    }

    #[test]
    fn compressed_bytes_decompress_to_the_playlist() {
        let body = b"#EXTM3U\n#EXT-X-TARGETDURATION:1\n".repeat(50);
        let packed = compress(&body).unwrap();
        assert!(packed.len() < body.len() / 4);
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&packed[..]), &mut out).unwrap();
        assert_eq!(out, body);
    }
}
