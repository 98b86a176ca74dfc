//! Listening sockets: one `SO_REUSEPORT` group per address, one member per worker.
//!
//! The supervisor creates every socket before any worker starts, in a fixed order
//! (address by address, worker 0 first), so that port 0 resolves to one port for the
//! whole group and so that a group's member order is the worker order (which a
//! reuseport BPF program indexes by).

pub(super) mod steering;

use std::net::{SocketAddr, TcpListener};

use anyhow::Context;
use socket2::{Domain, Protocol, Socket, Type};

use crate::server::supervisor::upgrade::{Inherited, Role};

/// One address's `SO_REUSEPORT` group: its sockets in member order.
pub(super) struct Group {
    /// The address as configured (port 0 included).
    pub configured: SocketAddr,
    /// The address actually bound.
    pub bound: SocketAddr,
    pub sockets: Vec<TcpListener>,
}

/// Binds `workers` listeners on each address, or takes over the group a previous
/// process handed over for it (see `server::upgrade`), binding more members only if
/// this process has more workers than the group has sockets.
pub(super) fn bind_all(
    addrs: &[SocketAddr],
    workers: usize,
    backlog: u32,
    mut inherited: Option<&mut Inherited>,
) -> anyhow::Result<Vec<Group>> {
    let mut groups = Vec::new();
    for &addr in addrs {
        let mut sockets = inherited.as_deref_mut().and_then(|i| i.take(Role::Serve, addr)).unwrap_or_default();
        let taken = sockets.len();
        let mut actual = match sockets.first() {
            Some(s) => s.local_addr()?,
            None => addr,
        };
        while sockets.len() < workers {
            let socket = bind_one(actual, backlog).with_context(|| format!("cannot listen on {addr}"))?;
            if sockets.is_empty() {
                actual = socket.local_addr()?;
            }
            sockets.push(socket);
        }
        if taken > 0 {
            tracing::info!(address = %actual, inherited = taken, bound = sockets.len() - taken, "listening sockets taken over");
        }
        groups.push(Group { configured: addr, bound: actual, sockets });
    }
    Ok(groups)
}

/// Deals each group's sockets to the workers: member `j` to worker `j % workers`,
/// so worker `w` holds member `w` of every group (the index a steering program
/// picks), plus any members past the worker count a previous process handed over.
/// Returns, per worker, its listeners (one per address in address order, then extras).
pub(super) fn distribute(groups: Vec<Group>, workers: usize) -> Vec<Vec<TcpListener>> {
    let mut per_worker: Vec<Vec<TcpListener>> = (0..workers).map(|_| Vec::new()).collect();
    let mut extras: Vec<(usize, TcpListener)> = Vec::new();
    for g in groups {
        for (j, socket) in g.sockets.into_iter().enumerate() {
            if j < workers {
                per_worker[j].push(socket);
            } else {
                extras.push((j % workers, socket));
            }
        }
    }
    for (w, socket) in extras {
        per_worker[w].push(socket);
    }
    per_worker
}

/// Applies the `[tcp]` settings to listening sockets; accepted connections inherit
/// them, so they cost nothing per connection. A setting the kernel refuses is
/// logged once and left at the kernel's default.
pub(super) fn apply_tcp_options<'a>(listeners: impl Iterator<Item = &'a TcpListener>, tcp: &crate::config::Tcp) {
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
        let groups = match bind_all(&addrs, 3, 16, None) {
            Ok(x) => x,
            Err(e) if format!("{e:#}").contains("[::1]") => return, // no IPv6 loopback here
            Err(e) => panic!("{e:#}"),
        };
        assert_eq!(groups.len(), 2);
        assert_ne!(groups[0].bound.port(), 0);
        let bound: Vec<SocketAddr> = groups.iter().map(|g| g.bound).collect();
        let per_worker = distribute(groups, 3);
        for listeners in &per_worker {
            assert_eq!(listeners.len(), 2);
            assert_eq!(listeners[0].local_addr().unwrap(), bound[0]);
            assert_eq!(listeners[1].local_addr().unwrap(), bound[1]);
        }
    }

    #[test]
    fn extra_members_go_round_the_workers() {
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let mut groups = bind_all(&[addr], 5, 16, None).unwrap();
        groups[0].configured = addr;
        let per_worker = distribute(groups, 2);
        assert_eq!(per_worker.iter().map(Vec::len).collect::<Vec<_>>(), [3, 2]);
    }
}
