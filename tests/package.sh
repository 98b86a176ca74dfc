#!/usr/bin/env bash
# The Debian package, checked on this machine (as root; it installs and removes it):
#
#   tests/package.sh              # build it with scripts/package, then check it
#   tests/package.sh FILE.deb     # check a package built before
#
# 1. lintian: no errors (warnings and notes are printed);
# 2. dpkg -i: the files, their owners and modes, the conffiles, the system user and
#    its directories;
# 3. the unit: `systemd-analyze verify` has nothing to say about it, and
#    `systemd-analyze security` rates its exposure (printed; at most 2.5 passes);
# 4. the unit's command line, run the way the unit runs it (the service user,
#    CAP_NET_BIND_SERVICE as the only, ambient, capability, no new privileges,
#    LimitNOFILE, UMask, /run/linerate as its RuntimeDirectory) against the packaged
#    configuration: it serves port 80, answers /healthz, writes its pid file and its
#    access log (which the logrotate snippet rotates and has reopened), and
#    `linerate upgrade --config /etc/linerate/linerate.toml` hands over to a new
#    process that serves the same port;
# 5. dpkg -r keeps the configuration, dpkg -P removes it with the state and logs.
#
# What this cannot check without systemd as PID 1 (containers, this test machine):
# the sandbox itself (ProtectSystem and friends are applied by systemd at start),
# Type=notify readiness as systemd sees it (crates/linerate/tests/upgrade.rs checks
# the notifications on a socket of its own), and `systemctl reload`.
# Everything it creates is removed at exit, the user too if it did not exist before.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

[ "$(id -u)" -eq 0 ] || { echo "tests/package.sh installs a package: run it as root" >&2; exit 1; }
apt_ensure lintian systemd adduser logrotate curl util-linux iproute2 procps

if [ $# -ge 1 ]; then
    deb=$1
else
    deb=$(scripts/package | tail -1)
fi
[ -f "$deb" ] || { echo "no package $deb" >&2; exit 1; }

if dpkg-query -W -f='${Status}' linerate 2>/dev/null | grep -q "install ok installed"; then
    echo "tests/package.sh: linerate is installed already; remove it first" >&2
    exit 1
fi
user_existed=0
getent passwd linerate >/dev/null && user_existed=1
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    rm -f /var/www/linerate/package-test.txt
    dpkg --purge linerate >/dev/null 2>&1 || true
    rm -rf /run/linerate
    if [ "$user_existed" = 0 ] && getent passwd linerate >/dev/null; then
        deluser --quiet --system linerate >/dev/null 2>&1 || true
        delgroup --quiet --system linerate >/dev/null 2>&1 || true
    fi
    rm -rf "$work"
}
work=$(mktemp -d)
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
# Running (a zombie, left to a PID 1 that does not reap, is not).
alive() { local s; s=$(ps -o stat= -p "$1" 2>/dev/null) || return 1; [[ $s != Z* ]]; }
step() { printf '\n--- %s\n' "$*"; }

step "lintian $deb"
# In a directory of the test's own: lintian leaves a cache file (mldbm-elf-*) in its TMPDIR.
TMPDIR="$work" lintian --fail-on error --no-tag-display-limit "$deb" 2>&1 | grep -v '^running with root privileges' || true
TMPDIR="$work" lintian --fail-on error "$deb" >/dev/null 2>&1 || fail "lintian reports errors"
echo "lintian: no errors"

step "dpkg -i"
dpkg -i "$deb"
check_mode() { # PATH OWNER:GROUP MODE
    local got
    got=$(stat -c '%U:%G %a' "$1") || fail "$1 is missing"
    [ "$got" = "$2 $3" ] || fail "$1: $got, want $2 $3"
    echo "ok $1 $got"
}
check_mode /usr/bin/linerate root:root 755
check_mode /lib/systemd/system/linerate.service root:root 644
check_mode /etc/linerate/linerate.toml root:root 644
check_mode /etc/logrotate.d/linerate root:root 644
check_mode /var/lib/linerate linerate:linerate 750
check_mode /var/log/linerate linerate:linerate 750
check_mode /var/cache/linerate linerate:linerate 750
check_mode /var/www/linerate root:root 755
for f in /usr/share/doc/linerate/copyright /usr/share/doc/linerate/changelog.gz /usr/share/man/man1/linerate.1.gz; do
    [ -f "$f" ] || fail "$f is missing"
done
conffiles=$(dpkg-query -W -f='${Conffiles}\n' linerate)
for f in /etc/linerate/linerate.toml /etc/logrotate.d/linerate; do
    grep -q " $f " <<<"$conffiles" || fail "$f is not a conffile"
done
IFS=: read -r _ _ uid gid _ home shell < <(getent passwd linerate) || fail "no linerate user"
[ "$uid" -lt 1000 ] || fail "linerate is not a system user (uid $uid)"
[ "$(getent group linerate | cut -d: -f3)" = "$gid" ] || fail "the user's group is not linerate"
case "$shell" in */nologin | */false) ;; *) fail "the user has a login shell: $shell" ;; esac
echo "ok user linerate uid=$uid gid=$gid home=$home shell=$shell"
linerate --version
linerate serve --config /etc/linerate/linerate.toml --check-config >/dev/null || fail "the packaged configuration is refused"
logrotate --debug /etc/logrotate.d/linerate >/dev/null 2>&1 || fail "logrotate refuses the snippet"
echo "ok packaged configuration and logrotate snippet are valid"

step "systemd-analyze verify"
out=$(systemd-analyze verify /lib/systemd/system/linerate.service 2>&1 || true)
if grep -i "linerate" <<<"$out"; then
    fail "systemd-analyze verify reports the problems above"
fi
echo "systemd-analyze verify: nothing to report about linerate.service"

step "systemd-analyze security"
security=$(systemd-analyze security --offline=true --no-pager /lib/systemd/system/linerate.service 2>&1 || true)
grep -E '^✗' <<<"$security" | sed 's/^/  exposed: /' | head -30 || true
score=$(sed -n 's/.*Overall exposure level for linerate.service: \([0-9.]*\).*/\1/p' <<<"$security")
[ -n "$score" ] || { echo "$security"; fail "no exposure level in the output above"; }
echo "exposure level: $score ($(grep -o 'Overall exposure level.*' <<<"$security"))"
awk -v s="$score" 'BEGIN { exit !(s <= 2.5) }' || fail "exposure $score is above 2.5"

step "the unit's command line as the service user"
exec_start=$(sed -n 's/^ExecStart=//p' /lib/systemd/system/linerate.service)
limit_nofile=$(sed -n 's/^LimitNOFILE=//p' /lib/systemd/system/linerate.service)
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt "$limit_nofile" ] && ! prlimit --nofile="$limit_nofile:$limit_nofile" true 2>/dev/null; then
    echo "LimitNOFILE=$limit_nofile cannot be granted here (hard limit $hard, no CAP_SYS_RESOURCE): running with $hard"
    limit_nofile=$hard
fi
install -d -o linerate -g linerate -m 0755 /run/linerate # RuntimeDirectory=linerate
extra=()
for port in 80 9090; do
    if ss -Hltn "sport = :$port" | grep -q .; then
        echo "port $port is in use on this machine: listening elsewhere instead (flags override the file)"
        extra=(--listen 127.0.0.1:81 --admin 127.0.0.1:9091)
    fi
done
http_port=80 admin_port=9090
[ ${#extra[@]} -eq 0 ] || { http_port=81; admin_port=9091; }
echo "hello from the package test" > /var/www/linerate/package-test.txt
umask_unit=$(sed -n 's/^UMask=//p' /lib/systemd/system/linerate.service)
# shellcheck disable=SC2086 # ExecStart is a command line
(
    umask "$umask_unit"
    exec prlimit --nofile="$limit_nofile:$limit_nofile" -- \
        setpriv --reuid=linerate --regid=linerate --init-groups --no-new-privs \
        --inh-caps=-all,+net_bind_service --ambient-caps=-all,+net_bind_service --bounding-set=-all,+net_bind_service \
        -- $exec_start "${extra[@]}" >"$work/stdout" 2>"$work/stderr"
) &
pids+=($!)
for _ in $(seq 100); do
    grep -q "listening admin" "$work/stdout" 2>/dev/null && break
    sleep 0.1
done
grep -q "listening http://0.0.0.0:$http_port\|listening http://127.0.0.1:$http_port" "$work/stdout" ||
    { cat "$work/stderr"; fail "not listening on port $http_port"; }
cat "$work/stdout"
pid=$(cat /run/linerate/linerate.pid)
grep -q "^Uid:.*\b$uid\b" "/proc/$pid/status" || fail "not running as linerate"
capeff=$(sed -n 's/^CapEff:\t//p' "/proc/$pid/status")
[ "$capeff" = "0000000000000400" ] || fail "effective capabilities $capeff, want CAP_NET_BIND_SERVICE only"
[ "$(sed -n 's/^Max open files *\([0-9]*\).*/\1/p' "/proc/$pid/limits")" = "$limit_nofile" ] || fail "open-file limit not $limit_nofile"
echo "ok pid $pid: user linerate, CapEff $capeff (CAP_NET_BIND_SERVICE), LimitNOFILE $limit_nofile"
[ "$(curl -sf "http://127.0.0.1:$http_port/package-test.txt")" = "hello from the package test" ] || fail "GET failed"
[ "$(curl -sf "http://127.0.0.1:$admin_port/healthz")" = "ok" ] || fail "/healthz failed"
echo "ok serves port $http_port, /healthz on $admin_port"
log=/var/log/linerate/access.log
for _ in $(seq 50); do grep -q 'package-test.txt' "$log" 2>/dev/null && break; sleep 0.1; done
grep -q 'package-test.txt' "$log" || fail "no access-log record in $log"
check_mode "$log" linerate:linerate 640
logrotate --force /etc/logrotate.d/linerate || fail "logrotate"
[ -f "$log.1" ] || fail "logrotate did not rotate $log"
curl -sf "http://127.0.0.1:$http_port/package-test.txt?after-rotation" >/dev/null || fail "GET after rotation"
for _ in $(seq 50); do grep -q 'package-test.txt' "$log" 2>/dev/null && break; sleep 0.1; done
grep -q 'package-test.txt' "$log" || fail "no record in the reopened $log after logrotate (SIGUSR1)"
echo "ok access log written, rotated by logrotate, reopened on SIGUSR1"

linerate upgrade --config /etc/linerate/linerate.toml || { cat "$work/stderr"; fail "linerate upgrade failed"; }
new=$(cat /run/linerate/linerate.pid)
[ "$new" != "$pid" ] || fail "the pid file still names $pid"
pids+=("$new")
[ "$(curl -sf "http://127.0.0.1:$http_port/package-test.txt")" = "hello from the package test" ] || fail "GET after the upgrade failed"
grep -q "^Uid:.*\b$uid\b" "/proc/$new/status" || fail "the new process does not run as linerate"
for _ in $(seq 100); do alive "$pid" || break; sleep 0.1; done
! alive "$pid" || fail "the old process $pid did not exit after the hand-over"
echo "ok linerate upgrade: $pid -> $new, same port"
kill -TERM "$new"
for _ in $(seq 100); do alive "$new" || break; sleep 0.1; done
! alive "$new" || fail "$new did not stop on SIGTERM"
[ ! -e /run/linerate/linerate.pid ] || fail "the pid file was left behind"
echo "ok stopped on SIGTERM, pid file removed"
rm -f /var/www/linerate/package-test.txt

step "dpkg -r, dpkg -P"
dpkg -r linerate >/dev/null
[ ! -e /usr/bin/linerate ] || fail "/usr/bin/linerate left after dpkg -r"
[ -f /etc/linerate/linerate.toml ] || fail "dpkg -r removed the configuration"
dpkg -P linerate >/dev/null
for f in /etc/linerate/linerate.toml /var/lib/linerate /var/log/linerate /var/cache/linerate /var/www/linerate; do
    [ ! -e "$f" ] || fail "$f left after dpkg -P"
done
echo "ok removed, then purged"
printf '\npackage: all checks passed (exposure level %s)\n' "$score"
