#!/usr/bin/env bash
# Runs liveness_test's abort case (DISABLED_LivenessAbortTest): the last rank stops itself with
# SIGSTOP and the survivors, abort on, must end the job. Passes only when
#   - mpirun exits non-zero (MPI_Abort) but not by our own timeout,
#   - a survivor printed "poseidon: ... lost peer rank <last> (host ...)",
#   - the job ended within <bound_s> of the stop (the rank prints its wall-clock stop time),
#   - nobody printed "NO ABORT" (the survivors' own fallback after 10 s),
#   - no rank printed a ThreadSanitizer report (the TSan build).
# Usage: liveness_abort_test.sh <bound_s> <mpiexec> <np> <binary> [mpiexec flags...]
set -u
bound=$1 mpiexec=$2 np=$3 binary=$4
shift 4
log=$(mktemp)
trap 'rm -f "$log"' EXIT

timeout -k 5 60 "$mpiexec" -np "$np" "$@" "$binary" --gtest_also_run_disabled_tests \
  --gtest_filter='DISABLED_LivenessAbortTest.*' >"$log" 2>&1
rc=$?
end=$(date +%s.%N)
cat "$log"

fail() {
  echo "liveness_abort_test: FAIL: $*"
  exit 1
}
if grep -q "liveness_test: SKIP" "$log"; then
  echo "liveness_abort_test: SKIP"
  exit 77
fi
# A sanitizer build's report fails the test whatever the exit status (the abort ends the job
# with a non-zero one anyway).
grep -q "WARNING: ThreadSanitizer" "$log" && fail "ThreadSanitizer reported (see above)"
last=$((np - 1))
stop=$(sed -n 's/.*rank [0-9]* stops itself at \([0-9.]*\).*/\1/p' "$log" | head -n 1)
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "mpirun ran into the 60 s timeout (rc $rc)"
[ "$rc" -ne 0 ] || fail "mpirun exited 0; expected the lost peer to end the job"
grep -q "NO ABORT" "$log" && fail "a rank outlived the freeze by 10 s"
[ -n "$stop" ] || fail "rank $last never printed its stop time"
grep -q "poseidon: rank [0-9]* (host .*): lost peer rank $last (host " "$log" ||
  fail "no 'lost peer rank $last' line"
elapsed=$(awk -v a="$stop" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
awk -v e="$elapsed" -v b="$bound" 'BEGIN { exit !(e <= b) }' ||
  fail "the job ended ${elapsed} s after the stop; expected at most ${bound} s"
echo "liveness_abort_test: PASS: mpirun exited $rc ${elapsed} s after rank $last stopped (bound ${bound} s)"
