//! Listening sockets: one `SO_REUSEPORT` group per address, one member per worker.
//!
//! The supervisor creates every socket before any worker starts, in a fixed order
//! (address by address, worker 0 first), so that port 0 resolves to one port for the
//! whole group and so that a group's member order is the worker order (which a
//! reuseport BPF program indexes by).

use std::net::{SocketAddr, TcpListener};

use anyhow::Context;
use socket2::{Domain, Protocol, Socket, Type};

/// Binds `workers` listeners on each address. Returns, per worker, its listeners
/// (one per address, in address order), and the addresses actually bound.
pub fn bind_all(
    addrs: &[SocketAddr],
    workers: usize,
    backlog: u32,
) -> anyhow::Result<(Vec<Vec<TcpListener>>, Vec<SocketAddr>)> {
    let mut per_worker: Vec<Vec<TcpListener>> = (0..workers).map(|_| Vec::new()).collect();
    let mut bound = Vec::new();
    for &addr in addrs {
        let mut actual = addr;
        for (w, listeners) in per_worker.iter_mut().enumerate() {
            let socket = bind_one(actual, backlog).with_context(|| format!("cannot listen on {addr}"))?;
            if w == 0 {
                actual = socket.local_addr()?;
                bound.push(actual);
            }
            listeners.push(socket);
        }
    }
    Ok((per_worker, bound))
}

/// Applies the `[tcp]` settings to listening sockets; accepted connections inherit
/// them, so they cost nothing per connection. A setting the kernel refuses is
/// logged once and left at the kernel's default.
pub fn apply_tcp_options<'a>(listeners: impl Iterator<Item = &'a TcpListener>, tcp: &crate::config::Tcp) {
    use linerate_sys::tcp as t;
    use std::os::fd::AsFd;
    let mut failed: Vec<&str> = Vec::new();
    let mut note = |what: &'static str, r: std::io::Result<()>, detail: String| {
        if let Err(e) = r {
            if !failed.contains(&what) {
                tracing::warn!("{what}: {detail} refused by the kernel ({e}); using the kernel default");
                failed.push(what);
            }
        }
    };
    for l in listeners {
        let fd = l.as_fd();
        if !tcp.congestion_control.is_empty() {
            note(
                "tcp.congestion_control",
                t::set_congestion_control(fd, &tcp.congestion_control),
                tcp.congestion_control.clone(),
            );
        }
        if tcp.max_pacing_rate_mbps > 0 {
            let bytes = tcp.max_pacing_rate_mbps.saturating_mul(1_000_000 / 8);
            note("tcp.max_pacing_rate_mbps", t::set_max_pacing_rate(fd, bytes), format!("{bytes} bytes/s"));
        }
        if tcp.send_buffer_bytes > 0 {
            let r = socket2::SockRef::from(l).set_send_buffer_size(tcp.send_buffer_bytes as usize);
            note("tcp.send_buffer_bytes", r, tcp.send_buffer_bytes.to_string());
        }
        if tcp.notsent_lowat_bytes > 0 {
            note(
                "tcp.notsent_lowat_bytes",
                t::set_notsent_lowat(fd, tcp.notsent_lowat_bytes),
                tcp.notsent_lowat_bytes.to_string(),
            );
        }
    }
}

fn bind_one(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM.nonblocking().cloexec(), Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        // `[::]` means IPv6 only, so that `0.0.0.0` can be listened on beside it.
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(backlog.min(i32::MAX as u32) as i32)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_zero_gives_one_port_per_group() {
        let addrs = ["127.0.0.1:0".parse().unwrap(), "[::1]:0".parse().unwrap()];
        let (per_worker, bound) = match bind_all(&addrs, 3, 16) {
            Ok(x) => x,
            Err(e) if format!("{e:#}").contains("[::1]") => return, // no IPv6 loopback here
            Err(e) => panic!("{e:#}"),
        };
        assert_eq!(bound.len(), 2);
        assert_ne!(bound[0].port(), 0);
        for listeners in &per_worker {
            assert_eq!(listeners.len(), 2);
            assert_eq!(listeners[0].local_addr().unwrap(), bound[0]);
            assert_eq!(listeners[1].local_addr().unwrap(), bound[1]);
        }
    }
}
