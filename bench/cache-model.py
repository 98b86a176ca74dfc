#!/usr/bin/env python3
"""Replays the viewers' requests of a linerate JSON access log against models of a
slice cache's eviction, and prints each model's byte hit ratio per cache size.

    bench/cache-model.py ACCESS_LOG [--slice-mib 4] [--cache-mib 512,1024,1536]
                         [--policies demand,demand-only,lru,lru-trim20,arc,belady]
                         [--user-agent linerate-bench] [--heads keep|shuffle|drop]

The log is the one `bench/origin.sh --access-log FILE` keeps of a tail run: it holds
every GET range (and the HEADs that size each title) in the order they arrived.
Requests matter, not the server's answers: the same log replays against every model.
A model is a fast way to ask "what would this eviction rule have done with these
viewers?"; a rule worth building is then measured for real with bench/origin.sh.

Each request's slices are looked up in order; a missing slice is fetched whole (its
bytes count as origin bytes, as the origin's log counts them) and stored. HEADs store
the first slice of their object, as a miss's head does, without counting it (the
bench leaves those bytes out as "discovery"). Byte hit ratio = 1 - origin bytes /
bytes asked for. The models:

  demand       linerate's store: past the limit, evict to 5% under it, the least
               demand first (a range that starts a slice counts one pass over it;
               passes decay with a 60 s half-life), then the least recently used;
               a slice whose last range stopped before its end goes last (for 30 s,
               or until a range reaches its end: a viewer part-way through it).
  demand-only  the same without that last rule.
  lru          least recently used, evicted to 5% under the limit as it is passed.
  lru-trimN    least recently used, trimmed to the limit only every N seconds (how
               nginx's cache manager behaves between its passes: the cache holds
               more than the limit in between).
  arc          adaptive replacement (Megiddo and Modha), strict limit.
  belady       the offline optimum (evicts the slice asked for again the latest):
               an upper bound no online rule reaches.

--heads asks what the bench's HEADs (one per title, in the catalogue's order, which
is its order of popularity, before the viewers start) do to a model: `shuffle` sends
the same HEADs at the same times for the titles in a random order (seeded), `drop`
leaves them out (the viewers' first GETs then fetch the first slices, as origin bytes).

Prints, per size and model, the byte hit ratio and the mean and peak bytes held.
"""

import argparse
import datetime
import json
import random
from collections import OrderedDict

MIB = 1 << 20


def load(path, user_agent, slice_bytes):
    """[(time, key, bytes asked of that slice, starts_it, is_head, reaches_its_end)]
    in arrival order."""
    events = []
    for line in open(path, errors="replace"):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if user_agent and r.get("user_agent") != user_agent:
            continue
        t = datetime.datetime.fromisoformat(r["time"].replace("Z", "+00:00")).timestamp()
        if r["method"] == "HEAD":
            events.append((t, (r["path"], 0), 0, False, True, True))
            continue
        if r["method"] != "GET" or not r.get("range") or not r.get("body_bytes"):
            continue
        spec = r["range"].split("=", 1)[1].split(",")[0]
        first, _, last = spec.partition("-")
        if not first:
            continue  # suffix ranges: not what the bench sends
        a = int(first)
        b = int(last) if last else a + r["body_bytes"] - 1
        for i in range(a // slice_bytes, b // slice_bytes + 1):
            lo, hi = max(a, i * slice_bytes), min(b, (i + 1) * slice_bytes - 1)
            events.append((t, (r["path"], i), hi - lo + 1, a <= i * slice_bytes, False, hi == (i + 1) * slice_bytes - 1))
    events.sort(key=lambda e: e[0])
    return events


def with_heads(events, mode):
    """The events with the HEADs kept, sent for titles in a random order, or dropped."""
    if mode == "keep":
        return events
    heads = [e for e in events if e[4]]
    rest = [e for e in events if not e[4]]
    if mode == "drop":
        return rest
    keys = [e[1] for e in heads]
    random.Random(1).shuffle(keys)
    heads = [(e[0], k) + e[2:] for e, k in zip(heads, keys)]
    return sorted(heads + rest, key=lambda e: e[0])


class Held:
    """Mean and peak of the bytes a model holds, weighted by time."""

    def __init__(self):
        self.t = None
        self.area = self.span = 0.0
        self.peak = 0

    def note(self, t, held):
        if self.t is not None:
            self.area += (t - self.t) * held
            self.span += t - self.t
        self.t = t
        self.peak = max(self.peak, held)

    def mean(self):
        return self.area / self.span if self.span else 0.0


MIDWAY_S = 30.0


def run_ranked(events, limit, slice_bytes, policy, trim_every=0.0, half_life=60.0):
    """demand, demand-only, lru and lru-trimN: evict by a ranking once past the limit."""
    cache = {}  # key -> [last use, demand, demand's time, part-way until]
    origin = asked = 0
    held = Held()
    next_trim = None

    def rank(k, now):
        used, d, td, midway = cache[k]
        if policy == "demand":
            return (midway > now, d * 0.5 ** ((now - td) / half_life), used)
        if policy == "demand-only":
            return (d * 0.5 ** ((now - td) / half_life), used)
        return (used,)

    def evict(now, to):
        for k in sorted(cache, key=lambda k: rank(k, now)):
            if len(cache) * slice_bytes <= to:
                break
            del cache[k]

    for t, k, n, starts, head, to_end in events:
        if trim_every:
            if next_trim is None:
                next_trim = t
            while t >= next_trim:
                if len(cache) * slice_bytes > limit:
                    evict(next_trim, limit)
                next_trim += trim_every
        asked += n
        if k in cache:
            c = cache[k]
            c[0] = t
            if starts and not head:
                c[1] = c[1] * 0.5 ** ((t - c[2]) / half_life) + 1
                c[2] = t
        else:
            if not head:
                origin += slice_bytes
            cache[k] = [t, 0.0, t, 0.0]
        if not head:
            cache[k][3] = 0.0 if to_end else t + MIDWAY_S
        if not trim_every and len(cache) * slice_bytes > limit:
            evict(t, limit - limit // 20)
        held.note(t, len(cache) * slice_bytes)
    return origin, asked, held


def run_arc(events, limit, slice_bytes):
    c = max(1, limit // slice_bytes)
    p = 0.0
    t1, t2, b1, b2 = OrderedDict(), OrderedDict(), OrderedDict(), OrderedDict()
    origin = asked = 0
    held = Held()

    def replace(in_b2):
        if t1 and (len(t1) > p or (in_b2 and len(t1) == p)):
            k, _ = t1.popitem(last=False)
            b1[k] = True
        elif t2:
            k, _ = t2.popitem(last=False)
            b2[k] = True

    for t, k, n, starts, head, _ in events:
        asked += n
        if k in t1 or k in t2:
            if starts and not head:
                (t1 if k in t1 else t2).pop(k)
                t2[k] = True
        else:
            if not head:
                origin += slice_bytes
            if k in b1:
                p = min(c, p + max(len(b2) / max(len(b1), 1), 1))
                replace(False)
                del b1[k]
                t2[k] = True
            elif k in b2:
                p = max(0, p - max(len(b1) / max(len(b2), 1), 1))
                replace(True)
                del b2[k]
                t2[k] = True
            else:
                if len(t1) + len(b1) == c:
                    if len(t1) < c:
                        b1.popitem(last=False)
                        replace(False)
                    else:
                        t1.popitem(last=False)
                elif len(t1) + len(t2) + len(b1) + len(b2) >= c:
                    if len(t1) + len(t2) + len(b1) + len(b2) >= 2 * c:
                        b2.popitem(last=False)
                    replace(False)
                t1[k] = True
        held.note(t, (len(t1) + len(t2)) * slice_bytes)
    return origin, asked, held


def run_belady(events, limit, slice_bytes):
    c = max(1, limit // slice_bytes)
    never = float("inf")
    next_use, last = [never] * len(events), {}
    for i in range(len(events) - 1, -1, -1):
        k = events[i][1]
        next_use[i] = last.get(k, never)
        last[k] = i
    cache = {}
    origin = asked = 0
    held = Held()
    for i, (t, k, n, _, head, _) in enumerate(events):
        asked += n
        if k not in cache and not head:
            origin += slice_bytes
        cache[k] = next_use[i]
        if len(cache) > c:
            del cache[max(cache, key=cache.get)]
        held.note(t, len(cache) * slice_bytes)
    return origin, asked, held


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log")
    ap.add_argument("--slice-mib", type=int, default=4)
    ap.add_argument("--cache-mib", default="512,1024,1536")
    ap.add_argument("--policies", default="demand,demand-only,lru,lru-trim20,arc,belady")
    ap.add_argument("--user-agent", default="linerate-bench")
    ap.add_argument("--heads", choices=("keep", "shuffle", "drop"), default="keep")
    a = ap.parse_args()
    slice_bytes = a.slice_mib * MIB
    events = with_heads(load(a.log, a.user_agent, slice_bytes), a.heads)
    if not any(e[2] for e in events):
        raise SystemExit("no GET ranges from %r in %s" % (a.user_agent, a.log))
    print("%d slice requests, %.0f MB asked for, %d MiB slices" %
          (sum(1 for e in events if not e[4]), sum(e[2] for e in events) / 1e6, a.slice_mib))
    print("| cache MiB | model | byte hit ratio | held mean MB | held peak MB |")
    print("|---|---|---|---|---|")
    for size in (int(s) for s in a.cache_mib.split(",")):
        limit = size * MIB
        for policy in a.policies.split(","):
            if policy == "arc":
                r = run_arc(events, limit, slice_bytes)
            elif policy == "belady":
                r = run_belady(events, limit, slice_bytes)
            elif policy in ("demand", "demand-only", "lru"):
                r = run_ranked(events, limit, slice_bytes, policy)
            elif policy.startswith("lru-trim"):
                r = run_ranked(events, limit, slice_bytes, "lru", trim_every=float(policy[len("lru-trim"):]))
            else:
                raise SystemExit("unknown model: %s" % policy)
            origin, asked, held = r
            print("| %d | %s | %.3f | %.0f | %.0f |" %
                  (size, policy, 1 - origin / asked, held.mean() / 1e6, held.peak / 1e6))


if __name__ == "__main__":
    main()
