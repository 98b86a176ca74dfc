#!/usr/bin/env python3
"""Clients and helpers of tests/origin/live-tests (standard library only):

  writer FILE --every MS --seconds S
      rewrites FILE (renamed over it) every MS ms: a live playlist that grows by
      one line each time (so its size, and nginx's ETag, change), stamped with
      "#STAMP:<ms since the epoch when written>".
  herd URL --viewers N --every MS --seconds S
      every MS ms for S seconds, N viewers at once, each on its own connection,
      GET URL: the age of each body (now - its #STAMP) and the statuses, as JSON.
  viewers URL --viewers N [--http10] [--delay MS] [--expect FILE] [--rounds K --at MS,...]
      N viewers at once (K times, each round at its time), raw HTTP over sockets,
      chunked bodies decoded strictly:
      per viewer its status, framing (chunked, length or close), whether the body
      ended properly (the last chunk, or the whole length), time to the first body
      byte and to the end, and whether the bytes are FILE's (read when they are
      done: it may be a file still being written); JSON.
  latency URL --viewers N [--procs P]
      N viewers (in P client processes) of a chunked stream of "T <send time ns>" lines (liar.py's tick
      mode): for every line sent after the viewer's request, receive time - send
      time; p50, p99 and max in ms, JSON.
"""

import argparse
import json
import os
import socket
import sys
import threading
import time
import urllib.parse


def writer(a):
    seq, lines = 0, []
    end = time.time() + a.seconds
    tmp = a.file + ".tmp"
    while time.time() < end:
        seq += 1
        lines.append("#EXTINF:2.0,\nseg%d.ts" % seq)
        body = "#EXTM3U\n#EXT-X-MEDIA-SEQUENCE:%d\n#STAMP:%d\n%s\n" % (seq, time.time() * 1000, "\n".join(lines))
        with open(tmp, "w") as f:
            f.write(body)
        os.rename(tmp, a.file)
        time.sleep(a.every / 1000)


def split(url):
    u = urllib.parse.urlsplit(url)
    return u.hostname, u.port or 80, u.path + ("?" + u.query if u.query else "")


def read_head(sock, buf):
    while b"\r\n\r\n" not in buf:
        piece = sock.recv(65536)
        if not piece:
            raise EOFError("closed before the head")
        buf += piece
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    fields = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        fields[k.strip().lower()] = v.strip()
    return status, fields, rest


def herd(a):
    host, port, path = split(a.url)
    ages, statuses, errors = [], {}, []
    lock = threading.Lock()

    def one():
        try:
            s = socket.create_connection((host, port), timeout=10)
            s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (path, host)).encode())
            data = b""
            while True:
                piece = s.recv(65536)
                if not piece:
                    break
                data += piece
            got = time.time() * 1000
            s.close()
            status, fields, body = read_head(s, data)
            stamp = None
            for line in body.decode("latin-1").split("\n"):
                if line.startswith("#STAMP:"):
                    stamp = int(line[7:])
            with lock:
                statuses[status] = statuses.get(status, 0) + 1
                if stamp is not None:
                    ages.append(got - stamp)
        except Exception as e:  # noqa: BLE001 - counted, reported
            with lock:
                errors.append(str(e))

    end = time.time() + a.seconds
    rounds = 0
    while time.time() < end:
        t = time.time()
        threads = [threading.Thread(target=one) for _ in range(a.viewers)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        rounds += 1
        time.sleep(max(0, a.every / 1000 - (time.time() - t)))
    ages.sort()
    print(json.dumps({"rounds": rounds, "responses": len(ages), "statuses": statuses, "errors": errors[:3],
                      "max_age_ms": round(ages[-1]) if ages else None,
                      "p50_age_ms": round(ages[len(ages) // 2]) if ages else None}))


def view(host, port, path, http10, t0):
    """One viewer: its outcome as a dict."""
    r = {"status": 0, "framing": None, "complete": False, "first_ms": None, "end_ms": None, "bytes": 0}
    body = bytearray()
    s = socket.create_connection((host, port), timeout=20)
    try:
        version = "HTTP/1.0" if http10 else "HTTP/1.1"
        s.sendall(("GET %s %s\r\nHost: %s\r\n\r\n" % (path, version, host)).encode())
        status, fields, buf = read_head(s, b"")
        r["status"] = status
        r["content_length"] = fields.get("content-length")
        r["x_cache"] = fields.get("x-cache")

        def more():
            nonlocal buf
            piece = s.recv(65536)
            if not piece:
                raise EOFError("closed")
            if r["first_ms"] is None:
                r["first_ms"] = (time.time() - t0) * 1000
            buf += piece

        if buf and r["first_ms"] is None:
            r["first_ms"] = (time.time() - t0) * 1000
        if fields.get("transfer-encoding", "").lower() == "chunked":
            r["framing"] = "chunked"
            while True:
                while b"\r\n" not in buf:
                    more()
                line, _, buf = buf.partition(b"\r\n")
                n = int(line.split(b";")[0], 16)
                while len(buf) < n + 2:
                    more()
                if buf[n:n + 2] != b"\r\n":
                    raise ValueError("bad chunk framing")
                body += buf[:n]
                buf = buf[n + 2:]
                if n == 0:
                    r["complete"] = True
                    break
        elif "content-length" in fields:
            r["framing"] = "length"
            n = int(fields["content-length"])
            while len(buf) < n:
                more()
            body += buf[:n]
            r["complete"] = True
        else:
            r["framing"] = "close"
            try:
                while True:
                    more()
            except EOFError:
                pass
            body += buf
            r["complete"] = True  # as far as a close-delimited body can tell
    except (EOFError, ValueError, OSError) as e:
        r["error"] = str(e)
        body += b""
    finally:
        s.close()
    r["end_ms"] = (time.time() - t0) * 1000
    r["bytes"] = len(body)
    r["body"] = bytes(body)
    return r


def viewers(a):
    # FILE is read once the viewers are done: it may still be written while they read.
    expect = a.expect
    time.sleep(a.delay / 1000)
    if a.rounds == 1:
        print(json.dumps(herd_once(a, expect)))
        return
    start, rounds = time.time(), []
    for i, at in enumerate(a.at[:a.rounds]):
        time.sleep(max(0, start + at / 1000 - time.time()))
        r = herd_once(a, expect)
        r["started_ms"] = round((time.time() - start) * 1000)
        rounds.append(r)
    print(json.dumps({"rounds": rounds}))


def herd_once(a, expect):
    """N viewers at once: a summary of their outcomes."""
    host, port, path = split(a.url)
    t0 = time.time()
    out = [None] * a.viewers

    def run(i):
        try:
            out[i] = view(host, port, path, a.http10, t0)
        except Exception as e:  # noqa: BLE001
            out[i] = {"status": 0, "error": str(e), "complete": False, "bytes": 0, "body": b""}

    threads = [threading.Thread(target=run, args=(i,)) for i in range(a.viewers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if expect is not None:
        with open(expect, "rb") as f:
            expect = f.read()
    for r in out:
        r["exact"] = expect is not None and r.pop("body") == expect
    firsts = sorted(r["first_ms"] for r in out if r.get("first_ms") is not None)
    ends = sorted(r["end_ms"] for r in out if r.get("end_ms") is not None)
    return {
        "viewers": a.viewers,
        "exact": sum(1 for r in out if r["exact"]),
        "complete": sum(1 for r in out if r["complete"]),
        "statuses": sorted({r["status"] for r in out}),
        "framing": sorted({str(r.get("framing")) for r in out}),
        "first_max_ms": round(firsts[-1]) if firsts else None,
        "first_p50_ms": round(firsts[len(firsts) // 2]) if firsts else None,
        "end_min_ms": round(ends[0]) if ends else None,
        "end_max_ms": round(ends[-1]) if ends else None,
        "bytes": sorted({r["bytes"] for r in out}),
        "content_length": sorted({str(r.get("content_length")) for r in out}),
        "x_cache": sorted({str(r.get("x_cache")) for r in out}),
        "errors": sorted({r["error"] for r in out if r.get("error")})[:3],
    }


def latency_part(url, n, start_at):
    """N viewers of a tick stream in this process, on non-blocking sockets and one
    epoll loop (asyncio's streams cost too much per read to be left out of a
    measure of milliseconds): for each "T <ns>" line sent after its viewer asked,
    receive time - send time, in ms."""
    import selectors
    host, port, path = split(url)
    time.sleep(max(0, start_at - time.time()))
    sel = selectors.DefaultSelector()
    viewers = {}
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=20)
        s.setblocking(False)
        viewers[s] = {"asked": time.time_ns(), "buf": b"", "head": False, "ok": None}
        s.send(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (path, host)).encode())
        sel.register(s, selectors.EVENT_READ)
    lat, outcomes, deadline = [], [], time.time() + 60
    while viewers and time.time() < deadline:
        for key, _ in sel.select(timeout=1):
            s, v = key.fileobj, viewers[key.fileobj]
            try:
                piece = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError as e:
                piece, v["ok"] = b"", str(e)
            got = time.time_ns()
            if piece:
                buf = v["buf"] + piece
                if not v["head"]:
                    if b"\r\n\r\n" not in buf:
                        v["buf"] = buf
                        continue
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    v["head"] = True
                    if not (b" 200 " in head.split(b"\r\n")[0] and b"chunked" in head.lower()):
                        v["ok"] = "not a chunked 200: %r" % head.split(b"\r\n")[0]
                        piece = b""
                # Every whole "T <ns>" line in what has arrived; a line cut by the
                # end of this read waits for the next.
                at = 0
                while True:
                    i = buf.find(b"T ", at)
                    j = buf.find(b"\n", i) if i >= 0 else -1
                    if j < 0:
                        break
                    sent = int(buf[i + 2:j])
                    if sent >= v["asked"]:
                        lat.append((got - sent) / 1e6)
                    at = j + 1
                v["buf"] = buf[at:] if i < 0 else buf[i:]
                if v["buf"].endswith(b"0\r\n\r\n"):
                    v["ok"] = v["ok"] or True
            if not piece:
                if v["ok"] is None:
                    v["ok"] = "closed before the last chunk"
                sel.unregister(s)
                s.close()
                outcomes.append(viewers.pop(s)["ok"])
    for s, v in viewers.items():
        outcomes.append(v["ok"] or "timed out")
        s.close()
    return lat, [o if o is True else str(o) for o in outcomes]


def latency(a):
    # Several client processes, so that one Python loop reading hundreds of
    # sockets in turn does not add its own delay to the measure.
    import multiprocessing
    start_at = time.time() + 0.5
    shares = [a.viewers // a.procs + (1 if i < a.viewers % a.procs else 0) for i in range(a.procs)]
    with multiprocessing.Pool(a.procs) as pool:
        parts = pool.starmap(latency_part, [(a.url, n, start_at) for n in shares])
    lat = [x for p in parts for x in p[0]]
    oks = [o for p in parts for o in p[1]]
    lat.sort()
    q = lambda p: round(lat[min(len(lat) - 1, int(p * len(lat)))], 2) if lat else None  # noqa: E731
    print(json.dumps({"viewers": a.viewers, "procs": a.procs, "ok": sum(1 for o in oks if o is True), "samples": len(lat),
                      "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": round(lat[-1], 2) if lat else None,
                      "errors": sorted({str(o) for o in oks if o is not True})[:3]}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("writer")
    w.add_argument("file")
    w.add_argument("--every", type=float, default=200)
    w.add_argument("--seconds", type=float, default=60)
    h = sub.add_parser("herd")
    h.add_argument("url")
    h.add_argument("--viewers", type=int, default=50)
    h.add_argument("--every", type=float, default=250)
    h.add_argument("--seconds", type=float, default=5)
    v = sub.add_parser("viewers")
    v.add_argument("url")
    v.add_argument("--viewers", type=int, default=20)
    v.add_argument("--http10", action="store_true")
    v.add_argument("--delay", type=float, default=0)
    v.add_argument("--expect")
    v.add_argument("--rounds", type=int, default=1)
    v.add_argument("--at", type=lambda x: [float(t) for t in x.split(",")], default=[0],
                   help="when each round starts, ms from the first: 0,250,800")
    lt = sub.add_parser("latency")
    lt.add_argument("url")
    lt.add_argument("--viewers", type=int, default=300)
    lt.add_argument("--procs", type=int, default=4)
    a = p.parse_args()
    if a.cmd == "writer":
        writer(a)
    elif a.cmd == "herd":
        herd(a)
    elif a.cmd == "viewers":
        viewers(a)
    else:
        latency(a)


if __name__ == "__main__":
    sys.exit(main())
