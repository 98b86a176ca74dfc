//! The titles a run plays: their URLs, where they live, and their sizes.
//!
//! A catalogue comes from a file of URLs (one per line, `#` comments) or from a base
//! URL and a list of file names. Order is popularity rank: the first title is the
//! most popular one for the Zipf sampler. Each origin (scheme, host, port) is
//! resolved once, and each title's size is discovered with a `HEAD` over one
//! kept-alive connection per origin, before the run starts; or, with
//! `--sizes-from DIR`, read from the file of the same name under DIR, so that the
//! server under test sees no request before the viewers' (a cache's `HEAD` of a
//! cold title may start its fill).

use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use rustls::pki_types::ServerName;

use super::client::{Conn, TlsTarget};
use super::exchange::{exchange, Buffers};
use super::plan::LiveStream;
use super::response::{Expect, ResponseReader};

/// A scheme, host and port that titles are fetched from.
pub(crate) struct Origin {
    /// `scheme://authority`, for messages.
    pub label: String,
    pub addr: SocketAddr,
    pub tls: Option<TlsTarget>,
}

/// One title of the catalogue.
pub(crate) struct Title {
    pub url: String,
    pub origin: usize,
    pub size_bytes: u64,
    /// `GET <path> HTTP/1.1` and fields up to `Range: bytes=`; the range and the
    /// blank line are appended per request.
    pub request_prefix: Vec<u8>,
    /// The local file with the same bytes, under `--verify DIR`.
    pub local: Option<PathBuf>,
}

pub(crate) struct Catalogue {
    pub origins: Vec<Origin>,
    pub titles: Vec<Title>,
}

/// A URL before discovery.
struct Entry {
    url: String,
    https: bool,
    authority: String,
    host: String,
    port: u16,
    target: String,
    /// Path relative to the verify directory.
    relative: PathBuf,
}

/// Reads a URL list file.
pub(crate) fn read_url_list(path: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading URL list {}", path.display()))?;
    let urls: Vec<String> =
        text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_owned).collect();
    anyhow::ensure!(!urls.is_empty(), "URL list {} has no URL", path.display());
    Ok(urls)
}

/// URLs for `--base-url URL --files a,b,c`, with the file names as paths relative
/// to the verify directory.
pub(crate) fn join_base(base: &str, files: &[String]) -> anyhow::Result<Vec<(String, PathBuf)>> {
    anyhow::ensure!(!files.is_empty(), "--files lists no file");
    let base = base.trim_end_matches('/');
    files
        .iter()
        .map(|f| {
            let f = f.trim();
            anyhow::ensure!(!f.is_empty(), "--files has an empty name");
            anyhow::ensure!(!f.starts_with('/'), "file name {f:?} must be relative to --base-url");
            let url = format!("{base}/{}", percent_encoding::utf8_percent_encode(f, PATH_UNSAFE));
            Ok((url, PathBuf::from(f)))
        })
        .collect()
}

/// Characters escaped when a file name becomes a URL path (`/` is kept).
const PATH_UNSAFE: &percent_encoding::AsciiSet =
    &percent_encoding::CONTROLS.add(b' ').add(b'"').add(b'#').add(b'%').add(b'<').add(b'>').add(b'?').add(b'`');

fn parse(url: &str, relative: Option<PathBuf>) -> anyhow::Result<Entry> {
    let uri: http::Uri = url.parse().with_context(|| format!("invalid URL {url:?}"))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => bail!("URL {url:?} must start with http:// or https://"),
    };
    let authority = uri.authority().with_context(|| format!("URL {url:?} has no host"))?;
    anyhow::ensure!(!authority.as_str().contains('@'), "URL {url:?}: user information is not supported");
    let host = authority.host().trim_start_matches('[').trim_end_matches(']').to_owned();
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    let target = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/").to_owned();
    let relative = match relative {
        Some(r) => r,
        None => {
            let decoded = percent_encoding::percent_decode_str(uri.path()).decode_utf8_lossy().into_owned();
            PathBuf::from(decoded.trim_start_matches('/'))
        }
    };
    anyhow::ensure!(
        relative.components().all(|c| matches!(c, std::path::Component::Normal(_))),
        "URL {url:?}: its path cannot be mapped into a verify directory"
    );
    Ok(Entry { url: url.to_owned(), https, authority: authority.as_str().to_owned(), host, port, target, relative })
}

/// Settings for discovery.
pub(crate) struct Discovery<'a> {
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    pub verify_dir: Option<&'a Path>,
    /// Titles sized from the files under this directory, not with a `HEAD`.
    pub sizes_dir: Option<&'a Path>,
    pub timeout: Duration,
}

/// Parses, resolves and sizes the titles (a `HEAD` each). `relative` holds the
/// verify paths for `--files`; `None` derives them from the URL paths.
pub(crate) async fn discover(urls: Vec<(String, Option<PathBuf>)>, opts: &Discovery<'_>) -> anyhow::Result<Catalogue> {
    let entries: Vec<Entry> = urls.into_iter().map(|(u, r)| parse(&u, r)).collect::<anyhow::Result<_>>()?;
    let mut origins: Vec<Origin> = Vec::new();
    let mut origin_keys: Vec<(bool, String, u16)> = Vec::new();
    let mut titles = Vec::with_capacity(entries.len());
    for e in &entries {
        let key = (e.https, e.host.clone(), e.port);
        let origin = match origin_keys.iter().position(|k| *k == key) {
            Some(i) => i,
            None => {
                origins.push(resolve(e, opts).await?);
                origin_keys.push(key);
                origins.len() - 1
            }
        };
        let request_prefix = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: linerate-bench\r\nRange: bytes=",
            e.target, e.authority
        )
        .into_bytes();
        let local = opts.verify_dir.map(|d| d.join(&e.relative));
        titles.push(Title { url: e.url.clone(), origin, size_bytes: 0, request_prefix, local });
    }

    // One connection per origin, kept alive across the HEADs.
    let bufs = RefCell::new(Buffers::new());
    let mut conns: Vec<Option<Conn>> = (0..origins.len()).map(|_| None).collect();
    let mut reader = ResponseReader::default();
    for (e, t) in entries.iter().zip(&mut titles) {
        let size = if let Some(dir) = opts.sizes_dir {
            let file = dir.join(&e.relative);
            let size = std::fs::metadata(&file)
                .with_context(|| format!("--sizes-from: {} (for {}) is not readable", file.display(), e.url))?
                .len();
            anyhow::ensure!(size > 0, "--sizes-from: {} is empty: nothing to stream", file.display());
            size
        } else {
            let size = head_size(e, &origins[t.origin], &mut conns[t.origin], &mut reader, &bufs, opts.timeout).await?;
            anyhow::ensure!(size > 0, "{} is empty: nothing to stream", e.url);
            size
        };
        if let Some(local) = &t.local {
            let meta = std::fs::metadata(local)
                .with_context(|| format!("--verify: {} (for {}) is not readable", local.display(), e.url))?;
            anyhow::ensure!(
                meta.len() == size,
                "--verify: {} has {} bytes but {} has {size}",
                local.display(),
                meta.len(),
                e.url
            );
        }
        t.size_bytes = size;
    }
    Ok(Catalogue { origins, titles })
}

/// The size of the title `e` names, from a `HEAD` over the origin's kept-alive
/// connection `conn` (opened when there is none; opened afresh, once, when the
/// server had closed it).
async fn head_size(
    e: &Entry,
    origin: &Origin,
    conn: &mut Option<Conn>,
    reader: &mut ResponseReader,
    bufs: &RefCell<Buffers>,
    timeout: Duration,
) -> anyhow::Result<u64> {
    let head = format!("HEAD {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: linerate-bench\r\n\r\n", e.target, e.authority);
    let mut attempts = 0;
    loop {
        attempts += 1;
        let c = match &mut *conn {
            Some(c) => c,
            slot => {
                let c = tokio::time::timeout(timeout, Conn::open(origin.addr, origin.tls.as_ref()))
                    .await
                    .map_err(|_| anyhow::anyhow!("connecting to {}: timed out", origin.label))?
                    .with_context(|| format!("connecting to {} ({})", origin.label, origin.addr))?;
                slot.insert(c)
            }
        };
        reader.start(Expect::Head);
        let mut first = None;
        let r = tokio::time::timeout(timeout, exchange(c, head.as_bytes(), reader, bufs, &mut first, &mut |_, _| true))
            .await
            .map_err(|_| anyhow::anyhow!("HEAD {}: no response within {:?}", e.url, timeout))?;
        match r {
            Ok(h) => {
                if h.close {
                    *conn = None;
                }
                return Ok(h.content_length);
            }
            // A kept-alive connection the server had closed: once more, fresh.
            Err(_) if attempts == 1 && first.is_none() => *conn = None,
            Err(err) => bail!("HEAD {}: {err}", e.url),
        }
    }
}

/// The catalogue of a live run (`--live URL`): the playlist's origin, resolved, and
/// no titles; and the stream's playlist.
pub(crate) async fn live(url: &str, opts: &Discovery<'_>) -> anyhow::Result<(Catalogue, LiveStream)> {
    let e = parse(url, Some(PathBuf::new())).with_context(|| "--live")?;
    let origin = resolve(&e, opts).await?;
    let stream = LiveStream {
        url: e.url.clone(),
        scheme: if e.https { "https" } else { "http" },
        authority: e.authority.clone(),
        target: e.target.clone(),
        origin: 0,
    };
    Ok((Catalogue { origins: vec![origin], titles: Vec::new() }, stream))
}

async fn resolve(e: &Entry, opts: &Discovery<'_>) -> anyhow::Result<Origin> {
    let scheme = if e.https { "https" } else { "http" };
    let label = format!("{scheme}://{}", e.authority);
    let addr = tokio::net::lookup_host((e.host.as_str(), e.port))
        .await
        .with_context(|| format!("resolving {}", e.host))?
        .next()
        .with_context(|| format!("{} resolves to no address", e.host))?;
    let tls = if e.https {
        let config = opts.tls.clone().context("internal: https origin without a TLS configuration")?;
        let server_name = ServerName::try_from(e.host.clone())
            .with_context(|| format!("{:?} is not a valid TLS server name", e.host))?;
        Some(TlsTarget { config, server_name })
    } else {
        None
    };
    Ok(Origin { label, addr, tls })
}

/// Whether any URL needs TLS (so the TLS configuration is built only then).
pub(crate) fn any_https(urls: &[(String, Option<PathBuf>)]) -> bool {
    urls.iter().any(|(u, _)| u.trim_start().to_ascii_lowercase().starts_with("https:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_origins_targets_and_local_paths() {
        let e = parse("http://127.0.0.1:8080/a/b%20c.m4s?x=1", None).unwrap();
        assert!(!e.https);
        assert_eq!((e.host.as_str(), e.port), ("127.0.0.1", 8080));
        assert_eq!(e.target, "/a/b%20c.m4s?x=1");
        assert_eq!(e.relative, PathBuf::from("a/b c.m4s"));
        let e = parse("https://[::1]/v.mp4", None).unwrap();
        assert_eq!((e.host.as_str(), e.port, e.https), ("::1", 443, true));
        for bad in ["ftp://x/y", "/relative", "http://x/../etc/passwd", "http://u:p@host/x"] {
            assert!(parse(bad, None).is_err(), "{bad}");
        }
    }

    #[test]
    fn base_url_and_files_join() {
        let joined = join_base("http://h:1/media/", &["a.bin".into(), "dir/b c.bin".into()]).unwrap();
        assert_eq!(joined[0].0, "http://h:1/media/a.bin");
        assert_eq!(joined[1], ("http://h:1/media/dir/b%20c.bin".to_string(), PathBuf::from("dir/b c.bin")));
        assert!(join_base("http://h", &["/abs".into()]).is_err());
        assert!(join_base("http://h", &[]).is_err());
    }

    #[test]
    fn sizes_from_a_directory_ask_the_server_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        std::fs::create_dir_all(dir.join("d")).unwrap();
        std::fs::write(dir.join("d/a b.bin"), vec![7u8; 1234]).unwrap();
        std::fs::write(dir.join("empty.bin"), b"").unwrap();
        let opts = Discovery { tls: None, verify_dir: None, sizes_dir: Some(&dir), timeout: Duration::from_secs(1) };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        // Port 9 of a loopback address nobody listens on: a HEAD would fail.
        let urls = |names: &[&str]| {
            join_base("http://127.0.0.1:9/", &names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap()
                .into_iter()
                .map(|(u, p)| (u, Some(p)))
                .collect::<Vec<_>>()
        };
        let c = rt.block_on(discover(urls(&["d/a b.bin"]), &opts)).unwrap();
        assert_eq!(c.titles[0].size_bytes, 1234);
        let missing = rt.block_on(discover(urls(&["nope.bin"]), &opts)).err().unwrap().to_string();
        assert!(missing.contains("--sizes-from") && missing.contains("nope.bin"), "{missing}");
        let empty = rt.block_on(discover(urls(&["empty.bin"]), &opts)).err().unwrap().to_string();
        assert!(empty.contains("nothing to stream"), "{empty}");
    }
}
