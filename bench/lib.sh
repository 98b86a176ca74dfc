# Helpers shared by the benchmark scripts (sourced, not run).

# parse_flags HELP SPEC... -- ARG...: a bench script's command line, parsed the same
# way in every script. Flags apply in the order given, so a flag after a preset (such
# as --quick) overrides what the preset set. Each SPEC is one flag:
#   --name=var        the flag takes a value, stored in var;
#   --name=var:CODE   the same, then CODE runs (a check, or a preset setting others);
#   --name:CODE       the flag takes no value; CODE runs (`quick=1 rounds=1`).
# HELP is either the lines of the script that -h and --help print (its header
# comment, as sed's `2,34`; any other argument is then "unknown" and exits 2) or a
# usage line, printed for -h, --help and any other argument alike, exit 2. A flag
# missing its value exits 1.
parse_flags() {
    local _help=$1 _specs=() _spec _arg _found
    shift
    while [ "$1" != -- ]; do _specs+=("$1"); shift; done
    shift
    while [ $# -gt 0 ]; do
        _arg=$1 _found=""
        for _spec in "${_specs[@]}"; do
            case "$_spec" in "$_arg="* | "$_arg:"*) _found=$_spec; break ;; esac
        done
        case "$_found" in
            "")
                if [[ ! $_help =~ ^[0-9]+,[0-9]+$ ]]; then echo "$_help" >&2; exit 2; fi
                case "$_arg" in
                    -h | --help) sed -n "${_help}p" "$0"; exit 0 ;;
                    *) echo "unknown argument: $_arg" >&2; exit 2 ;;
                esac ;;
            "$_arg="*)
                [ $# -ge 2 ] || { echo "$_arg needs a value" >&2; exit 1; }
                _spec=${_found#"$_arg="}
                printf -v "${_spec%%:*}" '%s' "$2"
                shift
                [ "$_spec" = "${_spec#*:}" ] || eval "${_spec#*:}" ;;
            *) eval "${_found#"$_arg:"}" ;;
        esac
        shift
    done
}

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

# loopback_limits: prints, one per line, the serve arguments that lift linerate's
# per-client limits ([client_limits] in docs/CONFIG.md) far above what the benchmark
# clients need: they all connect from 127.0.0.1, thousands of connections at once,
# which the production defaults would refuse. Nothing for a binary without them.
# Use: mapfile -t limits < <(loopback_limits)
loopback_limits() {
    if grep -q -- '--max-client-connections' <<< "$("$bin" serve --help)"; then
        printf '%s\n' --max-client-connections 1000000 --max-client-connection-rate 1000000
    fi
}

# start_work: a scratch directory in `work`, and an exit trap that stops every PID
# appended to `pids`, then runs the script's `on_exit` function if it defines one,
# and removes the directory. INT, TERM and HUP exit through the same trap.
start_work() {
    work=$(mktemp -d)
    pids=()
    trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true
          [ "$(type -t on_exit)" != function ] || on_exit; rm -rf "$work"' EXIT
    trap 'exit 130' INT TERM HUP
}

# make_content DIR FILES MIB [PREFIX] [WARM]: FILES random files of MIB MiB (PREFIX1.bin
# ..., PREFIX defaulting to f), kept across runs when their size is right, and read
# once into the page cache (unless WARM is 0).
make_content() {
    local dir=$1 files=$2 mib=$3 prefix=${4:-f} warm=${5:-1} size i f
    mkdir -p "$dir"
    size=$((mib * 1024 * 1024))
    for i in $(seq 1 "$files"); do
        f="$dir/$prefix$i.bin"
        if [ "$(stat -c %s "$f" 2>/dev/null || echo 0)" != "$size" ]; then
            head -c "$size" /dev/urandom > "$f"
        fi
        [ "$warm" = 0 ] || cat "$f" > /dev/null
    done
}

# make_test_cert DIR [CA_NAME NAME SAN]: a test CA (DIR/ca.pem, DIR/ca.key, named CA_NAME,
# default "bench test CA") and a 30-day server certificate signed by it (sign_test_cert),
# for 127.0.0.1 and localhost unless NAME and SAN say otherwise.
make_test_cert() {
    local d=$1
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -subj "/CN=${2:-bench test CA}" \
        -keyout "$d/ca.key" -out "$d/ca.pem" 2>/dev/null
    sign_test_cert "$d" "" 30 "${3:-localhost}" "${4:-IP:127.0.0.1,DNS:localhost}"
}

# sign_test_cert DIR SUFFIX DAYS NAME SAN: a server certificate for NAME (common name)
# and SAN (subjectAltName) valid for DAYS days, signed by make_test_cert's CA in DIR:
# DIR/certSUFFIX.pem and DIR/keySUFFIX.pem (DIR/ext.cnf holds its extensions).
sign_test_cert() {
    local d=$1 s=$2
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$4" \
        -keyout "$d/key$s.pem" -out "$d/server$s.csr" 2>/dev/null
    printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' "$5" > "$d/ext.cnf"
    openssl x509 -req -in "$d/server$s.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -days "$3" \
        -extfile "$d/ext.cnf" -out "$d/cert$s.pem" 2>/dev/null
}

# write_range_lua FILE FILES [BYTES]: a wrk script asking `Range: bytes=0-(BYTES-1)`
# (default 2 MiB) of the next of FILES files per request, and printing an exact RESULT
# line at the end.
write_range_lua() {
    local last=$(( ${3:-2097152} - 1 ))
    cat > "$1" <<LUA
local n = 0
local files = $2
request = function()
  n = n + 1
  return wrk.format("GET", "/f" .. (n % files + 1) .. ".bin", { ["Range"] = "bytes=0-$last" })
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

# tree_ticks PID: proc_ticks of PID and of its children, summed (nginx's master and
# workers).
tree_ticks() {
    local t=0 p
    for p in $(pgrep -P "$1") "$1"; do t=$((t + $(proc_ticks "$p"))); done
    echo "$t"
}

# Busy ticks of the whole machine: user nice system irq softirq steal.
machine_busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }

# "busy total" ticks of the whole machine: busy as in machine_busy but without the
# time of niced processes (user time at a positive nice value). The servers and the
# bench client run at nice 0; on a shared machine, low-priority jobs (`nice -n 19`
# builds, fuzzers) only take what they leave idle, and counting them would charge
# their work to whichever server happened to run beside them. A script that is itself
# niced (its servers and client with it) counts niced time as busy.
machine_ticks() {
    awk -v niced="$([ "$(nice)" -gt 0 ] && echo 1 || echo 0)" \
        '/^cpu / { busy = $2 + $4 + $7 + $8 + $9 + niced * $3; print busy, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat
}

# median of the numbers on stdin.
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print 0; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# column_median FILE FIELD KEY...: the median of field FIELD (from 1) over the lines of
# FILE, a results file of one run per line, whose first fields are KEY... in order.
column_median() {
    local file=$1 field=$2
    shift 2
    awk -v k="$field" -v keys="$*" 'BEGIN { n = split(keys, key, " ") }
        { for (i = 1; i <= n; i++) if ($i != key[i]) next; print $k }' "$file" | median
}

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

# The TLS directives of a benchmark nginx server block, on one line: the test
# certificate in $work, TLS 1.3 with AES-128-GCM only (the cipher linerate's
# comparisons use), and kernel TLS where the kernel has it.
nginx_tls13_lines() {
    echo "ssl_certificate $work/cert.pem; ssl_certificate_key $work/key.pem; ssl_protocols TLSv1.3;" \
        "ssl_conf_command Ciphersuites TLS_AES_128_GCM_SHA256; ssl_conf_command Options KTLS;"
}

# write_nginx_conf DIR WORKERS NOFILE CONNECTIONS SERVERS [HTTP]: DIR/nginx.conf for a
# benchmark nginx in the foreground: WORKERS workers that may open NOFILE files and
# CONNECTIONS connections each, sendfile with nopush/nodelay, no access log, an open
# file cache, temporary paths inside DIR, the given `server { }` blocks, and HTTP,
# more directives of the `http { }` block (`proxy_cache_path`, an `upstream`).
write_nginx_conf() {
    local d=$1 workers=$2 nofile=$3 conns=$4 servers=$5 http=${6:-}
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
$http
$servers
}
NGINX
}

# evict_dir DIR...: every regular file under each DIR dropped from the page cache
# after a sync (POSIX_FADV_DONTNEED, what `dd iflag=nocache count=0` does, from one
# process: a cache directory can hold 100,000 files), as a server started after a
# reboot would find them; prints the bytes fincore still finds resident (pages under
# I/O or mapped cannot be dropped).
evict_dir() {
    sync
    python3 - "$@" <<'PY'
import os, sys
for top in sys.argv[1:]:
    for d, _, names in os.walk(top):
        for n in names:
            try:
                fd = os.open(os.path.join(d, n), os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue  # gone meanwhile, or not a regular file
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
PY
    find "$@" -type f -exec fincore -nb -o RES {} + | awk '{ s += $1 } END { printf "%.0f\n", s }'
}

# wait_port PORT: up to 10 s for 127.0.0.1:PORT to accept connections.
wait_port() {
    for _ in $(seq 1 200); do
        python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $1), 0.2)" 2>/dev/null && return 0
        sleep 0.05
    done
    return 1
}

# Servers under test, one at a time: start_nginx PROTOCOL [DIRECTIVES] and
# start_linerate PROTOCOL set `server_pid` (also appended to `pids`) and `base`, the
# URL to fetch from; stop_server stops it. They serve `dir` with `workers` workers,
# HTTPS with make_test_cert's files in `work`, and start the server through the
# command prefix in `server_wrap` (empty: directly). DIRECTIVES go into nginx's
# `server { }` block.
server_wrap=()
server_pid=""
start_nginx() {
    local port listen
    port=$(free_port)
    listen="listen 127.0.0.1:$port reuseport;"
    [ "$1" = https ] && listen="listen 127.0.0.1:$port ssl reuseport; ssl_certificate $work/cert.pem; ssl_certificate_key $work/key.pem; ssl_protocols TLSv1.2 TLSv1.3;"
    write_nginx_conf "$work/nginx" "$workers" 19000 12000 "    server { $listen root $dir; ${2:-} }"
    "${server_wrap[@]}" nginx -c "$work/nginx/nginx.conf" -p "$work/nginx" &
    server_pid=$!
    pids+=("$server_pid")
    wait_port "$port" || { echo "nginx did not start" >&2; return 1; }
    base="$1://127.0.0.1:$port/"
}
start_linerate() { # PROTOCOL [EXTRA SERVE ARGUMENTS...]
    local limits
    mapfile -t limits < <(loopback_limits)
    # The admin endpoint on a free port: the default, 9090, may belong to another
    # server on this machine (a packaged linerate, another benchmark).
    local args=(serve --root "$dir" --workers "$workers" --log-level warn --admin 127.0.0.1:0 "${limits[@]}" "${@:2}")
    if [ "$1" = https ]; then
        grep -q -- '--tls-listen' <<< "$("$bin" serve --help)" ||
            { echo "$bin has no --tls-listen: it cannot serve HTTPS (run with --protocols http)" >&2; return 1; }
        args+=(--listen 127.0.0.1:0 --tls-listen "127.0.0.1:$(free_port)" --cert "$work/cert.pem" --key "$work/key.pem")
    else
        args+=(--listen 127.0.0.1:0)
    fi
    "${server_wrap[@]}" "$bin" "${args[@]}" > "$work/linerate.out" &
    server_pid=$!
    pids+=("$server_pid")
    for _ in $(seq 1 200); do
        grep -q "^listening $1://" "$work/linerate.out" 2>/dev/null && break
        sleep 0.05
    done
    base="$(sed -n "s|^listening \($1://.*\)|\1|p" "$work/linerate.out" | head -1)/"
    [ "$base" != "/" ] || { echo "linerate did not start" >&2; return 1; }
}
stop_server() {
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
}

# table_head "COLUMN|COLUMN|...": the first two lines of a markdown table.
table_head() {
    awk -v h="$1" 'BEGIN { n = split(h, c, "|"); for (i = 1; i <= n; i++) { head = head " " c[i] " |"; rule = rule "---|" }
        print "|" head; print "|" rule }'
}

# print_results FILE ROUNDS KEYS HEADER [JSON]: FILE has one run per line, fields
# separated by spaces, the first KEYS of them naming what was measured (protocol,
# server...), the others numbers; HEADER names the columns, separated by `|`. Prints
# a markdown table of every run and, with ROUNDS > 1, a second one with each
# column's median per key. With JSON, also writes both there ({"runs", "medians"}).
print_results() {
    python3 - "$@" <<'PY'
import json, statistics, sys
path, rounds, keys, header = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split("|")
rows = [line.split() for line in open(path) if line.strip()]
def table(rows):
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(r) + " |")
print()
table(rows)
groups = {}
for r in rows:
    groups.setdefault(tuple(r[:keys]), []).append([float(x) for x in r[keys:]])
medians = [list(k) + ["%.5g" % statistics.median(c) for c in zip(*v)] for k, v in groups.items()]
if rounds > 1:
    print()
    print("Medians of %d rounds:" % rounds)
    print()
    table(medians)
if len(sys.argv) > 5:
    as_obj = lambda r: {h: (v if i < keys else float(v)) for i, (h, v) in enumerate(zip(header, r))}
    with open(sys.argv[5], "w") as f:
        json.dump({"runs": [as_obj(r) for r in rows], "medians": [as_obj(r) for r in medians]}, f, indent=2)
        f.write("\n")
PY
}

# write_results OUT RESULTS ROUNDS KEYS HEADER: OUT.md, $work/setup then
# print_results's tables of RESULTS (OUT.json beside it); prints the tables and where
# they went, and exits 1 when `failed` is not 0.
write_results() {
    local out=$1
    mkdir -p "$(dirname "$out")"
    {
        cat "$work/setup"
        print_results "$2" "$3" "$4" "$5" "$out.json"
    } > "$out.md"
    tail -n +"$(( $(wc -l < "$work/setup") + 1 ))" "$out.md"
    echo
    echo "written: $out.md $out.json"
    [ "${failed:-0}" = 0 ] || { echo "some runs failed (see above)" >&2; exit 1; }
}

# bench_checks JSON QUICK: prints the errors by kind of a `linerate bench` run's JSON;
# fails on the ones that mean a broken server or set-up (connect, status, protocol,
# verify; with QUICK=1, a light smoke load, any error) or a run that served nothing.
bench_checks() {
    python3 - "$1" "$2" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
kinds = {k: v for k, v in j["errors"].items() if v}
if kinds:
    print("           errors by kind: %s; first: %s" % (", ".join("%s %d" % kv for kv in kinds.items()), j["first_error"]))
bad = [k for k in kinds if sys.argv[2] == "1" or k in ("connect", "status", "protocol", "verify")]
if bad:
    print("           FAIL: errors that should not happen: %s" % ", ".join(bad))
if j["bytes"] <= 0:
    print("           FAIL: the run served nothing")
sys.exit(1 if bad or j["bytes"] <= 0 else 0)
PY
}
