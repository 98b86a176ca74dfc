#!/usr/bin/env python3
"""The tiered fleet's counting, for tests/fleet/tier.sh.

  tier.py metric URL NAME [LABEL...]     the sum of NAME's samples on a Prometheus
                                         text endpoint whose labels hold every LABEL
                                         (0 when there is none)
  tier.py first PREFIX NAME P1 P2        the first title NAMEi whose key (PREFIX NAMEi
                                         /v.bin) has parent P1 (host:port) first
  tier.py distinct ROOT PREFIX LOG...    the distinct bytes viewers asked for: per
                                         title, the union of the ranges of the 200
                                         and 206 records under PREFIX in the edges'
                                         JSON access logs (a 200 is the whole file
                                         under ROOT, a HEAD its first slice)
  tier.py multiple NAME ROOT PREFIX BEFORE AFTER ERRORS LOG...
                                         one run's line: the origin's bytes (AFTER -
                                         BEFORE), the distinct bytes, their ratio
  tier.py check LINE...                  the runs' lines: every run with parents at
                                         most LIMIT x its distinct bytes
  tier.py kill JSON ROOT PREFIX BEFORE AFTER UPS CUT P1_ERRORS BIG LOG...
                                         the parent-kill run's line and checks (see
                                         scenario_tier_kill)
"""
import json
import os
import sys
import urllib.request

# With the parent tier, the origin's bytes at most this multiple of the distinct
# bytes asked for.
LIMIT = 1.1
# The nodes' [cache] slice_bytes.
SLICE = 1048576


def score(key, parent):
    """The rendezvous score of docs/CACHE.md ("Parent tier"), computed here
    independently: FNV-1a 64 of key, 0, parent host:port; SplitMix64's finish."""
    m = (1 << 64) - 1
    h = 0xcbf29ce484222325
    for b in key + b"\0" + parent:
        h = ((h ^ b) * 0x100000001b3) & m
    h = ((h ^ (h >> 30)) * 0xbf58476d1ce4e5b9) & m
    h = ((h ^ (h >> 27)) * 0x94d049bb133111eb) & m
    return h ^ (h >> 31)


def metric(url, name, labels):
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        sample, _, value = line.rpartition(" ")
        if (sample == name or sample.startswith(name + "{")) and all(l in sample for l in labels):
            total += float(value)
    return total


def distinct(root, prefix, logs):
    ranges = {}
    for log in logs:
        for line in open(log, errors="replace"):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            path = r.get("path") or ""
            if r.get("status") not in (200, 206) or not path.startswith(prefix):
                continue
            name = path[len(prefix):]
            size = os.path.getsize(os.path.join(root, name))
            rng = r.get("range")
            if r.get("method") == "HEAD":
                # The bench's catalogue discovery: on a cold cache a HEAD costs the
                # slice holding byte 0 (the object's head comes with it).
                first, last = 0, min(SLICE, size) - 1
            elif r["status"] == 200 or not rng:
                first, last = 0, size - 1
            else:
                a, _, b = rng.removeprefix("bytes=").partition("-")
                first, last = int(a), min(int(b or size - 1), size - 1)
            ranges.setdefault(name, []).append((first, last))
    total = 0
    for spans in ranges.values():
        spans.sort()
        end = -1
        for first, last in spans:
            if last > end:
                total += last - max(first, end + 1) + 1
                end = last
    return total, len(ranges)


def run_line(name, root, prefix, before, after, errors, logs):
    origin = float(after) - float(before)
    asked, titles = distinct(root, prefix, logs)
    multiple = origin / asked if asked else float("nan")
    return "%s origin_bytes=%.0f distinct_bytes=%d multiple=%.3f titles=%d errors=%s" % (
        name, origin, asked, multiple, titles, errors)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "metric":
        print("%.0f" % metric(args[0], args[1], args[2:]))
    elif cmd == "first":
        # The first title NAME{i} (i = 1, 2...) whose first-choice parent is P1.
        prefix, name, p1, p2 = args[0], args[1], args[2].encode(), args[3].encode()
        i = 1
        while True:
            key = ("%s%s%d/v.bin" % (prefix, name, i)).encode()
            if score(key, p1) > score(key, p2):
                print("%s%d" % (name, i))
                return 0
            i += 1
    elif cmd == "distinct":
        print("%d %d" % distinct(args[0], args[1], args[2:]))
    elif cmd == "multiple":
        print(run_line(*args[:6], args[6:]))
    elif cmd == "check":
        runs = {}
        for line in args:
            name, *pairs = line.split()
            runs[name] = dict(p.split("=", 1) for p in pairs)
        summary = " ".join("%s=%sx(%.1f/%.1fMB,%s_titles)" % (
            n.removeprefix("tier-"), v["multiple"], float(v["origin_bytes"]) / 1e6,
            int(v["distinct_bytes"]) / 1e6, v["titles"]) for n, v in runs.items())
        print("tier origin/distinct: %s limit_with_parents=%.1fx" % (summary, LIMIT))
        bad = [n for n, v in runs.items() if "parents" in n and not float(v["multiple"]) <= LIMIT]
        if bad:
            print("FAIL tier: with parents the origin sent more than %.1f x the distinct bytes: %s" % (
                LIMIT, ", ".join(bad)), file=sys.stderr)
            return 1
        if any(int(v["distinct_bytes"]) == 0 for v in runs.values()):
            print("FAIL tier: a run asked for nothing", file=sys.stderr)
            return 1
    elif cmd == "kill":
        report, root, prefix, before, after, ups, cut_fills, p1_errors, big = args[:9]
        logs = args[9:]
        big_attempts, big_same, big_kill_at, big_err = big.split(":", 3)
        j = json.load(open(report))
        errors = j["errors"]
        line = run_line("origin", root, prefix, before, after, j["errors_total"], logs).split(" ", 1)[1]
        kinds = ",".join("%s:%d" % kv for kv in errors.items() if kv[1]) or "-"
        print("tier-kill edge_fills_cut=%s edge_requests_to_p1_failed=%s viewer_bytes_at_kill=%s viewer_64MiB_attempts=%s viewer_bytes=%s "
              "bench_failed_requests=%d errors_by_kind=%s retried_segments=%d max_segment_attempts=%d "
              "unrecovered_segments=%d verified_bytes=%d rebuffers=%d parent_up_p1/p2=%s %s" % (
                  cut_fills, p1_errors, big_kill_at, big_attempts, big_same, j["errors_total"], kinds, j["retried_segments"],
                  j["max_segment_attempts"], j["unrecovered_segments"], j["verified_bytes"], j["rebuffers"], ups,
                  line))
        if big_err:
            print("tier-kill viewer's curl said: %s" % big_err.replace("_", " "), file=sys.stderr)
        fails = []
        if int(cut_fills) == 0:
            fails.append("the kill cut no edge's transfer from p1: nothing was tested")
        if big_same != "same" or int(big_attempts) > 2:
            fails.append("the 64 MiB viewer: %s bytes after %s attempts" % (big_same, big_attempts))
        cut = errors["short_body"] + errors["closed"]
        if j["errors_total"] != cut:
            fails.append("failures other than cut transfers: %s (%s)" % (kinds, j["first_error"]))
        if j["unrecovered_segments"]:
            fails.append("%d segments never arrived" % j["unrecovered_segments"])
        if j["max_segment_attempts"] > 2:
            fails.append("a segment took %d attempts" % j["max_segment_attempts"])
        if cut and j["retried_segments"] == 0:
            fails.append("cut transfers without a retried segment")
        if j["verified_bytes"] == 0:
            fails.append("nothing verified")
        if any(u.split(":")[1] != "0/1" for u in ups.split(",")):
            fails.append("an edge does not show p1 down and p2 up: %s" % ups)
        for f in fails:
            print("FAIL tier-kill: " + f, file=sys.stderr)
        return 1 if fails else 0
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
