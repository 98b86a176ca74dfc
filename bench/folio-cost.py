#!/usr/bin/env python3
"""What the size of page-cache folios costs a server: the same bytes, cached in 4 KiB
folios or in 2 MiB folios, sent with sendfile(2) and checked with cachestat(2).

Why it matters: linerate's fill threads (server::fill) bring cold windows in with
POSIX_FADV_WILLNEED + pread, and the kernel reads for those in 4 KiB folios
(forced read-ahead allocates order-0 folios); the kernel's own read-ahead for a
sequential reader (nginx's sendfile, `cat`) builds up to large folios. Every later
send of a page pays for its folio size, and so does every residency check.

Makes two files of random bytes in a scratch directory on the file system of --dir
(default: the current directory), drops them from the page cache, then brings
them back in two ways:

  small   POSIX_FADV_RANDOM, then POSIX_FADV_WILLNEED + pread per 2 MiB window,
          as a fill does (4 KiB folios);
  large   a read-only mapping of each 2 MiB window marked MADV_HUGEPAGE and
          faulted in with MADV_POPULATE_READ (2 MiB folios where the file system
          supports large folios; Linux 5.14+).

For each it prints the share of the file's pages in large folios (/proc/self/pagemap
and /proc/kpageflags: needs root), the sending thread's CPU seconds per GB sent with
sendfile over a loopback TCP connection to a reader in this process on another CPU
(on loopback the sender also pays for delivering to the receiving socket), and the time of one
cachestat(2) over a 2 MiB range. The two files are measured alternately, --rounds
times, and the medians are printed. Everything it creates is removed at the end.

Usage: bench/folio-cost.py [--quick] [--dir DIR] [--mib N] [--rounds N] [--passes N]
         (defaults: ., 64 MiB per file, 5 rounds, 8 passes over the file per round;
         --quick: 8 MiB, 1 round, 2 passes, a smoke run)
"""
import argparse
import ctypes
import mmap
import os
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time

WINDOW = 2 << 20
PAGE = 4096
MADV_HUGEPAGE = 14
MADV_POPULATE_READ = 22
SYS_CACHESTAT = 451

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def fill_small(path):
    """As linerate's fill threads do: no kernel read-ahead, WILLNEED + pread per window."""
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    for off in range(0, size, WINDOW):
        n = min(WINDOW, size - off)
        os.posix_fadvise(fd, off, n, os.POSIX_FADV_WILLNEED)
        got = 0
        while got < n:
            chunk = os.pread(fd, min(1 << 20, n - got), off + got)
            if not chunk:
                break
            got += len(chunk)
    os.close(fd)


def fill_large(path):
    """Fault each window in through a MADV_HUGEPAGE mapping."""
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    try:
        for off in range(0, size, WINDOW):
            n = min(WINDOW, size - off)
            addr = libc.mmap(None, n, mmap.PROT_READ, mmap.MAP_SHARED, fd, off)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), "mmap")
            try:
                for advice, name in ((MADV_HUGEPAGE, "MADV_HUGEPAGE"), (MADV_POPULATE_READ, "MADV_POPULATE_READ")):
                    if libc.madvise(addr, n, advice) != 0:
                        raise OSError(ctypes.get_errno(), name)
            finally:
                libc.munmap(addr, n)
    finally:
        os.close(fd)


def large_share(path):
    """Share of the file's cached pages that sit in large folios (compound pages)."""
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    m = mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
    large = seen = 0
    try:
        base = ctypes.addressof(ctypes.c_char.from_buffer(m))
        with open("/proc/self/pagemap", "rb", buffering=0) as pm, open("/proc/kpageflags", "rb", buffering=0) as kf:
            for i in range(size // PAGE):
                _ = m[i * PAGE]  # maps the cached page (reads nothing from disk: the file is cached)
                pm.seek((base // PAGE + i) * 8)
                entry = struct.unpack("<Q", pm.read(8))[0]
                if not entry >> 63:
                    continue
                kf.seek((entry & ((1 << 55) - 1)) * 8)
                flags = struct.unpack("<Q", kf.read(8))[0]
                seen += 1
                large += bool(flags & ((1 << 15) | (1 << 16)))  # KPF_COMPOUND_HEAD, KPF_COMPOUND_TAIL
    finally:
        try:
            m.close()
        except BufferError:
            pass
        os.close(fd)
    return large / seen if seen else float("nan")


def sendfile_cost(path, passes):
    """CPU seconds of the sending thread per GB sent with sendfile over loopback."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    reader = socket.create_connection(listener.getsockname())
    sender, _ = listener.accept()
    listener.close()

    cpus = sorted(os.sched_getaffinity(0))

    def drain():
        # The reader on another CPU than the sender, when there is one, so that
        # neither waits for the other to be scheduled.
        os.sched_setaffinity(0, {cpus[-1]})
        buf = bytearray(4 << 20)
        while reader.recv_into(buf):
            pass

    t = threading.Thread(target=drain)
    t.start()
    os.sched_setaffinity(0, {cpus[0]})
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    sent = 0
    cpu0 = time.thread_time()
    for _ in range(passes):
        off = 0
        while off < size:
            n = os.sendfile(sender.fileno(), fd, off, min(WINDOW, size - off))
            off += n
            sent += n
    cpu = time.thread_time() - cpu0
    os.sched_setaffinity(0, cpus)
    os.close(fd)
    sender.close()
    t.join()
    reader.close()
    return cpu / sent * 1e9


class Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class Stat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("cache", "dirty", "writeback", "evicted", "recently_evicted")]


def cachestat_cost(path, calls=2000):
    """Microseconds per cachestat(2) of one 2 MiB window (less this loop's own cost)."""
    fd = os.open(path, os.O_RDONLY)
    windows = max(1, os.fstat(fd).st_size // WINDOW)
    out = Stat()
    ranges = [Range(w * WINDOW, WINDOW) for w in range(windows)]

    def loop(nr):
        t = time.perf_counter()
        for i in range(calls):
            if libc.syscall(nr, fd, ctypes.byref(ranges[i % windows]), ctypes.byref(out), 0) != 0 and nr == SYS_CACHESTAT:
                raise OSError(ctypes.get_errno(), "cachestat")
        return (time.perf_counter() - t) / calls * 1e6

    try:
        # getppid (110) with the same arguments: the cost of the loop and of entering the kernel.
        return loop(SYS_CACHESTAT) - loop(110)
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=".")
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--passes", type=int, default=8)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.mib, args.rounds, args.passes = 8, 1, 2
    if os.geteuid() != 0:
        sys.exit("folio-cost: needs root (/proc/kpageflags)")
    with tempfile.TemporaryDirectory(prefix="linerate-folios-", dir=args.dir) as d:
        files = {}
        for kind in ("small", "large"):
            files[kind] = os.path.join(d, kind + ".bin")
            with open(files[kind], "wb") as f:
                f.write(os.urandom(args.mib << 20))
                f.flush()
                os.fsync(f.fileno())
        results = {k: {"share": [], "sendfile": [], "cachestat": []} for k in files}
        for r in range(args.rounds):
            for kind, fill in (("small", fill_small), ("large", fill_large)):
                evict(files[kind])
                fill(files[kind])
            for kind in (("small", "large") if r % 2 == 0 else ("large", "small")):
                res = results[kind]
                res["share"].append(large_share(files[kind]))
                res["sendfile"].append(sendfile_cost(files[kind], args.passes))
                res["cachestat"].append(cachestat_cost(files[kind]))
            print("round %d: sendfile CPU-s/GB small %.3f large %.3f; cachestat us small %.1f large %.1f"
                  % (r + 1, results["small"]["sendfile"][-1], results["large"]["sendfile"][-1],
                     results["small"]["cachestat"][-1], results["large"]["cachestat"][-1]))
    print()
    print("| folios | pages in large folios | sendfile CPU-s/GB | cachestat per 2 MiB, us |")
    print("|---|---|---|---|")
    for kind in ("small", "large"):
        res = results[kind]
        print("| %s | %.0f%% | %.3f | %.1f |" % (kind, 100 * statistics.median(res["share"]),
                                            statistics.median(res["sendfile"]), statistics.median(res["cachestat"])))
    ratio = statistics.median(results["large"]["sendfile"]) / statistics.median(results["small"]["sendfile"])
    print("\nlarge/small sendfile CPU per GB: %.2f (medians of %d rounds)" % (ratio, args.rounds))


if __name__ == "__main__":
    main()
