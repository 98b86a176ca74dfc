#!/bin/bash
# Runs inside the systemd guest (tests/vm/systemd/run), as a oneshot unit once the
# system is up: the Debian package under a real systemd as PID 1. Prints one line
# per check to ttyS1 ("ok ..." or "FAIL ..."), then "linerate-systemd-exit=N", and
# powers the machine off.
set -u
exec >/dev/ttyS1 2>&1
failures=0
ok() { echo "ok $*"; }
fail() {
    echo "FAIL $*"
    failures=$((failures + 1))
}
main_pid() { systemctl show -p MainPID --value linerate.service; }
alive() { [ -d "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }
finish() {
    echo "--- journal"
    journalctl -u linerate.service --no-pager -o short-monotonic | tail -60
    echo "linerate-systemd-exit=$failures"
    systemctl poweroff --no-block
    exit 0
}
trap finish EXIT

first=/root/debs/1.deb  # then the upgrade to
second=/root/debs/2.deb
echo "systemd $(systemctl --version | head -1 | cut -d' ' -f2), kernel $(uname -r)"

# 1. Install: postinst creates the user, enables and starts the unit, which tells
#    systemd READY (Type=notify: `systemctl start` returns once it has).
dpkg -i "$first" >/tmp/dpkg1.log 2>&1 || { cat /tmp/dpkg1.log; fail "dpkg -i $first"; exit 1; }
if systemctl is-active --quiet linerate.service; then ok "installed and started: $(systemctl is-enabled linerate.service), active"; else
    systemctl status linerate.service --no-pager
    fail "not active after install"
    exit 1
fi
pid=$(main_pid)
[ "$(stat -c %U "/proc/$pid")" = linerate ] && ok "runs as linerate (pid $pid)" || fail "runs as $(stat -c %U "/proc/$pid")"
grep -q '^CapEff:.*0000000000000400$' "/proc/$pid/status" && ok "CapEff: CAP_NET_BIND_SERVICE only" || fail "$(grep CapEff "/proc/$pid/status")"
grep -q '^NoNewPrivs:.*1$' "/proc/$pid/status" && ok "NoNewPrivs" || fail "NoNewPrivs not set"
grep -q '^Seccomp:.*2$' "/proc/$pid/status" && ok "seccomp filter on" || fail "no seccomp filter"
grep -q 'Max open files *1048576' "/proc/$pid/limits" && ok "LimitNOFILE 1048576" || fail "$(grep 'open files' "/proc/$pid/limits")"
# The sandbox, seen from inside the service's mount namespace.
ro() { awk -v m="$1" '$5 == m { split($6, o, ","); print o[1] }' "/proc/$pid/mountinfo" | tail -1; }
[ "$(ro /)" = ro ] && ok "/ is read-only (ProtectSystem=strict)" || fail "/ is $(ro /)"
[ "$(ro /var/log/linerate)" = rw ] && ok "/var/log/linerate is writable" || fail "/var/log/linerate is $(ro /var/log/linerate)"
[ "$(ro /home)" = ro ] || [ -z "$(ro /home)" ] || fail "/home is $(ro /home)"
[ "$(ro /tmp)" = rw ] && ok "/tmp is a private tmpfs" || fail "/tmp is $(ro /tmp)"
for i in 1 2 3 4; do head -c $((4 << 20)) /dev/urandom >"/var/www/linerate/t$i.bin"; done
[ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1/t1.bin)" = 200 ] && ok "serves port 80" || fail "GET :80"
[ "$(curl -s http://127.0.0.1:9090/healthz)" = ok ] && ok "/healthz" || fail "/healthz"
log=/var/log/linerate/access.log
sleep 1.5 # records wait up to a second in a worker's buffer
grep -q '"/t1.bin"' "$log" 2>/dev/null && ok "access log written in the sandbox ($log)" || fail "no access-log record in $log"
logrotate --force /etc/logrotate.d/linerate && [ -f "$log.1" ] && ok "logrotate rotated it" || fail "logrotate"
curl -s -o /dev/null http://127.0.0.1/t2.bin
sleep 1.5
grep -q '"/t2.bin"' "$log" 2>/dev/null && ok "reopened after rotation (SIGUSR1)" || fail "no record in the reopened $log"
score=$(systemd-analyze security --no-pager linerate.service 2>/dev/null | sed -n 's/.*Overall exposure level for linerate.service: \(.*\)/\1/p')
ok "systemd-analyze security (live): $score"

# 2. Reload: RELOADING, then READY; same main process, new configuration.
sed -i 's|^# cache_control = .*|cache_control = "public, max-age=60"|' /etc/linerate/linerate.toml
systemctl reload linerate.service || fail "systemctl reload"
sleep 1
[ "$(main_pid)" = "$pid" ] && ok "reload kept the main process" || fail "main pid changed at reload"
curl -sI http://127.0.0.1/t1.bin | grep -qi '^cache-control: public, max-age=60' && ok "reload applied" || fail "reload not applied"
journalctl -u linerate.service --no-pager | grep -q "configuration reloaded" && ok "journal: configuration reloaded" || fail "no reload in the journal"

# 3. A package upgrade under load: postinst runs `linerate upgrade`; systemd follows
#    the new main pid (MAINPID), nothing restarts, no request fails.
urls=$(for i in 1 2 3 4; do printf 'http://127.0.0.1/t%s.bin\n' "$i"; done)
echo "$urls" >/tmp/urls
linerate bench --url-list /tmp/urls --verify /var/www/linerate --sessions 8 --duration 12 \
    --bitrate-mbps 8 --segment-bytes 262144 --json >/tmp/bench.json 2>/tmp/bench.err &
bench=$!
sleep 4
restarts=$(systemctl show -p NRestarts --value linerate.service)
dpkg -i "$second" >/tmp/dpkg2.log 2>&1 || { cat /tmp/dpkg2.log; fail "dpkg -i $second"; }
cat /tmp/dpkg2.log | grep -i upgrade
new=$(main_pid)
[ "$new" != "$pid" ] && ok "systemd's main pid followed the upgrade: $pid -> $new" || fail "main pid still $pid"
[ "$(cat /run/linerate/linerate.pid)" = "$new" ] && ok "pid file names the new process" || fail "pid file: $(cat /run/linerate/linerate.pid)"
systemctl is-active --quiet linerate.service && ok "active after the upgrade" || fail "not active after the upgrade"
[ "$(systemctl show -p NRestarts --value linerate.service)" = "$restarts" ] && ok "no restart" || fail "restarted"
[ "$(dpkg-query -W -f='${Version}' linerate)" = "$(dpkg-deb -f "$second" Version)" ] && ok "version $(dpkg-query -W -f='${Version}' linerate) installed" || fail "version"
wait "$bench" || { cat /tmp/bench.err; fail "bench"; }
errors=$(sed -n 's/^  "errors_total": \([0-9]*\).*/\1/p' /tmp/bench.json)
resets=$(sed -n 's/^  "resets": \([0-9]*\).*/\1/p' /tmp/bench.json)
bytes=$(sed -n 's/^  "bytes": \([0-9]*\).*/\1/p' /tmp/bench.json)
verified=$(sed -n 's/^  "verified_bytes": \([0-9]*\).*/\1/p' /tmp/bench.json)
requests=$(sed -n 's/^  "requests": \([0-9]*\).*/\1/p' /tmp/bench.json)
if [ "$errors" = 0 ] && [ "$resets" = 0 ] && [ -n "$bytes" ] && [ "$bytes" = "$verified" ] && [ "$bytes" -gt 0 ]; then
    ok "bench across the upgrade: $requests requests, $bytes bytes verified, 0 errors, 0 resets"
else
    fail "bench across the upgrade: errors=$errors resets=$resets bytes=$bytes verified=$verified"
fi
if journalctl -u linerate.service --no-pager | grep -q "not our child"; then
    fail "systemd supervises the new process as not its child"
else
    ok "systemd adopted the new process as its own child"
fi
for _ in $(seq 150); do alive "$pid" || break; sleep 0.2; done
alive "$pid" && fail "the old process $pid is still running" || ok "the old process drained and exited"

# 4. Stop: STOPPING, drain, inactive (not failed).
systemctl stop linerate.service
state=$(systemctl show -p ActiveState --value linerate.service)
result=$(systemctl show -p Result --value linerate.service)
[ "$state" = inactive ] && [ "$result" = success ] && ok "stopped: $state, $result" || fail "after stop: $state, $result"
alive "$new" && fail "$new survived the stop" || true

# 5. Purge.
dpkg -P linerate >/dev/null 2>&1 || fail "dpkg -P"
[ ! -e /lib/systemd/system/linerate.service ] && [ ! -e /etc/linerate ] && ok "purged" || fail "files left after purge"
