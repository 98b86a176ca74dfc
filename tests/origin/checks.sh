# The verdicts of the origin rig's test scripts (tests/origin/*-tests), sourced by
# each after tests/origin/lib.sh:
#   check NAME CONDITION  evaluates the shell CONDITION (callers single-quote it, so
#                         that it is evaluated when check runs), prints
#                         "PASS NAME" or "FAIL NAME" and counts the verdict
#   note TEXT             a line of context, indented under the checks
#   pfield KEY            a field of $work/player.json, the report of
#                         tests/origin/live_player.py (KEY may be dotted:
#                         latency_s.p50); "none" when absent
#   checks_done           prints "N passed, N failed"; fails when any check failed
passed=0 failed=0

check() {
    if eval "$2"; then
        passed=$((passed + 1))
        echo "PASS $1"
    else
        failed=$((failed + 1))
        echo "FAIL $1"
    fi
}

note() { echo "     $*"; }

pfield() {
    python3 -c 'import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."):
    v = v.get(k) if isinstance(v, dict) else None
print(v)' "$work/player.json" "$1" 2>/dev/null || echo none
}

checks_done() {
    echo "$passed passed, $failed failed"
    [ "$failed" = 0 ]
}
