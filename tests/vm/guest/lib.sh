# Helpers for guest scenario scripts (busybox sh, sourced as `. /vm/lib.sh`).
# Scenarios run under `sh -eu`: any failing command fails the scenario; `fail`
# says why. Host tools are called by full path because busybox's shell prefers
# its own applets (busybox `ip` has no `netns`).

IP=/usr/sbin/ip
CURL=/usr/bin/curl
NGINX=/usr/sbin/nginx
ETHTOOL=/usr/sbin/ethtool
IPERF=/usr/bin/iperf3
WRK=/usr/bin/wrk
LINERATE=/usr/bin/linerate
TLS_DIR=/vm/tls

set -o pipefail

# log and report write to stderr (the console), so they may be used inside $(...).
log() { echo "[$SCENARIO $(cut -d" " -f1 /proc/uptime)] $*" >&2; }

fail() {
    echo "[$SCENARIO] FAIL: $*" >&2
    exit 1
}

# report KEY VALUE: a fact the host prints after the run (result.log).
report() {
    echo "[$SCENARIO] report: $1: $2" >&2
    echo "report: $1: $2" >>/tmp/vm-report
}

# report_line TEXT: a line the host prints as it is after the run (a table row).
report_line() {
    echo "[$SCENARIO] report: $1" >&2
    echo "report: $1" >>/tmp/vm-report
}

# expect_eq WHAT GOT WANT
expect_eq() {
    [ "$2" = "$3" ] || fail "$1: got '$2', want '$3'"
}

# in_client CMD...: runs CMD in the client network namespace (its traffic to
# 10.N.0.1 crosses cable N's emulated NICs).
in_client() { "$IP" netns exec client "$@"; }

# sha_range FILE FIRST LAST: sha256 of bytes FIRST..LAST (inclusive) of FILE. The
# whole file's sum comes from FILE.sha256 when the host supplied one (hashing
# 64 MiB takes seconds under TCG); every result is remembered for the next fetch.
sha_range() {
    local memo=/tmp/sha-memo/$(echo "$1" | tr / _)-$2-$3
    if [ ! -e "$memo" ]; then
        mkdir -p /tmp/sha-memo
        if [ "$2" = 0 ] && [ "$3" = $(($(file_size "$1") - 1)) ] && [ -e "$1.sha256" ]; then
            cat "$1.sha256" >"$memo"
        else
            dd if="$1" bs=1M iflag=skip_bytes,count_bytes skip="$2" count=$(($3 - $2 + 1)) 2>/dev/null |
                sha256sum | cut -d' ' -f1 >"$memo"
        fi
    fi
    cat "$memo"
}

# uptime_secs: seconds since boot, for timing steps inside the guest.
uptime_secs() { cut -d' ' -f1 /proc/uptime; }

# file_size FILE (busybox `wc -c` would read the whole file)
file_size() { stat -c %s "$1"; }

# nic_counter IF rx_bytes|tx_bytes (root namespace)
nic_counter() { cat "/sys/class/net/$1/statistics/$2"; }

# tls_stat NAME: a counter from /proc/net/tls_stat (exists once tls.ko is loaded).
tls_stat() {
    [ -r /proc/net/tls_stat ] || fail "/proc/net/tls_stat missing: the tls module is not loaded"
    awk -v k="$1" '$1 == k { print $2; found = 1 } END { if (!found) exit 1 }' /proc/net/tls_stat ||
        fail "no $1 in /proc/net/tls_stat"
}

# alive PID: true while PID runs (a child that exited stays a zombie until the
# shell waits for it, and `kill -0` succeeds on zombies).
alive() {
    local state
    state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$state" ] && [ "$state" != Z ]
}

# wait_listening PID STDOUT_FILE SCHEME HOST: waits (30 s at most: a guard against
# hangs, generous because a busy host can slow TCG a lot) for the server
# PID to print "listening SCHEME://HOST:PORT" and prints PORT. Fails with the
# server's stderr (STDOUT_FILE with .err instead of .out) if it exits first.
wait_listening() {
    local pid=$1 out=$2 scheme=$3 host=$4 line i=0
    while :; do
        line=$(grep -m1 "^listening $scheme://$host:" "$out" || true)
        [ -z "$line" ] || break
        if ! alive "$pid"; then
            {
                echo "--- server stdout:"
                cat "$out"
                echo "--- server stderr:"
                cat "${out%.out}.err"
            } >&2
            fail "server exited before printing 'listening $scheme://$host:PORT'"
        fi
        i=$((i + 1))
        [ $i -le 300 ] || fail "server did not print 'listening $scheme://$host:PORT' within 30 s"
        sleep 0.1
    done
    echo "${line##*:}"
}

# What fetch_and_compare fetches from a file of at least 8 MiB: the whole file,
# the first byte, a small head, an unaligned 4 MB span, 64 KiB across the middle
# ("mid"), a suffix range and an open-ended tail of 864 bytes ("tail").
RANGES="whole 0-0 0-65535 1000000-4999999 mid -1048576 tail"

# fetch_and_compare URL FILE [CURL_OPTIONS...]: fetches each of RANGES of URL with
# curl (one connection per fetch; in the client namespace when FETCH_NS=client)
# and compares every body's sha256 with the same bytes of FILE.
# Sets FETCHES (connections made) and FETCHED_BYTES.
FETCH_NS=""
fetch_and_compare() {
    local url=$1 file=$2 size code want got first last range t0 t1
    shift 2
    size=$(file_size "$file")
    FETCHES=0
    FETCHED_BYTES=0
    for range in $RANGES; do
        rm -f /tmp/body
        case $range in
        mid) range=$((size / 2 - 1))-$((size / 2 + 65534)) ;;
        tail) range=$((size - 864))- ;;
        esac
        case $range in
        whole) first=0 last=$((size - 1)) ;;
        -*) first=$((size + range)) last=$((size - 1)) ;;
        *-) first=${range%-} last=$((size - 1)) ;;
        *) first=${range%-*} last=${range#*-} ;;
        esac
        t0=$(uptime_secs)
        code=$(fetch_one "$url" "$range" "$@") || fail "curl $range $url failed (code '$code')"
        t1=$(uptime_secs)
        if [ "$range" = whole ]; then
            expect_eq "status of $url" "$code" 200
        else
            expect_eq "status of $url range $range" "$code" 206
        fi
        want=$(sha_range "$file" "$first" "$last")
        got=$(sha256sum /tmp/body | cut -d' ' -f1)
        expect_eq "sha256 of $url range $range ($first-$last)" "$got" "$want"
        log "$range: $code, $((last - first + 1)) bytes in $(awk "BEGIN { print $t1 - $t0 }") s, sha256 matches"
        FETCHES=$((FETCHES + 1))
        FETCHED_BYTES=$((FETCHED_BYTES + last - first + 1))
    done
    log "fetched $url: $FETCHES fetches, $FETCHED_BYTES bytes, all match"
}

# fetch_one URL RANGE|whole [CURL_OPTIONS...]: body to /tmp/body, prints the status.
fetch_one() {
    local url=$1 range=$2 ns=""
    shift 2
    [ "$FETCH_NS" = client ] && ns="$IP netns exec client"
    if [ "$range" = whole ]; then
        $ns "$CURL" -sS --max-time 120 -o /tmp/body -w '%{http_code}' "$@" "$url"
    else
        $ns "$CURL" -sS --max-time 120 -o /tmp/body -w '%{http_code}' -r "$range" "$@" "$url"
    fi
}

# split_responses STREAM METHOD...: STREAM holds every byte read from one
# connection; splits it into one response per METHOD (the methods of the requests
# written on that connection, in order). Each response must start exactly where the
# previous one ended, with an HTTP/1.1 status line; a response to HEAD has no body
# whatever its Content-Length says, one to GET exactly Content-Length bytes (none
# for 1xx, 204 and 304), and no byte may follow the last response. So a HEAD
# answered with body bytes, a body a byte too long or too short, a missing response
# or a left-over byte fails here. For response N (from 1) it leaves the head as
# received in /tmp/resp.N.head and sets RESP_STATUS_N, RESP_AT_N and RESP_LEN_N (the
# body's offset and length in STREAM); see resp_field and resp_body.
split_responses() {
    local stream=$1 at=0 n=0 size method meta hl status cl len
    shift
    size=$(file_size "$stream")
    for method in "$@"; do
        n=$((n + 1))
        [ "$at" -lt "$size" ] ||
            fail "$stream: no response $n (to $method): its $size bytes hold $((n - 1)) responses"
        dd if="$stream" of=/tmp/resp.chunk bs=16384 iflag=skip_bytes,count_bytes skip="$at" count=16384 2>/dev/null
        # "HEAD_BYTES STATUS CONTENT_LENGTH" ("-" when absent). A head is ASCII, and
        # awk stops at its empty line, before any body byte.
        meta=$(awk -v out="/tmp/resp.$n.head" '
            NR == 1 && !/^HTTP\/1\.1 [1-5][0-9][0-9] [^\r]*\r$/ { exit 1 }
            NR == 1 { status = $2 }
            { bytes += length($0) + 1; print > out }
            tolower($0) ~ /^content-length: *[0-9]+\r$/ { cl = $0; sub(/^[^:]*: */, "", cl); sub(/\r$/, "", cl) }
            /^\r$/ { printf "%d %s %s\n", bytes, status, cl == "" ? "-" : cl; done = 1; exit }
            END { if (!done) exit 1 }' /tmp/resp.chunk) ||
            fail "$stream: no HTTP/1.1 response head at byte $at (response $n, to $method): '$(head -c 100 /tmp/resp.chunk | tr -c '[:print:]' .)'"
        hl=${meta%% *}
        status=${meta#* }
        cl=${status#* }
        status=${status%% *}
        case $method:$status in
        HEAD:* | *:1?? | *:204 | *:304) len=0 ;;
        *)
            [ "$cl" != - ] || fail "$stream: response $n ($status to $method) has no Content-Length"
            len=$cl
            ;;
        esac
        eval "RESP_STATUS_$n=$status RESP_AT_$n=$((at + hl)) RESP_LEN_$n=$len"
        at=$((at + hl + len))
        [ "$at" -le "$size" ] ||
            fail "$stream: response $n ($status to $method) is cut short: its body would end at byte $at, the stream ends at $size"
    done
    [ "$at" = "$size" ] ||
        fail "$stream: $((size - at)) bytes follow the last of $n responses: '$(dd if="$stream" bs=100 iflag=skip_bytes skip="$at" count=1 2>/dev/null | tr -c '[:print:]' .)'"
}

# head_field FILE NAME: the value of field NAME (any case) in the response head in
# FILE (CRLFs as received); empty when absent.
head_field() {
    awk -v k="$2" 'BEGIN { k = tolower(k) ":" } { sub(/\r$/, "") }
        tolower(substr($0, 1, length(k))) == k { v = substr($0, length(k) + 1); sub(/^[ \t]*/, "", v); print v; exit }' "$1"
}

# resp_field N NAME: head_field of response N of the last split_responses.
resp_field() { head_field "/tmp/resp.$1.head" "$2"; }

# resp_body N STREAM: the body of response N of STREAM (after split_responses), to stdout.
resp_body() {
    local at len
    eval "at=\$RESP_AT_$1 len=\$RESP_LEN_$1"
    dd if="$2" bs=65536 iflag=skip_bytes,count_bytes skip="$at" count="$len" 2>/dev/null
}

# check_parts BODY FILE BOUNDARY RANGE...: BODY is a multipart/byteranges body with
# BOUNDARY whose parts must be exactly the RANGEs (FIRST-LAST) of FILE, in order,
# each with FILE's bytes, followed by the closing delimiter. A part's head ends with
# its Content-Range field and an empty line.
check_parts() {
    local body=$1 file=$2 boundary=$3 size r got want start spec first last
    shift 3
    size=$(file_size "$file")
    strings -t d -n 20 "$body" | grep 'Content-Range: bytes ' >/tmp/parts || true
    want=""
    for r in "$@"; do want="$want $r/$size"; done
    got=$(awk '{ printf " %s", $4 }' /tmp/parts)
    expect_eq "parts of the multipart body" "$got" "$want"
    while read -r start spec; do
        first=${spec%-*} last=${spec#*-}
        expect_eq "sha256 of part $spec" \
            "$(dd if="$body" bs=65536 iflag=skip_bytes,count_bytes skip="$start" count=$((last - first + 1)) 2>/dev/null |
                sha256sum | cut -d' ' -f1)" "$(sha_range "$file" "$first" "$last")"
    done <<EOF
$(awk '{ split($4, r, "/"); print $1 + length($2 " " $3 " " $4) + 4, r[1] }' /tmp/parts)
EOF
    expect_eq "end of the multipart body" "$(tail -c $((${#boundary} + 8)) "$body" | tr '\r\n' '<>')" \
        "<>--$boundary--<>"
}

# nginx_start MASTER LOG_LEVEL CONNECTIONS HTTP: starts Debian's nginx in the
# background, as root with one worker and its files in /tmp/nginx, with
# `master_process MASTER`, errors at LOG_LEVEL, CONNECTIONS per worker, and HTTP
# (directives and `server { }` blocks) in its `http { }` block after `access_log
# off; sendfile on;`. Sets NGINX_PID; nginx_wait waits for it to answer.
nginx_start() {
    mkdir -p /tmp/nginx /var/lib/nginx /var/log/nginx
    cat >/tmp/nginx/nginx.conf <<CONF
daemon off;
master_process $1;
worker_processes 1;
user root;
error_log /tmp/nginx/error.log $2;
pid /tmp/nginx/nginx.pid;
events { worker_connections $3; }
http {
    access_log off;
    sendfile on;
$4
}
CONF
    "$NGINX" -e /tmp/nginx/error.log -c /tmp/nginx/nginx.conf -p /tmp/nginx &
    NGINX_PID=$!
}

# nginx_wait URL: waits (30 s at most) until the nginx of nginx_start answers an
# HTTPS request for URL (from the client namespace when FETCH_NS=client); fails
# with its error log if it exits or does not answer.
nginx_wait() {
    local i=0 ns=""
    [ "$FETCH_NS" = client ] && ns="$IP netns exec client"
    until $ns "$CURL" -s --max-time 5 -o /dev/null --cacert "$TLS_DIR/ca.pem" "$1" 2>/dev/null; do
        alive $NGINX_PID || fail "nginx exited: $(cat /tmp/nginx/error.log)"
        i=$((i + 1))
        [ $i -le 300 ] || fail "nginx did not answer within 30 s: $(cat /tmp/nginx/error.log)"
        sleep 0.1
    done
}

# stop_pid PID: TERM, then wait (5 s at most) for it to go.
stop_pid() {
    local i=0
    kill "$1" 2>/dev/null || return 0
    while alive "$1"; do
        i=$((i + 1))
        [ $i -le 50 ] || { kill -9 "$1"; return 0; }
        sleep 0.1
    done
}
