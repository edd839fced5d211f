#!/usr/bin/env bash
# The flake hunter: run the suite, or a part of it, ROUNDS times under a background CPU load (BUSY
# busy processes: two on two cores is the CI machine's worst case), each round with a new seed for
# the tests' random moments (SWEEP_TEST_SEED, tests/conftest.py's `seed` fixture), and list every
# failure with its seed and the command that replays it. Run it before stopping on any change to
# the run loop, signals, leases or the checkpoint path (docs/development.md).
#
#   tests/stress.sh [-n ROUNDS] [-b BUSY] [-s FIRST_SEED] [PYTEST ARGS...]
#   tests/stress.sh -n 5 tests/run/test_resume.py tests/host/test_signals.py
#   tests/stress.sh -n 1 -b 2                      # the whole suite once, as CI under load
#
# Exit status: 0 if every round passed, 1 otherwise. Logs: $STRESS_LOGS (default /tmp/sweep-stress).
set -uo pipefail
cd "$(dirname "$0")/.."

rounds=3 busy=2 seed=${SWEEP_STRESS_SEED:-$(( $(date +%s) % 100000 ))}
while getopts "n:b:s:" opt; do
    case $opt in
        n) rounds=$OPTARG ;;
        b) busy=$OPTARG ;;
        s) seed=$OPTARG ;;
        *) sed -n '2,12p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
logs=${STRESS_LOGS:-/tmp/sweep-stress}
mkdir -p "$logs"
python=${PYTHON:-.venv/bin/python}

pids=()
for _ in $(seq "$busy"); do
    "$python" -c "while True: pass" &
    pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
echo "stress: $rounds rounds of: pytest $* (under $busy busy processes; seeds from $seed; logs in $logs)"

failed=0
summary="$logs/summary.txt"
: > "$summary"
for round in $(seq "$rounds"); do
    round_seed=$((seed + round - 1))
    log="$logs/round-$round.log"
    start=$(date +%s)
    SWEEP_TEST_SEED=$round_seed "$python" -m pytest -p no:cacheprovider -rf "$@" > "$log" 2>&1
    code=$?
    tail_line=$(grep -E "^=+ .*(passed|failed|error).* in " "$log" | tail -1)
    echo "round $round (SWEEP_TEST_SEED=$round_seed): exit $code, $(( $(date +%s) - start )) s: $tail_line" | tee -a "$summary"
    if [ "$code" -ne 0 ]; then
        failed=1
        grep -E "^(FAILED|ERROR) " "$log" | sed "s/^/    /" | tee -a "$summary"
        grep -h "seeded with" "$log" | sort -u | sed "s/^/    /" | tee -a "$summary"
        echo "    replay the round: SWEEP_TEST_SEED=$round_seed $python -m pytest $*" | tee -a "$summary"
    fi
done
echo "stress: $( [ $failed -eq 0 ] && echo "all $rounds rounds passed" || echo "failures above" ) ($summary)"
exit $failed
