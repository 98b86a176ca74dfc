#!/usr/bin/env bash
# Cold catalogue: linerate vs nginx when the catalogue is much larger than the memory
# the server may cache it in, and the disk is slow.
#
# A catalogue of random titles on a real disk (not tmpfs), Zipf-popular (the first
# title the most popular), played by `linerate bench` with 2 MiB segments. Every
# server runs inside a cgroup v1 memory cgroup capped at --mem-mib (the page cache its
# reads bring in is charged there, so that is all it may cache) and a blkio cgroup
# that throttles reads of the catalogue's disk to --disk-mbps. Before every run the
# catalogue's pages are evicted (and checked to be gone with fincore), so each run
# starts cold. Servers, alternating in each round: linerate (--workers N); nginx with
# `sendfile on` (a worker blocks while the disk reads, the common configuration);
# nginx with `aio threads; sendfile on;` (sendfile moved to a thread pool, nginx's
# answer to a cold disk); linerate-noadmit, linerate with its page-cache admission
# policy off (`fill.admission = false`: the kernel's LRU alone decides what stays
# cached), to be picked with --servers. Over HTTP and HTTPS, under two loads:
#
#   paced   --sessions viewers at --bitrate-mbps, started at --ramp per second. The
#           defaults fit the default disk even if nothing were ever cached: 150 x 5
#           Mb/s = 750 Mb/s = 94 MB/s of steady reads, and the ramp adds start-up
#           bursts of 10 viewers/s x 3 segments x 2 MiB = 63 MB/s while it lasts, at
#           most 157 MB/s in all, below the 200 MB/s disk. So no server is
#           overloaded; what differs is how long viewers wait (play delay, rebuffers)
#           and whether the hot titles, cached, stay fast while cold ones load.
#   closed  --closed-sessions sessions fetching segments back to back (--max-rate),
#           more than the disk can feed: throughput is bounded by the disk and by
#           how well the server keeps the hot titles cached.
#
# Reported per (protocol, load, server), in a table (stdout and --out PATH.md) and in
# JSON (PATH.json): Gb/s, play delay p50/p99, TTFB p99 of the --hot-titles most
# popular titles and of all requests, rebuffer ratio, errors, page-cache hit ratio,
# disk read MB/s, the machine's busy CPU (from /proc/stat), and the bytes served and
# read. Hit ratio and disk rate come from the server's blkio cgroup, the same way for
# every server: hit ratio = 1 - (bytes the cgroup read from the disk) / (body bytes
# served); below 0 when a server reads more than it sends (read-ahead never used).
# With --rounds > 1, a second table gives the medians.
#
# Usage: bench/cold.sh [--quick] [--titles N] [--title-mib M] [--dir DIR] [--mem-mib M]
#          [--disk-mbps MB] [--rounds N] [--protocols "http https"] [--load "paced closed"]
#          [--sessions N] [--bitrate-mbps R] [--ramp N] [--closed-sessions N]
#          [--duration S] [--hot-titles N] [--workers N] [--out PATH] [--bin PATH]
#          [--servers "linerate nginx nginx-aio"] [--warm] [--fill "KEY = VALUE; ..."]
#   defaults: 200 titles x 64 MiB in /var/tmp/linerate-cold (created once, reused while
#             the sizes match), memory cap = catalogue / 8 (1600 MiB), disk 200 MB/s
#             (megabytes per second; 0 = unthrottled), 3 rounds, HTTP and HTTPS, both
#             loads, 150 paced sessions at 5 Mb/s ramped 10/s, 32 closed-loop sessions,
#             60 s per run, hot titles 10, 2 server workers, out target/bench-cold.
#   --servers which servers to run, in this order each round (also linerate-noadmit).
#   --fill    `[fill]` keys for both linerate servers, `;`-separated TOML
#             (e.g. "cache_bytes = 1258291200; admission_half_life = \"120s\"").
#   --warm    the baseline: the catalogue is read into the page cache (by this script,
#             so its pages are not charged to the server's memory cgroup) before each
#             run instead of evicted: the same load with everything resident.
#   --quick   16 titles x 16 MiB, cap 64 MiB, disk 50 MB/s, 1 round, 5 s per run, HTTP,
#             12 paced sessions ramped 4/s, 8 closed-loop sessions, hot titles 4: a
#             smoke run that fails on any error.
#
# Fails (exit status 1) when a server does not start, a run serves nothing, the
# catalogue cannot be evicted, or a run reports errors that mean a broken server or
# set-up (connect, status, protocol); timeouts and cut connections are results under
# load, except in --quick, whose load is light enough that any error is a failure.
# Every server process and cgroup is removed on every exit path.
#
# Needs: root, cgroup v1 memory and blkio controllers at /sys/fs/cgroup, nginx built
# with threads (Debian's), openssl, python3, util-linux (fincore, findmnt), cargo.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

servers="linerate nginx nginx-aio" warm=0 fill_keys=
titles=200 title_mib=64 mem_mib="" disk_mbps=200 rounds=3 protocols="http https" loads="paced closed"
sessions=150 bitrate=5 ramp=10 closed_sessions=32 duration=60 hot=10 workers=2
dir=/var/tmp/linerate-cold out=target/bench-cold bin="" quick=0
parse_flags 2,65 "--quick:quick=1 titles=16 title_mib=16 mem_mib=64 disk_mbps=50 rounds=1 duration=5 protocols=http \
        hot=4 sessions=12 ramp=4 closed_sessions=8" --servers=servers --fill=fill_keys --warm:warm=1 --titles=titles \
    --title-mib=title_mib --dir=dir --mem-mib=mem_mib --disk-mbps=disk_mbps --rounds=rounds --protocols=protocols \
    --load=loads --sessions=sessions --bitrate-mbps=bitrate --ramp=ramp --closed-sessions=closed_sessions \
    --duration=duration --hot-titles=hot --workers=workers --out=out --bin=bin -- "$@"
[ "$quick" -eq 1 ] && dir="$dir-quick"
[ -n "$mem_mib" ] || mem_mib=$((titles * title_mib / 8))
for l in $loads; do
    case "$l" in paced|closed) ;; *) echo "unknown load: $l (paced, closed)" >&2; exit 2 ;; esac
done

cg_mem=/sys/fs/cgroup/memory cg_blk=/sys/fs/cgroup/blkio
[ -e "$cg_mem/memory.limit_in_bytes" ] && [ -e "$cg_blk/blkio.throttle.read_bps_device" ] ||
    { echo "needs cgroup v1 memory and blkio controllers at /sys/fs/cgroup (and root)" >&2; exit 1; }
require_tools nginx openssl python3 fincore findmnt
nginx -V 2>&1 | grep -q -- --with-threads || { echo "nginx is built without threads: no aio threads" >&2; exit 1; }
build_linerate

start_work

# --- catalogue, on a disk ------------------------------------------------------------
make_content "$dir" "$titles" "$title_mib" title 0
file_list=$(seq -f "title%g.bin" -s , 1 "$titles")
catalogue=()
for i in $(seq 1 "$titles"); do catalogue+=("$dir/title$i.bin"); done

# MAJ:MIN of the whole disk holding DIR (the parent of a partition).
disk_of() {
    local mm
    mm=$(findmnt -no MAJ:MIN -T "$1" | head -1 | tr -d ' ')
    [ -n "$mm" ] && [ -e "/sys/dev/block/$mm" ] ||
        { echo "$1 is not on a block device (tmpfs?): give a --dir on a disk" >&2; return 1; }
    [ ! -e "/sys/dev/block/$mm/partition" ] || mm=$(cat "$(readlink -f "/sys/dev/block/$mm")/../dev")
    echo "$mm"
}
disk=$(disk_of "$dir")

# Drops the catalogue's pages from the page cache and checks what is left. Reads the
# last server queued behind its throttle complete after it is gone (pages under I/O
# cannot be dropped), so it tries again for up to 10 s. A few pages may stay pinned
# for good (seen after nginx was stopped in the middle of sendfile from a throttled
# disk: no process has the file open or mapped, no I/O is in flight): up to
# max(1 MiB, 0.1% of the catalogue) left once it stops shrinking is reported and
# tolerated; more fails the run.
evict_catalogue() {
    local f left prev=-1 same=0 limit
    limit=$((titles * title_mib * 1024 * 1024 / 1000))
    [ "$limit" -ge 1048576 ] || limit=1048576
    sync
    for _ in $(seq 1 50); do
        for f in "${catalogue[@]}"; do dd if="$f" iflag=nocache count=0 status=none; done
        left=$(fincore -nb -o RES "${catalogue[@]}" | awk '{ s += $1 } END { printf "%.0f\n", s }')
        [ "$left" != 0 ] || return 0
        if [ "$left" = "$prev" ]; then same=$((same + 1)); else same=0; fi
        prev=$left
        if [ "$same" -ge 5 ] && [ "$left" -le "$limit" ]; then
            echo "  note: $left bytes of the catalogue stay cached (pinned; at most $limit tolerated)"
            return 0
        fi
        sleep 0.2
    done
    echo "could not evict the catalogue: $left bytes still cached" >&2
    return 1
}

make_test_cert "$work"

# --- cgroups: one memory and one blkio cgroup per run ----------------------------------
cgroups=()
cg_create() { # NAME: both cgroups with their limits; server_wrap starts a server in them
    local n=$1
    mkdir "$cg_mem/$n"
    cgroups+=("$cg_mem/$n")
    mkdir "$cg_blk/$n"
    cgroups+=("$cg_blk/$n")
    echo $((mem_mib * 1024 * 1024)) > "$cg_mem/$n/memory.limit_in_bytes"
    [ "$disk_mbps" = 0 ] || echo "$disk $((disk_mbps * 1000000))" > "$cg_blk/$n/blkio.throttle.read_bps_device"
    # shellcheck disable=SC2016 # expanded by that shell
    server_wrap=(sh -c 'echo $$ > "$1/cgroup.procs" && echo $$ > "$2/cgroup.procs" && shift 2 && exec "$@"'
        sh "$cg_mem/$n" "$cg_blk/$n")
}
cg_read_bytes() { # NAME: bytes the blkio cgroup read from the disk
    awk -v d="$disk" '$1 == d && $2 == "Read" { s += $3 } END { printf "%.0f\n", s }' \
        "$cg_blk/$1/blkio.throttle.io_service_bytes"
}
cg_remove_all() { # kills what is left in our cgroups, then removes them
    local d p ok
    for d in "${cgroups[@]}"; do
        ok=0
        for _ in $(seq 1 50); do
            for p in $(cat "$d/cgroup.procs" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
            if rmdir "$d" 2>/dev/null || [ ! -d "$d" ]; then ok=1; break; fi
            sleep 0.1
        done
        [ "$ok" = 1 ] || echo "could not remove $d" >&2
    done
    cgroups=()
}
on_exit() { cg_remove_all; }

# --- runs ------------------------------------------------------------------------------
results="$work/results"
failed=0
run_seq=0
run_one() { # protocol load server
    local proto=$1 load=$2 server=$3 name
    run_seq=$((run_seq + 1))
    name="linerate-cold-$$-$run_seq"
    if [ "$warm" = 1 ]; then
        cat "${catalogue[@]}" > /dev/null
    else
        evict_catalogue || exit 1
    fi
    cg_create "$name"
    case "$server" in
        linerate | linerate-noadmit)
            { echo "[fill]"; tr ';' '\n' <<< "$fill_keys"
              [ "$server" = linerate ] || echo "admission = false"; } > "$work/linerate.toml"
            start_linerate "$proto" --config "$work/linerate.toml" || exit 1 ;;
        nginx) start_nginx "$proto" || exit 1 ;;
        nginx-aio) start_nginx "$proto" "aio threads;" || exit 1 ;;
    esac
    local load_args=(--sessions "$sessions" --bitrate-mbps "$bitrate" --ramp "$ramp")
    [ "$load" = closed ] && load_args=(--sessions "$closed_sessions" --max-rate)
    local b0 t0 b1 t1 read_bytes
    read -r b0 t0 < <(machine_ticks)
    "$bin" bench --base-url "$base" --files "$file_list" "${load_args[@]}" --duration "$duration" \
        --segment-bytes 2097152 --startup-segments 3 --zipf 1 --hot-titles "$hot" \
        --cacert "$work/ca.pem" --json > "$work/bench.json" ||
        { echo "linerate bench failed against $server $proto $load" >&2; exit 1; }
    read -r b1 t1 < <(machine_ticks)
    read_bytes=$(cg_read_bytes "$name")
    stop_server
    cg_remove_all
    python3 - "$work/bench.json" "$proto" "$load" "$server" "$read_bytes" "$((b1 - b0))" "$((t1 - t0))" >> "$results" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
proto, load, server = sys.argv[2:5]
read, busy, total = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
served = j["bytes"]
hit = 1 - read / served if served else 0
print(proto, load, server, "%.3f" % j["gbps"], "%.0f" % j["play_delay_ms"]["p50"], "%.0f" % j["play_delay_ms"]["p99"],
      "%.1f" % j["hot_ttfb_p99_ms"], "%.1f" % j["ttfb_ms"]["p99"], "%.5f" % j["rebuffer_ratio"], j["errors_total"],
      "%.3f" % hit, "%.1f" % (read / 1e6 / max(j["elapsed_s"], 1e-3)), "%.1f" % (100.0 * busy / max(total, 1)),
      "%.0f" % (served / 1e6), "%.0f" % (read / 1e6))
PY
    tail -1 "$results" | awk '{ printf "  %-5s %-6s %-9s %7s Gb/s  play delay p50 %s ms p99 %s ms  hot ttfb p99 %s ms  rebuffer %s  errors %s  hit ratio %s  disk %s MB/s  busy %s%%\n", $1, $2, $3, $4, $5, $6, $7, $9, $10, $11, $12, $13 }'
    bench_checks "$work/bench.json" "$quick" || failed=1
}

{
    [ "$warm" = 1 ] && echo "WARM baseline: the whole catalogue is in the page cache before each run"
    echo "Cold catalogue: $titles titles x $title_mib MiB (Zipf 1) in $dir; each server capped at $mem_mib MiB of memory, disk $disk reads throttled to $( [ "$disk_mbps" = 0 ] && echo "none" || echo "$disk_mbps MB/s")"
    echo "loads: $loads (paced: $sessions sessions at $bitrate Mb/s, ramp $ramp/s; closed: $closed_sessions sessions); ${duration}s per run; hot = top $hot titles; $workers server workers"
    echo "host: $(nproc) CPUs, $(uname -r)"
} | tee "$work/setup"
for round in $(seq 1 "$rounds"); do
    for proto in $protocols; do
        for load in $loads; do
            for server in $servers; do
                run_one "$proto" "$load" "$server"
            done
        done
    done
done

write_results "$out" "$results" "$rounds" 3 \
    "protocol|load|server|Gb/s|play delay p50 ms|play delay p99 ms|hot TTFB p99 ms|TTFB p99 ms|rebuffer ratio|errors|page-cache hit ratio|disk read MB/s|machine busy %|served MB|disk read MB"
