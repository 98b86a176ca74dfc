# shellcheck shell=bash
# Other caches in front of an origin, for the benchmarks that compare linerate with
# them (sourced, not run; needs root): Apache Traffic Server 9.2 and Varnish 7.1, the
# Debian 12 packages, each run as a process of the benchmark's own (never the system
# service) on loopback, with its configuration, logs and storage in a directory the
# caller gives (and removes).
#
#   caches_install            installs the Debian packages when missing (apt-get).
#   ats_start DIR PORT ORIGIN_URL CACHE_BYTES SLICE_BYTES WORKERS
#   varnish_start DIR PORT ORIGIN_URL CACHE_BYTES SLICE_BYTES WORKERS
#       write DIR's configuration, start the server in the foreground on
#       127.0.0.1:PORT in front of ORIGIN_URL (http://HOST:PORT/), with a cache of
#       CACHE_BYTES, and return once it accepts connections (1 if it does not: the
#       end of its log on stderr). They set `cache_pid` (the process to measure and
#       stop; its children are the rest of the server) and append it to `pids` when
#       the caller has that array (bench/lib.sh's start_work kills them on exit).
#       The command prefix in `server_wrap`, if set, comes before the server's.
#       SLICE_BYTES is the slice size for ATS's slice plugin; Varnish caches whole
#       objects and ignores it.
#   cache_stop [PID]          stops the server (default: cache_pid) and its children,
#                             and waits until they are gone.
#   cache_rss_kb PID          peak RSS (VmHWM, KiB) of PID and its children, summed.
#
# Apache Traffic Server, set for video as its documentation pairs the parts:
#   remap.config: one rule mapping every request to the origin through the slice
#       plugin (--blockbytes SLICE_BYTES: a request, whole or ranged, is answered from
#       aligned blocks of that size, each fetched as its own internal request) and
#       cache_range_requests (which stores each block under the URL plus its range,
#       asks the origin for that range and turns its 206 into a cacheable object).
#   read-while-writer: proxy.config.cache.enable_read_while_writer 1 lets requests
#       for a block being fetched read it while it is written; it needs the
#       background fill settings (background_fill_active_timeout 0,
#       background_fill_completed_threshold 0.0: a fill goes on when its client
#       leaves) and max_doc_size 0 (no size limit, else the object's length must be
#       known before it may be read).
#   collapsed misses: a request that finds the block's write lock taken retries its
#       cache read (max_open_read_retries 50, every open_read_retry_time 10 ms, half
#       a second in all, long enough for the head of a slice over the emulated WAN)
#       before it goes to the origin itself; max_open_write_retries 5 lets a request
#       that lost the race for the write lock retry too, rather than proxy uncached.
#   storage.config: one file, DIR/cache/cache.db, of CACHE_BYTES (ATS lays out its
#       cache in stripes of 128 MiB; a smaller size is raised to that and the caller
#       should say so). The RAM cache is off (ram_cache.size 0): linerate and nginx
#       cache in the page cache only, and so does ATS then (its cache file is read
#       through the page cache, no O_DIRECT here).
#   restarts: ATS writes its cache's directory to disk every dir.sync_frequency
#       seconds (5 here, 60 by default), not when it is stopped: what it cached
#       since the last write is not found after a restart.
#   threads: proxy.config.exec_thread.autoconfig 0 and exec_thread.limit WORKERS,
#       the event threads that serve connections, as many as the other servers'
#       workers; ATS keeps its accept, task, cache disk (threads_per_disk, 8) and
#       log threads besides, which it does not let go.
#   the origin sends no Cache-Control: cache.required_headers 0 and a heuristic
#       freshness of at least an hour (heuristic_min_lifetime) keep every object
#       fresh for longer than a run. No access log (logging_enabled 0), as nginx.
#   traffic_server runs alone, without traffic_manager, as root (admin.user_id #-1:
#       no switch to the trafficserver user, which could not write DIR), its layout
#       (configuration, logs, runtime files, plugins) given by a runroot file.
#
# Varnish:
#   storage: -s file,DIR/storage.bin,CACHE_BYTES: a file on disk read through the
#       page cache, as the others' caches are (malloc would hold the cache in the
#       process's memory, a different cost; Varnish maps the file, so its RSS counts
#       the cached pages it touched, which linerate's and nginx's does not).
#   whole objects: Varnish caches whole objects. A range request on a miss makes it
#       fetch the entire object from the origin (without the Range field) and answer
#       the range from it, streaming (beresp.do_stream, the default) so the first
#       bytes go out while the rest arrives; requests for an object being fetched
#       wait for it (the waiting list) and then stream from it. It is a known property
#       of Varnish, measured as it is: the VCL adds nothing but a TTL of an hour
#       (the origin sends no Cache-Control) and lets ranges be answered from the
#       cached object, as Varnish does by default. A HEAD on a miss is a GET of the
#       whole object too (Varnish caches what it fetched). When the storage is full
#       of objects still being fetched, a fetch finds no room (varnishstat's
#       SMF.s0.c_fail counts the failed allocations) and its clients get bodies cut
#       short; the 503s seen for HEADs at the start of a long-tail run are likely the
#       same.
#   threads: thread_pools WORKERS (one per worker, as the others), each of at least
#       200 and at most 2000 threads: Varnish takes a thread per request being
#       served, and the flash crowd holds 500 viewers at once.
#   -F (foreground manager, its child the server), -j none (no privilege
#       separation: it runs as the benchmark's user), -n DIR/work (its working
#       directory, not /var/lib/varnish), the CLI on a free loopback port.
#
# If installing the packages starts their system services (where systemd runs),
# caches_install stops and disables them once, right after, so that only the
# benchmark's own servers run.

caches_install() {
    local missing=() p
    for p in trafficserver trafficserver-experimental-plugins varnish; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    echo "installing Debian packages: ${missing[*]}" >&2
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
    if [ -d /run/systemd/system ]; then
        systemctl disable --now trafficserver varnish varnishncsa >&2 2>/dev/null || true
    fi
}

# _cache_wait NAME PORT LOG: waits (up to 30 s) until 127.0.0.1:PORT accepts while
# cache_pid lives.
_cache_wait() {
    local _
    for _ in $(seq 1 300); do
        kill -0 "$cache_pid" 2>/dev/null || break
        python3 -c "import socket; socket.create_connection(('127.0.0.1', $2), 0.2)" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "$1 did not start; the end of $3:" >&2
    tail -15 "$3" >&2 2>/dev/null || true
    return 1
}

_cache_started() {
    cache_pid=$1
    if declare -p pids > /dev/null 2>&1; then pids+=("$cache_pid"); fi
}

# ats_runroot DIR: a runroot file (on stdout) that keeps Traffic Server's
# configuration (DIR/etc), runtime files, logs and cache in DIR, its programs and
# plugins where Debian puts them.
ats_runroot() {
    local d=$1
    cat <<EOF
prefix: /usr
exec_prefix: /usr
bindir: /usr/bin
sbindir: /usr/sbin
sysconfdir: $d/etc
datadir: $d/run
includedir: /usr/include
libdir: /usr/lib/trafficserver
libexecdir: /usr/lib/trafficserver/modules
localstatedir: $d/run
runtimedir: $d/run
logdir: $d/log
cachedir: $d/cache
EOF
}

ats_start() {
    local d=$1 port=$2 origin=${3%/} cache=$4 slice=$5 workers=$6 mods=/usr/lib/trafficserver/modules
    [ -e "$mods/slice.so" ] ||
        { echo "no ATS slice plugin in $mods (package trafficserver-experimental-plugins)" >&2; return 1; }
    mkdir -p "$d/etc" "$d/log" "$d/run" "$d/cache"
    # ATS's stripes are 128 MiB: a smaller cache would be no cache at all.
    [ "$cache" -ge 134217728 ] || cache=134217728
    ats_runroot "$d" > "$d/runroot.yaml"
    cat > "$d/etc/records.config" <<EOF
CONFIG proxy.config.admin.user_id STRING #-1
CONFIG proxy.config.http.server_ports STRING $port:ipv4:ip-in=127.0.0.1
CONFIG proxy.config.exec_thread.autoconfig INT 0
CONFIG proxy.config.exec_thread.limit INT $workers
CONFIG proxy.config.exec_thread.affinity INT 0
CONFIG proxy.config.accept_threads INT 1
CONFIG proxy.config.url_remap.remap_required INT 1
CONFIG proxy.config.reverse_proxy.enabled INT 1
CONFIG proxy.config.http.insert_request_via_str INT 0
CONFIG proxy.config.http.insert_response_via_str INT 0
CONFIG proxy.config.http.cache.http INT 1
CONFIG proxy.config.http.cache.required_headers INT 0
CONFIG proxy.config.http.cache.heuristic_min_lifetime INT 3600
CONFIG proxy.config.http.cache.heuristic_max_lifetime INT 86400
CONFIG proxy.config.cache.enable_read_while_writer INT 1
CONFIG proxy.config.http.background_fill_active_timeout INT 0
CONFIG proxy.config.http.background_fill_completed_threshold FLOAT 0.0
CONFIG proxy.config.cache.max_doc_size INT 0
CONFIG proxy.config.http.cache.max_open_read_retries INT 50
CONFIG proxy.config.http.cache.open_read_retry_time INT 10
CONFIG proxy.config.http.cache.max_open_write_retries INT 5
CONFIG proxy.config.cache.ram_cache.size INT 0
CONFIG proxy.config.cache.limits.http.max_alts INT 1
CONFIG proxy.config.cache.dir.sync_frequency INT 5
CONFIG proxy.config.http.keep_alive_no_activity_timeout_in INT 120
CONFIG proxy.config.http.keep_alive_no_activity_timeout_out INT 120
CONFIG proxy.config.http.transaction_no_activity_timeout_in INT 60
CONFIG proxy.config.http.transaction_no_activity_timeout_out INT 60
CONFIG proxy.config.net.connections_throttle INT 100000
CONFIG proxy.config.net.max_connections_in INT 100000
CONFIG proxy.config.log.logging_enabled INT 0
CONFIG proxy.config.diags.debug.enabled INT 0
CONFIG proxy.config.hostdb.host_file.path STRING /etc/hosts
EOF
    echo "map / $origin/ @plugin=slice.so @pparam=--blockbytes=$slice @plugin=cache_range_requests.so" > "$d/etc/remap.config"
    echo "$d/cache $cache" > "$d/etc/storage.config"
    : > "$d/etc/plugin.config"
    : > "$d/etc/volume.config"
    : > "$d/etc/hosting.config"
    : > "$d/etc/cache.config"
    : > "$d/etc/parent.config"
    : > "$d/etc/ssl_multicert.config"
    : > "$d/etc/splitdns.config"
    : > "$d/etc/socks.config"
    printf 'ip_allow:\n  - apply: in\n    ip_addrs: 0/0\n    action: allow\n' > "$d/etc/ip_allow.yaml"
    printf 'logging: {}\n' > "$d/etc/logging.yaml"
    printf 'sni: []\n' > "$d/etc/sni.yaml"
    printf 'strategies: []\n' > "$d/etc/strategies.yaml"
    cp -r /etc/trafficserver/body_factory "$d/etc/" 2>/dev/null || true
    "${server_wrap[@]}" traffic_server --run-root="$d/runroot.yaml" > "$d/log/stdout" 2>&1 &
    _cache_started $!
    _cache_wait "Traffic Server" "$port" "$d/log/diags.log" || { tail -5 "$d/log/stdout" >&2; return 1; }
}

varnish_start() {
    local d=$1 port=$2 origin=${3#http://} cache=$4 workers=$6 host admin
    origin=${origin%%/*}
    host=${origin%:*}
    mkdir -p "$d/work"
    cat > "$d/origin.vcl" <<EOF
vcl 4.1;
backend origin {
    .host = "$host";
    .port = "${origin##*:}";
    .first_byte_timeout = 60s;
    .between_bytes_timeout = 60s;
}
sub vcl_backend_response {
    set beresp.ttl = 1h;
    set beresp.grace = 1h;
}
EOF
    admin=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "${server_wrap[@]}" varnishd -F -j none -n "$d/work" -a "127.0.0.1:$port" -T "127.0.0.1:$admin" \
        -f "$d/origin.vcl" -s "file,$d/storage.bin,$cache" -p thread_pools="$workers" \
        -p thread_pool_min=200 -p thread_pool_max=2000 -p http_range_support=on > "$d/varnishd.log" 2>&1 &
    _cache_started $!
    _cache_wait Varnish "$port" "$d/varnishd.log"
}

cache_stop() {
    local p=${1:-$cache_pid} kids
    [ -n "$p" ] || return 0
    kids=$(pgrep -P "$p" || true)
    kill "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
    for k in $kids; do
        for _ in $(seq 1 50); do kill -0 "$k" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$k" 2>/dev/null || true
    done
}

cache_rss_kb() {
    local p t=0 v
    for p in $(pgrep -P "$1") "$1"; do
        v=$(awk '/^VmHWM:/ { print $2 }' "/proc/$p/status" 2>/dev/null || true)
        t=$((t + ${v:-0}))
    done
    echo "$t"
}
