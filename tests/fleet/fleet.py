#!/usr/bin/env python3
"""HAProxy and Prometheus queries for tests/fleet/run and bench/fleet.sh.

  fleet.py stat SOCK                          one line per server of the `nodes` backend
                                              (FLEET_BACKEND names another):
                                              name requests scur weight status
  fleet.py cmd SOCK LINE...                   HAProxy runtime commands (fails on any answer)
  fleet.py wait SOCK SERVER STATUS SECONDS    until SERVER's status starts with STATUS
                                              (UP, DOWN, DRAIN...); exit 1 on time-out
  fleet.py sample SOCK OUT SECONDS            every 0.1 s for SECONDS (or until OUT.stop
                                              exists): "t name requests scur weight status"
  fleet.py drain OUT SERVER T0                from a sample: when SERVER got its last new
                                              session, when HAProxy stopped giving it any
  fleet.py down OUT SERVER T0                 seconds from T0 until SERVER left UP
  fleet.py split OUT T0 T1                    per server: new sessions and mean weight
                                              between T0 and T1
  fleet.py prom URL QUERY [TIME]              an instant query's single value
  fleet.py bench FILE KEY                     a value from `linerate bench --json`
"""
import json
import os
import socket
import sys
import time
import urllib.parse
import urllib.request

# The backend whose servers are read: `nodes`, or FLEET_BACKEND (the tiered fleet's
# `edges`).
BACKEND = os.environ.get("FLEET_BACKEND", "nodes")


def command(sock, line):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    s.connect(sock)
    s.sendall(line.encode() + b"\n")
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    return data.decode()


def show_stat(sock):
    lines = command(sock, "show stat").splitlines()
    header = lines[0].lstrip("# ").split(",")
    rows = []
    for line in lines[1:]:
        if not line:
            continue
        row = dict(zip(header, line.split(",")))
        if row["pxname"] == BACKEND and row["svname"] not in ("FRONTEND", "BACKEND"):
            rows.append(row)
    return rows


def fmt(row):
    # New sessions: HTTP requests sent to the server (each is balanced on its own URI).
    new = row.get("req_tot") or row["stot"]
    return "%s %s %s %s %s" % (row["svname"], new, row["scur"], row["weight"], row["status"].replace(" ", "_"))


def read_sample(path):
    out = []
    for line in open(path):
        t, name, stot, scur, weight, status = line.split()
        out.append((float(t), name, int(stot), int(scur), int(weight), status))
    return out


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "stat":
        for row in show_stat(args[0]):
            print(fmt(row))
    elif cmd == "cmd":
        for line in args[1:]:
            out = command(args[0], line).strip()
            if out:
                print("%s: %s" % (line, out), file=sys.stderr)
                return 1
    elif cmd == "wait":
        sock, server, status, secs = args[0], args[1], args[2], float(args[3])
        end = time.time() + secs
        while time.time() < end:
            for row in show_stat(sock):
                if row["svname"] == server and row["status"].startswith(status):
                    return 0
            time.sleep(0.1)
        print("%s did not become %s within %.0f s: %s" % (server, status, secs,
              "; ".join(fmt(r) for r in show_stat(sock))), file=sys.stderr)
        return 1
    elif cmd == "sample":
        sock, out, secs = args[0], args[1], float(args[2])
        end = time.time() + secs
        with open(out, "w") as f:
            while time.time() < end and not os.path.exists(out + ".stop"):
                now = time.time()
                try:
                    rows = show_stat(sock)
                except OSError:
                    rows = []
                for row in rows:
                    f.write("%.3f %s\n" % (now, fmt(row)))
                f.flush()
                time.sleep(0.1)
    elif cmd == "drain":
        # The last sample in which SERVER's session count grew, and the first in which
        # its weight was 0 or its state not UP, both relative to T0.
        rows = [r for r in read_sample(args[0]) if r[1] == args[1]]
        t0 = float(args[2])
        last_new, prev, stopped = None, None, None
        for t, _, stot, _, weight, status in rows:
            if prev is not None and stot > prev:
                last_new = t
            prev = stot
            if t >= t0 and stopped is None and (weight == 0 or not status.startswith("UP")):
                stopped = t
        rel = lambda t: "none" if t is None else "%.2f" % (t - t0)
        print("last_new_session_s=%s not_up_s=%s" % (rel(last_new), rel(stopped)))
    elif cmd == "down":
        t0 = float(args[2])
        for t, name, _, _, _, status in read_sample(args[0]):
            if name == args[1] and t >= t0 and not status.startswith("UP"):
                print("%.2f" % (t - t0))
                return 0
        print("never")
    elif cmd == "split":
        t0, t1 = float(args[1]), float(args[2])
        first, last, weights = {}, {}, {}
        for t, name, stot, _, weight, _ in read_sample(args[0]):
            if t < t0 or t > t1:
                continue
            first.setdefault(name, stot)
            last[name] = stot
            weights.setdefault(name, []).append(weight)
        for name in sorted(first):
            print("%s %d %.1f" % (name, last[name] - first[name], sum(weights[name]) / len(weights[name])))
    elif cmd == "prom":
        url, query = args[0], args[1]
        params = {"query": query}
        if len(args) > 2:
            params["time"] = args[2]
        with urllib.request.urlopen(url + "/api/v1/query?" + urllib.parse.urlencode(params), timeout=5) as r:
            body = json.load(r)
        result = body["data"]["result"]
        if body["status"] != "success" or len(result) != 1:
            print("unexpected answer to %s: %s" % (query, body), file=sys.stderr)
            return 1
        print(result[0]["value"][1])
    elif cmd == "bench":
        value = json.load(open(args[0]))
        for key in args[1].split("."):
            value = value[key]
        print(value)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
