# A three-node linerate fleet behind HAProxy, scraped by Prometheus (sourced by
# tests/fleet/run and bench/fleet.sh; the caller has sourced bench/lib.sh and set
# `bin`).
#
# Network: four network namespaces made here and nothing outside them. `front` holds
# a bridge (10.77.0.1/24), HAProxy (10.77.0.1:8080 HTTP, :8443 HTTPS passed through),
# Prometheus (127.0.0.1:9091) and the `linerate bench` clients; nodes a, b and c
# (10.77.0.11-13) each hang on the bridge by a veth pair and run `linerate serve`
# (HTTP :8080, HTTPS :8443, admin :9090) with one worker on the same catalogue.
# fleet_up sets an exit trap that kills every process in those namespaces, deletes
# them (their veths and bridge go with them) and removes the scratch directory.

fleet_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fleet_py="$fleet_dir/fleet.py"
nodes=(a b c)
declare -A node_ip=([a]=10.77.0.11 [b]=10.77.0.12 [c]=10.77.0.13) node_pid=()
front_ip=10.77.0.1
prom_url=http://127.0.0.1:9091
fleet_ns=()
fleet_cgroups=()
# Files outside the scratch directory to remove at the end (glob patterns).
fleet_tmp_globs=()
# HAProxy's health-check and agent-check intervals (seconds) and the number of failed
# checks that mark a node down.
check_inter=1 agent_inter=1 check_fall=2

die() { echo "fleet: $*" >&2; exit 1; }
in_front() { ip netns exec "$front" "$@"; }
now() { date +%s.%N; }

# fleet_require: fails loudly on a missing package or kernel feature.
fleet_require() {
    [ "$(id -u)" = 0 ] || die "needs root (network namespaces, veths, a bridge)"
    local t
    for t in haproxy prometheus ip curl openssl python3; do
        command -v "$t" >/dev/null || die "missing $t (apt-get install haproxy prometheus iproute2 curl openssl python3)"
    done
}

fleet_cleanup() {
    local ns p
    # Bash reports each job the kills below end ("Killed"): not worth a line.
    exec 3>&2 2>/dev/null
    for ns in "${fleet_ns[@]}"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    done
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    { wait; } 2>/dev/null || true
    for ns in "${fleet_ns[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    # shellcheck disable=SC2086 # globs, expanded on purpose
    for p in "${fleet_tmp_globs[@]}"; do rm -f $p; done
    # A killed process leaves its cgroup a moment after it is reaped.
    for p in "${fleet_cgroups[@]}"; do
        for _ in $(seq 1 50); do rmdir "$p" 2>/dev/null && break; sleep 0.1; done
        [ ! -d "$p" ] || echo "fleet: could not remove $p" >&3
    done
    if [ -n "${work:-}" ]; then
        # FLEET_KEEP=DIR: keep the logs, configurations and samples (not the catalogue).
        [ -z "${FLEET_KEEP:-}" ] || { mkdir -p "$FLEET_KEEP"; rm -rf "$work/root" "$work/aff" "$work/prometheus" "$work/tier-root" "$work/weed" "$work"/cache-*; cp -r "$work/." "$FLEET_KEEP"; }
        rm -rf "$work"
    fi
}

# fleet_net: the namespaces, the bridge and the veths.
fleet_net() {
    local tag="lrfleet$$" n
    front="$tag-front"
    fleet_ns=("$front")
    ip netns add "$front" || die "cannot create a network namespace"
    ip -n "$front" link set lo up
    ip -n "$front" link add br0 type bridge || die "no bridge support in this kernel"
    ip -n "$front" addr add "$front_ip/24" dev br0
    ip -n "$front" link set br0 up
    for n in "${nodes[@]}"; do
        ip netns add "$tag-$n" || die "cannot create a network namespace"
        fleet_ns+=("$tag-$n")
        ip -n "$tag-$n" link set lo up
        ip link add "v$n" netns "$front" type veth peer name eth0 netns "$tag-$n" || die "no veth support in this kernel"
        ip -n "$front" link set "v$n" master br0 up
        ip -n "$tag-$n" addr add "${node_ip[$n]}/24" dev eth0
        ip -n "$tag-$n" link set eth0 up
    done
}
node_ns() { echo "lrfleet$$-$1"; }

# fleet_catalogue TITLES MIB: TITLES titles t1..tN, each a directory with one
# MIB-MiB file (v.bin) that sessions read segment by segment, in $work/root; sets
# `files` for `linerate bench --files`.
fleet_catalogue() {
    local i
    for i in $(seq 1 "$1"); do
        mkdir -p "$work/root/t$i"
        head -c "$(($2 * 1024 * 1024))" /dev/urandom > "$work/root/t$i/v.bin"
    done
    titles=$1
    files=$(seq 1 "$1" | sed 's|.*|t&/v.bin|' | paste -sd,)
}

# fleet_cert: a CA and a certificate for the fleet's front address, in $work.
fleet_cert() {
    make_test_cert "$work" "fleet test CA" media.fleet.test "IP:$front_ip,DNS:media.fleet.test"
}

# node_start NODE [CAPACITY_GBPS [ROOT [CGROUP]]]: starts (or restarts) a node and waits
# until it listens. CAPACITY_GBPS sets [admin] capacity_gbps, the throughput at which
# its /load reports no spare capacity; ROOT is its catalogue ($work/root); CGROUP a
# memory cgroup directory (cgroup_make) it runs in.
node_start() {
    local n=$1 ip=${node_ip[$1]} root=${3:-$work/root} i
    local wrap=()
    [ -z "${4:-}" ] || wrap=(bash -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$4")
    cat > "$work/node-$n.toml" <<EOF
root = "$root"
listen = ["$ip:8080"]
tls_listen = ["$ip:8443"]
workers = 1
[tls]
cert = "$work/cert.pem"
key = "$work/key.pem"
[timeouts]
drain = "20s"
[client_limits]
max_connections = 0
max_new_connections_per_second = 0
[admin]
listen = "$ip:9090"
capacity_connections = 2000
capacity_gbps = ${2:-0}
EOF
    "${wrap[@]}" ip netns exec "$(node_ns "$n")" "$bin" serve --config "$work/node-$n.toml" --log-level warn \
        > "$work/node-$n.out" 2> "$work/node-$n.err" &
    node_pid[$n]=$!
    pids+=("$!")
    for i in $(seq 1 100); do
        grep -q "^listening admin" "$work/node-$n.out" 2>/dev/null && return 0
        kill -0 "${node_pid[$n]}" 2>/dev/null || break
        sleep 0.1
    done
    cat "$work/node-$n.err" >&2
    die "node $n did not start"
}

haproxy_conf() {
    local n servers="" tls_servers=""
    for n in "${nodes[@]}"; do
        servers+="    server $n ${node_ip[$n]}:8080"$'\n'
        tls_servers+="    server $n ${node_ip[$n]}:8443"$'\n'
    done
    cat > "$work/haproxy.cfg" <<EOF
global
    stats socket $work/haproxy.sock mode 600 level admin
    maxconn 4000

defaults
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout check 2s
    # A request that could not be sent to a node (refused, reset before an answer)
    # goes to another node; consistent hashing picks the next one on the ring.
    retries 3
    option redispatch 1
    # Health: GET /healthz on the admin port (503 while draining); weight and drain
    # from the agent check, the bare /load line on the same port.
    default-server weight 256 check port 9090 inter ${check_inter}s fall $check_fall rise 2 agent-check agent-port 9090 agent-inter ${agent_inter}s

frontend media
    mode http
    bind $front_ip:8080
    default_backend nodes

backend nodes
    mode http
    # The first two path levels, /title/: a title's segments all go to one node.
    balance uri depth 2
    hash-type consistent
    retry-on all-retryable-errors
    option httpchk
    http-check send meth GET uri /healthz
    http-check expect status 200
    # Which node answered, for the operator (and the tests).
    http-response set-header X-Served-By %[srv_name]
$servers
# The same nodes in turn, without regard to the title (bench/fleet.sh's affinity
# comparison).
frontend media_rr
    mode http
    bind $front_ip:8081
    default_backend nodes_rr

backend nodes_rr
    mode http
    balance roundrobin
    option httpchk
    http-check send meth GET uri /healthz
    http-check expect status 200
$servers
frontend media_tls
    mode tcp
    bind $front_ip:8443
    default_backend nodes_tls

backend nodes_tls
    # TLS passed through, terminated by the nodes; a client address sticks to a node.
    mode tcp
    balance source
    hash-type consistent
    option httpchk
    http-check send meth GET uri /healthz
    http-check expect status 200
$tls_servers
EOF
}

prometheus_conf() {
    local n targets=()
    for n in "${nodes[@]}"; do targets+=("'${node_ip[$n]}:9090'"); done
    cat > "$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: linerate
    static_configs:
      - targets: [$(IFS=,; echo "${targets[*]}")]
EOF
}

# fleet_up TITLES MIB: the whole fleet, ready (every node UP in HAProxy, Prometheus
# scraping them all).
fleet_up() {
    fleet_require
    work=$(mktemp -d)
    pids=()
    trap fleet_cleanup EXIT
    trap 'exit 130' INT TERM HUP
    fleet_net
    fleet_catalogue "$1" "$2"
    fleet_cert
    local n i
    for n in "${nodes[@]}"; do node_start "$n"; done
    haproxy_conf
    haproxy -c -q -f "$work/haproxy.cfg" || die "HAProxy refuses its configuration"
    in_front haproxy -db -f "$work/haproxy.cfg" > "$work/haproxy.log" 2>&1 &
    pids+=("$!")
    prometheus_conf
    in_front prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/prometheus" \
        --web.listen-address=127.0.0.1:9091 > "$work/prometheus.log" 2>&1 &
    pids+=("$!")
    for n in "${nodes[@]}"; do
        for i in $(seq 1 50); do [ -S "$work/haproxy.sock" ] && break; sleep 0.1; done
        python3 "$fleet_py" wait "$work/haproxy.sock" "$n" UP 10 || { cat "$work/haproxy.log" >&2; die "node $n not UP in HAProxy"; }
    done
    for i in $(seq 1 100); do
        [ "$(in_front python3 "$fleet_py" prom "$prom_url" 'count(up == 1)' 2>/dev/null)" = 3 ] && return 0
        sleep 0.2
    done
    tail -20 "$work/prometheus.log" >&2
    die "Prometheus does not scrape the three nodes"
}

# fleet_bench OUT ARGS...: `linerate bench --json` from the front namespace through
# HAProxy over HTTP, every byte verified, into OUT.
fleet_bench() {
    local out=$1
    shift
    in_front "$bin" bench --base-url "http://$front_ip:8080/" --files "$files" --zipf 0 \
        --segment-bytes 1048576 --verify "$work/root" --workers 1 --json "$@" > "$out"
}

# sample_start SECONDS / sample_stop: HAProxy's per-server figures every 0.1 s into
# $work/sample.
sample_start() {
    rm -f "$work/sample.stop"
    python3 "$fleet_py" sample "$work/haproxy.sock" "$work/sample" "$1" &
    sampler=$!
    pids+=("$sampler")
}
sample_stop() {
    touch "$work/sample.stop"
    wait "$sampler" 2>/dev/null || true
}

bench_value() { python3 "$fleet_py" bench "$1" "$2"; }

# node_stop NODE: SIGTERM, and up to 30 s for the node to exit.
node_stop() {
    local p=${node_pid[$1]}
    kill -TERM "$p" 2>/dev/null || return 0
    for _ in $(seq 1 300); do
        kill -0 "$p" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$p" 2>/dev/null && die "node $1 did not stop"
    wait "$p" 2>/dev/null || true
}

# node_restart NODE: after a drain or a crash, the node back and UP in HAProxy.
#
# The agent's `drain` puts the server in HAProxy's administrative drain state, which
# only an agent reply with `ready` (or the operator) lifts; /load answers
# `up ready N%`, so the restarted node must come back by itself: nothing is sent to
# HAProxy's stats socket here.
node_restart() {
    node_start "$1" "${2:-0}" "${3:-}" "${4:-}"
    python3 "$fleet_py" wait "$work/haproxy.sock" "$1" UP 15 || die "node $1 not UP again"
}

# Scenarios. Each prints one result line `NAME key=value...` and returns 1 (after
# saying why on stderr) when a check fails.
fail() { echo "FAIL $*" >&2; return 1; }

# scenario_metrics SECONDS SESSIONS MBPS: paced sessions through HAProxy over HTTP;
# Prometheus's fleet Gb/s over the run (docs/OPERATIONS.md's query) within 10% of
# what the bench measured. Then a short HTTPS run through the TCP pass-through.
scenario_metrics() {
    local d=$1 s=$2 r=$3 t_start t_end bench_gbps prom_gbps rate_gbps elapsed errs before after diff
    t_start=$(now)
    fleet_bench "$work/metrics.json" --sessions "$s" --duration "$d" --bitrate-mbps "$r" ||
        fail "metrics: bench failed" || return 1
    t_end=$(now)
    sleep 2.5 # two scrapes after the end
    bench_gbps=$(bench_value "$work/metrics.json" gbps)
    elapsed=$(bench_value "$work/metrics.json" elapsed_s)
    errs=$(bench_value "$work/metrics.json" errors_total)
    # The fleet's body bytes before and after the run (the last scrape before each
    # time), over the bench's own duration.
    before=$(in_front python3 "$fleet_py" prom "$prom_url" 'sum(linerate_body_bytes_total)' "$t_start") &&
        after=$(in_front python3 "$fleet_py" prom "$prom_url" 'sum(linerate_body_bytes_total)' "$(now)") ||
        fail "metrics: Prometheus query failed" || return 1
    prom_gbps=$(python3 -c "print('%.4f' % (($after - $before) * 8 / 1e9 / $elapsed))")
    # The dashboard's query, for comparison (rate() misses the start-up burst before
    # the first scrape of the window).
    rate_gbps=$(in_front python3 "$fleet_py" prom "$prom_url" \
        "sum(rate(linerate_body_bytes_total[$(printf %.0f "$elapsed")s])) * 8 / 1e9" "$t_end")
    diff=$(python3 -c "print('%.1f' % (abs($prom_gbps - $bench_gbps) / $bench_gbps * 100))")
    echo "metrics bench_gbps=$bench_gbps prometheus_gbps=$prom_gbps diff_pct=$diff rate_query_gbps=$(printf %.4f "$rate_gbps") errors=$errs"
    [ "$errs" = 0 ] || fail "metrics: $errs failed requests: $(bench_value "$work/metrics.json" first_error)" || return 1
    python3 -c "import sys; sys.exit(0 if $diff <= 10 else 1)" ||
        fail "metrics: Prometheus says $prom_gbps Gb/s, the bench $bench_gbps Gb/s" || return 1

    in_front "$bin" bench --base-url "https://$front_ip:8443/" --files "$files" --zipf 0 --cacert "$work/ca.pem" \
        --segment-bytes 1048576 --verify "$work/root" --workers 1 --json --sessions 4 --duration 3 \
        > "$work/https.json" || fail "https: bench failed" || return 1
    sleep 2
    errs=$(bench_value "$work/https.json" errors_total)
    local tls ktls
    tls=$(in_front python3 "$fleet_py" prom "$prom_url" 'sum(linerate_tls_sessions_total)')
    ktls=$(in_front python3 "$fleet_py" prom "$prom_url" \
        'sum(linerate_body_bytes_total{transport="ktls"}) / sum(linerate_body_bytes_total{transport=~"ktls|usertls"})')
    echo "https gbps=$(bench_value "$work/https.json" gbps) errors=$errs tls_sessions=$tls ktls_byte_share=$ktls"
    [ "$errs" = 0 ] || fail "https: $errs failed requests: $(bench_value "$work/https.json" first_error)" || return 1
    [ "${tls%.*}" -gt 0 ] || fail "https: no TLS session on any node" || return 1
}

# big_title_on NODE MIB: a title of MIB MiB, outside the bench's list, that HAProxy
# sends to NODE (names are tried until X-Served-By, also on 404s, names NODE).
big_title_on() {
    local i
    for i in $(seq 1 60); do
        if in_front curl -sS -o /dev/null -D - "http://$front_ip:8080/big$i/v.bin" | grep -qi "^x-served-by: $1"; then
            mkdir -p "$work/root/big$i"
            head -c "$(($2 * 1024 * 1024))" /dev/urandom > "$work/root/big$i/v.bin"
            echo "big$i"
            return 0
        fi
    done
    return 1
}

# scenario_drain SECONDS SESSIONS MBPS: SIGTERM to node b a third into a verified
# run, while a slow viewer (curl at 2 MB/s) downloads a 24 MiB title from it. HAProxy
# gives b no new session later than one agent interval after the signal and takes it
# out of rotation (DRAIN or DOWN) as soon; its transfers finish (the slow download is
# whole and right, the bench has no failed request and no wrong byte); it exits 0.
scenario_drain() {
    local d=$1 s=$2 r=$3 t0 bench slow title errs res last out rc=0 slow_rc=0
    title=$(big_title_on b 24) || fail "drain: no title goes to node b" || return 1
    sample_start $((d + 40))
    fleet_bench "$work/drain.json" --sessions "$s" --duration "$d" --bitrate-mbps "$r" &
    bench=$!
    pids+=("$bench")
    sleep "$(python3 -c "print($d / 3)")"
    in_front curl -sS --limit-rate 2M -o "$work/slow.bin" "http://$front_ip:8080/$title/v.bin" &
    slow=$!
    pids+=("$slow")
    sleep 0.5
    t0=$(now)
    kill -TERM "${node_pid[b]}"
    wait "$bench" || fail "drain: bench failed" || return 1
    wait "$slow" || slow_rc=$?
    wait "${node_pid[b]}" || rc=$?
    sample_stop
    errs=$(bench_value "$work/drain.json" errors_total)
    res=$(python3 "$fleet_py" drain "$work/sample" b "$t0")
    out=same
    cmp -s "$work/slow.bin" "$work/root/$title/v.bin" || out=different
    echo "drain $res agent_inter_s=$agent_inter node_exit=$rc slow_download=$out bench_errors=$errs verified_bytes=$(bench_value "$work/drain.json" verified_bytes) gbps=$(bench_value "$work/drain.json" gbps)"
    [ "$errs" = 0 ] || fail "drain: $errs failed requests: $(bench_value "$work/drain.json" first_error)" || return 1
    [ "$slow_rc" = 0 ] && [ "$out" = same ] || fail "drain: the slow download from b did not finish whole (curl $slow_rc, $out)" || return 1
    [ "$rc" = 0 ] || fail "drain: node b exited $rc: $(tail -5 "$work/node-b.err")" || return 1
    # One agent interval, plus the 200 ms a bare agent check waits for the silence
    # that tells it from an HTTP request, plus the sampler's 0.1 s period, plus
    # 0.3 s for HAProxy's, the node's and the sampler's scheduling on a loaded
    # machine (a CI run measured 1.26 s, the bound was then 1.4): still well under
    # the two intervals a missed agent check would take.
    python3 - "$res" "$agent_inter" <<'PY' || return 1
import sys
kv = dict(x.split("=") for x in sys.argv[1].split())
limit = float(sys.argv[2]) + 0.6
for key in ("last_new_session_s", "not_up_s"):
    if kv[key] == "none" or float(kv[key]) > limit:
        sys.exit("FAIL drain: %s = %s, more than one agent interval (%.1f s)" % (key, kv[key], limit))
PY
}

# scenario_crash SECONDS SESSIONS MBPS: kill -9 of node c a third into a verified
# run, while two slow viewers (curl at 2 MB/s) download a 64 MiB title from it (more
# than the socket buffers on the way hold, so that the crash cuts them). Failed
# transfers (the bench's and the viewers') are at most the sessions HAProxy had on c
# at that moment (the most it had in the preceding second), no wrong byte reaches the
# bench, and HAProxy marks c down within its detection time (fall x inter) plus
# 0.3 s (the sampler's period, check scheduling).
scenario_crash() {
    local d=$1 s=$2 r=$3 t0 bench title errs held down slow=() failed=0 p
    title=$(big_title_on c 64) || fail "crash: no title goes to node c" || return 1
    sample_start $((d + 40))
    fleet_bench "$work/crash.json" --sessions "$s" --duration "$d" --bitrate-mbps "$r" &
    bench=$!
    pids+=("$bench")
    sleep "$(python3 -c "print($d / 3)")"
    for p in 1 2; do
        in_front curl -sS --limit-rate 2M -o /dev/null "http://$front_ip:8080/$title/v.bin" 2>/dev/null &
        slow+=("$!")
        pids+=("$!")
    done
    sleep 1.5
    # HAProxy's sessions on c right before the kill (the sampler's last second too).
    held=$(python3 "$fleet_py" stat "$work/haproxy.sock" | awk '$1 == "c" { print $3 }')
    t0=$(now)
    kill -KILL "${node_pid[c]}"
    wait "${node_pid[c]}" 2>/dev/null || true
    wait "$bench" || fail "crash: bench failed" || return 1
    for p in "${slow[@]}"; do wait "$p" || failed=$((failed + 1)); done
    sample_stop
    errs=$(bench_value "$work/crash.json" errors_total)
    held=$(awk -v t0="$t0" -v m="$held" '$2 == "c" && $1 >= t0 - 1 && $1 <= t0 && $4 > m { m = $4 } END { print m + 0 }' "$work/sample")
    down=$(python3 "$fleet_py" down "$work/sample" c "$t0")
    echo "crash marked_down_s=$down limit_s=$((check_fall * check_inter)) sessions_held=$held failed=$((errs + failed)) bench_errors=$errs slow_viewers_cut=$failed errors_by_kind=$(python3 -c "import json; e = json.load(open('$work/crash.json'))['errors']; print(','.join('%s:%d' % kv for kv in e.items() if kv[1]) or '-')")"
    [ "$failed" = 2 ] || fail "crash: the slow downloads from c were not cut" || return 1
    [ $((errs + failed)) -le "$held" ] || fail "crash: $((errs + failed)) failed transfers, more than the $held sessions c held" || return 1
    [ "$(bench_value "$work/crash.json" errors.verify)" = 0 ] || fail "crash: wrong bytes delivered" || return 1
    python3 -c "import sys; sys.exit(0 if '$down' != 'never' and float('$down') <= $check_fall * $check_inter + 0.3 else 1)" ||
        fail "crash: c marked down after $down s" || return 1
}

# scenario_load SECONDS SESSIONS MBPS CAPACITY_GBPS: every node restarted with
# `[admin] capacity_gbps` CAPACITY_GBPS. A baseline run through HAProxy gives each
# node's share of new sessions with equal load; then a second client loads node c
# directly at half that capacity (its /load reports about `up 50%`) and the same run
# is repeated. Node c's share must fall in proportion to its weight share: the ratio
# of its two shares within 35% of the ratio of its two weight shares (the hash ring
# places 256 points per node at full weight: over a few hundred titles its arcs are
# not exactly proportional).
scenario_load() {
    local d=$1 s=$2 r=$3 cap=$4 n side base loaded
    for n in "${nodes[@]}"; do
        node_stop "$n"
        node_restart "$n" "$cap"
    done
    sleep 2
    sample_start $((d + 10))
    local t0 t1
    t0=$(now)
    fleet_bench "$work/load-base.json" --sessions "$s" --ramp "$s" --duration "$d" --bitrate-mbps "$r" ||
        fail "load: bench failed" || return 1
    t1=$(now)
    sample_stop
    base=$(python3 "$fleet_py" split "$work/sample" "$t0" "$t1")
    # Half the capacity, straight to c: 40 sessions at CAPACITY/80 Gb/s each, started
    # over 2 s and asking for 256 KiB segments, so that the load c measures each second
    # is steady.
    in_front "$bin" bench --base-url "http://${node_ip[c]}:8080/" --files "$files" --zipf 0 --workers 1 \
        --segment-bytes 262144 --sessions 40 --ramp 20 --duration $((d + 8)) --json \
        --bitrate-mbps "$(python3 -c "print($cap * 1000 / 80)")" > "$work/load-side.json" &
    side=$!
    pids+=("$side")
    sleep 4 # the agent checks see c's load
    sample_start $((d + 10))
    t0=$(now)
    fleet_bench "$work/load.json" --sessions "$s" --ramp "$s" --duration "$d" --bitrate-mbps "$r" ||
        fail "load: bench failed" || return 1
    t1=$(now)
    sample_stop
    wait "$side" || fail "load: the side load failed" || return 1
    loaded=$(python3 "$fleet_py" split "$work/sample" "$t0" "$t1")
    python3 - "$base" "$loaded" "$(bench_value "$work/load-base.json" errors_total)" "$(bench_value "$work/load.json" errors_total)" <<'PY'
import sys
def parse(text):
    rows = {}
    for line in text.splitlines():
        name, new, weight = line.split()
        rows[name] = (int(new), float(weight))
    total_new = sum(v[0] for v in rows.values())
    total_w = sum(v[1] for v in rows.values())
    return {k: (v[0] / total_new, v[1] / total_w, v[1]) for k, v in rows.items()}
base, loaded = parse(sys.argv[1]), parse(sys.argv[2])
errors = int(sys.argv[3]) + int(sys.argv[4])
for name, rows in (("equal", base), ("c_loaded", loaded)):
    print("load %s " % name + " ".join("%s:share=%.3f,weight=%.0f" % (k, v[0], v[2]) for k, v in sorted(rows.items())))
got = loaded["c"][0] / base["c"][0]
want = loaded["c"][1] / base["c"][1]
print("load c_share_ratio=%.2f c_weight_share_ratio=%.2f errors=%d" % (got, want, errors))
if errors:
    sys.exit("FAIL load: %d failed requests" % errors)
if loaded["c"][2] > 0.75 * min(loaded["a"][2], loaded["b"][2]):
    sys.exit("FAIL load: c's weight did not fall under its side load")
if abs(got - want) > 0.35 * want:
    sys.exit("FAIL load: c's session share changed by %.2fx, its weight share by %.2fx" % (got, want))
PY
}

# cgroup_make NAME BYTES: a memory cgroup capped at BYTES (page cache included), under
# the cgroup v2 root or, with cgroup v1, under this process's own memory cgroup; its
# directory in `cgroup`. Removed at exit.
cgroup_make() {
    local dir
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        grep -qw memory /sys/fs/cgroup/cgroup.subtree_control || die "cgroup v2 without the memory controller enabled"
        dir=/sys/fs/cgroup/$1
        mkdir "$dir" || die "cannot create $dir"
        fleet_cgroups+=("$dir")
        echo "$2" > "$dir/memory.max"
    else
        [ -d /sys/fs/cgroup/memory ] || die "no memory cgroup controller"
        dir=/sys/fs/cgroup/memory$(sed -n 's/^[0-9]*:memory://p' /proc/self/cgroup)/$1
        mkdir "$dir" || die "cannot create $dir"
        fleet_cgroups+=("$dir")
        echo "$2" > "$dir/memory.limit_in_bytes"
    fi
    cgroup=$dir
}

# evict DIR...: every file under DIR out of the page cache.
evict() {
    python3 - "$@" <<'PY'
import os, sys
for top in sys.argv[1:]:
    for d, _, names in os.walk(top):
        for n in names:
            fd = os.open(os.path.join(d, n), os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
PY
}

# scenario_affinity SECONDS SESSIONS MBPS CACHE_MIB TITLES: each node gets its own copy
# of a catalogue of TITLES 1 MiB titles (so that nodes share no page cache) and runs in
# a memory cgroup of CACHE_MIB, smaller than the catalogue but larger than a third of
# it. The same verified run, uniform popularity, goes through HAProxy hashing titles
# (port 8080) and through round robin (port 8081), from a cold cache each time; the
# fleet's page-cache hit ratio over the second half of each run (Prometheus) must be
# higher with hashing.
scenario_affinity() {
    local d=$1 s=$2 r=$3 cache=$4 titles_n=$5 n i list mode port t_mid t_end res fil hit=() errs
    mkdir -p "$work/aff/a"
    for i in $(seq 1 "$titles_n"); do
        mkdir -p "$work/aff/a/c$i"
        head -c 1048576 /dev/urandom > "$work/aff/a/c$i/v.bin"
    done
    cp -r "$work/aff/a" "$work/aff/b"
    cp -r "$work/aff/a" "$work/aff/c"
    list=$(seq 1 "$titles_n" | sed 's|.*|c&/v.bin|' | paste -sd,)
    declare -A cg
    for n in "${nodes[@]}"; do
        cgroup_make "lrfleet$$-$n" $((cache * 1024 * 1024))
        cg[$n]=$cgroup
    done
    for mode in hash roundrobin; do
        port=8080
        [ "$mode" = hash ] || port=8081
        for n in "${nodes[@]}"; do node_stop "$n"; done
        evict "$work/aff"
        for n in "${nodes[@]}"; do node_restart "$n" 0 "$work/aff/$n" "${cg[$n]}"; done
        in_front "$bin" bench --base-url "http://$front_ip:$port/" --files "$list" --zipf 0 --workers 1 \
            --segment-bytes 1048576 --verify "$work/aff/a" --json --sessions "$s" --ramp "$s" \
            --duration "$d" --bitrate-mbps "$r" > "$work/affinity-$mode.json" &
        pids+=("$!")
        sleep "$(python3 -c "print($d / 2)")"
        t_mid=$(now)
        wait "${pids[-1]}" || fail "affinity: bench failed ($mode)" || return 1
        sleep 2.5
        t_end=$(now)
        errs=$(bench_value "$work/affinity-$mode.json" errors_total)
        [ "$errs" = 0 ] || fail "affinity: $errs failed requests ($mode): $(bench_value "$work/affinity-$mode.json" first_error)" || return 1
        res=$(in_front python3 "$fleet_py" prom "$prom_url" "sum(linerate_page_cache_bytes_total{source=\"resident\"})" "$t_end")-$(in_front python3 "$fleet_py" prom "$prom_url" "sum(linerate_page_cache_bytes_total{source=\"resident\"})" "$t_mid")
        fil=$(in_front python3 "$fleet_py" prom "$prom_url" "sum(linerate_page_cache_bytes_total{source=\"filled\"})" "$t_end")-$(in_front python3 "$fleet_py" prom "$prom_url" "sum(linerate_page_cache_bytes_total{source=\"filled\"})" "$t_mid")
        hit+=("$(python3 -c "r = $res; f = $fil; print('%.3f' % (r / (r + f)))")")
    done
    echo "affinity hash_hit_ratio=${hit[0]} roundrobin_hit_ratio=${hit[1]} cache_per_node_mib=$cache catalogue_mib=$titles_n"
    python3 -c "import sys; sys.exit(0 if ${hit[0]} > ${hit[1]} else 1)" ||
        fail "affinity: hashing titles did not raise the fleet's hit ratio" || return 1
}
