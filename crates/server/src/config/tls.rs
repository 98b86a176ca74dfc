//! `[tls]`: certificates (a default one and more by SNI), kernel TLS, the oldest
//! version accepted.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{bad, Bad};

/// Whether to hand TLS sessions to the kernel.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum KernelTls {
    /// Use kernel TLS when the kernel offers it, user-space TLS otherwise.
    #[default]
    Auto,
    /// Always user-space TLS.
    Off,
}

/// The oldest TLS version accepted.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub enum TlsVersion {
    #[default]
    #[serde(rename = "1.2")]
    Tls12,
    #[serde(rename = "1.3")]
    Tls13,
}

/// A certificate chain and its private key, both PEM files.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CertKey {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Tls {
    /// The default certificate chain (PEM): for clients without SNI or with a name
    /// no other certificate covers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// The default certificate's private key (PEM).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// More certificates, chosen by SNI against their DNS names.
    pub certificates: Vec<CertKey>,
    pub kernel_tls: KernelTls,
    /// `TLS_TX_ZEROCOPY_RO`: kTLS sendfile without copying pages first. Only for
    /// content that never changes in place (see docs/CONFIG.md).
    pub zerocopy_sendfile: bool,
    pub min_version: TlsVersion,
}

impl Default for Tls {
    fn default() -> Self {
        Tls {
            cert: None,
            key: None,
            certificates: Vec::new(),
            kernel_tls: KernelTls::Auto,
            zerocopy_sendfile: false,
            min_version: TlsVersion::Tls12,
        }
    }
}

impl Tls {
    /// `https`: whether there are HTTPS listeners (`tls_listen`), which need a
    /// certificate and its key.
    pub(super) fn validate(&self, https: bool) -> Result<(), Bad> {
        if https {
            if self.cert.is_none() {
                return bad("tls.cert", "`tls_listen` needs a certificate: set tls.cert or pass --cert FILE");
            }
            if self.key.is_none() {
                return bad("tls.key", "`tls_listen` needs a private key: set tls.key or pass --key FILE");
            }
        }
        Ok(())
    }
}
