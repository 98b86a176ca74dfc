//! The linerate media server as a library: the `linerate` binary parses the command
//! line and calls into it; the fuzz targets use its configuration parser and its
//! user-space TLS record layer.
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]

mod admin;
pub mod capacity;
pub mod config;
mod counters;
pub mod demo;
mod origin;
pub mod procfs;
pub mod server;
mod store;
pub mod sysfs;
pub mod tls;
pub mod topology;
mod transport;
pub mod tune;
