# topology: loopback
# media: 64
# timeout: 300
# default: no
#
# HTTPS benchmark inside the guest, where the kernel has TLS: Debian's
# nginx with kernel TLS, linerate with kernel TLS, and linerate with user-space TLS
# (`tls.kernel_tls = "off"`), serving the same 64 MiB file to the same wrk, in
# alternating rounds; plus linerate over plain HTTP, the same work without any
# encryption, and `openssl speed` for AES-128-GCM in this guest: together they show
# how much of the cost is encryption, which TCG emulates instruction by instruction. Each server: 1 worker, TLS 1.3 with AES-128-GCM only, the
# harness's ECDSA P-256 certificate, 127.0.0.1 (the guest's loopback: the emulated
# NICs would measure qemu's e1000e, not TLS). wrk -t1 -c8, every request
# `Range: bytes=K*2MiB-(K+1)*2MiB-1` over the file's 32 chunks in turn.
#
# Per run: Gb/s from wrk's byte count, the server's CPU seconds per GB
# (utime+stime from /proc/PID/stat; nginx's master and worker summed), the whole
# guest's busy CPU seconds per GB (/proc/stat: client, server, kernel), wrk's TLS
# connections (PassiveOpens in /proc/net/snmp, less wrk's one plain connect at
# start), and the /proc/net/tls_stat deltas. kTLS is proven per run: TlsTxSw must rise by exactly the connections
# accepted for both kTLS servers (and TlsRxSw too for linerate, which hands both
# directions to the kernel), and by nothing for user-space linerate. Before the
# runs, curl checks the negotiated protocol and cipher and one range's bytes on
# each server.
#
# The output ends with a markdown table of medians (also in
# target/vm/tls-bench/report.txt). Under TCG every instruction is emulated, the AES
# instructions included, so absolute Gb/s are far below real hardware and only the
# ratios within one run mean something; docs/performance/ktls-vm.md says how to read it.
# Takes about 100 s; change ROUNDS and SECONDS_PER_RUN below for longer runs.
. /vm/lib.sh

ROUNDS=3
SECONDS_PER_RUN=5
CONNECTIONS=8
CHUNK=2097152
# USER_HZ: the unit of /proc/PID/stat and /proc/stat times, 100 on x86 Linux (busybox
# has no getconf to ask).
CLK_TCK=100
SERVERS="nginx linerate-ktls linerate-user linerate-plain"

chunks=$(($(file_size /srv/media/big.bin) / CHUNK))

# --- servers ---------------------------------------------------------------
nginx_start on warn 256 "    tcp_nopush on;
    tcp_nodelay on;
    keepalive_requests 1000000;
    open_file_cache max=1000;
    types { application/octet-stream bin; }
    server {
        listen 127.0.0.1:8443 ssl;
        ssl_certificate $TLS_DIR/server.pem;
        ssl_certificate_key $TLS_DIR/server.key;
        ssl_protocols TLSv1.3;
        ssl_conf_command Ciphersuites TLS_AES_128_GCM_SHA256;
        ssl_conf_command Options KTLS;
        root /srv/media;
    }"
nginx_pid=$NGINX_PID

# linerate_start NAME KERNEL_TLS [http]: one linerate with one worker and a TLS
# listener (a plain HTTP one with "http"); sets PORT.
linerate_start() {
    local scheme=${3:-https}
    cat >/tmp/$1.toml <<CONF
root = "/srv/media"
$([ "$scheme" = https ] && echo tls_listen || echo listen) = ["127.0.0.1:0"]
workers = 1
[admin]
enabled = false
[tls]
cert = "$TLS_DIR/server.pem"
key = "$TLS_DIR/server.key"
min_version = "1.3"
kernel_tls = "$2"
CONF
    "$LINERATE" serve --config /tmp/$1.toml >/tmp/$1.out 2>/tmp/$1.err &
    eval "pid_$(echo $1 | tr - _)=$!"
    PORT=$(wait_listening $! /tmp/$1.out $scheme 127.0.0.1)
    [ "$scheme" = http ] || report "$1 start-up" "$(grep -o 'tls_mode=[a-z-]*' /tmp/$1.err)"
}
linerate_start linerate-ktls auto
port_linerate_ktls=$PORT
grep -q 'tls_mode=ktls-tx-rx' /tmp/linerate-ktls.err ||
    fail "linerate with kernel_tls = auto did not report tls_mode=ktls-tx-rx: $(cat /tmp/linerate-ktls.err)"
linerate_start linerate-user off
port_linerate_user=$PORT
linerate_start linerate-plain off http
port_linerate_plain=$PORT
grep -q 'tls_mode=userspace' /tmp/linerate-user.err ||
    fail "linerate with kernel_tls = off did not report tls_mode=userspace: $(cat /tmp/linerate-user.err)"
port_nginx=8443

nginx_wait https://localhost:$port_nginx/

port_of() { eval echo "\$port_$(echo $1 | tr - _)"; }
url_of() {
    case $1 in
    linerate-plain) echo "http://127.0.0.1:$(port_of $1)/" ;;
    *) echo "https://127.0.0.1:$(port_of $1)/" ;;
    esac
}

# server_ticks NAME: utime+stime of the server, all threads; nginx's master and
# its workers (the master's children) summed.
proc_ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }
server_ticks() {
    local t=0 p
    case $1 in
    nginx)
        for p in $nginx_pid $(cat /proc/$nginx_pid/task/$nginx_pid/children); do
            t=$((t + $(proc_ticks $p)))
        done
        ;;
    *) t=$(proc_ticks $(eval echo "\$pid_$(echo $1 | tr - _)")) ;;
    esac
    echo $t
}
# Busy ticks of the whole guest: user nice system irq softirq steal.
guest_busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
# Connections accepted by the guest's TCP (only the benchmark's, on loopback).
passive_opens() {
    awk '/^Tcp:/ { if (!c) { for (i = 1; i <= NF; i++) if ($i == "PassiveOpens") c = i } else print $c }' /proc/net/snmp
}

# --- what each server negotiates, and one range's bytes --------------------
for s in $SERVERS; do
    url=$(url_of $s | sed 's/127.0.0.1/localhost/')big.bin
    hs=$("$CURL" -sv --max-time 30 -o /tmp/body -r 2097152-4194303 --cacert "$TLS_DIR/ca.pem" "$url" 2>&1 |
        sed -n 's/.*SSL connection using //p' | tr -d '\r')
    if [ $s != linerate-plain ]; then
        report "$s handshake" "$hs"
        expect_eq "$s protocol and cipher" "$hs" "TLSv1.3 / TLS_AES_128_GCM_SHA256"
    fi
    expect_eq "$s bytes 2097152-4194303" "$(sha256sum /tmp/body | cut -d' ' -f1)" \
        "$(sha_range /srv/media/big.bin 2097152 4194303)"
done
# What encryption alone costs here: OpenSSL's AES-128-GCM on 16 KiB records, one
# vCPU. (A one-off `modprobe tcrypt mode=211 sec=1` in this guest measured the
# kernel's generic-gcm-aesni, which kTLS uses, at about 40 MB/s on 8 KiB blocks:
# the same order.)
speed=$(/usr/bin/openssl speed -evp aes-128-gcm -seconds 2 -bytes 16384 2>/dev/null | awk '/^AES-128-GCM/ { print $2 }')
report "openssl speed -evp aes-128-gcm (16 KiB)" "$speed bytes/s (k = 1000)"

# --- runs --------------------------------------------------------------------
cat >/tmp/range.lua <<LUA
local n = 0
request = function()
  local first = (n % $chunks) * $CHUNK
  n = n + 1
  return wrk.format("GET", "/big.bin", { ["Range"] = "bytes=" .. first .. "-" .. (first + $CHUNK - 1) })
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT bytes=%d requests=%d duration_us=%d errors=%d status=%d\\n",
    summary.bytes, summary.requests, summary.duration,
    e.connect + e.read + e.write + e.timeout, e.status))
end
LUA

# run_one SERVER ROUND: one wrk run; appends "server round gbps server_cpu_s_per_gb
# guest_cpu_s_per_gb connections tls_tx tls_rx requests server_cpu_s_per_s" to
# /tmp/results.
: >/tmp/results
run_one() {
    local s=$1 ticks busy opens tx rx out
    ticks=$(server_ticks $s)
    busy=$(guest_busy)
    opens=$(passive_opens)
    tx=$(tls_stat TlsTxSw)
    rx=$(tls_stat TlsRxSw)
    out=$("$WRK" -t1 -c$CONNECTIONS -d${SECONDS_PER_RUN}s --timeout 20s -s /tmp/range.lua "$(url_of $s)") ||
        fail "wrk against $s failed: $out"
    ticks=$(($(server_ticks $s) - ticks))
    busy=$(($(guest_busy) - busy))
    # wrk's start-up check connects once and closes without a handshake (the
    # resolve step of its wrk.lua); every other accepted connection is wrk's TLS.
    opens=$(($(passive_opens) - opens - 1))
    tx=$(($(tls_stat TlsTxSw) - tx))
    rx=$(($(tls_stat TlsRxSw) - rx))
    echo "$out" | grep -q '^RESULT ' || fail "wrk printed no RESULT line: $out"
    echo "$out" | awk -v s=$s -v r=$2 -v st=$ticks -v gt=$busy -v clk=$CLK_TCK -v c=$opens -v tx=$tx -v rx=$rx '
        /^RESULT/ {
            for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
            if (v["errors"] + v["status"] > 0) { print "errors " v["errors"] " bad status " v["status"] > "/dev/stderr"; exit 1 }
            if (v["bytes"] == 0) { print "no bytes" > "/dev/stderr"; exit 1 }
            gb = v["bytes"] / 1e9
            printf "%s %d %.3f %.2f %.2f %d %d %d %d %.2f\n", s, r, v["bytes"] * 8 / v["duration_us"] / 1000,
                st / clk / gb, gt / clk / gb, c, tx, rx, v["requests"], st / clk / (v["duration_us"] / 1e6)
        }' >>/tmp/results || fail "wrk against $s: $(echo "$out" | grep RESULT)"
    set -- $(tail -n1 /tmp/results)
    report "round $2 $1" "$3 Gb/s, server $4 CPU-s/GB (${10} CPU-s/s), guest $5 CPU-s/GB, $9 requests, $6 connections, TlsTxSw +$7 TlsRxSw +$8"
    case $1 in
    nginx) expect_eq "nginx: TlsTxSw rise (one per connection)" "$7" "$6" ;;
    linerate-ktls)
        expect_eq "linerate kTLS: TlsTxSw rise (one per connection)" "$7" "$6"
        expect_eq "linerate kTLS: TlsRxSw rise (one per connection)" "$8" "$6"
        ;;
    linerate-user | linerate-plain) expect_eq "$1: TlsTxSw and TlsRxSw rise" "$7 $8" "0 0" ;;
    esac
}

order=$SERVERS
reverse=$(echo $SERVERS | tr ' ' '\n' | sed -n '1!G; h; $p' | tr '\n' ' ')
round=1
while [ $round -le $ROUNDS ]; do
    for s in $order; do run_one $s $round; done
    # Alternate the order, so that no server always runs first or last.
    if [ "$order" = "$SERVERS" ]; then order=$reverse; else order=$SERVERS; fi
    round=$((round + 1))
done
expect_eq "TlsDecryptError" "$(tls_stat TlsDecryptError)" 0

# --- table -------------------------------------------------------------------
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
col() { awk -v s=$1 -v k=$2 '$1 == s { print $k }' /tmp/results | median; }
sum() { awk -v s=$1 -v k=$2 '$1 == s { t += $k } END { print t }' /tmp/results; }
nginx_gbps=$(col nginx 3)
report_line "| server (1 worker) | TLS records | Gb/s | vs nginx | server CPU-s/GB | guest CPU-s/GB | connections | TlsTxSw | TlsRxSw |"
report_line "|---|---|---|---|---|---|---|---|---|"
for s in $SERVERS; do
    case $s in
    nginx) what="nginx $("$NGINX" -v 2>&1 | sed 's|.*nginx/||')" mode="kTLS (OpenSSL)" ;;
    linerate-ktls) what=linerate mode="kTLS TX+RX" ;;
    linerate-user) what=linerate mode="user space (kernel_tls = off)" ;;
    linerate-plain) what=linerate mode="none: plain HTTP" ;;
    esac
    gbps=$(col $s 3)
    report_line "$(awk -v w="$what" -v m="$mode" -v g=$gbps -v n=$nginx_gbps -v sc=$(col $s 4) -v gc=$(col $s 5) \
        -v c=$(sum $s 6) -v tx=$(sum $s 7) -v rx=$(sum $s 8) \
        'BEGIN { printf "| %s | %s | %.3f | %.2f | %.2f | %.2f | %d | +%d | +%d |", w, m, g, g / n, sc, gc, c, tx, rx }')"
done
report_line "Medians of $ROUNDS alternating rounds of ${SECONDS_PER_RUN} s, wrk -t1 -c$CONNECTIONS, 2 MiB ranges of a 64 MiB file, TLS 1.3 AES-128-GCM, ECDSA P-256; connections and tls_stat deltas summed over the rounds. Guest: 2 vCPUs under qemu TCG, kernel $(uname -r); AES-128-GCM in this guest (openssl speed, 16 KiB): $(awk -v k="${speed%k}" 'BEGIN { printf "%.0f", k / 1000 }') MB/s."

# One worker cannot use more than one CPU-second per second. A guest process's CPU
# time runs on the guest's clock, which keeps going while the host has descheduled
# the vCPU's thread, so on a busy host it counts time the server did not get.
inflated=$(awk '$10 > 1.05 { n++; if ($10 > m) m = $10 } END { if (n) printf "%d %.2f", n, m }' /tmp/results)
if [ -n "$inflated" ]; then
    report_line "Warning: in ${inflated% *} of $(wc -l </tmp/results) runs the one-worker server used more than one CPU-second per second (up to ${inflated#* }): the host was busy and took the guest's vCPUs away, and the server CPU column counts that time. Re-run on a quiet host."
fi

stop_pid $pid_linerate_ktls
stop_pid $pid_linerate_user
stop_pid $pid_linerate_plain
kill -QUIT $nginx_pid
