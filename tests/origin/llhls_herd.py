#!/usr/bin/env python3
"""A herd of viewers asking for one blocking LL-HLS playlist at once.

    llhls_herd.py URL --viewers N --msn N

Each viewer (a thread with its own connection) asks for URL with `&token=<i>`
added, an argument that differs per viewer and must not split the cache key, all
released together. Prints one JSON object:
    statuses     {status: count}
    errors       viewers whose request failed (no answer)
    done         each viewer's time of the answer's last byte (epoch seconds)
    holding      viewers whose 200 body holds segment msn (media sequence +
                 segment count > msn)
    cache        {X-Cache value: count}
"""

import argparse
import http.client
import json
import threading
import time
import urllib.parse


def holds(body, msn):
    first = count = 0
    for line in body.decode("utf-8", "replace").splitlines():
        if line.startswith("#EXT-X-MEDIA-SEQUENCE:"):
            first = int(line.split(":", 1)[1])
        elif line and not line.startswith("#"):
            count += 1
    return first + count > msn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--viewers", type=int, default=100)
    ap.add_argument("--msn", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=15)
    args = ap.parse_args()
    u = urllib.parse.urlsplit(args.url)
    start = threading.Barrier(args.viewers)
    lock = threading.Lock()
    out = {"statuses": {}, "errors": 0, "done": [], "holding": 0, "cache": {}}

    def viewer(i):
        try:
            c = http.client.HTTPConnection(u.hostname, u.port, timeout=args.timeout)
            c.connect()
            start.wait()
            c.request("GET", f"{u.path}?{u.query}&token={i}")
            r = c.getresponse()
            body = r.read()
            done = time.time()
            c.close()
        except Exception:  # noqa: BLE001 -- counted, the test judges
            with lock:
                out["errors"] += 1
            return
        with lock:
            s = str(r.status)
            out["statuses"][s] = out["statuses"].get(s, 0) + 1
            xc = r.getheader("X-Cache", "-")
            out["cache"][xc] = out["cache"].get(xc, 0) + 1
            out["done"].append(done)
            if r.status == 200 and holds(body, args.msn):
                out["holding"] += 1

    threads = [threading.Thread(target=viewer, args=(i,)) for i in range(args.viewers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
