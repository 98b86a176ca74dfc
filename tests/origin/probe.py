#!/usr/bin/env python3
"""Clients for the origin-fill benchmark (bench/origin.sh) and cache tests, with
the standard library only.

  probe.py objects DIR COUNT BYTES
      COUNT files of BYTES random bytes under DIR, as DIR/o/NNN/NNNNNN.bin (1,000 per
      directory); kept when present with the right size. Prints the list file
      DIR/o/list (one path per line, from /).

  probe.py fill URL LIST [--clients N] [--limit K] [--root DIR]
      GETs each path of LIST (the first K) once through URL (http://host:port/), N
      (default 32) keep-alive clients in parallel; fails unless every answer is 200
      or 206 (and, with --root, has the bytes of the file under DIR). Prints
      `requests=R seconds=S`.

  probe.py first-hit URL LIST LOG DIR [--deadline S] [--sample N] [--seed N]
      For a server about to be started: once ready, creates DIR/ready, and tries to
      connect every 2 ms; the caller then writes the time it starts the server
      (epoch seconds, as `date +%s.%N`) into DIR/t0 and starts it (so the probe's own
      start-up, a fraction of a second, is not counted). Asks for the cached paths
      of LIST in a random order, one at a time on one connection, reconnecting
      until the server answers; a HIT is a 2xx answer during
      which LOG (the origin's access log) did not grow (a request the server sent to
      the origin is logged there before its bytes reach the server: the WAN delays
      them). Then asks N (default 200) more paths and counts their hits. Prints one
      JSON object: first_response_s and first_hit_s (from the start), misses_before_hit,
      errors_before_hit, sample, sample_hits, sample_s.

  probe.py play-start PORT [--timeout S]
      Prints the time (epoch seconds) at which a second connection to local port
      PORT has been seen established (/proc/net/tcp, read every 5 ms): when `linerate
      bench`, which sizes its titles with HEADs on one connection first, starts its
      sessions. Prints nothing if that does not happen within S (default 600) s.
"""

import argparse
import http.client
import json
import os
import random
import socket
import sys
import threading
import time
import urllib.parse


def cmd_objects(a):
    top = os.path.join(a.dir, "o")
    paths = []
    for i in range(a.count):
        rel = "o/%03d/%06d.bin" % (i // 1000, i)
        full = os.path.join(a.dir, rel)
        paths.append("/" + rel)
        try:
            if os.path.getsize(full) == a.bytes:
                continue
        except OSError:
            os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(os.urandom(a.bytes))
    os.makedirs(top, exist_ok=True)
    with open(os.path.join(top, "list"), "w") as f:
        f.write("\n".join(paths) + "\n")
    print(os.path.join(top, "list"))


def split(url):
    u = urllib.parse.urlsplit(url)
    return u.hostname, u.port or 80, u.path.rstrip("/")


def get(conn, path):
    conn.request("GET", path)
    r = conn.getresponse()
    return r.status, r.read()


def cmd_fill(a):
    host, port, base = split(a.url)
    paths = [p for p in open(a.list).read().split() if p][: a.limit or None]
    lock = threading.Lock()
    todo = iter(paths)
    bad = []

    def client():
        conn = http.client.HTTPConnection(host, port, timeout=30)
        while True:
            with lock:
                path = next(todo, None)
            if path is None:
                break
            for attempt in range(3):
                try:
                    status, body = get(conn, base + path)
                    break
                except (OSError, http.client.HTTPException) as e:
                    conn.close()
                    conn = http.client.HTTPConnection(host, port, timeout=30)
                    status, body = 0, str(e).encode()
            if status not in (200, 206) or (a.root and body != open(a.root + path, "rb").read()):
                with lock:
                    bad.append("%s: %s %r" % (path, status, body[:80]))
        conn.close()

    t0 = time.time()
    threads = [threading.Thread(target=client) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("requests=%d seconds=%.3f" % (len(paths), time.time() - t0))
    if bad:
        sys.exit("fill: %d bad answers, first: %s" % (len(bad), bad[0]))


def cmd_first_hit(a):
    host, port, base = split(a.url)
    paths = [p for p in open(a.list).read().split() if p]
    random.Random(a.seed).shuffle(paths)
    open(os.path.join(a.dir, "ready"), "w").close()
    deadline = time.time() + a.deadline
    out = {"first_response_s": None, "first_hit_s": None, "misses_before_hit": 0, "errors_before_hit": 0,
           "sample": 0, "sample_hits": 0, "sample_s": 0.0}
    conn = None
    i = 0

    def ask(path):
        nonlocal conn
        if conn is None:
            conn = http.client.HTTPConnection(host, port, timeout=10)
        size = os.path.getsize(a.log)
        try:
            status, _ = get(conn, base + path)
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = None
            return None, False
        return status, os.path.getsize(a.log) == size

    while time.time() < deadline and i < len(paths):
        status, quiet = ask(paths[i])
        if status is None:
            time.sleep(0.002)  # not listening yet (or the connection broke): try again
            continue
        now = time.time()
        if out["first_response_s"] is None:
            t0 = float(open(os.path.join(a.dir, "t0")).read())
            out["first_response_s"] = round(now - t0, 4)
        i += 1
        if 200 <= status < 300 and quiet:
            out["first_hit_s"] = round(now - t0, 4)
            break
        if 200 <= status < 300:
            out["misses_before_hit"] += 1
        else:
            out["errors_before_hit"] += 1
            time.sleep(0.01)
    t = time.time()
    for path in paths[i : i + a.sample]:
        status, quiet = ask(path)
        out["sample"] += 1
        out["sample_hits"] += 1 if status is not None and 200 <= status < 300 and quiet else 0
    out["sample_s"] = round(time.time() - t, 4)
    print(json.dumps(out))


def established(port):
    """The peers (address:port, hex) of the established connections to local PORT."""
    peers = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                peers.add(fields[2])
    return peers


def cmd_play_start(a):
    end = time.time() + a.timeout
    seen = set()
    while time.time() < end:
        seen |= established(a.port)
        if len(seen) >= 2:
            print("%.3f" % time.time(), flush=True)
            return
        time.sleep(0.005)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("objects")
    o.add_argument("dir")
    o.add_argument("count", type=int)
    o.add_argument("bytes", type=int)
    f = sub.add_parser("fill")
    f.add_argument("url")
    f.add_argument("list")
    f.add_argument("--clients", type=int, default=32)
    f.add_argument("--limit", type=int, default=0)
    f.add_argument("--root", default="", help="check each body against the file under ROOT")
    h = sub.add_parser("first-hit")
    h.add_argument("url")
    h.add_argument("list")
    h.add_argument("log")
    h.add_argument("dir")
    h.add_argument("--deadline", type=float, default=120)
    h.add_argument("--sample", type=int, default=200)
    h.add_argument("--seed", type=int, default=1)
    s = sub.add_parser("play-start")
    s.add_argument("port", type=int)
    s.add_argument("--timeout", type=float, default=600)
    a = p.parse_args()
    {"objects": cmd_objects, "fill": cmd_fill, "first-hit": cmd_first_hit, "play-start": cmd_play_start}[a.cmd](a)


if __name__ == "__main__":
    socket.setdefaulttimeout(30)
    main()
