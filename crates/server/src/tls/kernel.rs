//! Finding out, once at start-up, what kernel TLS this kernel offers.
//!
//! Nothing is assumed from the kernel version: for each TLS version and cipher the
//! probe attaches the `tls` ULP to a loopback connection and installs a (dummy) key
//! in each direction. A pair that takes both is used for kernel TLS; everything else
//! falls back to the user-space record layer. Transmit-only kernel TLS is not offered:
//! rustls hands over both directions at once, so without a receive key the session
//! stays in user space entirely.

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;

use linerate_sys::ktls::{self, Cipher, CryptoInfo, Direction, Version};

/// The result of the start-up probe.
#[derive(Clone, Debug)]
pub struct KernelProbe {
    /// Version/cipher pairs the kernel takes for both directions.
    pub supported: Vec<(Version, Cipher)>,
    /// Why kernel TLS is not used at all, when it is not.
    pub unavailable_because: Option<String>,
}

impl KernelProbe {
    pub fn disabled(why: &str) -> KernelProbe {
        KernelProbe { supported: Vec::new(), unavailable_because: Some(why.to_string()) }
    }

    pub fn supports(&self, version: Version, cipher: Cipher) -> bool {
        self.supported.contains(&(version, cipher))
    }

    /// The mode for the start-up log line: `ktls-tx-rx` or `userspace`.
    pub fn mode(&self) -> &'static str {
        if self.supported.is_empty() {
            "userspace"
        } else {
            "ktls-tx-rx"
        }
    }

    /// Logs the mode once, with the reason when kernel TLS is not used.
    pub fn log(&self) {
        match &self.unavailable_because {
            Some(why) => tracing::info!(tls_mode = %self.mode(), "TLS records are protected in user space: {why}"),
            None => tracing::info!(
                tls_mode = %self.mode(),
                ciphers = ?self.supported,
                "TLS records are protected by the kernel (kTLS transmit and receive); other ciphers use user space"
            ),
        }
    }
}

const ALL: [(Version, Cipher); 6] = [
    (Version::Tls13, Cipher::Aes128Gcm),
    (Version::Tls13, Cipher::Aes256Gcm),
    (Version::Tls13, Cipher::Chacha20Poly1305),
    (Version::Tls12, Cipher::Aes128Gcm),
    (Version::Tls12, Cipher::Aes256Gcm),
    (Version::Tls12, Cipher::Chacha20Poly1305),
];

/// Probes the kernel.
pub fn probe() -> KernelProbe {
    let mut supported = Vec::new();
    let mut first_error = None;
    for (version, cipher) in ALL {
        match try_pair(version, cipher) {
            Ok(()) => supported.push((version, cipher)),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let unavailable_because = if supported.is_empty() {
        Some(match first_error {
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                "the kernel has no TLS support (CONFIG_TLS is not set, or the tls module cannot be loaded)".to_string()
            }
            Some(e) => format!("the kernel refused kernel TLS keys: {e}"),
            None => "no cipher to probe".to_string(),
        })
    } else {
        None
    };
    KernelProbe { supported, unavailable_because }
}

fn try_pair(version: Version, cipher: Cipher) -> std::io::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let client = TcpStream::connect(listener.local_addr()?)?;
    let (_server, _) = listener.accept()?;
    let sock = client.as_fd();
    ktls::attach_ulp(sock)?;
    let key = vec![0u8; cipher.key_len()];
    let info = CryptoInfo::new(version, cipher, &key, &[0; 12], 0)?;
    ktls::install_key(sock, Direction::Tx, &info)?;
    ktls::install_key(sock, Direction::Rx, &info)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On any kernel the probe gives a consistent answer: either some pairs with no
    /// reason, or none with a reason. (Which one depends on the kernel; the VM
    /// harness checks the kernel TLS side for real.)
    #[test]
    fn probe_is_consistent() {
        let p = probe();
        assert_eq!(p.supported.is_empty(), p.unavailable_because.is_some(), "{p:?}");
        assert_eq!(p.mode() == "userspace", p.supported.is_empty());
        let off = KernelProbe::disabled("off");
        assert!(!off.supports(Version::Tls13, Cipher::Aes128Gcm));
        assert_eq!(off.mode(), "userspace");
    }
}
