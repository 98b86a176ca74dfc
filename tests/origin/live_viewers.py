#!/usr/bin/env python3
"""Viewers of a live HLS stream, as players follow one: each reloads the media
playlist (every half target duration, as RFC 8216 6.3.4 allows when it has not
changed, and after a target duration when it has), starts three segments from the
live edge and fetches every new segment once, on one kept-alive HTTP/1.1 connection.

    live_viewers.py --url http://127.0.0.1:8080/live/stream.m3u8 --root DIR
                    [--viewers 200] [--duration 30] [--ramp 100] [--trace FILE]

--root is the directory the origin serves the stream from: each segment received is
compared byte for byte with the file there (when it is still there), and each
playlist received is compared with the newest one on disk at the moment it was
asked for (its last segment's number: how far behind the live edge it was).

Prints one JSON object: requests, errors and byte mismatches; each viewer's gaps (a
segment skipped between two it fetched); segment delay (from the segment's file
appearing at the origin, its mtime, to its last byte at the viewer; the three a
viewer starts with left out) p50/p99/max; segment time to first byte (from the
request's last byte sent to the response's status line) p50/p99/max, how many segment
requests were sent while the segment's first request still waited for its first
byte (the first one included: they joined that origin fetch, so their TTFB is the
origin's on any cache),
and the TTFB p99 of the others; rebuffers, as a
player would have them: it starts playing once the three segments it joins with
have arrived, and a rebuffer is a later segment whose last byte arrives after the
moment its playback should have started (playback then waits for it; their total
wait is stall_s); playlist lag in segments (newest on disk minus newest received)
max and its count above one. --trace writes one line per playlist and segment
request to FILE: when it was sent (Unix time), its path, its time to first byte and
to last byte (s). Every wait is bounded by --duration plus a 10 s timeout per
request.
"""

import argparse
import asyncio
import json
import os
import re
import time
from urllib.parse import urljoin, urlsplit

TIMEOUT_S = 10.0


class Failure(Exception):
    pass


class Conn:
    def __init__(self, host, port):
        self.host, self.port = host, port
        self.reader = self.writer = None
        self.ttfb = None
        self.sent = None

    async def get(self, path):
        """(status, body) of a GET; reconnects once if a kept-alive connection was
        closed before the request reached the server."""
        for attempt in (0, 1):
            fresh = self.writer is None
            if fresh:
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            try:
                self.writer.write(
                    ("GET %s HTTP/1.1\r\nHost: %s:%d\r\nUser-Agent: live-viewers\r\n\r\n" % (path, self.host, self.port)).encode()
                )
                await self.writer.drain()
                sent = self.sent = time.time()
                return await self._response(sent)
            except (ConnectionError, asyncio.IncompleteReadError) as e:
                self.close()
                if fresh or attempt:
                    raise Failure("%s: %s" % (path, e or type(e).__name__))

    async def _response(self, sent):
        line = await self.reader.readline()
        if not line:
            raise ConnectionResetError("closed before the status line")
        self.ttfb = time.time() - sent
        status = int(line.split()[1])
        length, chunked, close = None, False, False
        while True:
            h = await self.reader.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            name, _, value = h.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value:
                chunked = True
            elif name == "connection" and "close" in value:
                close = True
        if chunked:
            parts = []
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readline()
                    break
                parts.append(await self.reader.readexactly(size))
                await self.reader.readexactly(2)
            body = b"".join(parts)
        elif length is not None:
            body = await self.reader.readexactly(length)
        else:
            body = await self.reader.read()
            close = True
        if close:
            self.close()
        return status, body

    def close(self):
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def parse_playlist(text):
    """(target duration s, [(sequence number, uri, duration s)])"""
    target, seq, out, dur = 2.0, 0, [], None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#EXT-X-TARGETDURATION:"):
            target = float(line.split(":", 1)[1])
        elif line.startswith("#EXT-X-MEDIA-SEQUENCE:"):
            seq = int(line.split(":", 1)[1])
        elif line.startswith("#EXTINF:"):
            dur = float(line.split(":", 1)[1].split(",")[0])
        elif line and not line.startswith("#"):
            out.append((seq, line, target if dur is None else dur))
            seq += 1
            dur = None
    return target, out


def newest_on_disk(root, name):
    try:
        with open(os.path.join(root, name), errors="replace") as f:
            segs = parse_playlist(f.read())[1]
        return segs[-1][0] if segs else None
    except OSError:
        return None


class Totals:
    def __init__(self):
        self.playlist_requests = self.segment_requests = self.errors = 0
        self.mismatches = self.verified = self.gaps = self.segment_bytes = 0
        self.delays = []
        self.ttfbs = []
        self.rebuffers = 0
        self.stall_s = 0.0
        self.lags = []
        self.first_error = None
        self.viewers_with_segments = 0
        self.trace = []

    def error(self, what):
        self.errors += 1
        if self.first_error is None:
            self.first_error = what


async def viewer(url, root, end, totals, start_at):
    await asyncio.sleep(max(0.0, start_at - time.time()))
    u = urlsplit(url)
    conn = Conn(u.hostname, u.port or 80)
    playlist_name = os.path.basename(u.path)
    last = None
    got_any = False
    due = None  # when the next segment's playback should start
    try:
        while time.time() < end:
            on_disk = newest_on_disk(root, playlist_name)
            asked = time.time()
            try:
                status, body = await asyncio.wait_for(conn.get(u.path), TIMEOUT_S)
            except (Failure, OSError, asyncio.TimeoutError, ValueError) as e:
                conn.close()
                totals.error("playlist: %r" % (e,))
                await asyncio.sleep(0.5)
                continue
            totals.playlist_requests += 1
            totals.trace.append((conn.sent, u.path, conn.ttfb, time.time() - conn.sent))
            if status != 200:
                totals.error("playlist: status %d" % status)
                await asyncio.sleep(0.5)
                continue
            target, segs = parse_playlist(body.decode("utf-8", "replace"))
            if segs and on_disk is not None:
                totals.lags.append(on_disk - segs[-1][0])
            new = [s for s in segs if last is None or s[0] > last]
            # The three a viewer starts with were published before it came:
            # their delay says nothing of the edge.
            joining = last is None
            if joining:
                new = new[-3:]
            elif new and new[0][0] > last + 1:
                totals.gaps += new[0][0] - last - 1
            for i, (seq, uri, dur) in enumerate(new):
                if time.time() >= end:
                    break
                path = urlsplit(urljoin(url, uri)).path
                try:
                    status, data = await asyncio.wait_for(conn.get(path), TIMEOUT_S)
                except (Failure, OSError, asyncio.TimeoutError, ValueError) as e:
                    conn.close()
                    totals.error("%s: %r" % (path, e))
                    break
                done = time.time()
                totals.segment_requests += 1
                totals.ttfbs.append(conn.ttfb)
                totals.trace.append((conn.sent, path, conn.ttfb, done - conn.sent))
                if status != 200:
                    totals.error("%s: status %d" % (path, status))
                    break
                totals.segment_bytes += len(data)
                if joining:
                    if i == len(new) - 1:  # the player starts with all three
                        due = done + sum(d for _, _, d in new)
                elif due is None:
                    due = done + dur
                elif done > due:
                    totals.rebuffers += 1
                    totals.stall_s += done - due
                    due = done + dur
                else:
                    due += dur
                file = os.path.join(root, os.path.basename(path))
                try:
                    with open(file, "rb") as f:
                        same = f.read() == data
                    mtime = os.stat(file).st_mtime
                    totals.verified += 1
                    if not same:
                        totals.mismatches += 1
                        totals.error("%s: bytes differ from the origin's file" % path)
                    if not joining:
                        totals.delays.append(done - mtime)
                except OSError:
                    pass
                last = seq
                got_any = True
            changed = bool(new)
            wait = target if changed else target / 2
            await asyncio.sleep(max(0.0, min(asked + wait, end) - time.time()))
    finally:
        conn.close()
        totals.viewers_with_segments += got_any


def pct(values, p):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(p / 100 * len(v)))]


async def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--viewers", type=int, default=200)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--ramp", type=float, default=100.0, help="viewers started per second")
    ap.add_argument("--trace", help="write each request's times to this file")
    a = ap.parse_args()
    if not 1 <= a.viewers <= 5000 or not 0 < a.duration <= 600:
        raise SystemExit("--viewers 1..5000, --duration up to 600 s")
    totals = Totals()
    t0 = time.time()
    end = t0 + a.duration
    tasks = [viewer(a.url, a.root, end, totals, t0 + i / a.ramp) for i in range(a.viewers)]
    await asyncio.wait_for(asyncio.gather(*tasks), a.duration + TIMEOUT_S + 5)
    if a.trace:
        with open(a.trace, "w") as f:
            for sent, path, ttfb, total in sorted(totals.trace):
                f.write("%.6f %s %.6f %.6f\n" % (sent, path, ttfb, total))

    def r(x):
        return None if x is None else round(x, 3)

    def r4(x):  # times to first byte: to 0.1 ms
        return None if x is None else round(x, 4)

    # Segment requests sent while the segment's first request still waited for
    # its first byte joined that origin fetch: their TTFB is the origin's, on
    # any cache. The rest could be answered from what the edge already had.
    playlist_path = urlsplit(a.url).path
    first = {}
    for sent, path, ttfb, _ in sorted(totals.trace):
        if path != playlist_path and path not in first:
            first[path] = sent + ttfb
    joined, after = 0, []
    for sent, path, ttfb, _ in totals.trace:
        if path == playlist_path:
            continue
        if sent < first[path]:
            joined += 1
        else:
            after.append(ttfb)

    print(json.dumps({
        "viewers": a.viewers,
        "viewers_with_segments": totals.viewers_with_segments,
        "duration_s": a.duration,
        "playlist_requests": totals.playlist_requests,
        "segment_requests": totals.segment_requests,
        "segment_bytes": totals.segment_bytes,
        "verified": totals.verified,
        "mismatches": totals.mismatches,
        "gaps": totals.gaps,
        "errors": totals.errors,
        "first_error": totals.first_error,
        "segment_ttfb_s": {"p50": r4(pct(totals.ttfbs, 50)), "p99": r4(pct(totals.ttfbs, 99)), "max": r4(max(totals.ttfbs, default=None))},
        "segment_requests_joining_the_first_fetch": joined,
        "segment_ttfb_after_the_first_byte_s": {"p99": r4(pct(after, 99))},
        "rebuffers": totals.rebuffers,
        "stall_s": round(totals.stall_s, 3),
        "segment_delay_s": {"p50": r(pct(totals.delays, 50)), "p99": r(pct(totals.delays, 99)), "max": r(max(totals.delays, default=None))},
        "playlist_lag_segments": {"max": max(totals.lags, default=None), "above_1": sum(1 for x in totals.lags if x > 1)},
    }))


if __name__ == "__main__":
    asyncio.run(main())
