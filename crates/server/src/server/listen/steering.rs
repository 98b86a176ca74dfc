//! Handing each new connection to a worker in the NUMA domain that received it.
//!
//! The mechanism is a classic BPF program attached to each `SO_REUSEPORT` group
//! (`SO_ATTACH_REUSEPORT_CBPF`). For every SYN it reads the CPU whose softirq is
//! processing it and returns a listener index, which is a worker index because
//! listeners are bound in worker order. Per CPU, by `numa.steering`:
//!
//! - `domain` (the default): one of the workers of the CPU's domain, chosen by the
//!   packet's flow hash (or at random when the packet has none);
//! - `cpu`: the worker of that CPU (held to it); with several there, one of them by flow
//!   hash; with none, one of the domain's as above;
//! - either way, a CPU in no domain (or in a domain without workers) gets an
//!   out-of-range index, on which the kernel falls back to its hash over all workers.
//!
//! Why `domain` by default: the CPU that runs a SYN's softirq is whatever the NIC's
//! interrupt placement (or, on loopback, the client's scheduling) makes it. Steering to
//! that exact CPU is right when each CPU has its own receive queue and the NIC's hash
//! spreads flows over them, but a NIC with one queue, or interrupts all affine to one
//! CPU, would send every connection to one worker. Within a domain, the flow hash keeps
//! workers balanced whatever the interrupts do; the NUMA locality is kept either way.
//!
//! Why not `SO_INCOMING_CPU` on each listener: it is a preference the kernel
//! applies only in some code paths and kernel versions (reuseport groups ignored
//! it until Linux 6.2), and it has no notion of "another worker of the same
//! domain". The BPF program is explicit, works since Linux 4.5, and falls back
//! cleanly. Whatever the mechanism, the workers count the connections that
//! nevertheless arrive from another domain (`SO_INCOMING_CPU` at accept).

use linerate_sys::reuseport::{op, Insn};

use crate::topology::Plan;

/// What a CPU's connections go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    Worker(usize),
    /// One of `count` consecutive workers from `first`, by flow hash.
    Spread {
        first: usize,
        count: usize,
    },
    /// No preference: the kernel's hash over all workers.
    Any,
}

/// The target of every CPU (index = CPU number) for a plan: per CPU when the plan
/// steers by CPU (`cpu-cbpf`), per domain otherwise.
pub(crate) fn targets(plan: &Plan) -> Vec<Target> {
    let by_cpu = plan.steering == "cpu-cbpf";
    let cpus = plan.cpu_domains();
    (0..cpus.len())
        .map(|cpu| {
            let on_cpu: Vec<usize> =
                plan.workers.iter().enumerate().filter(|(_, s)| s.cpu as usize == cpu).map(|(i, _)| i).collect();
            match on_cpu.as_slice() {
                [one] if by_cpu => return Target::Worker(*one),
                [first, ..] if by_cpu => return Target::Spread { first: *first, count: on_cpu.len() },
                _ => {}
            }
            match cpus[cpu].map(|d| &plan.domains[d].workers) {
                Some(ws) if ws.len() == 1 => Target::Worker(ws[0]),
                Some(ws) if !ws.is_empty() => Target::Spread { first: ws[0], count: ws.len() },
                _ => Target::Any,
            }
        })
        .collect()
}

/// The BPF program for these targets.
pub(crate) fn program(targets: &[Target]) -> Vec<Insn> {
    let insn = |code, jt, jf, k| Insn { code, jt, jf, k };
    let mut p = vec![insn(op::LD_W_ABS, 0, 0, op::AD_CPU)];
    for (cpu, target) in targets.iter().enumerate() {
        match *target {
            Target::Worker(w) => {
                // if A == cpu: return w (else skip the return)
                p.push(insn(op::JEQ_K, 0, 1, cpu as u32));
                p.push(insn(op::RET_K, 0, 0, w as u32));
            }
            Target::Spread { first, count } => {
                // if A == cpu: A = rxhash, or a random number when that is 0;
                // return first + A % count (else skip those 6 instructions)
                p.push(insn(op::JEQ_K, 0, 6, cpu as u32));
                p.push(insn(op::LD_W_ABS, 0, 0, op::AD_RXHASH));
                p.push(insn(op::JEQ_K, 0, 1, 0));
                p.push(insn(op::LD_W_ABS, 0, 0, op::AD_RANDOM));
                p.push(insn(op::MOD_K, 0, 0, count as u32));
                p.push(insn(op::ADD_K, 0, 0, first as u32));
                p.push(insn(op::RET_A, 0, 0, 0));
            }
            Target::Any => {}
        }
    }
    p.push(insn(op::RET_K, 0, 0, u32::MAX));
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Numa, Steering};
    use crate::topology::{Node, Topology};

    /// Runs the subset of classic BPF the program uses.
    fn run(p: &[Insn], cpu: u32, rxhash: u32, random: u32) -> u32 {
        let (mut pc, mut a) = (0usize, 0u32);
        loop {
            let i = p[pc];
            pc += 1;
            match i.code {
                op::LD_W_ABS if i.k == op::AD_CPU => a = cpu,
                op::LD_W_ABS if i.k == op::AD_RXHASH => a = rxhash,
                op::LD_W_ABS if i.k == op::AD_RANDOM => a = random,
                op::JEQ_K => pc += if a == i.k { i.jt } else { i.jf } as usize,
                op::MOD_K => a %= i.k,
                op::ADD_K => a = a.wrapping_add(i.k),
                op::RET_K => return i.k,
                op::RET_A => return a,
                other => panic!("unexpected instruction {other:#x}"),
            }
        }
    }

    fn topo(nodes: &[(u32, &[u32])]) -> Topology {
        Topology {
            nodes: nodes.iter().map(|(id, cpus)| Node { id: *id, cpus: cpus.to_vec(), distances: vec![] }).collect(),
            nics: vec![],
            disks: vec![],
            warnings: vec![],
        }
    }

    fn by_cpu() -> Numa {
        Numa { steering: Steering::Cpu, ..Numa::default() }
    }

    #[test]
    fn by_cpu_one_worker_per_cpu_gets_its_own_cpu() {
        // CPUs of node 1 are numbered before some of node 0's: worker order follows
        // domains, not CPU numbers.
        let plan = Plan::new(&topo(&[(0, &[0, 3]), (1, &[1, 2])]), 0, &by_cpu());
        let p = program(&targets(&plan));
        for (w, slot) in plan.workers.iter().enumerate() {
            assert_eq!(run(&p, slot.cpu, 12345, 7), w as u32, "cpu {}", slot.cpu);
        }
        assert_eq!(run(&p, 7, 1, 1), u32::MAX, "unknown CPU: kernel hash");
    }

    #[test]
    fn by_domain_every_worker_of_the_domain_gets_a_share() {
        let plan = Plan::new(&topo(&[(0, &[0, 3]), (1, &[1, 2])]), 0, &Numa::default());
        assert_eq!(plan.steering, "domain-cbpf");
        let p = program(&targets(&plan));
        for cpu in 0..4u32 {
            let node = if cpu == 0 || cpu == 3 { 0 } else { 1 };
            let mut seen = std::collections::BTreeSet::new();
            for hash in 1..=16u32 {
                let w = run(&p, cpu, hash, 0) as usize;
                assert_eq!(plan.workers[w].node, node, "cpu {cpu} hash {hash} -> worker {w}");
                seen.insert(w);
            }
            assert_eq!(seen.len(), 2, "cpu {cpu}: both workers of node {node}, got {seen:?}");
        }
        // A packet without a flow hash is placed at random, still in its domain.
        let w: Vec<u32> = (0..4).map(|r| run(&p, 3, 0, r)).collect();
        assert_eq!(w, vec![0, 1, 0, 1]);
        assert_eq!(run(&p, 9, 5, 5), u32::MAX, "unknown CPU: kernel hash");
    }

    #[test]
    fn fewer_workers_than_cpus_stay_in_the_domain() {
        for numa in [Numa::default(), by_cpu()] {
            let plan = Plan::new(&topo(&[(0, &[0, 1, 2, 3]), (1, &[4, 5, 6, 7])]), 4, &numa);
            let p = program(&targets(&plan));
            for cpu in 0..8u32 {
                for hash in [0u32, 1, 2, 3, 99, u32::MAX] {
                    let w = run(&p, cpu, hash, hash / 2) as usize;
                    assert_eq!(
                        plan.workers[w].node,
                        if cpu < 4 { 0 } else { 1 },
                        "cpu {cpu} hash {hash} -> worker {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn more_workers_than_cpus_spread_on_the_cpu() {
        let plan = Plan::new(&topo(&[(0, &[0]), (1, &[1])]), 4, &by_cpu());
        let t = targets(&plan);
        assert_eq!(t, vec![Target::Spread { first: 0, count: 2 }, Target::Spread { first: 2, count: 2 }]);
        let p = program(&t);
        assert_eq!((run(&p, 1, 2, 0), run(&p, 1, 1, 0)), (2, 3));
        assert_eq!((run(&p, 1, 0, 4), run(&p, 1, 0, 5)), (2, 3));
    }
}
