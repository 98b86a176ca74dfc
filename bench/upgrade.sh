#!/usr/bin/env bash
# Reloads and binary upgrades under load: `linerate bench --verify` (every body
# byte compared with the file) plays paced sessions over HTTP and HTTPS for 60 s
# while the server is reloaded 10 times (SIGHUP, alternating two configurations,
# each with its own certificate) and upgraded 3 times (`linerate upgrade`: a new
# copy of the binary renamed over the running one, then SIGUSR2). It passes with
# zero failed requests, zero wrong bytes and zero reset connections, and prints the
# bench's figures (docs/performance/upgrades.md has a run).
#
#   bench/upgrade.sh [--quick] [--bin PATH] [--sessions N] [--bitrate-mbps R]
#
# --quick: 15 s, 4 reloads, 1 upgrade (a smoke run; the suite's
# crates/linerate/tests/upgrade.rs is the short form with assertions in Rust).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

duration=60 reloads=10 upgrades=3 sessions=100 bitrate=8 bin=
parse_flags "usage: bench/upgrade.sh [--quick] [--bin PATH] [--sessions N] [--bitrate-mbps R]" \
    "--quick:duration=15 reloads=4 upgrades=1 sessions=12" --bin=bin --sessions=sessions --bitrate-mbps=bitrate -- "$@"
require_tools openssl curl
build_linerate
start_work

# The server runs from its own copy of the binary, which each upgrade replaces.
cp "$bin" "$work/linerate"
make_content "$work/root" 8 8 t
make_test_cert "$work"
# A second certificate from the same CA, expiring ten days earlier (so /metrics tells
# which one is in use).
sign_test_cert "$work" 2 20 localhost IP:127.0.0.1,DNS:localhost

config() { # N: configuration N % 2 (cache_control and certificate differ)
    local cert=cert.pem key=key.pem
    if [ $(($1 % 2)) = 1 ]; then cert=cert2.pem key=key2.pem; fi
    cat > "$work/linerate.toml.new" <<EOF
root = "$work/root"
listen = ["127.0.0.1:0"]
tls_listen = ["127.0.0.1:0"]
pid_file = "$work/linerate.pid"
cache_control = "max-age=$(($1 % 2 + 1))"
[tls]
cert = "$work/$cert"
key = "$work/$key"
[timeouts]
drain = "10s"
[admin]
listen = "127.0.0.1:0"
EOF
    mv "$work/linerate.toml.new" "$work/linerate.toml"
}
config 0
"$work/linerate" serve --config "$work/linerate.toml" > "$work/stdout" 2> "$work/stderr" &
pids+=($!)
for _ in $(seq 100); do grep -q "listening admin" "$work/stdout" 2>/dev/null && break; sleep 0.1; done
http=$(sed -n 's|^listening http://||p' "$work/stdout" | head -1)
https=$(sed -n 's|^listening https://||p' "$work/stdout" | head -1)
admin=$(sed -n 's|^listening admin http://||p' "$work/stdout" | head -1)
[ -n "$http" ] && [ -n "$https" ] && [ -n "$admin" ] || { cat "$work/stderr"; exit 1; }
on_exit() { # every process of the server, old and new, by the pids it wrote
    local p
    for p in "${server_pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
server_pids=("$(cat "$work/linerate.pid")")

for f in "$work"/root/*.bin; do
    echo "http://$http/$(basename "$f")"
    echo "https://$https/$(basename "$f")"
done > "$work/urls"
"$bin" bench --url-list "$work/urls" --verify "$work/root" --cacert "$work/ca.pem" \
    --sessions "$sessions" --duration "$duration" --bitrate-mbps "$bitrate" --segment-bytes 1048576 \
    --startup-segments 2 --json > "$work/bench.json" 2> "$work/bench.err" &
bench_pid=$!
pids+=("$bench_pid")

days_left() {
    curl -sf "http://$admin/metrics" | sed -n 's/^linerate_tls_certificate_days_left{.*key="tls".*} \(-*[0-9]*\)$/\1/p'
}
# Events spread over the run: a reload every duration/(reloads+1) seconds, the
# upgrades after reloads 3, 6 and 9 (after 3 in --quick).
gap=$(awk -v d="$duration" -v n="$reloads" 'BEGIN { printf "%.2f", d / (n + 1) }')
done_upgrades=0
for n in $(seq 1 "$reloads"); do
    sleep "$gap"
    before=$(days_left)
    config "$n"
    kill -HUP "$(cat "$work/linerate.pid")"
    for _ in $(seq 50); do [ "$(days_left)" != "$before" ] && break; sleep 0.1; done
    [ "$(days_left)" != "$before" ] || { echo "reload $n: the other certificate is not in use" >&2; exit 1; }
    echo "$(date +%T) reload $n: certificate $(( n % 2 + 1 )) in use ($(days_left) days left)"
    if [ "$done_upgrades" -lt "$upgrades" ] && [ $((n % 3)) = 0 ]; then
        cp "$bin" "$work/linerate.new" && mv "$work/linerate.new" "$work/linerate"
        old=$(cat "$work/linerate.pid")
        start=$(date +%s.%N)
        "$bin" upgrade --pid-file "$work/linerate.pid" --timeout 30 || { cat "$work/stderr"; exit 1; }
        new=$(cat "$work/linerate.pid")
        server_pids+=("$new")
        echo "$(date +%T) upgrade $((done_upgrades + 1)): $old -> $new in $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.0f ms", (e - s) * 1000 }')"
        done_upgrades=$((done_upgrades + 1))
    fi
done
wait "$bench_pid" || { cat "$work/bench.err"; exit 1; }

python3 - "$work/bench.json" "$reloads" "$done_upgrades" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
print(f"RESULT reloads={sys.argv[2]} upgrades={sys.argv[3]} requests={j['requests']} "
      f"bytes={j['bytes']} verified_bytes={j['verified_bytes']} errors={j['errors_total']} "
      f"resets={j['resets']} reconnects={j['reconnects']} connections={j['connections']} "
      f"gbps={j['gbps']:.2f} ttfb_p99_ms={j['ttfb_ms']['p99']:.1f} rebuffers={j['rebuffers']}")
bad = []
if j["errors_total"]: bad.append(f"{j['errors_total']} failed requests ({j['errors']}; first: {j['first_error']})")
if j["resets"]: bad.append(f"{j['resets']} connections reset")
if j["verified_bytes"] != j["bytes"] or not j["bytes"]: bad.append("not every byte verified")
if bad:
    print("FAIL: " + "; ".join(bad)); sys.exit(1)
print("PASS: no failed request, no wrong byte, no reset connection")
EOF
grep -c "upgrade: the new process serves" "$work/stderr" | xargs echo "hand-overs logged:"
! grep -E "upgrade failed|reload failed" "$work/stderr" || exit 1
