#!/usr/bin/env python3
"""An LL-HLS origin with blocking playlist reload, over a real ffmpeg HLS encode.

ffmpeg writes a live HLS stream (a playlist and its segments) into --dir; this
origin serves that directory over HTTP/1.1 (keep-alive) and adds what ffmpeg's HLS
muxer does not do: blocking playlist reload (RFC 8216bis section 6.2.5.2).

  GET NAME.m3u8                    the playlist as it is now, with
                                   #EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES added,
                                   Cache-Control: max-age=1
  GET NAME.m3u8?_HLS_msn=N[&_HLS_part=M][&_HLS_skip=YES|v2]
                                   held until the playlist holds segment N (media
                                   sequence + segment count > N), then answered with
                                   Cache-Control: max-age=BLOCKING_MAX_AGE; N more than
                                   two past the last segment: 400 at once (section
                                   6.2.5.2); not there within three target durations:
                                   503. ffmpeg makes no partial segments, so
                                   _HLS_part=M waits for the whole segment N (which
                                   holds every part of it); _HLS_skip is accepted and
                                   the whole playlist sent (a server may always do so).
  GET SEGMENT                      the file, Cache-Control: max-age=3600
  anything else                    404

Every request is logged once answered, one tab-separated line in the rig's format
(tests/origin/lib.sh), the query kept:
    msec  request-line  status  body-bytes  range-or-"-"  seconds-held  connection
and the first time each segment is seen in the playlist is logged to --published:
    msn  playlist-mtime(epoch seconds, the moment ffmpeg renamed it into place)
Prints "listening" once bound.
"""

import argparse
import os
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BLOCKING_MAX_AGE = 4
POLL = 0.005


class Stream:
    """The playlist as ffmpeg last wrote it, polled every POLL seconds."""

    def __init__(self, path, published_log):
        self.path = path
        self.published = open(published_log, "a", buffering=1)
        self.cond = threading.Condition()
        self.text = b""
        self.first = 0
        self.count = 0
        self.target = 1
        self.seen = -1
        threading.Thread(target=self.poll, daemon=True).start()

    def poll(self):
        mtime = None
        while True:
            try:
                st = os.stat(self.path)
                if st.st_mtime_ns != mtime:
                    mtime = st.st_mtime_ns
                    with open(self.path, "rb") as f:
                        self.update(f.read(), mtime / 1e9)
            except FileNotFoundError:
                pass
            time.sleep(POLL)

    def update(self, text, mtime):
        first, count, target = 0, 0, 1
        for line in text.decode("utf-8", "replace").splitlines():
            if line.startswith("#EXT-X-MEDIA-SEQUENCE:"):
                first = int(line.split(":", 1)[1])
            elif line.startswith("#EXT-X-TARGETDURATION:"):
                target = int(line.split(":", 1)[1])
            elif line and not line.startswith("#"):
                count += 1
        if count == 0:
            return
        with self.cond:
            self.text, self.first, self.count, self.target = text, first, count, target
            for msn in range(max(self.seen + 1, first), first + count):
                self.published.write(f"{msn}\t{mtime:.6f}\n")
            self.seen = max(self.seen, first + count - 1)
            self.cond.notify_all()

    def last(self):
        return self.first + self.count - 1

    def wait_for(self, msn):
        """The playlist once it holds segment `msn`: (status, body)."""
        with self.cond:
            if self.count and msn > self.last() + 2:
                return 400, b"_HLS_msn is more than two segments ahead\n"
            deadline = time.monotonic() + 3 * self.target
            while not self.count or self.last() < msn:
                left = deadline - time.monotonic()
                if left <= 0:
                    return 503, b"the segment did not appear within three target durations\n"
                self.cond.wait(left)
            return 200, self.text


def with_server_control(text):
    out = []
    for line in text.split(b"\n"):
        out.append(line)
        if line.startswith(b"#EXT-X-TARGETDURATION:"):
            out.append(b"#EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES")
    return b"\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--playlist", default="stream.m3u8")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--published", required=True)
    args = ap.parse_args()
    stream = Stream(os.path.join(args.dir, args.playlist), args.published)
    log = open(args.log, "a", buffering=1)
    log_lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def answer(self, status, body, ctype, cache, started):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if cache:
                self.send_header("Cache-Control", cache)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self.wfile.flush()
            line = "%.3f\t%s\t%d\t%d\t%s\t%.3f\t%s:%d\n" % (
                time.time(), self.requestline, status, len(body) if self.command != "HEAD" else 0,
                self.headers.get("Range", "-"), time.monotonic() - started, *self.client_address[:2])
            with log_lock:
                log.write(line)

        def do_GET(self):
            started = time.monotonic()
            url = urllib.parse.urlsplit(self.path)
            name = urllib.parse.unquote(url.path).lstrip("/")
            q = urllib.parse.parse_qs(url.query)
            if name == args.playlist:
                mpegurl = "application/vnd.apple.mpegurl"
                if "_HLS_msn" in q:
                    try:
                        msn = int(q["_HLS_msn"][0])
                        if "_HLS_part" in q:
                            int(q["_HLS_part"][0])
                    except ValueError:
                        return self.answer(400, b"bad _HLS_msn or _HLS_part\n", "text/plain", None, started)
                    status, body = stream.wait_for(msn)
                    if status != 200:
                        return self.answer(status, body, "text/plain", "no-store", started)
                    cache = f"max-age={BLOCKING_MAX_AGE}"
                elif "_HLS_part" in q:
                    return self.answer(400, b"_HLS_part without _HLS_msn\n", "text/plain", None, started)
                else:
                    with stream.cond:
                        body = stream.text
                    if not body:
                        return self.answer(404, b"no playlist yet\n", "text/plain", None, started)
                    cache = "max-age=1"
                return self.answer(200, with_server_control(body), mpegurl, cache, started)
            if "/" not in name and name.endswith(".ts"):
                try:
                    with open(os.path.join(args.dir, name), "rb") as f:
                        body = f.read()
                except FileNotFoundError:
                    return self.answer(404, b"not found\n", "text/plain", "max-age=1", started)
                return self.answer(200, body, "video/mp2t", "max-age=3600", started)
            return self.answer(404, b"not found\n", "text/plain", None, started)

        do_HEAD = do_GET

    server = ThreadingHTTPServer(("0.0.0.0", args.port), Handler)
    server.daemon_threads = True
    print("listening", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
