#!/usr/bin/env bash
# Quality of experience under load: linerate vs nginx, side by side, as viewers see it.
#
# Serves one catalogue (Zipf-popular titles of random bytes, warmed into the page
# cache before every run) from nginx and from linerate in turn, over HTTP and over
# HTTPS, and drives each with `linerate bench`: N paced sessions at a target bitrate,
# 2 MiB segments, 3 start-up segments, for a fixed duration. One run per (protocol,
# server), one after the other. Prints a table: Gb/s, play delay p50/p99, TTFB p99,
# rebuffer ratio, errors, the server's peak and steady RSS (all nginx processes
# summed), the whole machine's busy CPU during the run (from /proc/stat, without the
# time of niced processes, see machine_ticks in bench/lib.sh: at the same offered
# load, CPU spent is the efficiency figure), the server's own CPU and the client's.
#
# Usage: bench/qoe.sh [--quick] [--load overload|fixed] [--sessions N] [--duration S]
#          [--bitrate-mbps R] [--http-load N@R] [--https-load N@R] [--ramp N]
#          [--titles N] [--title-mib M] [--workers N] [--protocols "http https"]
#          [--rounds N] [--dir DIR] [--out DIR] [--bin PATH] [--linerate-config FILE]
#   --load overload (the default): 10000 sessions at 5 Mb/s (50 Gb/s offered, more
#             than this 2-core machine moves) for 60 s, started at 1000 per second.
#             Every run is an overload: it shows how each server degrades.
#   --load fixed: a load both servers carry with no rebuffer here, the same for both,
#             so the machine's busy CPU at that load is the efficiency verdict:
#             HTTP 8000 sessions at 1.25 Mb/s (10 Gb/s offered once all play, about
#             14 Gb/s moved with the start-ups), HTTPS 4000 sessions at 1 Mb/s (4 Gb/s,
#             about 6.6 Gb/s moved), each protocol's sessions started over 40 s, 60 s
#             runs, 3 rounds.
#   --http-load / --https-load N@R: N sessions at R Mb/s for that protocol.
#   defaults otherwise: 50 titles of 64 MiB, 2 server workers.
#   --quick   40 sessions for 5 s over 4 titles of 16 MiB: a smoke run.
#   --rounds  N runs per (protocol, server), alternating the servers (default 1);
#             with more than one, a second table gives each column's median.
#   --linerate-config FILE  a config file for linerate (`serve --config FILE`), to
#             compare a setting against nginx. Without it linerate gets one holding
#             `[open_file_cache] valid = "60s"`: both servers then keep open files and
#             trust them for 60 s without checking their paths again, as nginx's
#             `open_file_cache max=1000` does (its `open_file_cache_valid` is 60 s by
#             default; linerate's default, 0, checks every request with an `fstatat`).
#   --out     where each run's bench JSON, server samples (`t_s cpu_s rss_mib` each
#             second) and the SVG timelines (one per protocol and round, both servers
#             on each panel, drawn by `linerate chart`) are written (default
#             $TMPDIR/linerate-qoe-results).
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
dir="${TMPDIR:-/tmp}/linerate-qoe" out="${TMPDIR:-/tmp}/linerate-qoe-results" bin="" quick=0 label=overload
http_load="" https_load="" linerate_args=()
# load_preset: what --load sets.
load_preset() {
    case "$preset" in
        overload) label=overload sessions=10000 bitrate=5 ramp=1000 duration=60 ;;
        fixed) label=fixed http_load=8000@1.25 https_load=4000@1 ramp=per-load duration=60 rounds=3 ;;
        *) echo "--load: overload or fixed, not $preset" >&2; exit 2 ;;
    esac
}
parse_flags 2,52 "--quick:quick=1 sessions=40 duration=5 ramp=0 titles=4 title_mib=16 label=quick" \
    --load=preset:load_preset --sessions=sessions --duration=duration --bitrate-mbps=bitrate --http-load=http_load \
    --https-load=https_load --out=out --ramp=ramp --titles=titles --title-mib=title_mib --workers=workers \
    --protocols=protocols --rounds=rounds --dir=dir --bin=bin \
    '--linerate-config=linerate_config:linerate_args=(--config "$(realpath "$linerate_config")")' -- "$@"

[ "$quick" -eq 1 ] && dir="$dir-quick"
# Loads given by hand are neither preset: say so in the titles and file names.
[ "$label" = overload ] && [ -n "$http_load$https_load" ] && label=custom
for l in "$http_load" "$https_load"; do
    [ -z "$l" ] || [[ "$l" =~ ^[0-9]+@[0-9.]+$ ]] || { echo "a load is SESSIONS@MBPS, not $l" >&2; exit 2; }
done
# The sessions, bitrate and start rate of one protocol's runs: "SESSIONS BITRATE RAMP".
# With --load fixed, each protocol's sessions all start within 40 s.
load_of() {
    local l="" n r
    [ "$1" = http ] && l=$http_load
    [ "$1" = https ] && l=$https_load
    if [ -n "$l" ]; then n=${l%@*} r=${l#*@}; else n=$sessions r=$bitrate; fi
    if [ "$ramp" = per-load ]; then echo "$n $r $(( (n + 39) / 40 ))"; else echo "$n $r $ramp"; fi
}
mkdir -p "$out"

require_tools nginx openssl python3
build_linerate

start_work
# The same open-file cache validity as nginx's (see --linerate-config above).
if [ ${#linerate_args[@]} -eq 0 ]; then
    printf '[open_file_cache]\nvalid = "60s"\n' > "$work/linerate.toml"
    linerate_args=(--config "$work/linerate.toml")
fi

# --- catalogue -------------------------------------------------------------------
make_content "$dir" "$titles" "$title_mib" title
file_list=$(seq -f "title%g.bin" -s , 1 "$titles")

# --- certificates: a test CA and a server certificate for 127.0.0.1 ----------------
make_test_cert "$work"

# Resident memory (KiB) and CPU time (clock ticks, user + system) of a process and
# its children (nginx's workers): "RSS_KIB TICKS".
tree_usage() {
    local rss=0 ticks=0 p r t
    for p in "$1" $(pgrep -P "$1" || true); do
        r=$(awk '/^VmRSS:/ { print $2 }' "/proc/$p/status" 2>/dev/null || echo 0)
        # Fields 14 and 15 of /proc/PID/stat, counted after the command's closing paren.
        t=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | awk '{ print $12 + $13 }' || echo 0)
        rss=$((rss + ${r:-0})) ticks=$((ticks + ${t:-0}))
    done
    echo "$rss $ticks"
}

results="$work/results"
run_one() { # protocol server round
    local proto=$1 server=$2 round=$3 load_sessions load_bitrate load_ramp
    read -r load_sessions load_bitrate load_ramp < <(load_of "$proto")
    # Warm the catalogue again before every run: a kernel that reclaims idle page
    # cache proactively (DAMON's pageout scheme on the development machine takes pages
    # idle for about a minute) would otherwise make the first run after a pause read
    # part of it from disk, which is a cold-catalogue test, not this one.
    make_content "$dir" "$titles" "$title_mib" title
    if [ "$server" = nginx ]; then start_nginx "$proto" || exit 1; else start_linerate "$proto" "${linerate_args[@]}" || exit 1; fi
    local ramp_args=()
    [ "$load_ramp" != 0 ] && ramp_args=(--ramp "$load_ramp")
    local name="$out/qoe-$label-$proto-r$round-$server"
    local clk rss ticks ticks0 t0_ns now_ns peak=0 samples=()
    clk=$(getconf CLK_TCK)
    read -r b0 t0 < <(machine_ticks)
    read -r _ ticks0 < <(tree_usage "$server_pid")
    t0_ns=$(date +%s%N)
    "$bin" bench --base-url "$base" --files "$file_list" --sessions "$load_sessions" --duration "$duration" \
        --bitrate-mbps "$load_bitrate" --segment-bytes 2097152 --startup-segments 3 --zipf 1 "${ramp_args[@]}" \
        --cacert "$work/ca.pem" --json > "$name.json" &
    local bench_pid=$!
    : > "$name.samples"
    while kill -0 "$bench_pid" 2>/dev/null; do
        read -r rss ticks < <(tree_usage "$server_pid")
        now_ns=$(date +%s%N)
        [ "$rss" -gt "$peak" ] && peak=$rss
        printf '%s %s %s\n' "$(( (now_ns - t0_ns) / 1000000 ))e-3" "$(awk -v t="$((ticks - ticks0))" -v c="$clk" 'BEGIN { print t / c }')" \
            "$((rss / 1024))" >> "$name.samples"
        samples+=("$rss")
        sleep 1
    done
    wait "$bench_pid" || { echo "linerate bench failed against $server $proto" >&2; exit 1; }
    read -r b1 t1 < <(machine_ticks)
    read -r _ ticks < <(tree_usage "$server_pid")
    stop_server
    # Steady RSS: the median of the samples in the run's second half.
    local steady
    steady=$(printf '%s\n' "${samples[@]:$(( ${#samples[@]} / 2 ))}" | median)
    python3 - "$name.json" "$proto" "$server" "$peak" "$((b1 - b0))" "$((t1 - t0))" "$clk" "$((ticks - ticks0))" "$steady" >> "$results" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
proto, server, peak_kib, busy, total, clk = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
server_ticks, steady_kib = int(sys.argv[8]), float(sys.argv[9])
print(proto, server, "%.3f" % j["gbps"], "%.0f" % j["play_delay_ms"]["p50"], "%.0f" % j["play_delay_ms"]["p99"],
      "%.1f" % j["ttfb_ms"]["p99"], "%.5f" % j["rebuffer_ratio"], j["errors_total"], "%.0f" % (peak_kib / 1024),
      "%.0f" % (steady_kib / 1024), "%.1f" % (100.0 * busy / max(total, 1)), "%.1f" % (busy / clk),
      "%.1f" % (server_ticks / clk), "%.1f" % j["client_cpu_s"], j["plays_started"], j["plays_not_started"])
PY
    tail -1 "$results" | awk '{ printf "  %-8s %-5s %7s Gb/s  play delay p50 %s ms p99 %s ms  ttfb p99 %s ms  rebuffer ratio %s  errors %s  rss peak %s steady %s MiB  machine busy %s%%  server CPU %s s\n", $2, $1, $3, $4, $5, $6, $7, $8, $9, $10, $11, $13 }'
    python3 - "$name.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
kinds = ", ".join("%s %d" % (k, v) for k, v in j["errors"].items() if v)
if kinds:
    print("           errors by kind: %s; first: %s" % (kinds, j["first_error"]))
PY
}

if [ -n "$http_load$https_load" ]; then
    loads=""
    for proto in $protocols; do
        read -r n r p < <(load_of "$proto")
        loads="$loads $proto: $n sessions at $r Mb/s started at $p/s;"
    done
    echo "QoE ($label load):$loads 2 MiB segments, ${duration}s; $titles titles x $title_mib MiB (Zipf 1); $workers server workers"
else
    echo "QoE ($label load): $sessions sessions at $bitrate Mb/s, 2 MiB segments, ${duration}s, ramp $ramp/s; $titles titles x $title_mib MiB (Zipf 1); $workers server workers"
fi
echo "host: $(nproc) CPUs, $(uname -r)"
for round in $(seq 1 "$rounds"); do
    for proto in $protocols; do
        # Alternate which server goes first, so neither always runs on a warmer machine.
        order="nginx linerate"
        [ $((round % 2)) -eq 0 ] && order="linerate nginx"
        for server in $order; do
            run_one "$proto" "$server" "$round"
        done
        read -r n r _ < <(load_of "$proto")
        "$bin" chart --out "$out/qoe-$label-$proto-r$round.svg" \
            --title "$proto, $n sessions at $r Mb/s ($label load), round $round" \
            "nginx=$out/qoe-$label-$proto-r$round-nginx.json,$out/qoe-$label-$proto-r$round-nginx.samples" \
            "linerate=$out/qoe-$label-$proto-r$round-linerate.json,$out/qoe-$label-$proto-r$round-linerate.samples"
    done
done

print_results "$results" "$rounds" 2 \
    "protocol|server|Gb/s|play delay p50 ms|play delay p99 ms|TTFB p99 ms|rebuffer ratio|errors|server RSS peak MiB|server RSS steady MiB|machine busy %|machine CPU-s|server CPU-s|client CPU-s|plays started|plays still starting"
echo "bench JSON, server samples and timelines (SVG): $out"
# A run that moved nothing is a broken set-up, not a result.
if awk '$3 + 0 <= 0 { bad = 1 } END { exit !bad }' "$results"; then
    echo "a run moved no data" >&2
    exit 1
fi
