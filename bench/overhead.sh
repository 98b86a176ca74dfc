#!/usr/bin/env bash
# What a feature costs on a hot catalogue: linerate with it ("on") against linerate
# without it ("off"), on the same load (wrk, 2 MiB ranges of files in the page
# cache), alternating for several rounds. Prints the median Gb/s and server CPU
# seconds per GB of each and the difference.
#
# --feature stats (default): the admin endpoint scraped every second and TCP_INFO
#   sampled on 1% of connections, against no admin endpoint and no sampling. The
#   per-worker counters themselves are always on (a plain store on the worker's own
#   cache line); what can be turned off is reading them and the sampling.
# --feature fill: the page-cache residency check before every body range (and the
#   fill pool behind it, idle here since everything is resident), against
#   `fill.enabled = false`. With --files large enough that the check's memo rarely
#   hits, it measures the check itself.
# --feature build --base-bin PATH: this build ("on") against another linerate binary
#   ("off"), both with the default configuration: what a change to the hot path costs.
#
# --range-mib M asks for the first M MiB of each file (default 2: one fill window).
#
# Usage: bench/overhead.sh [--feature stats|fill|build] [--base-bin PATH] [--quick]
#          [--rounds N] [--duration S] [--conns C] [--files N] [--file-mib M]
#          [--range-mib M] [--bin PATH]
# Needs: wrk, curl, python3 (Debian packages), and cargo to build linerate.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

rounds=5 duration=10 conns=16 bin="" files=8 file_mib=256 dir="${TMPDIR:-/tmp}/linerate-bench" feature=stats
base_bin="" range_mib=2
parse_flags 2,26 --feature=feature --base-bin=base_bin --range-mib=range_mib --files=files --file-mib=file_mib \
    '--quick:rounds=1 duration=2 files=2 file_mib=16 dir="$dir-quick"' --rounds=rounds --duration=duration \
    --conns=conns --bin=bin -- "$@"
require_tools wrk curl python3
build_linerate

start_work

make_content "$dir" "$files" "$file_mib"
write_range_lua "$work/range.lua" "$files" $((range_mib * 1024 * 1024))

start_server() { # name config-text extra-args...
    local name=$1 conf=$2
    shift 2
    printf 'root = "%s"\n%s\n' "$dir" "$conf" > "$work/$name.toml"
    local limits server_bin=$bin
    [ "$feature" != build ] || [ "$name" != off ] || server_bin=$base_bin
    mapfile -t limits < <(bin=$server_bin loopback_limits)
    "$server_bin" serve --config "$work/$name.toml" --listen 127.0.0.1:0 --log-level warn "${limits[@]}" "$@" > "$work/$name.out" &
    pids+=($!)
    eval "${name}_pid=$!"
    wait_for_line "$work/$name.out" '^listening http://' || { echo "$name did not start" >&2; exit 1; }
    eval "${name}_url=$(sed -n 's/^listening \(http:.*\)/\1/p' "$work/$name.out" | head -1)"
}
case "$feature" in
    stats)
        start_server off $'[stats]\ntcp_info_sample = 0.0' --no-admin
        start_server on $'[stats]\ntcp_info_sample = 0.01' --admin 127.0.0.1:0
        on_admin=$(sed -n 's/^listening admin \(http:.*\)/\1/p' "$work/on.out")
        # A scraper, as Prometheus would run it, against "on" only.
        ( while true; do curl -s -o /dev/null "$on_admin/metrics"; curl -s -o /dev/null "$on_admin/status"; sleep 1; done ) &
        pids+=($!)
        on_label="on (scraped every 1 s, 1% TCP_INFO)" off_label="off (no admin, no sampling)"
        ;;
    fill)
        start_server off $'[fill]\nenabled = false' --no-admin
        start_server on $'[fill]\nenabled = true' --no-admin
        on_label="on (residency check, fill pool)" off_label="off (fill.enabled = false)"
        ;;
    build)
        [ -x "$base_bin" ] || { echo "--feature build needs --base-bin PATH (a linerate binary)" >&2; exit 2; }
        start_server off '' --no-admin
        start_server on '' --no-admin
        on_label="this build ($bin)" off_label="base ($base_bin)"
        ;;
    *) echo "unknown --feature $feature (stats, fill or build)" >&2; exit 2 ;;
esac

results="$work/results"
: > "$results"
echo "$feature overhead: $conns connections, ${duration}s x $rounds rounds, $files files x $file_mib MiB, ${range_mib} MiB ranges"
for r in $(seq 1 "$rounds"); do
    for variant in off on; do
        pid_var="${variant}_pid" url_var="${variant}_url"
        pid=${!pid_var} url=${!url_var}
        s0=$(proc_ticks "$pid"); m0=$(machine_busy)
        out=$(wrk -t2 -c"$conns" -d"${duration}s" -s "$work/range.lua" "$url/")
        s1=$(proc_ticks "$pid"); m1=$(machine_busy)
        echo "$out" | wrk_row "$variant" "c$conns" $((s1 - s0)) $((m1 - m0)) >> "$results"
        tail -1 "$results" | awk '{ printf "  round '"$r"' %-3s %7.2f Gb/s  server %.4f CPU-s/GB  errors %d\n", $1, $3, $4, $7 }'
    done
done
col() { column_median "$results" "$2" "$1"; } # VARIANT FIELD
off_cpu=$(col off 4) on_cpu=$(col on 4) off_gbps=$(col off 3) on_gbps=$(col on 3)
echo
table_head "variant|Gb/s|server CPU-s/GB"
echo "| $off_label | $off_gbps | $off_cpu |"
echo "| $on_label | $on_gbps | $on_cpu |"
awk -v a="$off_cpu" -v b="$on_cpu" 'BEGIN { printf "\nserver CPU-s/GB, on vs off: %+.1f%% (medians of '"$rounds"' rounds)\n", (b - a) / a * 100 }'
errs=$(awk '{ e += $7 } END { print e + 0 }' "$results")
[ "$errs" -eq 0 ] || { echo "errors during the runs: $errs" >&2; exit 1; }
