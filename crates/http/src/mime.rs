//! Media types by file extension.
//!
//! The table covers what a media CDN serves (progressive MP4, CMAF/fMP4 segments,
//! MPEG-TS, HLS and DASH manifests, audio, subtitles) and the common web types a
//! player page needs. Unknown extensions are `application/octet-stream`; operators
//! add or override entries in the configuration.

/// The type for files whose extension is not known.
pub const DEFAULT_TYPE: &str = "application/octet-stream";

const TABLE: &[(&str, &str)] = &[
    // Video and segments.
    ("mp4", "video/mp4"),
    ("m4v", "video/mp4"),
    ("m4s", "video/iso.segment"),
    ("cmfv", "video/mp4"),
    ("mov", "video/quicktime"),
    ("webm", "video/webm"),
    ("mkv", "video/x-matroska"),
    ("ts", "video/mp2t"),
    ("m2ts", "video/mp2t"),
    ("mts", "video/mp2t"),
    ("ogv", "video/ogg"),
    ("3gp", "video/3gpp"),
    ("avi", "video/x-msvideo"),
    ("flv", "video/x-flv"),
    // Manifests.
    ("m3u8", "application/vnd.apple.mpegurl"),
    ("m3u", "audio/x-mpegurl"),
    ("mpd", "application/dash+xml"),
    // Audio.
    ("m4a", "audio/mp4"),
    ("cmfa", "audio/mp4"),
    ("mp3", "audio/mpeg"),
    ("aac", "audio/aac"),
    ("ac3", "audio/ac3"),
    ("ec3", "audio/eac3"),
    ("flac", "audio/flac"),
    ("oga", "audio/ogg"),
    ("ogg", "audio/ogg"),
    ("opus", "audio/ogg"),
    ("wav", "audio/wav"),
    // Subtitles and timed text.
    ("vtt", "text/vtt; charset=utf-8"),
    ("webvtt", "text/vtt; charset=utf-8"),
    ("srt", "application/x-subrip"),
    ("ttml", "application/ttml+xml"),
    ("dfxp", "application/ttml+xml"),
    // Images.
    ("jpg", "image/jpeg"),
    ("jpeg", "image/jpeg"),
    ("png", "image/png"),
    ("gif", "image/gif"),
    ("webp", "image/webp"),
    ("avif", "image/avif"),
    ("svg", "image/svg+xml"),
    ("ico", "image/x-icon"),
    // Web.
    ("html", "text/html; charset=utf-8"),
    ("htm", "text/html; charset=utf-8"),
    ("css", "text/css; charset=utf-8"),
    ("js", "text/javascript; charset=utf-8"),
    ("mjs", "text/javascript; charset=utf-8"),
    ("json", "application/json"),
    ("xml", "application/xml"),
    ("txt", "text/plain; charset=utf-8"),
    ("wasm", "application/wasm"),
    ("woff", "font/woff"),
    ("woff2", "font/woff2"),
    ("ttf", "font/ttf"),
    ("otf", "font/otf"),
    // Downloads.
    ("pdf", "application/pdf"),
    ("zip", "application/zip"),
    ("gz", "application/gzip"),
    ("tgz", "application/gzip"),
    ("xz", "application/x-xz"),
    ("zst", "application/zstd"),
    ("tar", "application/x-tar"),
    ("iso", "application/octet-stream"),
    ("bin", "application/octet-stream"),
];

/// The extension of the last path segment (bytes after its last `.`), if any.
/// Dot-files such as `.htaccess` have no extension.
pub fn extension(path: &[u8]) -> Option<&[u8]> {
    let name = path.rsplit(|&b| b == b'/').next()?;
    let dot = name.iter().rposition(|&b| b == b'.')?;
    (dot > 0 && dot + 1 < name.len()).then(|| &name[dot + 1..])
}

/// The built-in media type for an extension (case-insensitive).
pub fn builtin_type(ext: &[u8]) -> Option<&'static str> {
    TABLE.iter().find(|(e, _)| e.as_bytes().eq_ignore_ascii_case(ext)).map(|&(_, t)| t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types() {
        for (name, ty) in [
            ("a/b.mp4", "video/mp4"),
            ("seg-1.M4S", "video/iso.segment"),
            ("x.ts", "video/mp2t"),
            ("master.m3u8", "application/vnd.apple.mpegurl"),
            ("manifest.mpd", "application/dash+xml"),
            ("a.webm", "video/webm"),
            ("a.mkv", "video/x-matroska"),
            ("a.mov", "video/quicktime"),
            ("a.m4a", "audio/mp4"),
            ("a.mp3", "audio/mpeg"),
            ("a.aac", "audio/aac"),
            ("a.vtt", "text/vtt; charset=utf-8"),
            ("index.html", "text/html; charset=utf-8"),
        ] {
            assert_eq!(extension(name.as_bytes()).and_then(builtin_type), Some(ty), "{name}");
        }
    }

    #[test]
    fn extensions() {
        assert_eq!(extension(b"a/b.tar.gz"), Some(&b"gz"[..]));
        assert_eq!(extension(b"dir.d/file"), None);
        assert_eq!(extension(b".hidden"), None);
        assert_eq!(extension(b"trailing."), None);
        assert_eq!(builtin_type(b"unknownext"), None);
    }

    #[test]
    fn table_has_no_duplicates() {
        for (i, (a, _)) in TABLE.iter().enumerate() {
            assert!(TABLE[i + 1..].iter().all(|(b, _)| !a.eq_ignore_ascii_case(b)), "{a}");
        }
    }
}
