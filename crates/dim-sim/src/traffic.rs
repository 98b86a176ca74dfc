//! Packet sources for the simulated receive queue: request/response flows whose
//! next request depends on when the last one was delivered, and bulk streams that
//! arrive in back-to-back trains at a fixed average rate.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A packet waiting in (or taken from) the receive ring.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Packet {
    pub arrival_ns: u64,
    pub bytes: u32,
    pub source: usize,
}

/// Parameters of the traffic model.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TrafficModel {
    /// Wire time of a full frame at the link rate (1500 B at 10 Gb/s = 1.2 µs):
    /// packets of one train arrive this far apart.
    pub frame_gap_ns: u64,
    /// Bulk frame size.
    pub bulk_frame_bytes: u32,
    /// Request size of a ping-pong flow.
    pub rr_request_bytes: u32,
    /// Everything in a transaction except the server's receive path: wire both
    /// ways, the client's own stack, the server application. Drawn per transaction
    /// from `rr_base_ns` plus an exponential tail with mean `rr_jitter_ns`.
    pub rr_base_ns: u64,
    pub rr_jitter_ns: u64,
    /// Largest train a bulk stream sends back to back (trains are 1..=this).
    pub bulk_max_train: u32,
}

impl Default for TrafficModel {
    fn default() -> TrafficModel {
        TrafficModel {
            frame_gap_ns: 1_200,
            bulk_frame_bytes: 1500,
            rr_request_bytes: 100,
            rr_base_ns: 25_000,
            rr_jitter_ns: 2_000,
            bulk_max_train: 16,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    /// Ping-pong: one request outstanding; the next one is sent when the response
    /// to this one arrives at the client.
    PingPong,
    /// Bulk: trains at `trains_per_sec`, each 1..=max_train frames.
    Bulk { trains_per_sec: f64 },
}

#[derive(Clone, Copy, Debug)]
struct Source {
    kind: Kind,
    until_ns: u64,
    /// Frames of the current bulk train still to arrive.
    train_left: u32,
    /// When the current bulk train started; train starts form a Poisson process,
    /// so the long-run rate is what was asked whatever the train lengths.
    train_start_ns: u64,
}

/// What one source is: a name for reports and when it is active.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Flow {
    PingPong,
    Bulk { packets_per_sec: f64 },
}

/// All sources of a run, merged in arrival order.
pub(crate) struct Traffic {
    model: TrafficModel,
    sources: Vec<Source>,
    next: BinaryHeap<Reverse<(u64, usize)>>,
    rng: fastrand::Rng,
}

impl Traffic {
    pub(crate) fn new(model: TrafficModel, seed: u64) -> Traffic {
        Traffic { model, sources: Vec::new(), next: BinaryHeap::new(), rng: fastrand::Rng::with_seed(seed) }
    }

    /// Adds a flow active in `[from_ns, until_ns)`.
    pub(crate) fn add(&mut self, flow: Flow, from_ns: u64, until_ns: u64) {
        let kind = match flow {
            Flow::PingPong => Kind::PingPong,
            Flow::Bulk { packets_per_sec } => {
                let mean_train = f64::from(self.model.bulk_max_train + 1) / 2.0;
                Kind::Bulk { trains_per_sec: packets_per_sec / mean_train }
            }
        };
        let id = self.sources.len();
        self.sources.push(Source { kind, until_ns, train_left: 0, train_start_ns: 0 });
        // Spread first arrivals so flows that start together are not in lockstep.
        let first = from_ns + self.rng.u64(0..10_000);
        self.schedule(id, first);
    }

    fn schedule(&mut self, id: usize, at_ns: u64) {
        if at_ns < self.sources[id].until_ns {
            self.next.push(Reverse((at_ns, id)));
        }
    }

    /// Time of the next arrival, if any source has one scheduled.
    pub(crate) fn peek_ns(&self) -> Option<u64> {
        self.next.peek().map(|Reverse((t, _))| *t)
    }

    /// Takes the next arrival and schedules that source's following one.
    pub(crate) fn pop(&mut self) -> Option<Packet> {
        let Reverse((t, id)) = self.next.pop()?;
        let model = self.model;
        let src = &mut self.sources[id];
        let bytes = match src.kind {
            Kind::PingPong => model.rr_request_bytes,
            Kind::Bulk { trains_per_sec } => {
                if src.train_left == 0 {
                    src.train_left = self.rng.u32(1..=model.bulk_max_train);
                    src.train_start_ns = t;
                }
                src.train_left -= 1;
                let next = if src.train_left > 0 {
                    t + model.frame_gap_ns
                } else {
                    let mean_ns = 1e9 / trains_per_sec;
                    let start = src.train_start_ns + (-(1.0 - self.rng.f64()).ln() * mean_ns) as u64;
                    start.max(t + model.frame_gap_ns)
                };
                self.schedule(id, next);
                model.bulk_frame_bytes
            }
        };
        Some(Packet { arrival_ns: t, bytes, source: id })
    }

    /// The server's stack delivered `packet` at `at_ns`; a ping-pong flow's next
    /// request arrives one round trip later. For ping-pong packets, returns the
    /// transaction time the client sees: the server's receive latency plus the rest
    /// of the round trip (wire, client, application; drawn per transaction).
    pub(crate) fn delivered(&mut self, packet: &Packet, at_ns: u64) -> Option<u64> {
        if !matches!(self.sources[packet.source].kind, Kind::PingPong) {
            return None;
        }
        let jitter = (-(1.0 - self.rng.f64()).ln() * self.model.rr_jitter_ns as f64) as u64;
        let rest = self.model.rr_base_ns + jitter;
        self.schedule(packet.source, at_ns + rest);
        Some(at_ns - packet.arrival_ns + rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_rate_and_trains_match_the_request() {
        let mut t = Traffic::new(TrafficModel::default(), 7);
        t.add(Flow::Bulk { packets_per_sec: 100_000.0 }, 0, 1_000_000_000);
        let mut n = 0u64;
        let mut gaps_at_line_rate = 0u64;
        let mut last = 0;
        while let Some(p) = t.pop() {
            if p.arrival_ns - last == TrafficModel::default().frame_gap_ns {
                gaps_at_line_rate += 1;
            }
            last = p.arrival_ns;
            n += 1;
        }
        assert!((90_000..110_000).contains(&n), "{n} packets in 1 s");
        // Trains average 8.5 frames, so most gaps are back to back.
        assert!(gaps_at_line_rate > n * 3 / 4, "{gaps_at_line_rate} of {n}");
    }

    #[test]
    fn ping_pong_waits_for_delivery() {
        let mut t = Traffic::new(TrafficModel::default(), 7);
        t.add(Flow::PingPong, 0, 1_000_000_000);
        let p = t.pop().unwrap();
        assert_eq!(t.peek_ns(), None, "no second request before the first is answered");
        let rtt = t.delivered(&p, p.arrival_ns + 5_000).unwrap();
        assert!(rtt >= 30_000);
        assert_eq!(t.peek_ns(), Some(p.arrival_ns + rtt));
    }

    #[test]
    fn sources_stop_at_the_end_of_their_phase() {
        let mut t = Traffic::new(TrafficModel::default(), 1);
        t.add(Flow::Bulk { packets_per_sec: 1e6 }, 1_000_000, 2_000_000);
        let mut all = Vec::new();
        while let Some(p) = t.pop() {
            all.push(p.arrival_ns);
        }
        assert!(!all.is_empty());
        assert!(all.iter().all(|&a| (1_000_000..2_000_000).contains(&a)));
    }
}
