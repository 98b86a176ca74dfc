#!/usr/bin/env bash
# Live: four caches, one at a time, in front of the same live HLS origin, under the
# same viewers. The origin is tests/origin/live.sh's: ffmpeg encodes a test source
# in real time (2 s segments, a playlist of six) into the origin rig's nginx
# (tests/origin/lib.sh: a network namespace behind Toxiproxy, --delay-ms each way),
# which sends `Cache-Control: max-age=1` with the playlist and max-age=3600 with the
# segments. One encoder runs for the whole benchmark; each run starts its server
# with an empty cache, lets --viewers viewers (tests/origin/live_viewers.py: each
# follows the playlist on one kept-alive connection, joining three segments from the
# live edge, started --ramp a second) watch for --seconds, then stops it. Servers
# alternate: in the order given in odd rounds, reversed in even ones.
#
# Per run, one row:
#   origin req/segment       the origin's segment requests over the distinct
#                            segments it was asked for (1: each fetched once)
#   origin playlist req/s    the origin's playlist requests per second of the run
#                            (the playlist's max-age is 1 s: 1 is one per lifetime)
#   origin bytes/segment byte  segment bytes the origin sent over the bytes of the
#                            distinct segments it was asked for (1: each sent once)
#   delay p50/p99 s          from a segment's file appearing at the origin to its
#                            last byte at a viewer (live latency added by the path)
#   TTFB p99 ms              segment requests: request sent to status line
#   joined the first fetch %  segment requests sent while the segment's first
#                            request (included) still waited for its first byte: they wait
#                            on the origin whatever the cache (the viewers' own
#                            timing), and make most of the TTFB p99
#   TTFB p99 after ms        the TTFB p99 of the other segment requests
#   rebuffers                segments that arrived after a player that started with
#                            its three first ones would have needed them
#   stale playlists          playlists a viewer got more than one segment behind
#                            the origin's newest when it asked
#   errors                   failed or wrong requests, byte mismatches with the
#                            origin's file, and segments a viewer skipped
#   Gb/s                     segment bytes the viewers received, over the run
#   CPU-s, CPU-s/GB          the server's utime+stime (all its processes: nginx's
#                            master and workers, Varnish's manager and child), and
#                            per GB of segments served
#   peak RSS MB              the sum of each of its processes' peak resident size
# Origin figures come from the origin's own access log, never from the server.
#
# The servers (each on loopback, two workers or threads, configured in the scratch
# directory, started and stopped by this script; no system service):
#   linerate  `[[origin]]` prefix /live/ (docs/CACHE.md "Live"): every miss and
#             every expired playlist is one origin request that all waiters share,
#             and a segment's bytes go to every waiter as they arrive;
#             refresh_ahead_percent = 20, so a playlist is revalidated in the
#             background about one origin round trip before it expires.
#   nginx     Debian 12's 1.22: proxy_cache with the origin's Cache-Control obeyed
#             (proxy_cache_valid only for answers without it); proxy_cache_lock on,
#             so one request fills a missing segment while the others wait (nginx
#             checks for the lock's release every 500 ms; the timeout and age at
#             5 s, above any fill here); proxy_cache_use_stale updating, so while
#             one request refreshes an expired playlist the others get the expired
#             copy rather than going to the origin (without background updates, so
#             the request that refreshes it waits for the new one); kept-alive
#             origin connections (upstream keepalive, HTTP/1.1).
#   ats       Apache Traffic Server 9.2 (Debian's trafficserver), as traffic_server
#             alone with a runroot in the scratch directory, running as root. Its
#             documentation's four settings for read-while-writer
#             (enable_read_while_writer 1, background_fill_active_timeout 0,
#             background_fill_completed_threshold 0, max_doc_size 0: waiters read an
#             object while it is written, the fill goes on if its first client
#             leaves, no size limit for objects of unknown size); open read retries
#             (100 x 10 ms: a request for an object being fetched waits up to a
#             second for it instead of going to the origin); open_write_fail_action 2
#             (an expired object being refreshed by another request is served
#             stale, not fetched again); a 256 MB RAM cache, a 256 MB disk cache
#             file, logging off, two exec threads.
#   varnish   Varnish 7.1 (Debian's varnish), `varnishd -F -j none` with its working
#             directory in the scratch directory and `-s malloc,256m`: the origin as
#             the backend, the origin's max-age as the TTL; a grace of 1 s for
#             playlists (an expired playlist is served at most a second past its
#             lifetime while one background fetch refreshes it) and the default for
#             segments; responses streamed to waiters as they arrive (do_stream,
#             the default) and concurrent misses coalesced on one fetch (its waiting
#             list).
# Traffic Server and Varnish are installed with apt-get when missing (`--servers`
# without them needs neither); a system service the packages start is then stopped
# and disabled at once (`systemctl disable --now`) so that it holds no port.
#
# Usage: bench/live.sh [--quick] [--servers "linerate nginx ats varnish"] [--viewers N]
#          [--seconds S] [--rounds N] [--ramp N] [--delay-ms MS] [--out PATH] [--bin PATH]
#          [--trace DIR] [--linerate-origin "KEY = VALUE"]
#   defaults: all four servers, 1000 viewers started 100 a second, watching 30 s, 2
#             rounds, the origin 10 ms away each way, results in target/bench-live.md
#             and .json.
#   --trace   write each run's requests (sent, path, TTFB, time to last byte)
#             to DIR/SERVER-ROUND.trace, to look into a percentile; linerate's
#             access log (with each response's cache status) to
#             DIR/linerate-ROUND.access.log.
#   --linerate-origin  a line set in linerate's [[origin]] table (in place of the
#             key's line there, if any), such as "refresh_ahead_percent = 0" (the
#             table has 20, as docs/CACHE.md "Live" recommends).
#   --quick   the short form: --viewers 200 --seconds 10 --rounds 1 (about a
#             minute), which fails on any error (a rebuffer is a result, reported:
#             a loaded machine can cause one).
#
# Fails (exit 1) when a server does not start or does not serve the playlist, a run
# has viewers without a segment, or a byte differs from the origin's file. Every
# process, the origin's namespace and veth, and the scratch directory are removed on
# every exit path. Needs root, nginx, ffmpeg, curl, python3, iproute2, Go or apt for
# Toxiproxy (built once into target/tools), cargo to build linerate (or --bin).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
. tests/origin/lib.sh
. tests/origin/live.sh
. bench/caches.sh

servers="linerate nginx ats varnish" viewers=1000 seconds=30 rounds=2 ramp=100 delay_ms=10
out=target/bench-live bin="" quick=0 trace="" linerate_origin=""
parse_flags 2,93 "--quick:quick=1 viewers=200 seconds=10 rounds=1" --servers=servers --viewers=viewers --seconds=seconds --rounds=rounds --ramp=ramp \
    --delay-ms=delay_ms --out=out --bin=bin --trace=trace \
    --linerate-origin=linerate_origin -- "$@"
for s in $servers; do
    case "$s" in linerate | nginx | ats | varnish) ;; *) echo "unknown server: $s (linerate nginx ats varnish)" >&2; exit 2 ;; esac
done
in_range() { # VALUE LOW HIGH MESSAGE: exits 2 with MESSAGE unless LOW <= VALUE <= HIGH
    if ! [[ $1 =~ ^[0-9]+$ ]] || [ "$1" -lt "$2" ] || [ "$1" -gt "$3" ]; then echo "$4" >&2; exit 2; fi
}
in_range "$viewers" 1 5000 "--viewers: 1 to 5000"
in_range "$seconds" 5 600 "--seconds: 5 to 600"
in_range "$rounds" 1 20 "--rounds: 1 to 20"
in_range "$ramp" 1 100000 "--ramp: viewers started a second, at least 1"
[ "$(id -u)" = 0 ] || { echo "bench/live.sh: needs root (the origin rig)" >&2; exit 1; }
has() { [[ " $1 " == *" $2 "* ]]; }
require_tools nginx ffmpeg curl python3 ip tc

# Debian's packages, when a server needs one. Their services are not for this
# benchmark: stopped and disabled right after the install.
install_pkgs() { # COMMAND "SERVICE..." PACKAGE...: the packages, unless COMMAND is there
    command -v "$1" >/dev/null && return 0
    echo "live: installing ${*:3} (apt-get)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${@:3}" >&2 ||
        { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${@:3}" >&2; } ||
        { echo "live: cannot install ${*:3}" >&2; exit 1; }
    if [ -d /run/systemd/system ]; then
        # shellcheck disable=SC2086 # the services, one word each
        systemctl disable --now $2 >&2 || true
    fi
}
has "$servers" ats && install_pkgs traffic_server trafficserver trafficserver trafficserver-experimental-plugins
has "$servers" varnish && install_pkgs varnishd "varnish varnishncsa" varnish
! has "$servers" linerate || build_linerate
ensure_toxiproxy

start_work
chmod 755 "$work"
# 1000 viewers hold 1000 connections, and each server as many again and its own.
ulimit -n "$(ulimit -Hn)"
ORIGIN_DELAY_MS=$delay_ms live_origin_up
origin_authority=${ORIGIN_URL#http://}
origin_authority=${origin_authority%/}
mkdir -p "$work/empty"

# --- the servers ------------------------------------------------------------------------
# start_live SERVER: SERVER with an empty cache on a free loopback port, its files in
# $work/SERVER; sets server_pid and url (the playlist through it). Returns once it
# answers the playlist with a 200.
start_live() {
    local s=$1 port d=$work/$1 i code
    port=$(free_port)
    rm -rf "$d"
    mkdir -p "$d/cache"
    case "$s" in
        linerate)
            live_linerate_conf "$work/empty" "$d/cache" > "$d/linerate.toml"
            # The line replaces one setting the same key, or is added.
            if [ -n "$linerate_origin" ]; then
                sed -i "/^${linerate_origin%%[ =]*}[ =]/d; /^urls = /a $linerate_origin" "$d/linerate.toml"
            fi
            local limits
            mapfile -t limits < <(loopback_limits)
            "$bin" serve --config "$d/linerate.toml" --workers 2 --log-level warn --admin 127.0.0.1:0 "${limits[@]}" \
                ${trace:+--access-log "$trace/linerate-$round.access.log"} \
                --listen "127.0.0.1:$port" > "$d/out" 2> "$d/err" & ;;
        nginx)
            write_nginx_conf "$d" 2 19000 12000 "    server {
        listen 127.0.0.1:$port reuseport;
        location /live/ {
            proxy_cache live;
            proxy_cache_valid 200 1s;
            proxy_cache_lock on;
            proxy_cache_lock_timeout 5s;
            proxy_cache_lock_age 5s;
            proxy_cache_use_stale updating;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_pass http://origin;
        }
    }" "    proxy_cache_path $d/cache levels=1:2 keys_zone=live:16m max_size=500m inactive=1h use_temp_path=off;
    upstream origin { server $origin_authority; keepalive 64; }"
            nginx -e "$d/error.log" -c "$d/nginx.conf" -p "$d" > "$d/out" 2> "$d/err" & ;;
        ats)
            ats_conf "$d" "$port"
            traffic_server --run-root="$d/runroot.yaml" > "$d/out" 2> "$d/err" & ;;
        varnish)
            cat > "$d/live.vcl" <<VCL
vcl 4.1;
backend origin { .host = "127.0.0.1"; .port = "${origin_authority##*:}"; }
sub vcl_backend_response {
    if (bereq.url ~ "\.m3u8$") { set beresp.grace = 1s; }
}
VCL
            varnishd -F -j none -n "$d/varnish" -a "127.0.0.1:$port" -f "$d/live.vcl" -s malloc,256m \
                -p thread_pools=2 > "$d/out" 2> "$d/err" & ;;
    esac
    server_pid=$!
    pids+=("$server_pid")
    url=http://127.0.0.1:$port/live/stream.m3u8
    for i in $(seq 1 200); do
        code=$(curl -s --noproxy '*' --max-time 2 -o /dev/null -w '%{http_code}' "$url" || true)
        [ "$code" = 200 ] && return 0
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "$s did not serve the playlist (last answer ${code:-none}):" >&2
    tail -5 "$d/out" "$d/err" "$d/error.log" "$d/log/diags.log" 2>/dev/null >&2
    return 1
}

# ats_conf DIR PORT: Traffic Server's runroot, configuration and cache in DIR (the
# header says why each setting).
ats_conf() {
    local d=$1 port=$2
    mkdir -p "$d/etc" "$d/run" "$d/log" "$d/cache"
    cp -r /etc/trafficserver/. "$d/etc/"
    ats_runroot "$d" > "$d/runroot.yaml"
    echo "$d/cache 256M" > "$d/etc/storage.config"
    echo "map http://127.0.0.1:$port/ $ORIGIN_URL" > "$d/etc/remap.config"
    cat > "$d/etc/records.config" <<ATS
CONFIG proxy.config.http.server_ports STRING $port:ipv4:ip-in=127.0.0.1
CONFIG proxy.config.admin.user_id STRING #-1
CONFIG proxy.config.exec_thread.autoconfig INT 0
CONFIG proxy.config.exec_thread.limit INT 2
CONFIG proxy.config.accept_threads INT 1
CONFIG proxy.config.task_threads INT 2
CONFIG proxy.config.url_remap.remap_required INT 1
CONFIG proxy.config.reverse_proxy.enabled INT 1
CONFIG proxy.config.log.logging_enabled INT 0
CONFIG proxy.config.http.insert_response_via_str INT 0
CONFIG proxy.config.cache.ram_cache.size INT 268435456
CONFIG proxy.config.cache.enable_read_while_writer INT 1
CONFIG proxy.config.http.background_fill_active_timeout INT 0
CONFIG proxy.config.http.background_fill_completed_threshold FLOAT 0.000000
CONFIG proxy.config.cache.max_doc_size INT 0
CONFIG proxy.config.cache.read_while_writer.max_retries INT 10
CONFIG proxy.config.cache.read_while_writer_retry.delay INT 50
CONFIG proxy.config.http.cache.max_open_read_retries INT 100
CONFIG proxy.config.http.cache.open_read_retry_time INT 10
CONFIG proxy.config.http.cache.open_write_fail_action INT 2
ATS
}

# stop_live: the server and any process it started.
stop_live() {
    local kids p
    kids=$(pgrep -P "$server_pid" || true)
    stop_server
    for p in $kids; do kill "$p" 2>/dev/null || true; done
}

# tree_hwm PID: the peak resident sizes (VmHWM) of PID and its children, summed, in kB.
tree_hwm() {
    local p t=0 k
    for p in $(pgrep -P "$1") "$1"; do
        k=$(awk '/^VmHWM:/ { print $2 }' "/proc/$p/status" 2>/dev/null || true)
        t=$((t + ${k:-0}))
    done
    echo "$t"
}

clk=$(getconf CLK_TCK)
failed=0

# run_live SERVER: one run; appends its row to $work/results.
run_live() {
    local s=$1 c0 ticks hwm since until_t
    start_live "$s" || exit 1
    origin_settle 5 || true
    since=$(date +%s.%N)
    c0=$(tree_ticks "$server_pid")
    timeout $((seconds + 60)) python3 tests/origin/live_viewers.py --url "$url" --root "$LIVE_DIR" \
        --viewers "$viewers" --duration "$seconds" --ramp "$ramp" ${trace:+--trace "$trace/$s-$round.trace"} > "$work/viewers.json" ||
        { echo "the viewers of $s failed" >&2; exit 1; }
    until_t=$(date +%s.%N)
    ticks=$(( $(tree_ticks "$server_pid") - c0 ))
    hwm=$(tree_hwm "$server_pid")
    origin_settle 5 || true
    stop_live
    python3 - "$work/viewers.json" "$ORIGIN_LOG" "$LIVE_DIR" "$s" "$since" "$until_t" "$ticks" "$clk" "$hwm" \
        "$quick" >> "$work/results" <<'PY' || failed=1
import json, os, re, sys
v = json.load(open(sys.argv[1]))
log, root, s = sys.argv[2], sys.argv[3], sys.argv[4]
since, until, ticks, clk, hwm = float(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8]), int(sys.argv[9])
quick = sys.argv[10] == "1"
seg_req = seg_bytes = playlists = 0
segs = set()
for line in open(log):
    f = line.rstrip("\n").split("\t")
    if len(f) < 4 or float(f[0]) < since:
        continue
    path = f[1].split(" ")[1] if " " in f[1] else ""
    m = re.fullmatch(r"/live/(seg[0-9]+\.ts)", path)
    if m:
        seg_req += 1
        seg_bytes += int(f[3])
        segs.add(m.group(1))
    elif path == "/live/stream.m3u8":
        playlists += 1
distinct_bytes = sum(os.path.getsize(os.path.join(root, n)) for n in segs)
span = until - since
served = v["segment_bytes"]
cpu = ticks / clk
errors = v["errors"] + v["mismatches"] + v["gaps"]
print(s, "%.3f" % (seg_req / max(len(segs), 1)), "%.2f" % (playlists / span), "%.3f" % (seg_bytes / max(distinct_bytes, 1)),
      "%.3f" % v["segment_delay_s"]["p50"], "%.3f" % v["segment_delay_s"]["p99"], "%.1f" % (v["segment_ttfb_s"]["p99"] * 1000),
      "%.2f" % (100 * v["segment_requests_joining_the_first_fetch"] / max(v["segment_requests"], 1)),
      "%.1f" % ((v["segment_ttfb_after_the_first_byte_s"]["p99"] or 0) * 1000),
      v["playlist_lag_segments"]["above_1"], v["rebuffers"], errors, "%.3f" % (served * 8 / v["duration_s"] / 1e9), "%.2f" % cpu,
      "%.2f" % (cpu / max(served / 1e9, 1e-9)), "%.0f" % (hwm / 1024))
if v["mismatches"] or v["viewers_with_segments"] != v["viewers"] or (quick and errors):
    print("           FAIL %s: %d byte mismatches, %d errors, %d rebuffers, %d of %d viewers got a segment; first error: %s"
          % (s, v["mismatches"], errors, v["rebuffers"], v["viewers_with_segments"], v["viewers"], v["first_error"]),
          file=sys.stderr)
    sys.exit(1)
if v["first_error"]:
    print("           %s: %d errors, first: %s" % (s, v["errors"], v["first_error"]), file=sys.stderr)
PY
    tail -1 "$work/results" | awk '{ printf "  %-8s origin req/segment %s  playlist req/s %s  bytes/segment byte %s  delay p50 %s s p99 %s s  TTFB p99 %s ms (%s%% joined the first fetch; the others %s ms)  stale playlists %s  rebuffers %s  errors %s  %s Gb/s  CPU %s s (%s s/GB)  peak RSS %s MB\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16 }'
}

{
    echo "Live: servers $servers; $viewers viewers (started $ramp a second) for $seconds s; $rounds round(s)"
    echo "origin: ffmpeg in real time, 2 s segments (~0.4 Mb/s), playlist max-age=1, ${delay_ms} ms each way (Toxiproxy $ORIGIN_TOXIPROXY_VERSION)"
    echo "host: $(nproc) CPUs, $(uname -r), $(nginx -v 2>&1 | sed 's/.*: //')$(! has "$servers" ats || echo ", $(traffic_server -V 2>&1 | head -1 | awk '{ print "Traffic Server " $3 }')")$(! has "$servers" varnish || echo ", $(varnishd -V 2>&1 | head -1 | sed 's/varnishd (\([^ ]*\) .*/\1/')"), $(! has "$servers" linerate || "$bin" --version 2>/dev/null || echo linerate)"
} | tee "$work/setup"
for round in $(seq 1 "$rounds"); do
    order=$servers
    [ $((round % 2)) = 1 ] || order=$(tr ' ' '\n' <<< "$servers" | tac | tr '\n' ' ')
    echo "round $round: $order"
    for s in $order; do run_live "$s"; done
done
kill -0 "$LIVE_FFMPEG_PID" 2>/dev/null || { echo "the encoder stopped during the runs:" >&2; tail -5 "$work/ffmpeg.log" >&2; failed=1; }

write_results "$out" "$work/results" "$rounds" 1 \
    "server|origin req/segment|origin playlist req/s|origin bytes/segment byte|delay p50 s|delay p99 s|TTFB p99 ms|joined the first fetch %|TTFB p99 after ms|stale playlists|rebuffers|errors|Gb/s|server CPU-s|CPU-s/GB|peak RSS MB"
