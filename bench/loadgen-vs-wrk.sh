#!/usr/bin/env bash
# linerate bench (closed loop) vs wrk, side by side, against the same linerate.
#
# Same content and request shape as bench/compare-nginx.sh: 8 files of 256 MiB warmed
# into the page cache, 2 MiB ranges. wrk runs -t2 with each request
# `Range: bytes=0-2097151` on the next file; `linerate bench --max-rate` runs with the
# same connection count (one session = one connection) and 2 workers, fetching
# 2 MiB segments of titles chosen uniformly (--zipf 0). The two clients alternate
# for several rounds. Printed per connection count: median Gb/s of each client and
# their ratio, and each client's own CPU seconds per GB (user+sys from getrusage of
# the finished client process), plus the server's and the whole machine's.
#
# Target: bench Gb/s within 10% of wrk's, bench CPU-s/GB <= wrk's.
#
# Usage: bench/loadgen-vs-wrk.sh [--quick] [--rounds N] [--duration S]
#          [--workers N] [--conns "16 256"] [--dir DIR] [--bin PATH]
#   --quick   1 round of 2 s, 2 files of 16 MiB: a smoke test.
#
# Needs: wrk, python3 (Debian packages), and cargo to build linerate.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

rounds=3 duration=10 workers=2 conns="16 256" dir="${TMPDIR:-/tmp}/linerate-bench" bin=""
files=8 file_mib=256 quick=0
parse_flags 2,21 "--quick:quick=1 rounds=1 duration=2 files=2 file_mib=16" --rounds=rounds --duration=duration \
    --workers=workers --conns=conns --dir=dir --bin=bin -- "$@"
[ "$quick" -eq 1 ] && dir="$dir-quick"

require_tools wrk python3
build_linerate

start_work

make_content "$dir" "$files" "$file_mib"
file_list=$(seq -f "f%g.bin" -s , 1 "$files")
write_range_lua "$work/range.lua" "$files"

mapfile -t limits < <(loopback_limits)
"$bin" serve "${limits[@]}" --root "$dir" --listen 127.0.0.1:0 --admin 127.0.0.1:0 --workers "$workers" --log-level warn > "$work/linerate.out" &
pids+=($!)
server_pid=$!
wait_for_line "$work/linerate.out" '^listening http://' || true
url=$(sed -n 's/^listening \(http:.*\)/\1/p' "$work/linerate.out" | head -1)
[ -n "$url" ] || { echo "linerate did not start" >&2; exit 1; }

clk=$(getconf CLK_TCK)
# Runs a command; its stdout goes to $work/out, its user+sys CPU seconds to $work/cpu.
with_cpu() {
    python3 - "$@" > "$work/out" <<'PY'
import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(r.ru_utime + r.ru_stime, file=sys.stderr)
PY
}

results="$work/results"
run_one() {
    local client=$1 c=$2 s0 m0 s1 m1 cpu gbps bytes errors
    s0=$(proc_ticks "$server_pid"); m0=$(machine_busy)
    case "$client" in
        wrk) cpu=$(with_cpu wrk -t2 -c"$c" -d"${duration}s" -s "$work/range.lua" "$url/" 2>&1 >/dev/null | tail -1)
             read -r bytes gbps errors < <(awk '/^RESULT/ { for (i = 2; i <= NF; i++) { split($i, kv, "="); r[kv[1]] = kv[2] }
                 printf "%.0f %.3f %d\n", r["bytes"], r["bytes"] * 8 / r["duration_us"] / 1000, r["errors"] + r["status"] }' "$work/out") ;;
        bench) cpu=$(with_cpu "$bin" bench --base-url "$url/" --files "$file_list" --sessions "$c" --workers 2 \
                 --duration "$duration" --max-rate --zipf 0 --segment-bytes 2097152 --json 2>&1 >/dev/null | tail -1)
             read -r bytes gbps errors < <(python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))
print(j["bytes"], "%.3f" % j["gbps"], j["errors_total"])' "$work/out") ;;
    esac
    s1=$(proc_ticks "$server_pid"); m1=$(machine_busy)
    awk -v cl="$client" -v c="$c" -v g="$gbps" -v b="$bytes" -v cpu="$cpu" -v ds=$((s1 - s0)) -v dm=$((m1 - m0)) \
        -v clk="$clk" -v e="$errors" 'BEGIN { gb = b / 1e9; if (gb <= 0) gb = 1e-9
        printf "%s %d %.3f %.4f %.4f %.4f %d\n", cl, c, g, cpu / gb, (ds / clk) / gb, (dm / clk) / gb, e }' >> "$results"
    tail -1 "$results" | awk '{ printf "  %-6s c=%-4s %7.2f Gb/s  client %.4f CPU-s/GB  server %.4f  machine %.4f  errors %d\n", $1, $2, $3, $4, $5, $6, $7 }'
}

echo "linerate bench --max-rate vs wrk -t2 against linerate ($workers workers): $files files x $file_mib MiB, 2 MiB ranges, ${duration}s x $rounds rounds"
echo "host: $(nproc) CPUs, $(uname -r)"
for c in $conns; do
    for r in $(seq 1 "$rounds"); do
        echo "round $r, $c connections"
        run_one wrk "$c"
        run_one bench "$c"
    done
done

col() { column_median "$results" "$3" "$1" "$2"; } # CLIENT CONNECTIONS FIELD
echo
table_head "connections|wrk Gb/s|bench Gb/s|ratio|wrk client CPU-s/GB|bench client CPU-s/GB|server CPU-s/GB (wrk / bench)|machine CPU-s/GB (wrk / bench)"
fail=0
for c in $conns; do
    awk -v c="$c" -v wg="$(col wrk "$c" 3)" -v bg="$(col bench "$c" 3)" -v wc="$(col wrk "$c" 4)" -v bc="$(col bench "$c" 4)" \
        -v ws="$(col wrk "$c" 5)" -v bs="$(col bench "$c" 5)" -v wm="$(col wrk "$c" 6)" -v bm="$(col bench "$c" 6)" \
        'BEGIN { printf "| %d | %.1f | %.1f | %.3f | %.4f | %.4f | %.4f / %.4f | %.4f / %.4f |\n", c, wg, bg, (wg > 0 ? bg / wg : 0), wc, bc, ws, bs, wm, bm }'
    errs=$(awk -v c="$c" '$2 == c { e += $7 } END { print e + 0 }' "$results")
    [ "$errs" -eq 0 ] || { echo "errors during the $c-connection runs: $errs" >&2; fail=1; }
done
echo
echo "medians of $rounds rounds; client CPU = user+sys of the client process (getrusage)"
exit $fail
