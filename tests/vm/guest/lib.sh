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
