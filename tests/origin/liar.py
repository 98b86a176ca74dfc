#!/usr/bin/env python3
"""A lying origin: serves a catalogue over HTTP/1.1 the way nginx does (single byte
ranges, ETag and Last-Modified computed as nginx computes them), except that it can
break the protocol in the ways nginx never will, to test what a cache does with an
origin that does.

Modes (the first path segment selects one for that request, `/short/title1.bin`;
otherwise the mode written in --mode-file applies, `honest` when it is empty or
missing):

  honest  the truth.
  short   Content-Length says 4096 bytes more than the body sent; the connection
          is then closed (a body cut by a crash or a proxy).
  long    Content-Length says 4096 bytes fewer than the body sent (half the body
          when it is smaller); the whole body follows it on the connection, which
          is then closed (bytes past the framing).
  range   a 206 whose Content-Range names the asked length at an offset 4096
          bytes further than asked (the body is the asked range): a cache that
          trusts Content-Range stores bytes under the wrong offset. Requests
          without Range are answered honestly.
  head    a 100 KiB response head (one header field of 102,400 bytes of value):
          more than any sane head limit.

Live modes, an origin sending what it is still making (only by path prefix):

  chunked   a 200 of the whole file, whatever the Range, with Transfer-Encoding:
            chunked and no length, in CHUNKS chunks CHUNK_MS ms apart (a segment
            the encoder is still writing).
  chunkcut  the same, but after half the chunks it sends half of the next one
            and closes the connection: a body cut mid-chunk.
  tick      a 200, chunked, of TICKS chunks TICK_MS ms apart, each a line
            "T <send time in ns since the epoch>" padded to TICK_BYTES bytes:
            the time each chunk left the origin, for a viewer to measure how long
            it took to reach it. The file named need not exist.
  grow      a low-latency CMAF origin over a directory an encoder writes in place
            (ffmpeg's DASH muxer with -streaming 1 appends each fragment to the
            segment's file as it is made): a segment `NAME-<number>.m4s` is
            complete once the next number's file exists. A complete file is served
            as `honest` does; a segment still being written is sent as a 200,
            chunked, without a length, each append forwarded within GROW_POLL_MS,
            until the next segment appears (or nothing was appended for
            GROW_IDLE_S); one that does not exist yet is waited for up to
            GROW_WAIT_S (a low-latency player asks for a segment when its first
            fragment is due), then 404. Every answer carries Cache-Control:
            max-age=1 for a manifest (.mpd, .m3u8), max-age=3600 for the rest.
            `grow/.../time` answers the origin's clock (xs:dateTime, no-store),
            the time source a DASH manifest names for its players.

Each response is logged in the rig's access log format, one line per request, tab
separated: msec, request line, status, body bytes sent, Range (or -), request time
in seconds, connection (`L` and a number). Standard library only.
"""

import argparse
import email.utils
import os
import re
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODES = ("honest", "short", "long", "range", "head")
LIVE_MODES = ("chunked", "chunkcut", "tick", "grow")
GROW_POLL_MS, GROW_IDLE_S, GROW_WAIT_S = 5, 3.0, 4.0
SEGMENT = re.compile(r"(.*-)(\d+)(\.m4s)$")
CHUNKS, CHUNK_MS = 10, 100
TICKS, TICK_MS, TICK_BYTES = 40, 50, 1000
SHIFT = 4096
HEAD_PAD = 100 * 1024

args = None
log_lock = threading.Lock()
conn_ids = iter(range(1, 1 << 62))
conn_lock = threading.Lock()


def log(line):
    with log_lock, open(args.log, "a") as f:
        f.write(line + "\n")


def current_mode():
    try:
        with open(args.mode_file) as f:
            m = f.read().strip()
    except OSError:
        return "honest"
    return m if m in MODES else "honest"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "liar"

    def setup(self):
        super().setup()
        with conn_lock:
            self.conn_id = "L%d" % next(conn_ids)

    def log_message(self, *a):  # the access log is ours; no stderr line per request
        pass

    def finish_log(self, status, sent, t0):
        rng = self.headers.get("Range") or "-"
        log("%.3f\t%s\t%d\t%d\t%s\t%.3f\t%s" % (time.time(), self.requestline, status, sent, rng,
                                               time.time() - t0, self.conn_id))

    def do_HEAD(self):
        self.serve(head_only=True)

    def do_GET(self):
        self.serve(head_only=False)

    def send(self, data):
        try:
            self.wfile.write(data)
            return len(data)
        except OSError:
            self.close_connection = True
            return 0

    def serve(self, head_only):
        t0 = time.time()
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        parts = path.lstrip("/").split("/", 1)
        mode = current_mode()
        if parts[0] in MODES + LIVE_MODES and len(parts) == 2:
            mode, path = parts[0], "/" + parts[1]
        rel = os.path.normpath(path.lstrip("/"))
        full = os.path.join(args.root, rel)
        if mode == "grow" and os.path.basename(rel) == "time":
            self.serve_time(head_only, t0)
            return
        if mode == "grow" and not head_only and not rel.startswith(".."):
            if self.serve_growing(full, t0):
                return
        elif mode in LIVE_MODES and not head_only and (mode == "tick" or os.path.isfile(full)):
            self.serve_live(mode, full, t0)
            return
        if rel.startswith("..") or not os.path.isfile(full):
            body = b"not found\n"
            self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.finish_log(404, self.send(b"" if head_only else body), t0)
            return
        st = os.stat(full)
        size = st.st_size
        first, last, status = 0, size - 1, 200
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", (self.headers.get("Range") or "").strip())
        if m and (m.group(1) or m.group(2)) and size > 0:
            if m.group(1):
                first = int(m.group(1))
                last = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            else:
                first, last = max(0, size - int(m.group(2))), size - 1
            if first > last or first >= size:
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % size)
                self.send_header("Content-Length", "0")
                self.end_headers()
                self.finish_log(416, 0, t0)
                return
            status = 206
        n = last - first + 1
        declared = n
        if mode == "short":
            declared = n + SHIFT
        elif mode == "long":
            declared = n - SHIFT if n > 2 * SHIFT else n // 2
        self.send_response(status)
        self.send_header("Content-Type", grow_content_type(full) if mode == "grow" else "application/octet-stream")
        self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
        self.send_header("ETag", '"%x-%x"' % (int(st.st_mtime), size))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            a, b = (first + SHIFT, last + SHIFT) if mode == "range" else (first, last)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, size))
        self.send_header("Content-Length", str(declared))
        if mode == "grow":
            self.send_header("Cache-Control", grow_cache_control(full))
        if mode == "head":
            self.send_header("X-Oversized", "a" * HEAD_PAD)
        if mode in ("short", "long"):
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        sent = 0
        if not head_only:
            with open(full, "rb") as f:
                f.seek(first)
                left = n
                while left > 0:
                    chunk = f.read(min(left, 256 * 1024))
                    if not chunk:
                        break
                    k = self.send(chunk)
                    sent += k
                    if k < len(chunk):
                        break
                    left -= len(chunk)
        self.finish_log(status, sent, t0)


    def serve_live(self, mode, full, t0):
        self.send_response(200)
        self.send_header("Content-Type", "video/mp2t")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "max-age=3600")
        self.end_headers()
        try:
            self.wfile.flush()
        except OSError:
            self.close_connection = True
            return
        sent = 0
        if mode == "tick":
            pieces = [None] * TICKS
            gap = TICK_MS
        else:
            with open(full, "rb") as f:
                data = f.read()
            step = -(-len(data) // CHUNKS)
            pieces = [data[i:i + step] for i in range(0, len(data), step)]
            gap = CHUNK_MS
        for i, piece in enumerate(pieces):
            if i > 0:
                time.sleep(gap / 1000)
            if piece is None:
                line = b"T %d\n" % time.time_ns()
                piece = line + b"." * (TICK_BYTES - len(line) - 1) + b"\n"
            frame = b"%x\r\n" % len(piece) + piece + b"\r\n"
            if mode == "chunkcut" and i == len(pieces) // 2:
                self.send(frame[:len(frame) // 2])
                sent += len(piece) // 2
                self.close_connection = True
                try:
                    self.wfile.flush()
                    self.connection.shutdown(2)
                except OSError:
                    pass
                self.finish_log(200, sent, t0)
                return
            if self.send(frame) < len(frame):
                self.finish_log(200, sent, t0)
                return
            try:
                self.wfile.flush()
            except OSError:
                self.close_connection = True
                return
            sent += len(piece)
        self.send(b"0\r\n\r\n")
        self.finish_log(200, sent, t0)


    def serve_time(self, head_only, t0):
        """The origin's clock, as a DASH player synchronises with it (xs:dateTime)."""
        now = time.time()
        body = (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + ".%03dZ" % (int(now * 1000) % 1000)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.finish_log(200, self.send(b"" if head_only else body), t0)

    def serve_growing(self, full, t0):
        """A segment being written: followed, chunked. False: not a segment, or
        complete, for the caller to serve as a file."""
        m = SEGMENT.match(full)
        if not m:
            return False
        nxt = "%s%0*d%s" % (m.group(1), len(m.group(2)), int(m.group(2)) + 1, m.group(3))
        waited_until = time.time() + GROW_WAIT_S
        while not os.path.exists(full) and time.time() < waited_until:
            time.sleep(GROW_POLL_MS / 1000)
        if not os.path.exists(full) or os.path.exists(nxt):
            return False
        self.send_response(200)
        self.send_header("Content-Type", grow_content_type(full))
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", grow_cache_control(full))
        self.end_headers()
        sent, last_growth = 0, time.time()
        with open(full, "rb") as f:
            while True:
                # Whether it was complete is read before what is there: once the
                # next segment exists, this one was written whole.
                done = os.path.exists(nxt) or time.time() - last_growth > GROW_IDLE_S
                piece = f.read()
                if piece:
                    last_growth = time.time()
                    frame = b"%x\r\n" % len(piece) + piece + b"\r\n"
                    if self.send(frame) < len(frame):
                        self.finish_log(200, sent, t0)
                        return True
                    try:
                        self.wfile.flush()
                    except OSError:
                        self.close_connection = True
                        self.finish_log(200, sent, t0)
                        return True
                    sent += len(piece)
                elif done:
                    break
                else:
                    time.sleep(GROW_POLL_MS / 1000)
        self.send(b"0\r\n\r\n")
        self.finish_log(200, sent, t0)
        return True


def grow_content_type(path):
    return {".mpd": "application/dash+xml", ".m3u8": "application/vnd.apple.mpegurl"}.get(
        os.path.splitext(path)[1], "video/mp4")


def grow_cache_control(path):
    return "max-age=1" if path.endswith((".mpd", ".m3u8")) else "max-age=3600"


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def main():
    global args
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", required=True)
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--log", required=True)
    p.add_argument("--mode-file", required=True)
    args = p.parse_args()
    srv = Server(("0.0.0.0", args.port), Handler)
    print("listening %d" % srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
