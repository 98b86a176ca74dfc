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
# Usage: bench/compare-nginx.sh [--quick] [--rounds N] [--duration S]
#          [--workers N] [--conns "16 256"] [--dir DIR] [--bin PATH]
#   --quick   1 round of 2 s per workload, 2 files of 16 MiB: a smoke test.
#
# Needs: nginx, wrk, iperf3, python3 (Debian packages), and cargo to build linerate.
# Every load is bounded by wrk's duration; all servers are stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=3 duration=10 workers=$(nproc) conns="16 256" dir="${TMPDIR:-/tmp}/linerate-bench" bin=""
files=8 file_mib=256 quick=0
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 rounds=1 duration=2 files=2 file_mib=16 ;;
        --rounds) rounds=$2; shift ;;
        --duration) duration=$2; shift ;;
        --workers) workers=$2; shift ;;
        --conns) conns=$2; shift ;;
        --dir) dir=$2; shift ;;
        --bin) bin=$2; shift ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
[ "$quick" -eq 1 ] && dir="$dir-quick"

for tool in nginx wrk iperf3; do
    command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install nginx wrk iperf3)" >&2; exit 1; }
done
if [ -z "$bin" ]; then
    cargo build --release --locked -q -p linerate
    bin=target/release/linerate
fi

work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# --- content -------------------------------------------------------------
mkdir -p "$dir"
size=$((file_mib * 1024 * 1024))
for i in $(seq 1 "$files"); do
    f="$dir/f$i.bin"
    if [ "$(stat -c %s "$f" 2>/dev/null || echo 0)" != "$size" ]; then
        head -c "$size" /dev/urandom > "$f"
    fi
    cat "$f" > /dev/null # into the page cache
done

cat > "$work/range.lua" <<EOF
local n = 0
local files = $files
request = function()
  n = n + 1
  return wrk.format("GET", "/f" .. (n % files + 1) .. ".bin", { ["Range"] = "bytes=0-2097151" })
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT bytes=%d requests=%d duration_us=%d errors=%d status=%d\n",
    summary.bytes, summary.requests, summary.duration,
    e.connect + e.read + e.write + e.timeout, e.status))
end
EOF

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# --- servers -------------------------------------------------------------
nginx_port=$(free_port)
mkdir -p "$work/nginx"
cat > "$work/nginx/nginx.conf" <<EOF
worker_processes $workers;
daemon off;
master_process on;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
worker_rlimit_nofile 16384;
events { worker_connections 8192; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_requests 1000000;
    open_file_cache max=1000;
    client_body_temp_path $work/nginx;
    proxy_temp_path $work/nginx;
    fastcgi_temp_path $work/nginx;
    uwsgi_temp_path $work/nginx;
    scgi_temp_path $work/nginx;
    types { application/octet-stream bin; }
    server {
        listen 127.0.0.1:$nginx_port reuseport;
        root $dir;
    }
}
EOF
nginx -c "$work/nginx/nginx.conf" -p "$work/nginx" &
pids+=($!)
nginx_master=$!

"$bin" serve --root "$dir" --listen 127.0.0.1:0 --workers "$workers" --log-level warn > "$work/linerate.out" &
pids+=($!)
linerate_pid=$!
for _ in $(seq 1 100); do
    grep -q '^listening http://' "$work/linerate.out" 2>/dev/null && break
    sleep 0.05
done
linerate_url=$(sed -n 's/^listening //p' "$work/linerate.out" | head -1)
[ -n "$linerate_url" ] || { echo "linerate did not start" >&2; exit 1; }
for _ in $(seq 1 100); do
    curl -s -o /dev/null "http://127.0.0.1:$nginx_port/f1.bin" -r 0-0 && break
    sleep 0.05
done

clk=$(getconf CLK_TCK)
# utime+stime of a process and its threads; for nginx, all of the master's children.
proc_ticks() { awk '{ sub(/^.*\) /, ""); split($0, f, " "); print f[12] + f[13] }' "/proc/$1/stat"; }
server_ticks() {
    case "$1" in
        nginx)
            local t=0
            for p in $(pgrep -P "$nginx_master") "$nginx_master"; do t=$((t + $(proc_ticks "$p"))); done
            echo "$t" ;;
        linerate) proc_ticks "$linerate_pid" ;;
    esac
}
# busy ticks of the whole machine: user nice system irq softirq steal
machine_busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }

url_of() { case "$1" in nginx) echo "http://127.0.0.1:$nginx_port/";; linerate) echo "$linerate_url/";; esac; }

# Runs one load; appends "server conns gbps srv_cpu_per_gb machine_cpu_per_gb requests errors" to results.
results="$work/results"
run_one() {
    local server=$1 c=$2
    local s0 m0 s1 m1 out
    s0=$(server_ticks "$server"); m0=$(machine_busy)
    out=$(wrk -t2 -c"$c" -d"${duration}s" -s "$work/range.lua" "$(url_of "$server")")
    s1=$(server_ticks "$server"); m1=$(machine_busy)
    echo "$out" | awk -v srv="$server" -v c="$c" -v ds=$((s1 - s0)) -v dm=$((m1 - m0)) -v clk="$clk" '
        /^RESULT/ {
            for (i = 2; i <= NF; i++) { split($i, kv, "="); r[kv[1]] = kv[2] }
            gb = r["bytes"] / 1e9
            printf "%s %d %.2f %.4f %.4f %d %d\n", srv, c, r["bytes"] * 8 / r["duration_us"] / 1000,
                (ds / clk) / gb, (dm / clk) / gb, r["requests"], r["errors"] + r["status"]
        }' >> "$results"
    tail -1 "$results" | awk '{ printf "  %-8s c=%-4s %7.2f Gb/s  server %.4f CPU-s/GB  machine %.4f CPU-s/GB  errors %d\n", $1, $2, $3, $4, $5, $7 }'
}

echo "linerate vs nginx: $workers workers each, $files files x $file_mib MiB, wrk -t2, ${duration}s x $rounds rounds"
echo "host: $(nproc) CPUs, $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
for c in $conns; do
    for r in $(seq 1 "$rounds"); do
        echo "round $r, $c connections"
        run_one nginx "$c"
        run_one linerate "$c"
    done
done

# --- ceiling ---------------------------------------------------------------
iperf_port=$(free_port)
iperf3 -s -1 -p "$iperf_port" > /dev/null 2>&1 &
pids+=($!)
sleep 0.3
iperf=$(iperf3 -c 127.0.0.1 -p "$iperf_port" -Z -t "$duration" 2>/dev/null | awk '/receiver/ { print $(NF-2) " " $(NF-1) }')

# --- summary ---------------------------------------------------------------
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print 0; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
col() { awk -v s="$1" -v c="$2" -v k="$3" '$1 == s && $2 == c { print $k }' "$results" | median; }
echo
echo "| connections | nginx Gb/s | linerate Gb/s | ratio | nginx server CPU-s/GB | linerate server CPU-s/GB | nginx machine CPU-s/GB | linerate machine CPU-s/GB |"
echo "|---|---|---|---|---|---|---|---|"
fail=0
for c in $conns; do
    ng=$(col nginx "$c" 3); lr=$(col linerate "$c" 3)
    awk -v c="$c" -v ng="$ng" -v lr="$lr" -v ns="$(col nginx "$c" 4)" -v ls="$(col linerate "$c" 4)" \
        -v nm="$(col nginx "$c" 5)" -v lm="$(col linerate "$c" 5)" \
        'BEGIN { printf "| %d | %.1f | %.1f | %.3f | %.4f | %.4f | %.4f | %.4f |\n", c, ng, lr, (ng > 0 ? lr / ng : 0), ns, ls, nm, lm }'
    errs=$(awk -v c="$c" '$2 == c { e += $7 } END { print e + 0 }' "$results")
    [ "$errs" -eq 0 ] || { echo "errors during the $c-connection runs: $errs" >&2; fail=1; }
    awk -v lr="$lr" 'BEGIN { exit !(lr > 0) }' || { echo "linerate moved no data at c=$c" >&2; fail=1; }
done
echo
echo "medians of $rounds rounds; iperf3 -Z loopback ceiling (one stream): ${iperf:-n/a}"
exit $fail
