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
