#!/usr/bin/env bash
# Liveness drill on the real job: poseidon_mlp with one of its fault testing aids.
#
#   expect=lost : the trainer's --stop-rank freezes one rank (SIGSTOP, mid-step). Passes only when
#     - mpirun exits non-zero, but not through our own 60 s timeout (124 / 137),
#     - a survivor printed "lost peer rank <R>" for the stopped rank R,
#     - the job ended within <bound_s> of the stop (the rank prints its stop time first) and
#       within <wall_s> of the launch.
#   expect=alive : the trainer's --sleep-rank puts one rank's training thread to sleep (its
#     process runs on). Passes only when mpirun exits 0 within <wall_s>, training completed
#     (the summary and the bit-identical-parameters lines) and nobody printed "lost peer".
#   Either way, no rank may print a ThreadSanitizer report (the TSan build).
#
# Never hangs: mpirun runs under `timeout -k 5 60`. The trainer is launched through a symlink in
# a directory of our own, a marker no other process carries: whatever mpirun leaves behind (a
# stopped rank, say) is killed by that marker afterwards, and leaving any behind fails the test.
#
# Usage: trainer_fault_test.sh lost|alive <bound_s> <wall_s> <mpiexec> <np> <poseidon_mlp>
#          [mpiexec flags...] -- [trainer flags...]
# The POSEIDON_* settings (peer timeout, grace) come from the environment.
set -u
expect=$1 bound=$2 wall=$3 mpiexec=$4 np=$5 binary=$6
shift 6
mpi_flags=()
while [[ $# -gt 0 && "$1" != "--" ]]; do
  mpi_flags+=("$1")
  shift
done
[[ $# -gt 0 ]] && shift  # the "--"
case "$expect" in
  lost | alive) ;;
  *)
    echo "trainer_fault_test: expected 'lost' or 'alive', got '$expect'" >&2
    exit 2
    ;;
esac

dir=$(mktemp -d /tmp/psd-drill-test.XXXXXX)
marker="$dir/poseidon_mlp"
ln -s "$binary" "$marker"
log="$dir/log"
cleanup() {
  pkill -KILL -f "^$marker( |$)" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT

start=$(date +%s.%N)
timeout -k 5 60 "$mpiexec" -np "$np" "${mpi_flags[@]}" "$marker" "$@" >"$log" 2>&1
rc=$?
end=$(date +%s.%N)
cat "$log"

fail() {
  echo "trainer_fault_test: FAIL: $*"
  exit 1
}
# Leftovers: give the launcher's own clean-up a moment, then kill by the marker and fail.
left=""
for _ in 1 2 3 4 5 6 7 8 9 10; do
  left=$(pgrep -f "^$marker( |$)")
  [[ -z "$left" ]] && break
  sleep 0.2
done
if [[ -n "$left" ]]; then
  ps -o pid,stat,etime,args -p "$(echo $left | tr ' ' ',')" 2>/dev/null
  pkill -KILL -f "^$marker( |$)"
  fail "mpirun exited (rc $rc) and left $(echo "$left" | wc -l) trainer process(es) behind (killed)"
fi

# A sanitizer build's report fails the test whatever the exit status (a lost peer ends the job
# with a non-zero one anyway).
grep -q "WARNING: ThreadSanitizer" "$log" && fail "ThreadSanitizer reported (see above)"

total=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
[[ $rc -ne 124 && $rc -ne 137 ]] || fail "mpirun ran into the 60 s timeout (rc $rc)"
awk -v t="$total" -v w="$wall" 'BEGIN { exit !(t <= w) }' ||
  fail "the job took ${total} s from launch; expected at most ${wall} s"

if [[ $expect == alive ]]; then
  [[ $rc -eq 0 ]] || fail "mpirun exited $rc; a slow (sleeping) rank must not end the job"
  grep -q "lost peer" "$log" && fail "a rank declared a slow (sleeping) peer lost"
  grep -q "wakes at" "$log" || fail "the sleeping rank never printed that it woke"
  grep -q "^summary : held-out accuracy" "$log" || fail "no training summary"
  grep -q "^params  : bit-identical" "$log" || fail "no bit-identical-parameters line"
  echo "trainer_fault_test: PASS: a rank slept mid-step, training completed (rc 0) in ${total} s," \
    "nobody declared it lost"
  exit 0
fi

stopped=$(sed -n 's/.*poseidon_mlp: rank \([0-9]*\) stops itself.* at \([0-9.]*\) (testing aid.*/\1 \2/p' "$log" |
  head -n 1)
[[ -n "$stopped" ]] || fail "no rank printed that it stopped itself"
read -r rank stop <<<"$stopped"
[[ $rc -ne 0 ]] || fail "mpirun exited 0; expected the lost peer to end the job"
grep -q "lost peer rank $rank (host " "$log" || fail "no 'lost peer rank $rank' line"
elapsed=$(awk -v a="$stop" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
awk -v e="$elapsed" -v b="$bound" 'BEGIN { exit !(e <= b) }' ||
  fail "the job ended ${elapsed} s after rank $rank stopped; expected at most ${bound} s"
echo "trainer_fault_test: PASS: mpirun exited $rc ${elapsed} s after rank $rank stopped" \
  "(bound ${bound} s), ${total} s after launch (bound ${wall} s); the output names rank $rank"
