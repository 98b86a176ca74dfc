#!/usr/bin/env bash
# linerate vs nginx, side by side, on the same files with the same client.
#
# Serves 8 random files of 256 MiB (warmed into the page cache) from nginx and from
# linerate with the same number of workers, and drives each with wrk (-t2, each
# request `Range: bytes=0-2097151` on the next of the 8 files) at 16 and 256
# connections, alternating nginx and linerate for several rounds. Prints, per
# workload, the median Gb/s of each server and their ratio, and two costs per GB
# served: the server process's CPU seconds (utime+stime from /proc/<pid>/stat, all
# nginx workers summed) and the whole machine's busy CPU seconds (from /proc/stat).
# Also prints iperf3 -Z over loopback as the ceiling for one TCP stream.
#
# HTTPS runs use one ECDSA P-256 certificate for both servers and TLS 1.3 with
# AES-128-GCM; nginx has `ssl_conf_command Options KTLS` (kernel TLS where the
# kernel has it, OpenSSL in user space otherwise), linerate its defaults (kernel TLS
# where available, its user-space record layer otherwise). The TLS mode each
# server ends up in is printed.
#
# With --access-log, each server also runs a second time with an access log on, in
# the same rounds ("nginx-log": `access_log ... combined buffer=64k flush=1s`, nginx's
# buffered logging; "linerate-log": `--access-log`, JSON lines), and a second table
# gives each server's Gb/s with the log on against off and its server CPU time per
# request both ways: what logging costs. --log-format combined makes linerate write
# nginx's format too, so both write the same kind of line.
#
# Both servers keep open files and trust them for 60 s without checking their paths
# again: nginx's `open_file_cache max=1000` (whose `open_file_cache_valid` is 60 s by
# default) and linerate's `[open_file_cache] valid = "60s"` (its default, 0, checks
# every request with an `fstatat`).
#
# --range-bytes N asks for the first N bytes of each file instead of 2 MiB (e.g. 1024,
# to see per-request costs such as logging).
#
# Usage: bench/compare-nginx.sh [--quick] [--rounds N] [--duration S] [--access-log]
#          [--log-format json|combined] [--range-bytes N] [--workers N]
#          [--conns "16 256"] [--proto "http https"] [--dir DIR] [--bin PATH]
#   --quick   1 round of 2 s per workload, 2 files of 16 MiB: a smoke test.
#
# Needs: nginx, wrk, iperf3, python3 (Debian packages), and cargo to build linerate.
# Every load is bounded by wrk's duration; all servers are stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

rounds=3 duration=10 workers=$(nproc) conns="16 256" protos="http https" dir="${TMPDIR:-/tmp}/linerate-bench" bin=""
files=8 file_mib=256 quick=0 access_log=0 log_format=json range_bytes=2097152
parse_flags 2,34 "--quick:quick=1 rounds=1 duration=2 files=2 file_mib=16" --rounds=rounds --duration=duration \
    --workers=workers --conns=conns --proto=protos --dir=dir --bin=bin "--access-log:access_log=1" \
    '--log-format=log_format:case "$log_format" in json|combined) ;; *) echo "--log-format: json or combined" >&2; exit 2 ;; esac' \
    --range-bytes=range_bytes -- "$@"
[ "$quick" -eq 1 ] && dir="$dir-quick"

require_tools nginx wrk iperf3 openssl python3
build_linerate

start_work

# --- content -------------------------------------------------------------
make_content "$dir" "$files" "$file_mib"
write_range_lua "$work/range.lua" "$files" "$range_bytes"

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=localhost \
    -keyout "$work/key.pem" -out "$work/cert.pem" 2> /dev/null

# --- servers -------------------------------------------------------------
nginx_port=$(free_port)
nginx_tls_port=$(free_port)
nginx_log_port=$(free_port)
nginx_log_tls_port=$(free_port)
servers="nginx linerate"
log_blocks=""
if [ "$access_log" -eq 1 ]; then
    servers="nginx nginx-log linerate linerate-log"
    log_blocks="
    server {
        listen 127.0.0.1:$nginx_log_port reuseport;
        access_log $work/nginx-access.log combined buffer=64k flush=1s;
        root $dir;
    }
    server {
        listen 127.0.0.1:$nginx_log_tls_port ssl reuseport;
        access_log $work/nginx-access.log combined buffer=64k flush=1s;
        $(nginx_tls13_lines)
        root $dir;
    }"
fi
write_nginx_conf "$work/nginx" "$workers" 16384 8192 "$log_blocks
    server {
        listen 127.0.0.1:$nginx_port reuseport;
        root $dir;
    }
    server {
        listen 127.0.0.1:$nginx_tls_port ssl reuseport;
        $(nginx_tls13_lines)
        root $dir;
    }"
nginx -c "$work/nginx/nginx.conf" -p "$work/nginx" &
pids+=($!)
nginx_master=$!

mapfile -t limits < <(loopback_limits)
# start_linerate_on NAME CONFIG WHAT: a linerate with CONFIG and an HTTP and an HTTPS
# listener, its output in $work/NAME.out and .err; sets VAR_pid, VAR_url and
# VAR_tls_url, VAR being NAME with `-` as `_`. WHAT names it if it does not start.
start_linerate_on() {
    local var=${1//-/_} url
    "$bin" serve --config "$2" "${limits[@]}" --root "$dir" --listen 127.0.0.1:0 --tls-listen 127.0.0.1:0 --cert "$work/cert.pem" \
        --key "$work/key.pem" --workers "$workers" --admin 127.0.0.1:0 --log-level info > "$work/$1.out" 2> "$work/$1.err" &
    pids+=($!)
    printf -v "${var}_pid" %s "$!"
    wait_for_line "$work/$1.out" '^listening https://' || true
    url=$(sed -n 's/^listening \(http:.*\)/\1/p' "$work/$1.out" | head -1)
    printf -v "${var}_url" %s "$url"
    printf -v "${var}_tls_url" %s "$(sed -n 's/^listening \(https:.*\)/\1/p' "$work/$1.out" | head -1)"
    [ -n "$url" ] || { echo "$3 did not start" >&2; exit 1; }
}
# The same open-file cache validity as nginx's (see the header).
printf '[open_file_cache]\nvalid = "60s"\n' > "$work/linerate.toml"
start_linerate_on linerate "$work/linerate.toml" linerate
if [ "$access_log" -eq 1 ]; then
    { cat "$work/linerate.toml"; printf '[access_log]\npath = "%s"\nformat = "%s"\n' "$work/linerate-access.log" "$log_format"; } \
        > "$work/linerate-log.toml"
    start_linerate_on linerate-log "$work/linerate-log.toml" "linerate (with access log)"
fi
for _ in $(seq 1 100); do
    curl -s -o /dev/null "http://127.0.0.1:$nginx_port/f1.bin" -r 0-0 && break
    sleep 0.05
done

# CPU ticks of a server: for nginx, the master and all its workers.
server_ticks() {
    case "$1" in
        nginx|nginx-log) tree_ticks "$nginx_master" ;;
        linerate) proc_ticks "$linerate_pid" ;;
        linerate-log) proc_ticks "$linerate_log_pid" ;;
    esac
}

url_of() {
    case "$1/$2" in
        nginx/http) echo "http://127.0.0.1:$nginx_port/" ;;
        nginx/https) echo "https://127.0.0.1:$nginx_tls_port/" ;;
        linerate/http) echo "$linerate_url/" ;;
        linerate/https) echo "$linerate_tls_url/" ;;
        nginx-log/http) echo "http://127.0.0.1:$nginx_log_port/" ;;
        nginx-log/https) echo "https://127.0.0.1:$nginx_log_tls_port/" ;;
        linerate-log/http) echo "$linerate_log_url/" ;;
        linerate-log/https) echo "$linerate_log_tls_url/" ;;
    esac
}

# Runs one load; appends "server workload gbps srv_cpu_per_gb machine_cpu_per_gb requests errors"
# to the results, where workload is proto/conns.
results="$work/results"
touch "$results"
run_one() {
    local server=$1 proto=$2 c=$3
    local s0 m0 s1 m1 out
    s0=$(server_ticks "$server"); m0=$(machine_busy)
    out=$(wrk -t2 -c"$c" -d"${duration}s" -s "$work/range.lua" "$(url_of "$server" "$proto")")
    s1=$(server_ticks "$server"); m1=$(machine_busy)
    echo "$out" | wrk_row "$server" "$proto/$c" $((s1 - s0)) $((m1 - m0)) >> "$results"
    tail -1 "$results" | awk '{ printf "  %-12s %-10s %7.2f Gb/s  server %.4f CPU-s/GB  machine %.4f CPU-s/GB  errors %d\n", $1, $2, $3, $4, $5, $7 }'
}

echo "linerate vs nginx: $workers workers each, $files files x $file_mib MiB, wrk -t2, ${duration}s x $rounds rounds"
echo "host: $(nproc) CPUs, $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
case " $protos " in
    *" https "*)
        echo "linerate TLS: $(grep -o 'tls_mode=[a-z-]*' "$work/linerate.err" | head -1)"
        if grep -q '^tls ' /proc/modules 2> /dev/null || [ -e /proc/net/tls_stat ]; then
            echo "kernel TLS available: nginx may use it (see /proc/net/tls_stat)"
        else
            echo "kernel TLS not available here: nginx uses OpenSSL in user space"
        fi ;;
esac
workloads=""
for proto in $protos; do
    for c in $conns; do
        workloads="$workloads $proto/$c"
        for r in $(seq 1 "$rounds"); do
            echo "round $r, $proto, $c connections"
            for s in $servers; do
                run_one "$s" "$proto" "$c"
            done
        done
    done
done

# --- ceiling ---------------------------------------------------------------
iperf_port=$(free_port)
iperf3 -s -1 -p "$iperf_port" > /dev/null 2>&1 &
pids+=($!)
sleep 0.3
iperf=$(iperf3 -c 127.0.0.1 -p "$iperf_port" -Z -t "$duration" 2>/dev/null | awk '/receiver/ { print $(NF-2) " " $(NF-1) }')

# --- summary ---------------------------------------------------------------
col() { column_median "$results" "$3" "$1" "$2"; } # SERVER WORKLOAD FIELD
echo
table_head "workload|nginx Gb/s|linerate Gb/s|ratio|nginx server CPU-s/GB|linerate server CPU-s/GB|nginx machine CPU-s/GB|linerate machine CPU-s/GB"
fail=0
for w in $workloads; do
    ng=$(col nginx "$w" 3); lr=$(col linerate "$w" 3)
    awk -v w="$w" -v ng="$ng" -v lr="$lr" -v ns="$(col nginx "$w" 4)" -v ls="$(col linerate "$w" 4)" \
        -v nm="$(col nginx "$w" 5)" -v lm="$(col linerate "$w" 5)" \
        'BEGIN { printf "| %s | %.1f | %.1f | %.3f | %.4f | %.4f | %.4f | %.4f |\n", w, ng, lr, (ng > 0 ? lr / ng : 0), ns, ls, nm, lm }'
    errs=$(awk -v w="$w" '$2 == w { e += $7 } END { print e + 0 }' "$results")
    [ "$errs" -eq 0 ] || { echo "errors during the $w runs: $errs" >&2; fail=1; }
    awk -v lr="$lr" 'BEGIN { exit !(lr > 0) }' || { echo "linerate moved no data in $w" >&2; fail=1; }
done
if [ "$access_log" -eq 1 ]; then
    # Server CPU microseconds per request of one run: CPU-s/GB x GB / requests.
    per_req() {
        awk -v s="$1" -v w="$2" -v d="$duration" '$1 == s && $2 == w && $6 > 0 { print $4 * ($3 * d / 8) / $6 * 1e6 }' "$results" | median
    }
    echo
    echo "Access log cost (log on against off, same rounds):"
    echo
    table_head "workload|server|Gb/s off|Gb/s on|on/off|server CPU us/request off|on|logging us/request"
    for w in $workloads; do
        for s in nginx linerate; do
            off=$(col "$s" "$w" 3); on=$(col "$s-log" "$w" 3)
            awk -v w="$w" -v s="$s" -v off="$off" -v on="$on" -v co="$(per_req "$s" "$w")" -v cn="$(per_req "$s-log" "$w")" \
                'BEGIN { printf "| %s | %s | %.2f | %.2f | %.3f | %.1f | %.1f | %.1f |\n", w, s, off, on, (off > 0 ? on / off : 0), co, cn, cn - co }'
        done
    done
    # The last records reach the file within a second or two (buffers flush after a second).
    lr_reqs=$(awk '$1 == "linerate-log" { n += $6 } END { print n + 0 }' "$results")
    for _ in $(seq 1 20); do
        lr_lines=$(wc -l < "$work/linerate-access.log" 2> /dev/null || echo 0)
        [ "$lr_lines" -ge "$lr_reqs" ] && break
        sleep 0.25
    done
    ng_lines=$(wc -l < "$work/nginx-access.log" 2> /dev/null || echo 0)
    echo
    echo "records written: linerate $lr_lines (wrk counted $lr_reqs complete requests), nginx $ng_lines"
    [ "$lr_lines" -ge "$lr_reqs" ] || { echo "linerate logged fewer records than requests" >&2; fail=1; }
fi
echo
echo "medians of $rounds rounds; iperf3 -Z loopback ceiling (one stream): ${iperf:-n/a}"
exit $fail
