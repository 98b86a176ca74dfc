#!/usr/bin/env bash
# A three-node linerate fleet behind HAProxy, scraped by Prometheus (tests/fleet/lib.sh
# sets it up in network namespaces it makes and removes): the full form of
# tests/fleet/run. Runs each behaviour with more sessions and longer, then prints a
# table of what was measured and whether each check held:
#   metrics   Prometheus's fleet Gb/s against linerate bench's (within 10%); HTTPS
#             passed through HAProxy in TCP mode, terminated by the nodes
#   drain     SIGTERM to a node under `linerate bench --verify`
#   crash     kill -9 of a node
#   load      a node with twice the load on /load: its share of new sessions
#   affinity  page-cache hit ratio of the fleet with consistent hashing and with round
#             robin, each node's page cache capped by a memory cgroup
#   tier      the tiered fleet (tests/fleet/tier.sh: three edges, two parents, an S3
#             origin): the origin's bytes against the distinct bytes asked for, from
#             a cold fleet with parents and without, hashed and round robin
#   tier-kill kill -9 of a parent under a verified run
#
#   bench/fleet.sh [--quick] [--no-tier] [--bin PATH]
#
# --quick: the short forms' sizes (about six minutes; the full form about twelve).
# --no-tier: the flat fleet's rows only (about three minutes with --quick). With both,
# this is tests/fleet/run, which scripts/test runs; scripts/test runs the tier's short
# form on its own, tests/fleet/tier, with the same scenario functions. Needs root, haproxy and prometheus (and
# SeaweedFS, fetched once); FLEET_KEEP=DIR keeps the logs, configurations and samples.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
. tests/fleet/lib.sh
. tests/fleet/tier.sh

quick=0 tier=1 bin=
parse_flags "usage: bench/fleet.sh [--quick] [--no-tier] [--bin PATH]" --quick:quick=1 --no-tier:tier=0 --bin=bin -- "$@"
build_linerate
fleet_up 240 1

if [ "$quick" = 1 ]; then
    d=12 sessions=16 md=8 msessions=12 lsessions=32 ad=20 asessions=30 acache=96 atitles=192
    td=12 tsessions=24 ttitles=48
else
    d=30 sessions=40 md=30 msessions=40 lsessions=48 ad=60 asessions=40 acache=128 atitles=288
    td=30 tsessions=40 ttitles=120
fi
results=$work/results
run() { # NAME FUNCTION ARGS...: one scenario, its lines and verdict kept for the table
    local name=$1 out rc=0
    shift
    # In this shell, not a subshell: scenarios stop, restart and wait for nodes.
    "$@" > "$work/$name.out" 2> "$work/$name.fail" || rc=$?
    out=$(cat "$work/$name.out")
    echo "$out"
    [ "$rc" = 0 ] || cat "$work/$name.fail" >&2
    printf '%s\t%s\t%s\n' "$name" "$([ "$rc" = 0 ] && echo pass || echo FAIL)" "$(tr '\n' ' ' <<< "$out")" >> "$results"
    return 0
}
run metrics scenario_metrics "$md" "$msessions" 8
run drain scenario_drain "$d" "$sessions" 8
node_restart b
run crash scenario_crash "$d" "$sessions" 8
run load scenario_load "$d" "$lsessions" 8 0.8
run affinity scenario_affinity "$ad" "$asessions" 10 "$acache" "$atitles"
if [ "$tier" = 1 ]; then
    tier_up "$ttitles" 4
    run tier scenario_tier_multiples "$td" "$tsessions" 16 1.0
    run tier-kill scenario_tier_kill "$td" "$tsessions" 16 1.0
fi

echo
echo "| behaviour | checks | measured |"
echo "|---|---|---|"
while IFS=$'\t' read -r name verdict figures; do
    echo "| $name | $verdict | ${figures% } |"
done < "$results"
failed=$(grep -c $'\tFAIL\t' "$results" || true)
[ "$failed" = 0 ] || { echo "$failed behaviour(s) failed" >&2; exit 1; }
