//! Limits per client, checked once when a connection is accepted: how many
//! connections a client (an address, or a prefix of `client_limits.ipv4_prefix` /
//! `ipv6_prefix` bits) has open at once, and how fast it opens new ones (a token
//! bucket per client).
//!
//! A client's connections land on any worker (the kernel's `SO_REUSEPORT` choice),
//! so the table is process-wide: a fixed set of mutex-guarded shards, each a map
//! from client to its entry. A connection touches one shard twice: when it is
//! admitted and when its [`ClientSlot`] is dropped (at close, on any path, panics
//! included). An entry goes away once it has no connection open and its token bucket
//! has refilled, so the table holds only clients seen in the last few seconds; idle
//! entries of clients that never come back are swept out as the shard is used.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::config::ClientLimits;
use crate::counters::Refusal;

const SHARDS: usize = 64;
/// How often a shard is swept for idle entries, at most.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// How often the summary of refusals may be logged as a warning.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// A client: its address with the bits past the configured prefix cleared.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub(crate) struct Client(IpAddr);

impl Client {
    pub(crate) fn of(addr: IpAddr, limits: &ClientLimits) -> Client {
        // An IPv4 client on a dual-stack socket arrives as ::ffff:a.b.c.d.
        match addr.to_canonical() {
            IpAddr::V4(a) => {
                let bits = u32::from(a) & mask32(limits.ipv4_prefix);
                Client(IpAddr::V4(bits.into()))
            }
            IpAddr::V6(a) => {
                let bits = u128::from(a) & mask128(limits.ipv6_prefix);
                Client(IpAddr::V6(bits.into()))
            }
        }
    }
}

fn mask32(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix.min(32))).unwrap_or(0)
}

fn mask128(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix.min(128))).unwrap_or(0)
}

struct Entry {
    connections: u32,
    /// Tokens left in the bucket at `refilled`.
    tokens: f64,
    refilled: Instant,
    /// When the bucket will be full again with no new connection: from then on the
    /// entry carries no information beyond its connection count.
    full_at: Instant,
}

struct Shard {
    clients: HashMap<Client, Entry>,
    swept: Instant,
}

/// The process-wide table of clients. Shared by `Arc` between the workers.
pub(crate) struct ClientTable {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    /// Refusals since the last warning, by kind; and when that warning was (ms
    /// since `epoch`).
    unreported: [AtomicU64; 2],
    last_warning_ms: AtomicU64,
    epoch: Instant,
}

impl Default for ClientTable {
    fn default() -> Self {
        let now = Instant::now();
        ClientTable {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard { clients: HashMap::new(), swept: now })).collect(),
            hasher: RandomState::new(),
            unreported: Default::default(),
            last_warning_ms: AtomicU64::new(0),
            epoch: now,
        }
    }
}

/// A connection's place in its client's count; given back on drop.
pub(crate) struct ClientSlot {
    table: Arc<ClientTable>,
    client: Client,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.table.release(self.client, Instant::now());
    }
}

impl ClientTable {
    fn shard(&self, client: &Client) -> MutexGuard<'_, Shard> {
        let i = (self.hasher.hash_one(client) as usize) % SHARDS;
        // A panic while holding a shard leaves counts that are still consistent
        // (each update is a few plain stores): keep using it.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a new connection from `addr`, or says which limit refuses it. With
    /// no limit configured, admits without touching the table (`Ok(None)`).
    pub(crate) fn admit(
        self: &Arc<Self>,
        addr: IpAddr,
        limits: &ClientLimits,
        now: Instant,
    ) -> Result<Option<ClientSlot>, Refusal> {
        let rate = limits.max_new_connections_per_second;
        if limits.max_connections == 0 && rate == 0 {
            return Ok(None);
        }
        let client = Client::of(addr, limits);
        let burst = f64::from(limits.new_connections_burst.max(1));
        let mut shard = self.shard(&client);
        if now.saturating_duration_since(shard.swept) >= SWEEP_EVERY {
            shard.swept = now;
            shard.clients.retain(|_, e| e.connections > 0 || e.full_at > now);
        }
        let entry =
            shard.clients.entry(client).or_insert(Entry { connections: 0, tokens: burst, refilled: now, full_at: now });
        if rate > 0 {
            let rate = f64::from(rate);
            let elapsed = now.saturating_duration_since(entry.refilled).as_secs_f64();
            let tokens = (entry.tokens + elapsed * rate).min(burst);
            entry.refilled = now;
            if tokens < 1.0 {
                entry.tokens = tokens;
                return Err(Refusal::Rate);
            }
            entry.tokens = tokens - 1.0;
            entry.full_at = now + Duration::from_secs_f64((burst - entry.tokens) / rate);
        }
        if limits.max_connections > 0 && entry.connections >= limits.max_connections {
            return Err(Refusal::Connections);
        }
        entry.connections += 1;
        Ok(Some(ClientSlot { table: self.clone(), client }))
    }

    fn release(&self, client: Client, now: Instant) {
        let mut shard = self.shard(&client);
        if let Some(e) = shard.clients.get_mut(&client) {
            e.connections = e.connections.saturating_sub(1);
            if e.connections == 0 && e.full_at <= now {
                shard.clients.remove(&client);
            }
        }
    }

    /// Clients with an entry in the table.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).clients.len()).sum()
    }

    /// Notes a refusal for the periodic warning: at most one line a minute, with the
    /// counts since the previous one, so a flood of refused connections cannot flood
    /// the log. Returns true when this call logged.
    pub(crate) fn note_refusal(&self, why: Refusal, now: Instant) -> bool {
        self.unreported[why as usize].fetch_add(1, Ordering::Relaxed);
        let every = WARN_EVERY.as_millis() as u64;
        // Offset by one period so that the very first refusal is reported.
        let now_ms = now.saturating_duration_since(self.epoch).as_millis() as u64 + every;
        let last = self.last_warning_ms.load(Ordering::Relaxed);
        if now_ms < last + every {
            return false;
        }
        if self.last_warning_ms.compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            return false;
        }
        let connections = self.unreported[Refusal::Connections as usize].swap(0, Ordering::Relaxed);
        let rate = self.unreported[Refusal::Rate as usize].swap(0, Ordering::Relaxed);
        tracing::warn!(
            over_max_connections = connections,
            over_new_connection_rate = rate,
            "client limits refused new connections (counted in linerate_client_limit_refusals_total; next summary in a minute at the earliest)"
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_connections: u32, rate: u32, burst: u32) -> ClientLimits {
        ClientLimits {
            max_connections,
            max_new_connections_per_second: rate,
            new_connections_burst: burst,
            ..ClientLimits::default()
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn prefixes_group_addresses() {
        let l = ClientLimits { ipv4_prefix: 24, ipv6_prefix: 64, ..ClientLimits::default() };
        assert_eq!(Client::of(ip("10.1.2.3"), &l), Client::of(ip("10.1.2.200"), &l));
        assert_ne!(Client::of(ip("10.1.2.3"), &l), Client::of(ip("10.1.3.3"), &l));
        assert_eq!(Client::of(ip("::ffff:10.1.2.3"), &l), Client::of(ip("10.1.2.9"), &l));
        assert_eq!(Client::of(ip("2001:db8:0:1::1"), &l), Client::of(ip("2001:db8:0:1:ffff::2"), &l));
        assert_ne!(Client::of(ip("2001:db8:0:1::1"), &l), Client::of(ip("2001:db8:0:2::1"), &l));
        let exact = ClientLimits { ipv4_prefix: 32, ipv6_prefix: 128, ..ClientLimits::default() };
        assert_ne!(Client::of(ip("10.1.2.3"), &exact), Client::of(ip("10.1.2.4"), &exact));
        assert_ne!(Client::of(ip("::1"), &exact), Client::of(ip("::2"), &exact));
        assert_eq!(mask32(1), 0x8000_0000);
        assert_eq!(mask128(1), 1 << 127);
    }

    #[test]
    fn connection_limit_counts_open_connections_and_frees_on_drop() {
        let t = Arc::new(ClientTable::default());
        let l = limits(2, 0, 1);
        let now = Instant::now();
        let a = t.admit(ip("192.0.2.1"), &l, now).unwrap();
        let b = t.admit(ip("192.0.2.1"), &l, now).unwrap();
        assert_eq!(t.admit(ip("192.0.2.1"), &l, now).err(), Some(Refusal::Connections));
        assert!(t.admit(ip("192.0.2.2"), &l, now).unwrap().is_some(), "another client is not affected");
        drop(a);
        let c = t.admit(ip("192.0.2.1"), &l, now).unwrap();
        drop((b, c));
        assert_eq!(t.len(), 0, "entries at zero are removed");
    }

    #[test]
    fn no_limits_touch_nothing() {
        let t = Arc::new(ClientTable::default());
        let l = limits(0, 0, 1);
        for _ in 0..1000 {
            assert!(t.admit(ip("192.0.2.1"), &l, Instant::now()).unwrap().is_none());
        }
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn rate_limit_is_a_token_bucket() {
        let t = Arc::new(ClientTable::default());
        let l = limits(0, 10, 5);
        let start = Instant::now();
        let mut slots = Vec::new();
        for _ in 0..5 {
            slots.push(t.admit(ip("192.0.2.1"), &l, start).unwrap());
        }
        assert_eq!(t.admit(ip("192.0.2.1"), &l, start).err(), Some(Refusal::Rate));
        // 10 per second: one token back every 100 ms.
        let later = start + Duration::from_millis(150);
        assert!(t.admit(ip("192.0.2.1"), &l, later).is_ok());
        assert_eq!(t.admit(ip("192.0.2.1"), &l, later).err(), Some(Refusal::Rate));
        // Closing connections does not give tokens back: connecting and closing
        // at once cannot beat the rate.
        slots.clear();
        assert_eq!(t.admit(ip("192.0.2.1"), &l, later).err(), Some(Refusal::Rate));
        assert_eq!(t.len(), 1, "kept while its bucket refills");
    }

    #[test]
    fn idle_entries_are_swept() {
        let t = Arc::new(ClientTable::default());
        let l = limits(0, 100, 10);
        let start = Instant::now();
        for i in 0..500u32 {
            let slot = t.admit(IpAddr::V4((0x0a00_0000 + i).into()), &l, start).unwrap();
            drop(slot);
        }
        assert_eq!(t.len(), 500, "buckets not yet refilled");
        // Each bucket refills in 10 ms; a second later every shard sweeps on its next use.
        let later = start + SWEEP_EVERY + Duration::from_millis(20);
        for i in 0..5000u32 {
            let _ = t.admit(IpAddr::V4((0x0b00_0000 + i).into()), &l, later);
        }
        let left = t.len();
        assert!(left <= 5000, "old entries swept: {left}");
        let old = (0..500u32).filter(|i| {
            let c = Client::of(IpAddr::V4((0x0a00_0000 + i).into()), &l);
            t.shard(&c).clients.contains_key(&c)
        });
        assert_eq!(old.count(), 0);
    }

    #[test]
    fn refusal_warnings_are_rate_limited() {
        let t = ClientTable::default();
        let now = Instant::now();
        assert!(t.note_refusal(Refusal::Rate, now), "the first one is reported");
        for i in 0..1000 {
            assert!(!t.note_refusal(Refusal::Connections, now + Duration::from_millis(i)));
        }
        assert!(t.note_refusal(Refusal::Rate, now + WARN_EVERY + Duration::from_millis(1)));
    }
}
