# Helpers shared by the benchmark scripts (sourced, not run).

# require_tools TOOL...: exits with a clear message when one is missing.
require_tools() {
    local t
    for t in "$@"; do
        command -v "$t" >/dev/null || { echo "missing $t (apt-get install $*)" >&2; exit 1; }
    done
}

# build_linerate: sets `bin` to a release linerate, building one unless --bin gave it.
build_linerate() {
    if [ -z "${bin:-}" ]; then
        cargo build --release --locked -q -p linerate
        bin=target/release/linerate
    fi
}

# start_work: a scratch directory in `work`, and an exit trap that stops every PID
# appended to `pids` and removes the directory.
start_work() {
    work=$(mktemp -d)
    pids=()
    trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"' EXIT
}

# make_content DIR FILES MIB [PREFIX]: FILES random files of MIB MiB (PREFIX1.bin ...,
# PREFIX defaulting to f), kept across runs when their size is right, and read once
# into the page cache.
make_content() {
    local dir=$1 files=$2 mib=$3 prefix=${4:-f} size i f
    mkdir -p "$dir"
    size=$((mib * 1024 * 1024))
    for i in $(seq 1 "$files"); do
        f="$dir/$prefix$i.bin"
        if [ "$(stat -c %s "$f" 2>/dev/null || echo 0)" != "$size" ]; then
            head -c "$size" /dev/urandom > "$f"
        fi
        cat "$f" > /dev/null
    done
}

# write_range_lua FILE FILES: a wrk script asking `Range: bytes=0-2097151` of the next
# of FILES files per request, and printing an exact RESULT line at the end.
write_range_lua() {
    cat > "$1" <<LUA
local n = 0
local files = $2
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
LUA
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# utime+stime (clock ticks) of a process, all its threads included.
proc_ticks() { awk '{ sub(/^.*\) /, ""); split($0, f, " "); print f[12] + f[13] }' "/proc/$1/stat"; }

# Busy ticks of the whole machine: user nice system irq softirq steal.
machine_busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }

# median of the numbers on stdin.
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print 0; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# wait_for_line FILE PATTERN: up to 5 s for a line matching PATTERN in FILE.
wait_for_line() {
    local i
    for i in $(seq 1 100); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.05
    done
    return 1
}

# wrk_row LABEL WORKLOAD DS_TICKS DM_TICKS: turns wrk's RESULT line (stdin) into
# "LABEL WORKLOAD gbps server_cpu_s_per_gb machine_cpu_s_per_gb requests errors".
wrk_row() {
    awk -v srv="$1" -v w="$2" -v ds="$3" -v dm="$4" -v clk="$(getconf CLK_TCK)" '
        /^RESULT/ {
            for (i = 2; i <= NF; i++) { split($i, kv, "="); r[kv[1]] = kv[2] }
            gb = r["bytes"] / 1e9
            if (gb == 0) gb = 1e-9
            printf "%s %s %.2f %.4f %.4f %d %d\n", srv, w, r["bytes"] * 8 / r["duration_us"] / 1000,
                (ds / clk) / gb, (dm / clk) / gb, r["requests"], r["errors"] + r["status"]
        }'
}

# write_nginx_conf DIR WORKERS NOFILE CONNECTIONS SERVERS: DIR/nginx.conf for a
# benchmark nginx in the foreground: WORKERS workers that may open NOFILE files and
# CONNECTIONS connections each, sendfile with nopush/nodelay, no access log, an open
# file cache, temporary paths inside DIR, and the given `server { }` blocks.
write_nginx_conf() {
    local d=$1 workers=$2 nofile=$3 conns=$4 servers=$5
    mkdir -p "$d"
    cat > "$d/nginx.conf" <<NGINX
worker_processes $workers;
daemon off;
master_process on;
pid $d/nginx.pid;
error_log $d/error.log warn;
worker_rlimit_nofile $nofile;
events { worker_connections $conns; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_requests 1000000;
    open_file_cache max=1000;
    client_body_temp_path $d;
    proxy_temp_path $d;
    fastcgi_temp_path $d;
    uwsgi_temp_path $d;
    scgi_temp_path $d;
    types { application/octet-stream bin; }
$servers
}
NGINX
}
