#!/usr/bin/env bash
# Frozen-rank drill: does a rank frozen from outside (kill -STOP) end the job, and how fast?
#
# Step by step, for each of --trials trials:
#  1. Launch poseidon_mlp at --np ranks under `timeout -k 5 60` with POSEIDON_PEER_TIMEOUT_S=5
#     (the caller's POSEIDON_* settings otherwise, default grace). The trainer is started
#     through a symlink in a directory of this drill's own: a marker no other process carries.
#  2. Pick a random rank and a random moment 0.5-3 s after the launch (--from training: after
#     rank 0 printed its "initial :" line, i.e. once training begins); find that rank's pid
#     by the marker (pgrep) and OMPI_COMM_WORLD_RANK in its environment, and `kill -STOP` it.
#  3. Wait for mpirun. Record: hung (hit the 60 s timeout), exit code, seconds from the stop to
#     mpirun's exit, whether the output names the stopped rank ("lost peer rank R"), where the
#     stop landed, and the trainer processes mpirun left behind (killed by the marker). Where:
#     "startup" when rank 0 had not printed "initial :" (printed once every rank's engine is
#     up), "init" within that when the stopped rank had fewer than 5 threads (main + Open
#     MPI's 3 during and after MPI_Init; the first communicator's liveness thread makes 5);
#     "training" otherwise ("done" after the summary). Liveness starts with the
#     Communicator, so a stop inside MPI_Init (before it) is not expected to end the job:
#     those hangs are counted apart; every later stop must end it.
#  4. One line per trial, then a summary: hangs, max / median seconds from stop to exit, named.
#
#   scripts/drill-frozen-rank.sh                                  # 20 trials, np 4, auto
#   scripts/drill-frozen-rank.sh --strategy sfb --trials 5
#   scripts/drill-frozen-rank.sh --hidden 1024,1024 --iters 20000  # the shared-memory path
#
# Every process this drill starts is ended: mpirun by its id, the trainers by the marker.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
TRIALS=20
NP=4
STRATEGY=auto
HIDDEN=""
ITERS=1000000  # far more than 60 s of training: only a lost peer (or the timeout) ends a trial
FROM=launch
SEED=""
OUTER_TIMEOUT=60
BINARY="${POSEIDON_BUILD_DIR:-$ROOT/build}/examples/poseidon_mlp"
KEEP_LOGS=""

usage() {
  cat <<EOF
usage: $0 [--trials 20] [--np 4] [--strategy auto|allreduce|ps|sfb|topk] [--hidden W1,W2]
          [--iters $ITERS] [--from launch|training] [--seed N] [--binary PATH] [--keep-logs DIR]
Freezes a random rank of poseidon_mlp (kill -STOP) 0.5-3 s after --from and checks that the job
ends (POSEIDON_PEER_TIMEOUT_S=5 unless set) and names the rank. Binary: \$POSEIDON_BUILD_DIR
(default build/)/examples/poseidon_mlp.
EOF
}
die() {
  echo "drill-frozen-rank: $*" >&2
  exit 2
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --trials) TRIALS="$2"; shift 2 ;;
    --np) NP="$2"; shift 2 ;;
    --strategy) STRATEGY="$2"; shift 2 ;;
    --hidden) HIDDEN="$2"; shift 2 ;;
    --iters) ITERS="$2"; shift 2 ;;
    --from) FROM="$2"; shift 2 ;;
    --seed) SEED="$2"; shift 2 ;;
    --binary) BINARY="$2"; shift 2 ;;
    --keep-logs) KEEP_LOGS="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done
[[ "$TRIALS" =~ ^[0-9]+$ && $TRIALS -ge 1 ]] || die "--trials '$TRIALS': expected an integer >= 1"
[[ "$NP" =~ ^[0-9]+$ && $NP -ge 2 ]] || die "--np '$NP': expected an integer >= 2 (a peer to lose)"
[[ "$FROM" == launch || "$FROM" == training ]] || die "--from '$FROM': expected launch or training"
[[ -x "$BINARY" ]] || die "trainer '$BINARY' not found: scripts/build.sh (or --binary)"
command -v pgrep >/dev/null || die "needs pgrep (procps)"
[[ -n "$SEED" ]] && RANDOM=$SEED

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export POSEIDON_PEER_TIMEOUT_S="${POSEIDON_PEER_TIMEOUT_S:-5}"

WORK="$(mktemp -d /tmp/psd-drill.XXXXXX)"
MARKER="$WORK/poseidon_mlp"
ln -s "$(readlink -f "$BINARY")" "$MARKER"
MPIRUN_PID=""
# The trainers are exactly the processes whose command line starts with the marker.
marker_pids() { pgrep -f "^$MARKER( |$)"; }
cleanup() {
  [[ -n "$MPIRUN_PID" ]] && kill -KILL "$MPIRUN_PID" 2>/dev/null
  pkill -KILL -f "^$MARKER( |$)" 2>/dev/null
  if [[ -n "$KEEP_LOGS" ]]; then
    mkdir -p "$KEEP_LOGS" && cp "$WORK"/trial-*.log "$KEEP_LOGS"/ 2>/dev/null
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

now() { date +%s.%N; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
# Pid of MPI rank $1 among the marker's processes, or nothing yet.
rank_pid() {
  local pid
  for pid in $(marker_pids); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then
      echo "$pid"
      return
    fi
  done
}

args=(--iters "$ITERS" --log-every 0 --no-print-plan --strategy "$STRATEGY")
[[ -n "$HIDDEN" ]] && args+=(--hidden "$HIDDEN")
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
echo "drill-frozen-rank: $TRIALS trials, np $NP, strategy $STRATEGY, hidden ${HIDDEN:-default}," \
  "iters $ITERS, POSEIDON_PEER_TIMEOUT_S=$POSEIDON_PEER_TIMEOUT_S" \
  "POSEIDON_PEER_LOST_GRACE_S=${POSEIDON_PEER_LOST_GRACE_S:-default}, stop 0.5-3 s after $FROM," \
  "outer timeout ${OUTER_TIMEOUT} s; load average $load_before"

hangs=0 named=0 nonzero=0 leftovers_total=0 init_stops=0 init_hangs=0
secs=() phases=() tnamed=0
for ((t = 1; t <= TRIALS; t++)); do
  log="$WORK/trial-$t.log"
  rank=$((RANDOM % NP))
  delay=$(awk -v r="$RANDOM" 'BEGIN { printf "%.2f", 0.5 + 2.5 * r / 32767 }')
  launch=$(now)
  timeout -k 5 "$OUTER_TIMEOUT" mpirun -np "$NP" --oversubscribe --bind-to none \
    --mca mpi_yield_when_idle 1 "$MARKER" "${args[@]}" >"$log" 2>&1 &
  MPIRUN_PID=$!

  # The moment: delay after the launch, or after training began.
  base=$launch
  if [[ $FROM == training ]]; then
    while kill -0 "$MPIRUN_PID" 2>/dev/null && ! grep -q "^initial :" "$log"; do sleep 0.05; done
    base=$(now)
  fi
  sleep "$(awk -v b="$base" -v d="$delay" -v n="$(now)" 'BEGIN { s = b + d - n; print (s > 0 ? s : 0) }')"
  pid=""
  while kill -0 "$MPIRUN_PID" 2>/dev/null; do
    pid=$(rank_pid "$rank")
    [[ -n "$pid" ]] && break
    sleep 0.05
  done
  stop=""
  if [[ -n "$pid" ]] && kill -STOP "$pid" 2>/dev/null; then stop=$(now); fi
  threads=$(awk '/^Threads:/ { print $2 }' "/proc/$pid/status" 2>/dev/null)
  phase=startup
  [[ ${threads:-0} -lt 5 ]] && phase=init
  grep -q "^initial :" "$log" && phase=training
  grep -q "^summary :" "$log" && phase="done"
  wait "$MPIRUN_PID"
  rc=$?
  end=$(now)
  MPIRUN_PID=""
  left=$(marker_pids | wc -l)
  if ((left > 0)); then
    sleep 1 # the launcher's own clean-up may still be under way
    left=$(marker_pids | wc -l)
    pkill -KILL -f "^$MARKER( |$)" 2>/dev/null
  fi
  leftovers_total=$((leftovers_total + left))

  if [[ -z "$stop" ]]; then
    echo "trial $t: rank $rank never found running (mpirun exited $rc after $(sub "$launch" "$end") s): not counted"
    continue
  fi
  hung=no
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    hung=yes
    hangs=$((hangs + 1))
    [[ $phase == init ]] && init_hangs=$((init_hangs + 1))
  fi
  [[ $rc -ne 0 ]] && nonzero=$((nonzero + 1))
  is_named=no
  if grep -q "lost peer rank $rank (host " "$log"; then is_named=yes; named=$((named + 1)); fi
  [[ $phase == init ]] && init_stops=$((init_stops + 1))
  s=$(sub "$stop" "$end")
  secs+=("$s")
  phases+=("$phase")
  [[ $phase != init && $is_named == yes ]] && tnamed=$((tnamed + 1))
  echo "trial $t: stopped rank $rank (pid $pid) $(sub "$launch" "$stop") s after launch [$phase, $threads threads];" \
    "exit $rc after ${s} s; hung $hung; named $is_named; leftovers $left"
done

# "max median" of the arguments (seconds), or "- -" for none.
max_median() {
  (($# > 0)) || { echo "- -"; return; }
  printf '%s\n' "$@" | sort -g |
    awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
                               printf "%.2f %.2f\n", v[NR], m }'
}
n=${#secs[@]}
read -r smax smed < <(max_median "${secs[@]}")
# The same figures over the stops after MPI_Init (the communicator's liveness running).
tsecs=()
for ((i = 0; i < n; i++)); do [[ ${phases[$i]} != init ]] && tsecs+=("${secs[$i]}"); done
tn=${#tsecs[@]}
read -r tmax tmed < <(max_median "${tsecs[@]}")
echo "summary: np $NP, strategy $STRATEGY, hidden ${HIDDEN:-default}: $n trials; hangs $hangs;" \
  "seconds from stop to exit: max $smax, median $smed; named $named/$n; non-zero exit $nonzero/$n;" \
  "stopped inside MPI_Init $init_stops (hung $init_hangs); after it $tn: hangs" \
  "$((hangs - init_hangs)), stop to exit max $tmax, median $tmed, named $tnamed/$tn;" \
  "leftover processes $leftovers_total;" \
  "load average $load_before -> $(cut -d' ' -f1-3 /proc/loadavg)"
# Passes when every stop after MPI_Init ended the job and named the rank, and nothing was left.
((hangs == init_hangs && tnamed == tn && leftovers_total == 0))
