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

Kernel socket buffers are not in the resident set; this is the server's own memory.

Exits 1 when any state costs more than --max-kib-per-conn. The default, 24 KiB, leaves
room above what these states measured with 200 connections (plain about 9 KiB, TLS
established about 18 KiB; fewer connections spread the fixed costs of allocator
arenas over fewer of them): a server that starts holding buffers per idle connection
fails it.

Usage: bench/conn-memory.py [--conns N] [--bin PATH] [--max-kib-per-conn KIB]
         (defaults: 2000, target/release/linerate, 24)
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
        conns.append(s)
    return conns


def main():
    ap = argparse.ArgumentParser(description="Server memory per open connection.")
    ap.add_argument("--conns", type=int, default=2000)
    ap.add_argument("--bin", default="target/release/linerate")
    ap.add_argument("--max-kib-per-conn", type=float, default=24.0,
                    help="fail when any state's KiB per connection is above this (default 24)")
    a = ap.parse_args()
    if a.conns < 1 or a.conns > 9000:
        sys.exit("--conns must be 1 to 9000 (one client socket each, 20,000 files per process)")
    if a.max_kib_per_conn <= 0:
        sys.exit("--max-kib-per-conn must be positive")
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"no linerate at {a.bin}: cargo build --release, or pass --bin PATH")
    with tempfile.TemporaryDirectory() as d:
        make_certs(d)
        ctx = ssl.create_default_context(cafile=f"{d}/ca.pem")
        print(f"server memory per connection, {a.conns} connections, 2 workers")
        print("| state | server RSS growth MiB | KiB per connection |")
        print("|---|---|---|")
        over = []
        for name, tls, state in [("plain, idle", False, "tcp"), ("tls, tcp only", True, "tcp"),
                                 ("tls, handshaking", True, "handshaking"),
                                 ("tls, established", True, "established")]:
            p, port = start(a.bin, d, tls)
            try:
                time.sleep(0.5)
                before = rss_kib(p.pid)
                conns = open_conns(port, a.conns, state, ctx)
                time.sleep(1.5)
                grown = rss_kib(p.pid) - before
                print(f"| {name} | {grown / 1024:.1f} | {grown / a.conns:.1f} |", flush=True)
                if grown / a.conns > a.max_kib_per_conn:
                    over.append(f"{name}: {grown / a.conns:.1f} KiB")
                for c in conns:
                    c.close()
            finally:
                p.kill()
                p.wait()
    if over:
        sys.exit(f"over the budget of {a.max_kib_per_conn:g} KiB per connection: {'; '.join(over)}")


if __name__ == "__main__":
    main()
