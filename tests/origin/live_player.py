#!/usr/bin/env python3
"""A real player on a live stream: headless Chromium, driven through chromedriver
(WebDriver), opens PAGE_URL (a page that plays the stream with hls.js and exposes
`window.state()`), and samples the player once a second for SECONDS.

    live_player.py PAGE_URL SECONDS

Prints one JSON object: whether it started and when, media time played against
wall time since it started playing, rebuffers (playback stopping for want of data
once playing: the page counts the first `waiting` after each `playing`),
hls.js errors (fatal ones apart), and the live latency hls.js estimates (seconds
behind the live edge) p50/max over the samples. chromedriver runs in a process
group of its own, killed with Chromium on every exit path.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def call(url, method="GET", body=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    page, seconds = sys.argv[1], float(sys.argv[2])
    port = free_port()
    profile = tempfile.mkdtemp(prefix="live-player.")
    # Chromium's temporary files and PulseAudio's runtime directory go under the
    # profile's directory, removed at the end, instead of staying in /tmp.
    env = dict(os.environ, TMPDIR=profile, PULSE_RUNTIME_PATH=profile)
    driver = subprocess.Popen(
        ["chromedriver", "--port=%d" % port], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, env=env,
    )
    wd = "http://127.0.0.1:%d" % port
    try:
        for _ in range(100):
            try:
                call(wd + "/status", timeout=2)
                break
            except OSError:
                time.sleep(0.1)
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic",
                "--autoplay-policy=no-user-gesture-required", "--user-data-dir=" + profile]
        caps = {"capabilities": {"alwaysMatch": {"goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args}}}}
        session = wd + "/session/" + call(wd + "/session", "POST", caps, timeout=60)["value"]["sessionId"]
        call(session + "/url", "POST", {"url": page}, timeout=60)
        samples = []
        end = time.time() + seconds
        while time.time() < end:
            time.sleep(1.0)
            s = call(session + "/execute/sync", "POST", {"script": "return window.state ? window.state() : null;", "args": []})["value"]
            if s is not None:
                s["wall"] = time.time()
                samples.append(s)
        try:
            call(session, "DELETE", timeout=10)
        except OSError:
            pass
    finally:
        try:
            os.killpg(driver.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        driver.wait()
        subprocess.run(["rm", "-rf", profile], check=False)

    playing = [s for s in samples if s.get("started")]
    out = {"samples": len(samples), "started": bool(playing)}
    if playing:
        first, last = playing[0], playing[-1]
        lat = sorted(s["latency"] for s in playing if isinstance(s.get("latency"), (int, float)))
        out.update({
            "start_s": round(first["wall"] - samples[0]["wall"] + 1.0, 1),
            "wall_s": round(last["wall"] - first["wall"], 1),
            "media_s": round(last["t"] - first["t"], 1),
            "rebuffers": last["waiting"],
            "media_error": last["err"],
            "fatal": last["fatal"],
            "errors": last["errors"],
            "latency_s": {"p50": round(lat[len(lat) // 2], 2) if lat else None, "max": round(lat[-1], 2) if lat else None},
        })
    elif samples:
        out["last"] = samples[-1]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
