#!/usr/bin/env python3
"""Server memory per connection: how much a linerate's resident set grows for each
open connection, in the states a busy edge holds thousands of.

For each state, starts `linerate serve` (2 workers, a scratch root, a test
certificate made with openssl), opens N connections from this process, waits, and
reports the growth of the server's VmRSS divided by N:

  plain, idle          TCP connected to the HTTP port, nothing sent
  tls, tcp only        TCP connected to the HTTPS port, nothing sent
  tls, handshaking     ClientHello sent, the server's answer never read
  tls, established     handshake finished, no request
  tls, idle            one request answered (a 1 KiB file), the connection kept open:
                       a viewer between two segments
  tls, sending         a request for a large file sent, the response never read: the
                       socket buffers fill and the server holds what it has for the
                       viewer (most viewers of an overloaded edge are in this state)

Kernel socket buffers are not in the resident set; this is the server's own memory.
Before measuring, WARM_UP connections of the state are opened and closed, so that
what the first one of a kind allocates for good (TLS, allocator arenas) is not
counted per connection: the figures then hardly depend on N.

Exits 1 when any state costs more than its budget (BUDGET_KIB below, KiB per
connection): about one and a half times what it measured
(docs/performance/memory.md), so a server that starts holding a buffer per connection in
any of these states fails it. --budget-scale F multiplies every budget.

Usage: bench/conn-memory.py [--conns N] [--bin PATH] [--budget-scale F]
         (defaults: 2000, target/release/linerate, 1)
Needs: python3, openssl (Debian packages), a built linerate.
"""
import argparse
import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import time


# KiB per connection each state may cost. Measured (2000 and 200 connections, after
# the warm-up): plain idle 4, TLS TCP only 4, handshaking 5.5 to 6, established 5,
# idle after a response 5.5, sending 8 to 12 (the tail of at most one record per
# viewer, and what the kernel took of it varies). Before the work that set them,
# the same states cost 8.7, 12.9, 14.8, 15.0, 15.3 and 195 KiB.
BUDGET_KIB = {
    "plain, idle": 6.5,
    "tls, tcp only": 6.5,
    "tls, handshaking": 9.5,
    "tls, established": 7.0,
    "tls, idle": 7.0,  # nginx: about 7 KiB per established HTTPS connection
    "tls, sending": 18.0,
}
WARM_UP = 16

SMALL_FILE_BYTES = 1024
# Larger than what the kernel lets one connection's socket buffers hold, so the
# server is still sending when the figure is read.
BIG_FILE_BYTES = 256 << 20


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def make_certs(d):
    def run(*args):
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run("openssl", "req", "-x509", *ec, "-days", "2", "-subj", "/CN=conn-memory CA",
        "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.pem")
    run("openssl", "req", *ec, "-subj", "/CN=localhost", "-keyout", f"{d}/key.pem", "-out", f"{d}/s.csr")
    with open(f"{d}/ext.cnf", "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    run("openssl", "x509", "-req", "-in", f"{d}/s.csr", "-CA", f"{d}/ca.pem", "-CAkey", f"{d}/ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", f"{d}/ext.cnf", "-out", f"{d}/cert.pem")


def start(binary, d, tls):
    args = [binary, "serve", "--root", d, "--workers", "2", "--listen", "127.0.0.1:0", "--no-admin",
            "--log-level", "warn"]
    # Thousands of connections from 127.0.0.1: lift the per-client limits
    # ([client_limits]) when the binary has them.
    if "--max-client-connections" in subprocess.run([binary, "serve", "--help"], capture_output=True, text=True).stdout:
        args += ["--max-client-connections", "1000000", "--max-client-connection-rate", "1000000"]
    if tls:
        args += ["--tls-listen", "127.0.0.1:0", "--cert", f"{d}/cert.pem", "--key", f"{d}/key.pem"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    scheme = "https" if tls else "http"
    deadline = time.time() + 10
    while time.time() < deadline:
        line = p.stdout.readline()
        m = re.match(rf"listening {scheme}://127\.0\.0\.1:(\d+)", line)
        if m:
            return p, int(m.group(1))
        if not line and p.poll() is not None:
            break
    p.kill()
    sys.exit(f"linerate did not start ({' '.join(args)})")


def open_conns(port, n, state, ctx):
    conns = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if state == "handshaking":
            t = ctx.wrap_socket(s, server_hostname="localhost", do_handshake_on_connect=False)
            t.setblocking(False)
            try:
                t.do_handshake()  # sends the ClientHello; the answer is never read
            except ssl.SSLWantReadError:
                pass
            s = t
        elif state == "established":
            s = ctx.wrap_socket(s, server_hostname="localhost")
        elif state == "idle":
            s = ctx.wrap_socket(s, server_hostname="localhost")
            s.sendall(b"GET /small HTTP/1.1\r\nHost: localhost\r\n\r\n")
            got = b""
            while not (b"\r\n\r\n" in got and len(got.split(b"\r\n\r\n", 1)[1]) >= SMALL_FILE_BYTES):
                chunk = s.recv(4096)
                if not chunk:
                    sys.exit("the server closed during a response")
                got += chunk
        elif state == "sending":
            s = ctx.wrap_socket(s, server_hostname="localhost")
            s.sendall(b"GET /big HTTP/1.1\r\nHost: localhost\r\n\r\n")  # never read
        conns.append(s)
    return conns


def main():
    ap = argparse.ArgumentParser(description="Server memory per open connection.")
    ap.add_argument("--conns", type=int, default=2000)
    ap.add_argument("--bin", default="target/release/linerate")
    ap.add_argument("--budget-scale", type=float, default=1.0,
                    help="multiply every state's budget by this (default 1)")
    a = ap.parse_args()
    if a.conns < 1 or a.conns > 9000:
        sys.exit("--conns must be 1 to 9000 (one client socket each, 20,000 files per process)")
    if a.budget_scale <= 0:
        sys.exit("--budget-scale must be positive")
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"no linerate at {a.bin}: cargo build --release, or pass --bin PATH")
    with tempfile.TemporaryDirectory() as d:
        make_certs(d)
        with open(f"{d}/small", "wb") as f:
            f.write(b"x" * SMALL_FILE_BYTES)
        with open(f"{d}/big", "wb") as f:
            f.truncate(BIG_FILE_BYTES)  # sparse: reads as zeros, sealed like any data
        ctx = ssl.create_default_context(cafile=f"{d}/ca.pem")
        print(f"server memory per connection, {a.conns} connections, 2 workers")
        print("| state | server RSS growth MiB | KiB per connection | budget KiB |")
        print("|---|---|---|---|")
        over = []
        for name, tls, state in [("plain, idle", False, "tcp"), ("tls, tcp only", True, "tcp"),
                                 ("tls, handshaking", True, "handshaking"),
                                 ("tls, established", True, "established"),
                                 ("tls, idle", True, "idle"),
                                 ("tls, sending", True, "sending")]:
            p, port = start(a.bin, d, tls)
            try:
                for c in open_conns(port, WARM_UP, state, ctx):
                    c.close()
                time.sleep(1.0)
                before = rss_kib(p.pid)
                conns = open_conns(port, a.conns, state, ctx)
                time.sleep(1.5)
                grown = rss_kib(p.pid) - before
                per_conn, budget = grown / a.conns, BUDGET_KIB[name] * a.budget_scale
                print(f"| {name} | {grown / 1024:.1f} | {per_conn:.1f} | {budget:g} |", flush=True)
                if per_conn > budget:
                    over.append(f"{name}: {per_conn:.1f} KiB, budget {budget:g}")
                for c in conns:
                    c.close()
            finally:
                p.kill()
                p.wait()
    if over:
        sys.exit(f"over budget (KiB per connection): {'; '.join(over)}")


if __name__ == "__main__":
    main()
