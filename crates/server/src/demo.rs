//! `linerate serve --demo`: a catalogue to serve at once, with no setup.
//!
//! The binary carries a player page and a short H.264/AAC MP4 (faststart); they are
//! written to a fresh temporary directory, which becomes the content root and is
//! removed when the server exits.

use anyhow::Context;

const INDEX_HTML: &[u8] = include_bytes!("../assets/demo/index.html");
const DEMO_MP4: &[u8] = include_bytes!("../assets/demo/demo.mp4");

/// The demo catalogue on disk; dropping it removes the directory.
pub struct Demo {
    dir: tempfile::TempDir,
}

impl Demo {
    pub fn create() -> anyhow::Result<Demo> {
        let dir =
            tempfile::Builder::new().prefix("linerate-demo-").tempdir().context("cannot create the demo directory")?;
        std::fs::write(dir.path().join("index.html"), INDEX_HTML)?;
        std::fs::write(dir.path().join("demo.mp4"), DEMO_MP4)?;
        Ok(Demo { dir })
    }

    pub fn root(&self) -> &std::path::Path {
        self.dir.path()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_catalogue() {
        let demo = Demo::create().unwrap();
        let mp4 = std::fs::read(demo.root().join("demo.mp4")).unwrap();
        // ISO BMFF: the first box is `ftyp`, and faststart puts `moov` before `mdat`.
        assert_eq!(&mp4[4..8], b"ftyp");
        let moov = mp4.windows(4).position(|w| w == b"moov").unwrap();
        let mdat = mp4.windows(4).position(|w| w == b"mdat").unwrap();
        assert!(moov < mdat);
        let html = std::fs::read_to_string(demo.root().join("index.html")).unwrap();
        assert!(html.contains("<video") && html.contains("demo.mp4"));
        let root = demo.root().to_owned();
        drop(demo);
        assert!(!root.exists());
    }
}
