#!/usr/bin/env bash
# Quality of experience under load: linerate vs nginx, side by side, as viewers see it.
#
# Serves one catalogue (Zipf-popular titles of random bytes, warmed into the page
# cache) from nginx and from linerate in turn, over HTTP and over HTTPS, and drives
# each with `linerate bench`: N paced sessions at a target bitrate, 2 MiB segments,
# 3 start-up segments, for a fixed duration. One run per (protocol, server), one
# after the other. Prints a table: Gb/s, play delay p50/p99, TTFB p99, rebuffer
# ratio, errors, the server's peak RSS (all nginx processes summed), the whole
# machine's busy CPU during the run (from /proc/stat: at the same offered load, CPU
# spent is the efficiency figure), and the client's own CPU.
#
# Usage: bench/qoe.sh [--quick] [--sessions N] [--duration S] [--bitrate-mbps R]
#          [--ramp N] [--titles N] [--title-mib M] [--workers N] [--protocols "http https"]
#          [--rounds N] [--dir DIR] [--bin PATH]
#   defaults: 10000 sessions at 5 Mb/s for 60 s, started at 1000 per second,
#             50 titles of 64 MiB, 2 server workers.
#   --quick   40 sessions for 5 s over 4 titles of 16 MiB: a smoke run.
#   --rounds  N runs per (protocol, server), alternating the servers (default 1);
#             with more than one, a second table gives each column's median.
#
# Limits: each process may open 20,000 files here. The bench needs one socket per
# session (at most 10,000) and so does the server; they are separate processes, so
# both fit. nginx gets worker_rlimit_nofile 19000; linerate derives its per-worker
# connection cap from its own limit.
#
# linerate over HTTPS uses `serve --tls-listen ADDR:PORT --cert FILE --key FILE`. A
# --bin without that option fails the run (use --protocols http with it): every run
# asked for is measured, or the script exits non-zero.
#
# Needs: nginx, openssl, python3 (Debian packages), and cargo to build linerate.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

sessions=10000 duration=60 bitrate=5 ramp=1000 titles=50 title_mib=64 workers=2 protocols="http https" rounds=1
dir="${TMPDIR:-/tmp}/linerate-qoe" bin="" quick=0
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 sessions=40 duration=5 ramp=0 titles=4 title_mib=16 ;;
        --sessions) sessions=$2; shift ;;
        --duration) duration=$2; shift ;;
        --bitrate-mbps) bitrate=$2; shift ;;
        --ramp) ramp=$2; shift ;;
        --titles) titles=$2; shift ;;
        --title-mib) title_mib=$2; shift ;;
        --workers) workers=$2; shift ;;
        --protocols) protocols=$2; shift ;;
        --rounds) rounds=$2; shift ;;
        --dir) dir=$2; shift ;;
        --bin) bin=$2; shift ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done

[ "$quick" -eq 1 ] && dir="$dir-quick"

require_tools nginx openssl python3
build_linerate

start_work

# --- catalogue -------------------------------------------------------------------
make_content "$dir" "$titles" "$title_mib" title
file_list=$(seq -f "title%g.bin" -s , 1 "$titles")

# --- certificates: a test CA and a server certificate for 127.0.0.1 ----------------
make_test_cert "$work"

# Resident memory of a process and its children, in KiB.
tree_rss_kib() {
    local t=0 p
    for p in "$1" $(pgrep -P "$1" || true); do
        t=$((t + $(awk '/^VmRSS:/ { print $2 }' "/proc/$p/status" 2>/dev/null || echo 0)))
    done
    echo "$t"
}

results="$work/results"
run_one() { # protocol server
    local proto=$1 server=$2
    if [ "$server" = nginx ]; then start_nginx "$proto" || exit 1; else start_linerate "$proto" || exit 1; fi
    local ramp_args=()
    [ "$ramp" != 0 ] && ramp_args=(--ramp "$ramp")
    read -r b0 t0 < <(machine_ticks)
    "$bin" bench --base-url "$base" --files "$file_list" --sessions "$sessions" --duration "$duration" \
        --bitrate-mbps "$bitrate" --segment-bytes 2097152 --startup-segments 3 --zipf 1 "${ramp_args[@]}" \
        --cacert "$work/ca.pem" --json > "$work/bench.json" &
    local bench_pid=$! peak=0 r
    while kill -0 "$bench_pid" 2>/dev/null; do
        r=$(tree_rss_kib "$server_pid"); [ "$r" -gt "$peak" ] && peak=$r
        sleep 1
    done
    wait "$bench_pid" || { echo "linerate bench failed against $server $proto" >&2; exit 1; }
    read -r b1 t1 < <(machine_ticks)
    stop_server
    python3 - "$work/bench.json" "$proto" "$server" "$peak" "$((b1 - b0))" "$((t1 - t0))" "$(getconf CLK_TCK)" >> "$results" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
proto, server, peak_kib, busy, total, clk = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
print(proto, server, "%.3f" % j["gbps"], "%.0f" % j["play_delay_ms"]["p50"], "%.0f" % j["play_delay_ms"]["p99"],
      "%.1f" % j["ttfb_ms"]["p99"], "%.5f" % j["rebuffer_ratio"], j["errors_total"], "%.0f" % (peak_kib / 1024),
      "%.1f" % (100.0 * busy / max(total, 1)), "%.1f" % (busy / clk), "%.1f" % j["client_cpu_s"], j["plays_started"],
      j["plays_not_started"])
PY
    tail -1 "$results" | awk '{ printf "  %-8s %-5s %7s Gb/s  play delay p50 %s ms p99 %s ms  ttfb p99 %s ms  rebuffer ratio %s  errors %s  rss %s MiB  machine busy %s%%\n", $2, $1, $3, $4, $5, $6, $7, $8, $9, $10 }'
    python3 - "$work/bench.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
kinds = ", ".join("%s %d" % (k, v) for k, v in j["errors"].items() if v)
if kinds:
    print("           errors by kind: %s; first: %s" % (kinds, j["first_error"]))
PY
}

echo "QoE: $sessions sessions at $bitrate Mb/s, 2 MiB segments, ${duration}s, ramp $ramp/s; $titles titles x $title_mib MiB (Zipf 1); $workers server workers"
echo "host: $(nproc) CPUs, $(uname -r)"
for round in $(seq 1 "$rounds"); do
    for proto in $protocols; do
        for server in nginx linerate; do
            run_one "$proto" "$server"
        done
    done
done

print_results "$results" "$rounds" 2 \
    "protocol|server|Gb/s|play delay p50 ms|play delay p99 ms|TTFB p99 ms|rebuffer ratio|errors|server RSS MiB|machine busy %|machine CPU-s|client CPU-s|plays started|plays still starting"
# A run that moved nothing is a broken set-up, not a result.
if awk '$3 + 0 <= 0 { bad = 1 } END { exit !bad }' "$results"; then
    echo "a run moved no data" >&2
    exit 1
fi
