#!/usr/bin/env bash
# TLS handshakes per second, linerate vs nginx: full handshakes and resumed ones.
#
# Both servers get the same ECDSA P-256 certificate (signed by a test CA the client
# trusts, so the client verifies the chain as a player would), TLS 1.3 with
# AES-128-GCM and X25519, and session resumption (linerate: its tickets and session
# cache; nginx: `ssl_session_tickets on` and a shared session cache). The client is
# `linerate bench --connection-per-request --max-rate`: every request (the first
# KiB of a small file) on a new connection, closed once its response is in, so each
# request costs one handshake. "full" runs with `--no-resume`; "resumed" with the
# default, where each bench session (a viewer) resumes with the ticket its previous
# connection received (its first connection is a full handshake, the rest resume).
#
# Servers alternate within each round (nginx first in odd rounds, linerate first in
# even ones). Per run: handshakes/s, the server's CPU seconds per 1000 handshakes
# (utime+stime from /proc/<pid>/stat, nginx's master and workers summed) and the
# whole machine's busy CPU seconds per 1000 handshakes. Prints every run, the
# medians, and the linerate/nginx ratios (handshakes/s: >1 is linerate faster; CPU:
# <1 is linerate cheaper). Fails if a run had errors, or if the resumed runs resumed
# less than 90 % of their handshakes, or the full runs resumed any.
#
# --profile: instead of the rounds, one full-handshake load per server under
# `perf record` (sampling the server's processes only) and where their CPU time
# goes: by library, then the top symbols (`perf report --no-children`).
#
# Usage: bench/handshakes.sh [--quick] [--rounds N] [--duration S] [--workers N]
#          [--bench-workers N] [--sessions N] [--json FILE] [--bin PATH] [--profile]
#   --workers N        server workers (nginx worker_processes, linerate --workers): 1
#   --bench-workers N  client threads: 1 (the client verifies a signature and a
#                      certificate per full handshake; on a small machine it
#                      competes with the server for the same cores)
#   --sessions N       concurrent connections: 16
#   --quick            1 round of 4 s per load (about 30 s in all): a smoke test.
#
# Needs: nginx, openssl, python3 (Debian packages), and cargo to build linerate.
# Every load is bounded by the bench's --duration; every process started here is
# stopped and the scratch directory removed on exit, however the script ends.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

rounds=5 duration=10 workers=1 bench_workers=1 sessions=16 json="" bin="" profile=0
parse_flags 2,34 "--quick:rounds=1 duration=4" --rounds=rounds --duration=duration --workers=workers \
    --bench-workers=bench_workers --sessions=sessions --json=json --bin=bin --profile:profile=1 -- "$@"

require_tools nginx openssl python3
build_linerate
start_work

dir="$work/root"
mkdir -p "$dir"
chmod 755 "$work" # nginx's workers run as another user
head -c 4096 /dev/urandom > "$dir/small.bin"
make_test_cert "$work"

# --- servers -------------------------------------------------------------
nginx_port=$(free_port)
write_nginx_conf "$work/nginx" "$workers" 16384 8192 "
    ssl_session_cache shared:SSL:10m;
    ssl_session_tickets on;
    server {
        listen 127.0.0.1:$nginx_port ssl reuseport;
        $(nginx_tls13_lines)
        root $dir;
    }"
nginx -c "$work/nginx/nginx.conf" -p "$work/nginx" &
nginx_master=$!
pids+=("$nginx_master")

cat > "$work/linerate.toml" <<TOML
[tls]
min_version = "1.3"
TOML
mapfile -t limits < <(loopback_limits)
"$bin" serve --config "$work/linerate.toml" "${limits[@]}" --root "$dir" --tls-listen 127.0.0.1:0 \
    --cert "$work/cert.pem" --key "$work/key.pem" --workers "$workers" --log-level info \
    > "$work/linerate.out" 2> "$work/linerate.err" &
linerate_pid=$!
pids+=("$linerate_pid")
wait_for_line "$work/linerate.out" '^listening https://' || { echo "linerate did not start" >&2; cat "$work/linerate.err" >&2; exit 1; }
linerate_url="$(sed -n 's/^listening \(https:.*\)/\1/p' "$work/linerate.out" | head -1)/"
nginx_url="https://127.0.0.1:$nginx_port/"
wait_port "$nginx_port" || { echo "nginx did not start" >&2; exit 1; }

server_ticks() {
    case "$1" in
        nginx) tree_ticks "$nginx_master" ;;
        linerate) proc_ticks "$linerate_pid" ;;
    esac
}
url_of() { if [ "$1" = nginx ]; then echo "$nginx_url"; else echo "$linerate_url"; fi; }

# What each server negotiates with a stock client (printed, and checked to be the
# same): protocol, cipher, key exchange, signature.
negotiated() {
    local port=${1##*:}
    port=${port%/}
    openssl s_client -connect "127.0.0.1:$port" -servername localhost -CAfile "$work/ca.pem" -brief \
        < /dev/null 2>&1 | sed -n 's/^\(Protocol version\|Ciphersuite\|Signature type\|Hash used\|Server Temp Key\|Negotiated TLS1.3 group\): *//p' |
        paste -sd ' ' -
}
ng_neg=$(negotiated "$nginx_url")
lr_neg=$(negotiated "$linerate_url")
[ "$profile" -eq 1 ] && rounds=1
echo "handshakes: $workers server worker(s), bench with $bench_workers thread(s) and $sessions connections, ${duration}s x $rounds rounds"
echo "host: $(nproc) CPUs, $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "nginx negotiates:    $ng_neg"
echo "linerate negotiates: $lr_neg"
echo "linerate $(grep -o 'tls_mode=[a-z-]*' "$work/linerate.err" | head -1)"
[ -n "$ng_neg" ] && [ "$ng_neg" = "$lr_neg" ] || { echo "the servers do not negotiate the same parameters" >&2; exit 1; }

# --- loads ---------------------------------------------------------------
# One run: appends "server mode handshakes_per_s server_cpu_s_per_1000 machine_cpu_s_per_1000
# full resumed errors" to the results.
results="$work/results"
: > "$results"
clk=$(getconf CLK_TCK)
run_one() {
    local server=$1 mode=$2 s0 m0 s1 m1 resume=()
    [ "$mode" = full ] && resume=(--no-resume)
    s0=$(server_ticks "$server"); m0=$(machine_busy)
    "$bin" bench --base-url "$(url_of "$server")" --files small.bin --cacert "$work/ca.pem" \
        --sessions "$sessions" --workers "$bench_workers" --duration "$duration" --max-rate \
        --segment-bytes 1024 --connection-per-request "${resume[@]}" --json > "$work/run.json"
    s1=$(server_ticks "$server"); m1=$(machine_busy)
    python3 - "$work/run.json" "$server" "$mode" $((s1 - s0)) $((m1 - m0)) "$clk" >> "$results" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
server, mode, ds, dm, clk = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
n = j["handshakes_full"] + j["handshakes_resumed"]
k = max(n, 1) / 1000
print(server, mode, "%.1f" % j["handshakes_per_s"], "%.4f" % (ds / clk / k), "%.4f" % (dm / clk / k),
      j["handshakes_full"], j["handshakes_resumed"], j["errors_total"])
PY
    tail -1 "$results" | awk '{ printf "  %-9s %-8s %8.1f handshakes/s  server %.4f CPU-s/1000  machine %.4f CPU-s/1000  full %d resumed %d errors %d\n", $1, $2, $3, $4, $5, $6, $7, $8 }'
}

# --profile: perf record of each server under a full-handshake load, then exit.
if [ "$profile" -eq 1 ]; then
    require_tools perf
    for s in linerate nginx; do
        if [ "$s" = nginx ]; then targets=$(pgrep -P "$nginx_master" | paste -sd, -); else targets=$linerate_pid; fi
        "$bin" bench --base-url "$(url_of "$s")" --files small.bin --cacert "$work/ca.pem" --sessions "$sessions" \
            --workers "$bench_workers" --duration "$duration" --max-rate --segment-bytes 1024 \
            --connection-per-request --no-resume --json > "$work/run.json" &
        bench_pid=$!
        pids+=("$bench_pid")
        sleep 1
        perf record -q -F 1999 -p "$targets" -o "$work/perf-$s.data" -- sleep $((duration > 3 ? duration - 2 : 1)) 2> /dev/null
        wait "$bench_pid"
        echo
        echo "== $s, full handshakes: $(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("%.0f handshakes/s" % j["handshakes_per_s"])' "$work/run.json")"
        echo "-- by library (share of the server's samples)"
        # sed, not head: it reads to the end, so no SIGPIPE fails the pipeline.
        perf report -i "$work/perf-$s.data" --stdio --no-children --sort dso 2> /dev/null | sed -n '/^ *[0-9]/p' | sed -n 1,8p
        echo "-- top symbols"
        perf report -i "$work/perf-$s.data" --stdio --no-children --sort dso,sym 2> /dev/null | sed -n '/^ *[0-9]/p' | sed -n 1,30p
    done
    exit 0
fi

for r in $(seq 1 "$rounds"); do
    order="nginx linerate"
    [ $((r % 2)) -eq 0 ] && order="linerate nginx"
    for mode in full resumed; do
        echo "round $r, $mode handshakes"
        for s in $order; do
            run_one "$s" "$mode"
        done
    done
done

# --- summary ---------------------------------------------------------------
print_results "$results" "$rounds" 2 "server|handshakes|handshakes/s|server CPU-s per 1000|machine CPU-s per 1000|full|resumed|errors" $json
col() { column_median "$results" "$3" "$1" "$2"; } # SERVER MODE FIELD
echo
table_head "handshakes|nginx /s|linerate /s|linerate/nginx|nginx server CPU-s/1000|linerate server CPU-s/1000|linerate/nginx CPU"
fail=0
for mode in full resumed; do
    awk -v m="$mode" -v ng="$(col nginx "$mode" 3)" -v lr="$(col linerate "$mode" 3)" \
        -v nc="$(col nginx "$mode" 4)" -v lc="$(col linerate "$mode" 4)" \
        'BEGIN { printf "| %s | %.0f | %.0f | %.3f | %.4f | %.4f | %.3f |\n", m, ng, lr, (ng > 0 ? lr / ng : 0), nc, lc, (nc > 0 ? lc / nc : 0) }'
done
errs=$(awk '{ e += $8 } END { print e + 0 }' "$results")
[ "$errs" -eq 0 ] || { echo "errors during the runs: $errs" >&2; fail=1; }
awk '$2 == "full" && $7 > 0 { bad = 1 } END { exit bad }' "$results" ||
    { echo "a --no-resume run resumed sessions" >&2; fail=1; }
awk '$2 == "resumed" && $7 < 0.9 * ($6 + $7) { bad = 1 } END { exit bad }' "$results" ||
    { echo "a resumed run resumed less than 90 % of its handshakes" >&2; fail=1; }
awk '$3 <= 0 { bad = 1 } END { exit bad }' "$results" || { echo "a run made no handshake" >&2; fail=1; }
echo
echo "medians of $rounds rounds; the host is shared: compare runs of the same round"
exit $fail
