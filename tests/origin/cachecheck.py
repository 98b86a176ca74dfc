#!/usr/bin/env python3
"""Clients (and one origin) for the pull-through cache's tests (tests/origin/cache-tests),
with the standard library only.

  cachecheck.py crowd URL PATH FILE [--viewers N] [--spread S] [--rate BPS]
                      [--detail OUT]
      A flash crowd: N (default 200) viewers, each on a connection of its own
      (opened first), ask URL+PATH (a plain http:// URL), their requests sent over
      S (default 0.5) seconds. Each body is compared, as it arrives, with FILE;
      with --rate, each viewer reads at most BPS bytes a second, as a player does,
      through a 256 KiB receive buffer. Prints one JSON
      object: viewers, ok (200 and exactly FILE's bytes), bad (the first few
      failures described), spread_s (first to last request sent), ttfb_p50_ms,
      ttfb_p99_ms, ttfb_max_ms (request sent to the response's first byte), and
      seconds (the whole crowd). --detail: one line per viewer in OUT, `viewer
      sent_ms ttfb_ms` (sent_ms from the planned start of the crowd).

  cachecheck.py multipart URL PATH FILE RANGES [--cafile PEM]
      GETs URL+PATH (http:// or https://, its certificate checked against PEM) with `Range: bytes=RANGES` (several ranges): expects a 206
      multipart/byteranges answer whose every part has the Content-Range asked for
      and exactly those bytes of FILE. Prints `parts=N` and exits 0, or says what
      differs and exits 1.

  cachecheck.py slow URL PATH OUT [--rate BPS] [--rcvbuf BYTES] [--range A-B]
                     [--mark BYTES MARKFILE] [--timeout S]
      One slow viewer: reads the answer at about BPS bytes per second (default
      1 MB/s) through a small receive buffer (default 64 KiB), writing the body to
      OUT as it arrives; creates MARKFILE once BYTES of body have arrived (the
      test's cue to act mid-transfer). Ends at the body's end, the connection's
      close, or after S seconds (default 60). Prints one JSON object: status,
      content_length, body_bytes, complete (the whole Content-Length arrived).

  cachecheck.py fields-origin --root DIR --log LOG [--port N]
      An origin like the rig's lying one (tests/origin/liar.py: nginx's ETag and
      Last-Modified, single byte ranges, its access-log format, appended to LOG),
      always honest, that adds fields chosen by the first path segment, which is
      then taken off the path: /cookie/a.bin is a.bin with `Set-Cookie`,
      /nostore/a.bin with `Cache-Control: no-store`, /private/a.bin with
      `Cache-Control: private`. Prints `listening PORT` once it listens.
"""

import argparse
import http.client
import json
import os
import re
import socket
import struct
import sys
import threading
import time
import urllib.parse


# Linux's SO_TIMESTAMPNS (and SCM_TIMESTAMPNS, the same number); Python names it
# only from 3.13.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


def split(url):
    u = urllib.parse.urlsplit(url)
    return u.hostname, u.port or 80, u.path.rstrip("/")


def read_head(sock, buf):
    """Reads from sock until the end of a response head; returns (status,
    fields, the body bytes already read), or raises OSError."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise OSError("closed before the end of the head (%d bytes)" % len(buf))
        buf += chunk
    head, rest = bytes(buf).split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    return status, fields, rest


def percentile(values, p):
    v = sorted(values)
    if not v:
        return None
    k = min(len(v) - 1, max(0, int(round(p / 100.0 * len(v) + 0.5)) - 1))
    return v[k]


def cmd_crowd(a):
    host, port, base = split(a.url)
    want = open(a.file, "rb").read()
    request = ("GET %s%s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (base, a.path, host)).encode()
    n = a.viewers
    ttfb = [None] * n
    app_ttfb = [None] * n
    sent_at = [None] * n
    bad = []
    lock = threading.Lock()
    ready = threading.Barrier(n + 1)
    go = threading.Event()
    start = [0.0]

    def viewer(i):
        why = None
        s = None
        try:
            # Connected before the crowd starts: the requests then leave on time.
            s = socket.socket()
            if a.rate:
                # A paced player's window: the server cannot run far ahead of it.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)
            s.settimeout(60)
            s.connect((host, port))
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError as e:
            why = "viewer %d: connect: %s" % (i, e)
        ready.wait()
        go.wait()
        delay = start[0] + a.spread * i / n - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        try:
            if why:
                raise OSError(why)
            with s:
                t = time.time()
                s.sendall(request)
                sent_at[i] = t
                # One byte first: the kernel's receive time of the skb holding it.
                first, anc, _, _ = s.recvmsg(1, socket.CMSG_SPACE(16))
                seen = time.time()
                if not first:
                    raise OSError("closed before any byte")
                app_ttfb[i] = seen - t
                ttfb[i] = seen - t
                for level, kind, data in anc:
                    if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
                        sec, nsec = struct.unpack("qq", data[:16])
                        ttfb[i] = sec + nsec / 1e9 - t
                status, fields, body = read_head(s, bytearray(first))
                if status != 200:
                    raise OSError("status %d" % status)
                length = int(fields.get("content-length", -1))
                if length != len(want):
                    raise OSError("Content-Length %d, %d expected" % (length, len(want)))
                at = len(body)
                if body != want[:at]:
                    raise OSError("wrong bytes in the first %d" % at)
                buf = bytearray(256 * 1024)
                while at < length:
                    k = s.recv_into(buf)
                    if k == 0:
                        raise OSError("cut after %d of %d body bytes" % (at, length))
                    if buf[:k] != want[at : at + k]:
                        raise OSError("wrong bytes at %d" % at)
                    at += k
                    if a.rate:
                        ahead = t + at / a.rate - time.time()
                        if ahead > 0:
                            time.sleep(ahead)
                if s.recv(1):
                    raise OSError("bytes past the body")
        except (OSError, ValueError) as e:
            why = str(e) if why else "viewer %d: %s" % (i, e)
        if why:
            with lock:
                bad.append(why)

    threads = [threading.Thread(target=viewer, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    ready.wait()
    start[0] = time.monotonic() + 0.05
    t0 = time.monotonic()
    go.set()
    for t in threads:
        t.join(120)
    sent = [x for x in sent_at if x is not None]
    first_sent = min(sent) if sent else 0
    if a.detail:
        with open(a.detail, "w") as f:
            for i in range(n):
                if sent_at[i] is not None:
                    f.write("%d %.1f %s %s\n" % (i, (sent_at[i] - first_sent) * 1000,
                                                  "-" if ttfb[i] is None else "%.1f" % (ttfb[i] * 1000),
                                                  "-" if app_ttfb[i] is None else "%.1f" % (app_ttfb[i] * 1000)))
    done = [x for x in ttfb if x is not None]
    app = [x for x in app_ttfb if x is not None]
    ms = lambda x: None if x is None else round(x * 1000, 1)
    print(json.dumps({
        "viewers": n,
        "ok": n - len(bad),
        "bad": sorted(bad)[:5],
        "spread_s": round(max(sent) - min(sent), 3) if sent else None,
        "ttfb_p50_ms": ms(percentile(done, 50)),
        "ttfb_p99_ms": ms(percentile(done, 99)),
        "ttfb_max_ms": ms(max(done) if done else None),
        "app_ttfb_p50_ms": ms(percentile(app, 50)),
        "app_ttfb_p99_ms": ms(percentile(app, 99)),
        "seconds": round(time.monotonic() - t0, 3),
    }))


def cmd_multipart(a):
    host, port, base = split(a.url)
    want = open(a.file, "rb").read()
    size = len(want)
    if a.url.startswith("https:"):
        import ssl

        ctx = ssl.create_default_context(cafile=a.cafile or None)
        conn = http.client.HTTPSConnection(host, port, timeout=60, context=ctx)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("GET", base + a.path, headers={"Range": "bytes=" + a.ranges})
    r = conn.getresponse()
    body = r.read()
    ctype = r.getheader("Content-Type", "")
    m = re.match(r'multipart/byteranges;\s*boundary="?([^";]+)"?', ctype)
    if r.status != 206 or not m:
        sys.exit("multipart: status %d, Content-Type %r" % (r.status, ctype))
    expected = []
    for spec in a.ranges.split(","):
        first, _, last = spec.strip().partition("-")
        if first == "":
            first, last = max(0, size - int(last)), size - 1
        else:
            first, last = int(first), min(int(last), size - 1) if last else size - 1
        expected.append((first, last))
    delim = b"\r\n--" + m.group(1).encode()
    # CRLF, then each part after its delimiter, then the delimiter and "--" (RFC
    # 2046: the CRLF before a delimiter is part of it, so the preamble is empty).
    pieces = body.split(delim)
    if pieces[0] != b"" or not pieces[-1].startswith(b"--"):
        sys.exit("multipart: malformed body (%d bytes)" % len(body))
    parts = [p[2:] if p.startswith(b"\r\n") else p for p in pieces[1:-1]]
    if len(parts) != len(expected):
        sys.exit("multipart: %d parts, %d asked for" % (len(parts), len(expected)))
    for i, (part, (first, last)) in enumerate(zip(parts, expected)):
        head, _, data = part.partition(b"\r\n\r\n")
        cr = re.search(rb"Content-Range:\s*bytes (\d+)-(\d+)/(\d+)", head, re.I)
        if not cr or (int(cr.group(1)), int(cr.group(2)), int(cr.group(3))) != (first, last, size):
            sys.exit("multipart: part %d has %r, bytes %d-%d/%d expected" % (i, cr and cr.group(0), first, last, size))
        if data != want[first : last + 1]:
            sys.exit("multipart: part %d (bytes %d-%d): wrong bytes" % (i, first, last))
    print("parts=%d" % len(parts))


def cmd_slow(a):
    host, port, base = split(a.url)
    out = {"status": None, "content_length": None, "body_bytes": 0, "complete": False}
    deadline = time.monotonic() + a.timeout
    marked = a.mark is None
    try:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, a.rcvbuf)
        s.settimeout(max(1.0, a.timeout))
        s.connect((host, port))
        rng = "Range: bytes=%s\r\n" % a.range if a.range else ""
        s.sendall(("GET %s%s HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n" % (base, a.path, host, rng)).encode())
        status, fields, body = read_head(s, bytearray())
        out["status"] = status
        length = int(fields.get("content-length", -1))
        out["content_length"] = length
        step = 16 * 1024
        pause = step / float(a.rate)
        with open(a.out, "wb") as f:
            f.write(body)
            got = len(body)
            while got < length and time.monotonic() < deadline:
                if not marked and got >= a.mark[0]:
                    open(a.mark[1], "w").close()
                    marked = True
                chunk = s.recv(step)
                if not chunk:
                    break
                f.write(chunk)
                f.flush()
                got += len(chunk)
                time.sleep(pause)
            out["body_bytes"] = got
            out["complete"] = got == length
        s.close()
    except (OSError, ValueError) as e:
        out["error"] = str(e)
    if not marked:
        open(a.mark[1], "w").close()
    print(json.dumps(out))


FIELDS = {
    "cookie": [("Set-Cookie", "session=1; Path=/")],
    "nostore": [("Cache-Control", "no-store")],
    "private": [("Cache-Control", "private, max-age=60")],
}


def cmd_fields_origin(a):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import liar  # the rig's origin that lies on demand; here, always honest

    liar.args = argparse.Namespace(root=a.root, log=a.log, mode_file=os.devnull)

    class Handler(liar.Handler):
        extra = ()

        def serve(self, head_only):
            parts = self.path.split("/", 2)
            if len(parts) == 3 and parts[1] in FIELDS:
                self.extra = FIELDS[parts[1]]
                self.path = "/" + parts[2]
            super().serve(head_only)

        def end_headers(self):
            for name, value in self.extra:
                self.send_header(name, value)
            super().end_headers()

    srv = liar.Server(("127.0.0.1", a.port), Handler)
    print("listening %d" % srv.server_address[1], flush=True)
    srv.serve_forever()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("crowd")
    c.add_argument("url")
    c.add_argument("path")
    c.add_argument("file")
    c.add_argument("--viewers", type=int, default=200)
    c.add_argument("--spread", type=float, default=0.5)
    c.add_argument("--rate", type=float, default=0, help="each viewer reads at most this many bytes/s (0: no limit)")
    c.add_argument("--detail", default="", help="write `viewer sent_ms ttfb_ms` lines here")
    m = sub.add_parser("multipart")
    m.add_argument("url")
    m.add_argument("path")
    m.add_argument("file")
    m.add_argument("ranges")
    m.add_argument("--cafile", default="", help="the CA of an https:// URL's certificate")
    s = sub.add_parser("slow")
    s.add_argument("url")
    s.add_argument("path")
    s.add_argument("out")
    s.add_argument("--rate", type=int, default=1000000)
    s.add_argument("--rcvbuf", type=int, default=65536)
    s.add_argument("--range", default="")
    s.add_argument("--mark", nargs=2, metavar=("BYTES", "MARKFILE"), default=None)
    s.add_argument("--timeout", type=float, default=60)
    f = sub.add_parser("fields-origin")
    f.add_argument("--root", required=True)
    f.add_argument("--log", required=True)
    f.add_argument("--port", type=int, default=0)
    a = p.parse_args()
    if a.cmd == "slow" and a.mark:
        a.mark = (int(a.mark[0]), a.mark[1])
    {"crowd": cmd_crowd, "multipart": cmd_multipart, "slow": cmd_slow, "fields-origin": cmd_fields_origin}[a.cmd](a)


if __name__ == "__main__":
    main()
