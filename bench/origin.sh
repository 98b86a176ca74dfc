#!/usr/bin/env bash
# Origin fill: linerate's pull-through cache (`[[origin]]`, docs/CACHE.md) against
# nginx's best cache configuration, both in front of the same origin behind the same
# emulated WAN (tests/origin/lib.sh: nginx in a network namespace, the rate capped by
# tbf at --rate, Toxiproxy adding --delay-ms each way), with the same cache size,
# slice size and worker count, alternating the servers (in the order given in odd
# rounds, reversed in even ones). Each server has a cache directory of its own in the
# scratch directory, emptied before each run (its pages leave the page cache with its
# files). The catalogue stays in --dir across runs, warm in the origin's page cache:
# the origin's disk is not under test. Origin bytes and requests come from the
# origin's own access log, never from the server under test.
#
# Workloads (--workloads, each a table, one row per run and the medians per server):
#   flash    --flash-sessions paced viewers (5 Mb/s, 2 MiB segments, 3 start-up
#            segments) start one cold title within 2 s and watch it for
#            --flash-duration s; the title (--flash-mib) is short enough that each
#            viewer asks for all of it. The bench takes the title's size from the
#            origin's file (`--sizes-from`), not from a HEAD to the server: a HEAD
#            of a cold title starts a fill (all of it, in Varnish), and the crowd
#            would find the title already coming. Origin bytes / title bytes (1:
#            each byte fetched once), origin requests (ideal: one per slice), play
#            delay p50/p99, TTFB p99, rebuffers, errors, server CPU-s and CPU-s
#            per GB served.
#   tail     a Zipf(1) catalogue of 4 x --cache-mib in titles of --title-mib, played
#            by --tail-sessions paced viewers (5 Mb/s, started --tail-ramp a second)
#            for --tail-duration s: byte hit ratio (1 - origin bytes / served bytes),
#            origin bytes per served byte, Gb/s, rebuffers. The bench sizes each title
#            with a HEAD before it plays, which on a cold cache fills the first slice
#            of every title (nginx turns a HEAD into a GET of the slice): those origin
#            bytes are reported apart ("discovery MB") and left out of the ratios,
#            which count the origin requests that began once viewers played (by
#            their start, the log's time less their duration: a server that answers
#            a HEAD before its slice is in may still be filling it then). The cache
#            directory's size on disk (`du`, every half second while viewers play:
#            mean and peak MB) is reported beside it: a server that goes over its
#            limit between two passes of its eviction holds more than it was given.
#            Five minutes by default: at this miss rate the cache's contents turn
#            over every 25-30 s, and the first minute is the warm-up (a cache full of
#            the HEADs' first slices, emptied and refilled by the first plays), where
#            a server that holds more than its limit between passes gains most. The
#            steady state after it is what a cache in front of a catalogue lives in;
#            `--tail-duration 60` measures the first minute alone.
#   restart  the cache filled with --restart-slices objects of 4 KiB, each one slice,
#            by 32 keep-alive clients; slices of 64 KiB (the least linerate takes)
#            for both servers. Tiny objects on purpose: what a restart costs grows
#            with the slices, not the bytes, and 100,000 of them are 400 MiB. The
#            server is stopped, the cache's pages dropped from the page cache (as
#            after a reboot), and it is started again while one client asks for the
#            cached objects in a random order: seconds from the start to the first
#            answer and to the first HIT (an answer during which the origin's log
#            did not grow), the misses before it, and the hits among the next 200
#            objects asked. nginx's cache loader walks the cache directory in the
#            background after a start; linerate replays its index journal.
#   hits     the first titles of the tail catalogue that fill half the cache, cached
#            by one pass, then --hits-sessions closed-loop sessions (2 MiB ranges)
#            for --duration s: Gb/s, server CPU-s per GB and the origin's requests
#            during the run (0: all hits), then the same load on the same server
#            serving the same files from its root (the SERVER-local row): "hits cost
#            what local files cost", the hits' CPU-s per GB over the local one
#            (target for linerate: at most 1.05).
#
# nginx (Debian 12's 1.22.1, built with the slice and thread modules), and why:
#   proxy_cache_path DIR levels=1:2 keys_zone=origin:64m max_size=CACHE inactive=7d
#       use_temp_path=off: two directory levels so no directory holds 100,000 files;
#       64 MB of keys hold about 500,000 entries (the restart's 100,000 slices
#       among them); max_size the same as linerate's max_size_bytes; inactive=7d so
#       nothing leaves for idleness during a run (the default is 10 minutes);
#       use_temp_path=off so a slice is written in the cache directory and renamed
#       into place, not copied over from proxy_temp_path.
#   slice S: ranges are fetched and cached as aligned slices of S (--slice-mib, the
#       same as linerate's cache.slice_bytes); without it a range on a miss fetches
#       the whole file from the origin.
#   proxy_cache_key $uri$slice_range: each slice its own entry.
#   proxy_set_header Range $slice_range: the origin is asked for that slice.
#   proxy_cache_valid 200 206 1h: the origin sends no Cache-Control; 206 slices are
#       kept for an hour, longer than any run.
#   proxy_cache_lock on; proxy_cache_lock_timeout 30s; proxy_cache_lock_age 30s: one
#       request per missing slice goes to the origin and everyone else waits for it
#       to be cached (polling every 500 ms, hard-coded in nginx); with the defaults
#       (5 s each) a slice slower than 5 s sends the whole herd to the origin, and
#       those responses are not cached.
#   upstream { keepalive 64 } with proxy_http_version 1.1 and an empty Connection
#       header: kept-alive origin connections, no TCP handshake (one RTT) per slice.
#   proxy_buffer_size 64k; proxy_buffers 32 64k: fewer, larger reads of the origin's
#       bytes (the defaults are 8 buffers of one page).
#   sendfile on; aio threads: hits are sent by sendfile from a thread pool, so a
#       cache file that is not in memory does not stall the worker (nginx's best for a
#       cold cache, measured in bench/cold.sh).
#   worker_processes --workers, as many as linerate's workers.
# linerate: `linerate serve --config FILE` with `[[origin]]` prefix = "/", urls = [the
#   origin's URL], `[cache]` slice_bytes, one `[[cache.dirs]]` with path and
#   max_size_bytes = the cache size, an empty root, and the per-client limits lifted
#   (loopback_limits in bench/lib.sh). Before the first run the script checks that
#   this binary takes that configuration (`--check-config`) and that a request for a
#   title only the origin has is filled from it; it stops with a message otherwise
#   (use --servers nginx until the pull-through cache is in the binary).
# ats and varnish (--servers): Apache Traffic Server 9.2 and Varnish 7.1, Debian's
#   packages (installed with apt-get when missing), started and stopped by
#   bench/caches.sh, whose header gives each setting and why. ATS: the slice plugin
#   with blocks of --slice-mib (256 KiB at least: the restart's 64 KiB slices become
#   256 KiB blocks) and cache_range_requests, read-while-writer, collapsed misses,
#   one cache file of the cache size (at least 128 MiB, ATS's stripe: under --quick
#   ATS has twice the others' cache), --workers event threads. Varnish: whole objects
#   (a range on a miss fetches the whole title), streaming, file storage of the cache
#   size, a thread pool per worker. Their "on disk" columns count the preallocated
#   cache file whole (and Varnish's shared-memory log in its working directory). In
#   restart, ATS is given 7 s after the fill before it is stopped (it writes its
#   cache's directory every 5 s, not at a stop); Varnish's storage does not outlive
#   its process, so its row has no HIT (-1) and does not fail. In hits they have no
#   local row (they serve no files of their own): -1 in the ratio's column. CPU and
#   peak RSS (the flash's and tail's "peak RSS MB": VmHWM summed over the server's
#   processes) count every process of each server: nginx's master and workers,
#   Varnish's manager and child, ATS's traffic_server and traffic_crashlog. Varnish
#   maps its storage file, so its RSS counts the cached pages it touched.
#
# Usage: bench/origin.sh [--quick] [--servers "linerate nginx ats varnish"] [--workloads "flash tail
#          restart hits"] [--rounds N] [--slice-mib 1|2|4|8] [--cache-mib M]
#          [--title-mib M] [--duration S] [--flash-sessions N] [--flash-mib M]
#          [--flash-duration S] [--tail-sessions N] [--tail-ramp N] [--tail-titles N] [--tail-duration S]
#          [--hits-sessions N] [--nginx-cache-mib M] [--access-log FILE]
#          [--restart-slices N] [--rate RATE] [--delay-ms MS] [--workers N] [--dir DIR]
#          [--out PATH] [--bin PATH] [--linerate-origin "KEY = VALUE"]
#   defaults: linerate and nginx, 3 rounds, 4 MiB slices, a 1024 MiB cache, 16 MiB titles (the tail: 256
#             of them), 60 s hits runs, 500 flash viewers of a 16 MiB title for 30 s, 200
#             tail viewers started 40 a second for 300 s, 32 hits sessions, 100,000 restart
#             slices, the origin at 1gbit (tc's units) and 10 ms each way, 2 workers,
#             the catalogue in /var/tmp/linerate-origin, results in
#             target/bench-origin.md and .json.
#   --tail-titles  the tail's catalogue in titles (default: 4 x the cache): another
#             cache size against the same catalogue.
#   --access-log FILE  linerate's JSON access log of its last flash or tail run kept
#             as FILE (the tail's when both run), for bench/cache-model.py (eviction
#             rules replayed on a tail's requests) or a look at each response;
#             the log costs linerate CPU in every workload: not for CPU figures.
#   --linerate-origin  a line added to linerate's [[origin]] table, such as
#             "read_ahead_slices = 1" (docs/CACHE.md, "Read-ahead").
#   --nginx-cache-mib  nginx's max_size (default: --cache-mib), to compare the two at
#             the same size on disk rather than the same setting (see the tail's
#             disk columns).
#   --quick   one round, a 64 MiB cache (tail: 16 titles), 5 s tail and hits runs, an 8 MiB flash
#             title for 8 s (still 500 viewers), 40 tail viewers, 16 hits sessions,
#             2,000 restart slices: a smoke run (about a minute per server) that
#             fails on any error of linerate or nginx (ATS's and Varnish's errors
#             under load are reported as results: with the quick 64 MiB storage,
#             Varnish cuts responses short when it cannot allocate storage for what it
#             streams, and the tail's row says so with its counters).
#
# Fails (exit 1) when a server does not start, a run serves nothing, a fill returns
# wrong bytes, or a run reports errors that mean a broken server or set-up (connect,
# status, protocol; under --quick, any error of linerate or nginx). Every process, the origin's namespace,
# veth and qdiscs, and the scratch directory are removed on every exit path.
#
# Needs: root, nginx (Debian's), trafficserver, trafficserver-experimental-plugins
# and varnish for those servers (apt-get installs them), curl, python3, iproute2, util-linux (fincore), Go or
# apt for Toxiproxy (built once into target/tools), cargo to build linerate.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
. tests/origin/lib.sh
. bench/caches.sh

servers="linerate nginx" workloads="flash tail restart hits" rounds=3 slice_mib=4 workers=2
rate=1gbit delay_ms=10 cache_mib=1024 title_mib=16 duration=60
flash_sessions=500 flash_mib=16 flash_duration=30 tail_sessions=200 tail_ramp=40 tail_duration=300 hits_sessions=32
restart_slices=100000 dir=/var/tmp/linerate-origin out=target/bench-origin bin="" quick=0 tail_titles="" nginx_cache_mib="" access_log="" linerate_origin=""
parse_flags 2,155 "--quick:quick=1 rounds=1 cache_mib=64 duration=5 flash_mib=8 flash_duration=8 tail_sessions=40 tail_duration=5 \
        hits_sessions=16 restart_slices=2000" \
    --servers=servers --workloads=workloads --rounds=rounds --slice-mib=slice_mib --cache-mib=cache_mib \
    --title-mib=title_mib --duration=duration --flash-sessions=flash_sessions --flash-mib=flash_mib \
    --flash-duration=flash_duration --tail-sessions=tail_sessions --tail-ramp=tail_ramp --tail-titles=tail_titles --tail-duration=tail_duration \
    --hits-sessions=hits_sessions --nginx-cache-mib=nginx_cache_mib --access-log=access_log --restart-slices=restart_slices --rate=rate --delay-ms=delay_ms \
    --workers=workers --dir=dir --out=out --bin=bin --linerate-origin=linerate_origin -- "$@"
[ "$quick" -eq 1 ] && dir="$dir-quick"
case "$slice_mib" in 1 | 2 | 4 | 8) ;; *) echo "--slice-mib: 1, 2, 4 or 8, not $slice_mib" >&2; exit 2 ;; esac
for s in $servers; do
    case "$s" in linerate | nginx | ats | varnish) ;; *) echo "unknown server: $s (linerate, nginx, ats, varnish)" >&2; exit 2 ;; esac
done
for w in $workloads; do
    case "$w" in flash | tail | restart | hits) ;; *) echo "unknown workload: $w (flash tail restart hits)" >&2; exit 2 ;; esac
done
[ -n "$tail_titles" ] || tail_titles=$((4 * cache_mib / title_mib))
[ "$tail_titles" -ge 4 ] || { echo "--cache-mib must be at least --title-mib (the tail needs 4 titles)" >&2; exit 2; }
hot_titles=$((cache_mib / 2 / title_mib))
[ "$hot_titles" -ge 1 ] || hot_titles=1
slice_bytes=$((slice_mib * 1024 * 1024))
cache_bytes=$((cache_mib * 1024 * 1024))
nginx_cache_bytes=$(( ${nginx_cache_mib:-$cache_mib} * 1024 * 1024 ))
restart_slice_bytes=65536
restart_object_bytes=4096
# The restart's cache: its slices with room to spare, whatever either server counts
# per slice, and never less than --cache-mib.
restart_cache_bytes=$((restart_slices * restart_slice_bytes))
[ "$restart_cache_bytes" -ge "$cache_bytes" ] || restart_cache_bytes=$cache_bytes
has() { [[ " $1 " == *" $2 "* ]]; }
# cache_of SERVER: the cache size SERVER is given.
cache_of() { if [ "$1" = nginx ]; then echo "$nginx_cache_bytes"; else echo "$cache_bytes"; fi; }

require_tools nginx curl python3 fincore ip tc
nginx -V 2>&1 | grep -q -- --with-threads || { echo "nginx is built without threads: no aio threads" >&2; exit 1; }
nginx -V 2>&1 | grep -q -- --with-http_slice_module || { echo "nginx is built without the slice module" >&2; exit 1; }
if has "$servers" ats || has "$servers" varnish; then caches_install; fi
build_linerate # the bench client, and the server under test

start_work
# nginx's workers (nobody) reach their cache directory through the scratch directory.
chmod 755 "$work"
mkdir -p "$work/empty"

# --- the catalogue, and the origin ------------------------------------------------------
has "$workloads" flash && make_content "$dir" 1 "$flash_mib" flash
if has "$workloads" tail || has "$workloads" hits; then make_content "$dir" "$tail_titles" "$title_mib" title; fi
if has "$workloads" restart; then
    objects_list=$(python3 tests/origin/probe.py objects "$dir" "$restart_slices" "$restart_object_bytes")
    head -n "$restart_slices" "$objects_list" > "$work/objects"
fi
tail_files=$(seq -f "title%g.bin" -s , 1 "$tail_titles")
hot_files=$(seq -f "title%g.bin" -s , 1 "$hot_titles")
ORIGIN_RATE=$rate ORIGIN_DELAY_MS=$delay_ms origin_up "$dir"
origin_authority=${ORIGIN_URL#http://}
origin_authority=${origin_authority%/}

# --- the servers ------------------------------------------------------------------------
# start_cached SERVER SLICE_BYTES CACHE_BYTES [PORT [nowait]]: SERVER with the cache in
# front of the origin on 127.0.0.1:PORT (default: a free port), its cache directory
# $work/cache-SERVER; sets server_pid and base. Waits until it accepts, unless nowait.
start_cached() {
    local server=$1 slice=$2 cache=$3 port=${4:-} d
    [ -n "$port" ] || port=$(free_port)
    base=http://127.0.0.1:$port/
    case "$server" in
        nginx)
            d=$work/nginx-cache
            write_nginx_conf "$d" "$workers" 19000 12000 "    server {
        listen 127.0.0.1:$port reuseport;
        location / {
            slice $slice;
            proxy_cache origin;
            proxy_cache_key \$uri\$slice_range;
            proxy_set_header Range \$slice_range;
            proxy_cache_valid 200 206 1h;
            proxy_cache_lock on;
            proxy_cache_lock_timeout 30s;
            proxy_cache_lock_age 30s;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffer_size 64k;
            proxy_buffers 32 64k;
            aio threads;
            add_header X-Cache \$upstream_cache_status;
            proxy_pass http://origin;
        }
    }" "    proxy_cache_path $work/cache-nginx levels=1:2 keys_zone=origin:64m max_size=$cache inactive=7d use_temp_path=off;
    upstream origin { server $origin_authority; keepalive 64; }"
            "${server_wrap[@]}" nginx -e "$d/error.log" -c "$d/nginx.conf" -p "$d" > "$d/stdout" 2>&1 &
            server_pid=$! ;;
        linerate)
            linerate_conf "$slice" "$cache" > "$work/linerate-cache.toml"
            mkdir -p "$work/cache-linerate"
            local limits
            mapfile -t limits < <(loopback_limits)
            "${server_wrap[@]}" "$bin" serve --config "$work/linerate-cache.toml" --workers "$workers" --log-level warn \
                --admin 127.0.0.1:0 "${limits[@]}" --listen "127.0.0.1:$port" > "$work/linerate.out" 2> "$work/linerate.err" &
            server_pid=$! ;;
        ats | varnish)
            # ATS's slice plugin takes blocks of 256 KiB at least: the restart's 64 KiB
            # slices become 256 KiB ones (its 4 KiB objects are one block either way).
            [ "$slice" -ge 262144 ] || slice=262144
            # bench/caches.sh: returns once the server accepts (nowait or not: the
            # restart's probe measures from before the start either way).
            "${server}_start" "$work/cache-$server" "$port" "$ORIGIN_URL" "$cache" "$slice" "$workers" || return 1
            server_pid=$cache_pid
            return 0 ;;
    esac
    pids+=("$server_pid")
    [ "${5:-}" = nowait ] && return 0
    wait_port "$port" && kill -0 "$server_pid" 2>/dev/null && return 0
    echo "$server did not start:" >&2
    tail -5 "$work/nginx-cache/error.log" "$work/linerate.err" 2>/dev/null >&2
    return 1
}

# linerate_conf SLICE_BYTES CACHE_BYTES: linerate's configuration (config/origin.rs).
linerate_conf() {
    origin_linerate_conf "$work/empty" / "$ORIGIN_URL" "$work/cache-linerate" "$2" "slice_bytes = $1" |
        if [ -n "$linerate_origin" ]; then sed "/^urls = /a $linerate_origin"; else cat; fi
    [ -z "$access_log" ] || printf '\n[access_log]\npath = "%s"\n' "$work/linerate-access.json"
}

# reset_cache SERVER: its cache directory emptied (the server is stopped).
reset_cache() { rm -rf "$work/cache-$1"; }

# linerate_ready: this linerate takes the configuration, and fills from the origin.
linerate_ready() {
    local code
    linerate_conf "$slice_bytes" "$cache_bytes" > "$work/linerate-check.toml"
    if ! "$bin" serve --config "$work/linerate-check.toml" --check-config > "$work/check-config.out" 2>&1; then
        echo "$bin does not take the pull-through cache's configuration ([[origin]], [cache]):" >&2
        tail -3 "$work/check-config.out" >&2
        echo "use a linerate with the cache (issue 28), or --servers nginx" >&2
        return 1
    fi
    reset_cache linerate
    start_cached linerate "$slice_bytes" "$cache_bytes" || return 1
    origin_log_clear
    # A path only the origin has: the first one of the catalogue this run made.
    local path=/flash1.bin
    has "$workloads" flash || path=/title1.bin
    has "$workloads" flash || has "$workloads" tail || has "$workloads" hits || path=$(head -1 "$work/objects")
    code=$(curl -s --noproxy '*' -o /dev/null -w '%{http_code}' -r 0-0 "${base%/}$path" || true)
    origin_settle
    stop_server
    reset_cache linerate
    if [ "$code" != 206 ] || [ "$(origin_requests)" = 0 ]; then
        echo "$bin takes [[origin]] but did not fill from the origin (answer $code, $(origin_requests) origin requests):" \
            "its pull-through cache is not in this build; use --servers nginx" >&2
        return 1
    fi
}

# stop_server: the server stopped, and every process it started gone (Varnish's child,
# nginx's workers).
stop_server() { cache_stop "$server_pid"; }

# run_bench JSON ARGS...: `linerate bench` against $base, server CPU ticks in `ticks`
# and its peak RSS in `rss_kb` (VmHWM, summed over the server and its children).
run_bench() {
    local json=$1 c0
    shift
    c0=$(tree_ticks "$server_pid")
    "$bin" bench --base-url "$base" --segment-bytes 2097152 --json "$@" > "$json" ||
        { echo "linerate bench failed" >&2; return 1; }
    ticks=$(( $(tree_ticks "$server_pid") - c0 ))
    rss_kb=$(cache_rss_kb "$server_pid")
    # Under --quick any error fails a smoke run of linerate or nginx; ATS's and
    # Varnish's own failures under load (a short body when Varnish's storage cannot
    # hold what it is streaming) are results, reported, and fail only when they mean
    # a broken set-up (connect, status, protocol, verify).
    local strict=$quick
    [ "$current" = linerate ] || [ "$current" = nginx ] || strict=0
    bench_checks "$json" "$strict" || failed=1
    if [ "$current" = varnish ]; then
        varnishstat -n "$work/cache-varnish/work" -1 -f MAIN.fetch_failed -f MAIN.n_lru_nuked -f MAIN.n_lru_limited \
            -f SMF.s0.c_fail 2> /dev/null | awk '{ printf "%s%s %s", (NR > 1 ? ", " : "           varnish: "), $1, $2 } END { print "" }'
    fi
}

# keep_access_log SERVER: linerate's access log of the run just stopped kept as --access-log.
keep_access_log() {
    if [ -n "$access_log" ] && [ "$1" = linerate ]; then
        mkdir -p "$(dirname "$access_log")"
        mv "$work/linerate-access.json" "$access_log"
    fi
}

clk=$(getconf CLK_TCK)
failed=0 current=""

# --- the workloads: each appends one row to $work/res-WORKLOAD ----------------------------
run_flash() { # SERVER
    local s=$1 title_bytes=$((flash_mib * 1024 * 1024))
    reset_cache "$s"
    start_cached "$s" "$slice_bytes" "$(cache_of "$s")" || exit 1
    origin_log_clear
    # An older --bin sizes the title with a HEAD (see the header).
    local sizes=()
    ! grep -q -- '--sizes-from' <<< "$("$bin" bench --help)" || sizes=(--sizes-from "$dir")
    run_bench "$work/flash.json" --files flash1.bin "${sizes[@]}" --sessions "$flash_sessions" --ramp $(( (flash_sessions + 1) / 2 )) \
        --duration "$flash_duration" --bitrate-mbps 5 --startup-segments 3 --zipf 0 || exit 1
    origin_settle
    stop_server
    keep_access_log "$s"
    python3 - "$work/flash.json" "$s" "$(origin_bytes)" "$(origin_requests)" "$title_bytes" "$ticks" "$clk" "$rss_kb" \
        >> "$work/res-flash" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
s, ob, oreq, tb, ticks, clk = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
cpu = ticks / clk
print(s, "%.3f" % (ob / tb), oreq, "%.0f" % j["play_delay_ms"]["p50"], "%.0f" % j["play_delay_ms"]["p99"],
      "%.1f" % j["ttfb_ms"]["p99"], j["rebuffers"], j["errors_total"], "%.2f" % cpu,
      "%.3f" % (cpu / max(j["bytes"] / 1e9, 1e-9)), "%.0f" % (j["bytes"] / 1e6), "%.0f" % (int(sys.argv[8]) / 1024))
PY
    tail -1 "$work/res-flash" | awk '{ printf "  flash   %-8s origin/title %s  origin requests %s  play delay p50 %s ms p99 %s ms  TTFB p99 %s ms  rebuffers %s  errors %s  CPU %s s (%s s/GB)  peak RSS %s MB\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $12 }'
}

run_tail() { # SERVER
    local s=$1
    rm -f "$work/linerate-access.json"
    reset_cache "$s"
    start_cached "$s" "$slice_bytes" "$(cache_of "$s")" || exit 1
    origin_log_clear
    # When the sessions start, after the bench's HEADs (see the header).
    local port=${base##*:}
    python3 tests/origin/probe.py play-start "${port%/}" --timeout $((tail_duration + 600)) > "$work/play-start" &
    local watcher=$!
    pids+=("$watcher")
    # The cache directory's size on disk, with the time of each reading.
    : > "$work/disk"
    while :; do
        echo "$(date +%s.%N) $(du -sb "$work/cache-$s" 2>/dev/null | cut -f1)" >> "$work/disk"
        sleep 0.5
    done &
    local sampler=$!
    pids+=("$sampler")
    run_bench "$work/tail.json" --files "$tail_files" --sessions "$tail_sessions" --ramp "$tail_ramp" \
        --duration "$tail_duration" --bitrate-mbps 5 --startup-segments 3 --zipf 1 || exit 1
    kill "$watcher" "$sampler" 2>/dev/null || true
    wait "$watcher" "$sampler" 2>/dev/null || true
    origin_settle
    stop_server
    keep_access_log "$s"
    local t_play
    t_play=$(cat "$work/play-start")
    [ -n "$t_play" ] || { echo "the tail's sessions never connected" >&2; exit 1; }
    python3 - "$work/tail.json" "$s" "$(origin_bytes_begun "$t_play")" "$(origin_bytes)" "$ticks" "$clk" \
        "$work/disk" "$t_play" "$(cache_of "$s")" "$rss_kb" >> "$work/res-tail" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
s, played, total, ticks, clk = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
t_play, limit = float(sys.argv[8]), int(sys.argv[9])
disk = [int(f[1]) for f in (l.split() for l in open(sys.argv[7])) if len(f) == 2 and float(f[0]) >= t_play]
served = j["bytes"]
per = played / served if served else 0
print(s, "%.3f" % (1 - per), "%.3f" % per, "%.3f" % j["gbps"], j["rebuffers"], "%.5f" % j["rebuffer_ratio"],
      j["errors_total"], "%.0f" % (served / 1e6), "%.0f" % (played / 1e6), "%.0f" % ((total - played) / 1e6),
      "%.3f" % ((ticks / clk) / max(served / 1e9, 1e-9)), "%.0f" % (limit / 1e6),
      "%.0f" % (sum(disk) / max(len(disk), 1) / 1e6), "%.0f" % (max(disk, default=0) / 1e6),
      "%.0f" % (int(sys.argv[10]) / 1024))
PY
    tail -1 "$work/res-tail" | awk '{ printf "  tail    %-8s byte hit ratio %s  origin/served %s  %s Gb/s  rebuffers %s (ratio %s)  errors %s  served %s MB  origin %s MB (+%s MB discovery)  CPU %s s/GB  limit %s MB, on disk mean %s MB peak %s MB  peak RSS %s MB\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15 }'
}

run_restart() { # SERVER
    local s=$1 fill t0 t1 stop_s left port
    reset_cache "$s"
    start_cached "$s" "$restart_slice_bytes" "$restart_cache_bytes" || exit 1
    origin_log_clear
    fill=$(python3 tests/origin/probe.py fill "$base" "$work/objects" --clients 32 --root "$dir") ||
        { echo "the restart's fill through $s failed" >&2; exit 1; }
    # ATS writes its cache's directory to disk every dir.sync_frequency seconds
    # (bench/caches.sh: 5) and not when it stops: what it cached since the last
    # write is gone after a restart. Waiting past one write measures the restart.
    [ "$s" != ats ] || sleep 7
    origin_settle
    [ "$(origin_requests /o/)" = "$restart_slices" ] ||
        echo "  note: $(origin_requests /o/) origin requests filled $restart_slices objects"
    t0=$(date +%s.%N)
    stop_server
    t1=$(date +%s.%N)
    stop_s=$(python3 -c "print('%.2f' % ($t1 - $t0))")
    left=$(evict_dir "$work/cache-$s")
    origin_log_clear
    port=$(free_port)
    rm -rf "$work/probe"
    mkdir "$work/probe"
    python3 tests/origin/probe.py first-hit "http://127.0.0.1:$port/" "$work/objects" "$ORIGIN_LOG" "$work/probe" \
        --deadline $((quick ? 30 : 180)) --sample 200 > "$work/restart.json" &
    local probe=$!
    pids+=("$probe")
    for _ in $(seq 1 200); do [ -e "$work/probe/ready" ] && break; sleep 0.05; done
    date +%s.%N > "$work/probe/t0"
    start_cached "$s" "$restart_slice_bytes" "$restart_cache_bytes" "$port" nowait
    wait "$probe" || { echo "the restart's probe failed" >&2; exit 1; }
    kill -0 "$server_pid" 2>/dev/null || { echo "$s exited after its restart" >&2; tail -5 "$work/linerate.err" >&2; exit 1; }
    origin_settle
    stop_server
    python3 - "$work/restart.json" "$s" "$restart_slices" "$fill" "$stop_s" "$left" >> "$work/res-restart" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
s, n, fill, stop_s, left = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
fill_s = dict(kv.split("=") for kv in fill.split())["seconds"]
never = lambda v: -1 if v is None else v
print(s, n, "%.1f" % float(fill_s), stop_s, "%.3f" % never(j["first_response_s"]), "%.3f" % never(j["first_hit_s"]),
      j["misses_before_hit"], "%.3f" % (j["sample_hits"] / max(j["sample"], 1)), "%.2f" % j["sample_s"], "%.1f" % (left / 1e6))
PY
    tail -1 "$work/res-restart" | awk '{ printf "  restart %-8s %s slices filled in %s s, stopped in %s s; first answer %s s, first HIT %s s after the start (%s misses before), sample hit share %s in %s s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }'
    if [ "$(awk '{ print $6 }' <<< "$(tail -1 "$work/res-restart")")" = -1.000 ]; then
        if [ "$s" = varnish ]; then
            echo "           no HIT after the restart: Varnish's storage does not outlive its process"
        else
            echo "           FAIL: no HIT after the restart"
            failed=1
        fi
    fi
}

run_hits() { # SERVER
    local s=$1 hit_ticks
    reset_cache "$s"
    start_cached "$s" "$slice_bytes" "$(cache_of "$s")" || exit 1
    tr , '\n' <<< "$hot_files" | sed 's|^|/|' > "$work/hot"
    python3 tests/origin/probe.py fill "$base" "$work/hot" --clients 4 --root "$dir" > /dev/null ||
        { echo "the hits' fill through $s failed" >&2; exit 1; }
    origin_settle
    # The cached slices warm in the page cache, as the local files are (make_content).
    find "$work/cache-$s" -type f -exec cat {} + > /dev/null
    origin_log_clear
    run_bench "$work/hits.json" --files "$hot_files" --sessions "$hits_sessions" --max-rate --duration "$duration" \
        --zipf 0 || exit 1
    hit_ticks=$ticks
    origin_settle
    stop_server
    local oreq
    oreq=$(origin_requests)
    if [ "$s" = ats ] || [ "$s" = varnish ]; then
        # No local row: neither serves files of its own (-1 in the ratio's column).
        python3 - "$work/hits.json" "$s" "$hit_ticks" "$clk" "$oreq" >> "$work/res-hits" <<'PY'
import json, sys
h, s, ht, clk, oreq = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
print(s, "%.3f" % h["gbps"], "%.4f" % ((ht / clk) / max(h["bytes"] / 1e9, 1e-9)), "-1", oreq, h["errors_total"])
PY
        tail -1 "$work/res-hits" | awk '{ printf "  hits    %-14s %s Gb/s  %s server CPU-s/GB (no local row)  origin requests %s  errors %s\n", $1, $2, $3, $5, $6 }'
        return 0
    fi
    make_content "$dir" "$hot_titles" "$title_mib" title
    if [ "$s" = nginx ]; then start_nginx http "aio threads;" || exit 1; else start_linerate http || exit 1; fi
    run_bench "$work/hits-local.json" --files "$hot_files" --sessions "$hits_sessions" --max-rate --duration "$duration" \
        --zipf 0 || exit 1
    stop_server
    python3 - "$work/hits.json" "$work/hits-local.json" "$s" "$hit_ticks" "$ticks" "$clk" "$oreq" >> "$work/res-hits" <<'PY'
import json, sys
h, l = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
s, ht, lt, clk, oreq = sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
per_gb = lambda j, t: (t / clk) / max(j["bytes"] / 1e9, 1e-9)
hc, lc = per_gb(h, ht), per_gb(l, lt)
print(s, "%.3f" % h["gbps"], "%.4f" % hc, "%.3f" % (hc / lc if lc else 0), oreq, h["errors_total"])
print(s + "-local", "%.3f" % l["gbps"], "%.4f" % lc, "1.000", 0, l["errors_total"])
PY
    tail -2 "$work/res-hits" | awk '{ printf "  hits    %-14s %s Gb/s  %s server CPU-s/GB (x%s of local)  origin requests %s  errors %s\n", $1, $2, $3, $4, $5, $6 }'
}

# --- runs ------------------------------------------------------------------------------
if has "$servers" linerate; then linerate_ready || exit 1; fi

{
    echo "Origin fill: servers $servers; workloads $workloads; $rounds round(s)"
    echo "origin: $rate, ${delay_ms} ms each way (Toxiproxy $ORIGIN_TOXIPROXY_VERSION, tbf); cache $cache_mib MiB, slices $slice_mib MiB; $workers server workers${linerate_origin:+; linerate: $linerate_origin}"
    echo "flash: $flash_sessions viewers of one $flash_mib MiB title for ${flash_duration} s; tail: $tail_sessions viewers, $tail_titles titles of $title_mib MiB (Zipf 1) for ${tail_duration} s; restart: $restart_slices slices of 4 KiB objects (64 KiB slices); hits: $hits_sessions closed-loop sessions over $hot_titles titles for ${duration} s"
    echo "host: $(nproc) CPUs, $(uname -r), $(nginx -v 2>&1 | sed 's/.*: //'), $("$bin" --version 2>/dev/null || echo linerate)"
} | tee "$work/setup"
for round in $(seq 1 "$rounds"); do
    order=$servers
    [ $((round % 2)) = 1 ] || order=$(tr ' ' '\n' <<< "$servers" | tac | tr '\n' ' ')
    for w in $workloads; do
        for s in $order; do current=$s; "run_$w" "$s"; done
    done
done

mkdir -p "$(dirname "$out")"
declare -A head=(
    [flash]="server|origin bytes / title bytes|origin requests|play delay p50 ms|play delay p99 ms|TTFB p99 ms|rebuffers|errors|server CPU-s|server CPU-s/GB|served MB|peak RSS MB"
    [tail]="server|byte hit ratio|origin bytes / served byte|Gb/s|rebuffers|rebuffer ratio|errors|served MB|origin MB|discovery origin MB|server CPU-s/GB|limit MB|on disk mean MB|on disk peak MB|peak RSS MB"
    [restart]="server|slices|fill s|stop s|first answer s|first HIT s|misses before HIT|sample hit share|sample s|resident MB after eviction"
    [hits]="server|Gb/s|server CPU-s/GB|CPU-s/GB / local|origin requests|errors"
)
{
    cat "$work/setup"
    for w in $workloads; do
        echo
        echo "### $w"
        print_results "$work/res-$w" "$rounds" 1 "${head[$w]}" "$work/res-$w.json"
    done
} > "$out.md"
python3 - "$out.json" "$work/setup" $workloads <<PY
import json, sys
out, setup, names = sys.argv[1], sys.argv[2], sys.argv[3:]
doc = {"setup": open(setup).read().splitlines()}
for w in names:
    doc[w] = json.load(open("$work/res-%s.json" % w))
json.dump(doc, open(out, "w"), indent=2)
open(out, "a").write("\n")
PY
tail -n +5 "$out.md"
echo
echo "written: $out.md $out.json"
[ "$failed" = 0 ] || { echo "some runs failed (see above)" >&2; exit 1; }
