#!/usr/bin/env bash
# Emulated cluster: 1..8 "hosts" in network namespaces joined by rate-limited links, running
# poseidon_model_trainer in its three modes, then the scaling table (bench/RESULTS.md).
#
# Step by step (recipe and the reasons for every flag: /work/shared/CLUSTER-EMULATION.md):
#  1. Remove leftovers of an earlier run (namespaces psdc-*, /etc/netns/psdc-*), and arm a trap
#     so that everything is removed again on EXIT, INT and TERM.
#  2. A namespace psdc-br holds the bridge; host i gets namespace psdc-n<i> with eth0, the end
#     of a veth pair whose other end sits on the bridge. Both ends get a tbf qdisc at --rate, so
#     every host has a full-duplex port of that rate into a switch. Addresses come from a
#     private /24 that exists only inside these namespaces; /etc/netns/psdc-n<i>/hosts names
#     the hosts n0..n7. The machine's own network namespace is never touched.
#  3. mpirun runs inside psdc-n0 with its own UTS namespace and hostname n0; Open MPI starts the
#     other hosts' daemons through a plm_rsh_agent script that enters psdc-n<i> with
#     `ip netns exec` + `unshare --uts` + `hostname n<i>`.
#  4. For each P in --hosts: the trainer (dense, dense-overlap, hybrid-overlap), under timeout.
#  5. Scaling efficiency = throughput(P) / (P x throughput(1)) per mode; the table and the run's
#     conditions go to bench/RESULTS.md ("Emulated cluster") through bench/cluster/report.py.
#
# Fault drill (--cut-host I --cut-after S): instead of the sweep, only the hybrid-overlap mode at
# the largest P of --hosts, with POSEIDON_PEER_TIMEOUT_S=5 (the caller's grace, default 2 s);
# S seconds after its launch, host nI's link goes down inside its namespace (`ip link set eth0
# down`: packets vanish, no connection is reset, as when a cable is pulled). Within timeout +
# grace + 8 s of the cut, the trainers on the other hosts must have ended with a survivor naming
# rank I (host nI) as lost (Poseidon's part), and mpirun must have exited non-zero (the
# launcher's part: Open MPI's mpirun also waits for its daemon on the cut host; its out-of-band
# TCP keepalive is turned down to 3 s + 3 x 1 s for the drill). Liveness runs from the first
# Communicator: a cut during the trainer's set-up (the cost-model probe) is detected too; one
# inside MPI_Init is not. The result is printed; nothing goes to bench/RESULTS.md.
#
# Collective benchmark (--osu "PROGRAM ARGS"): instead of the trainer, bench/osu's PROGRAM (e.g.
# "osu_allreduce -m 1M:64M") at each P, with --ranks-per-host R ranks on every host (R > 1: Open
# MPI's shared-memory transport vader between them, Poseidon's window within the host), placed
# --map slot (consecutive ranks on one host) or --map node (ranks dealt round-robin over hosts).
# Its table goes to the output only.
#
# Compute is emulated with sleeps (see poseidon_model_trainer); --compute-scale makes the
# compute : communication ratio of a modelled cluster on these links: modelling 10 Gbit/s with
# 1 Gbit/s links needs compute-scale 10 (the default: Titan X GPUs on a 10 Gbit/s network).
#
#   bench/cluster/emulate.sh                       # P = 1 2 4 8, VGG19 shrunk 32x, 1 Gbit/s
#   bench/cluster/emulate.sh --hosts "1 2 4" --rate 500mbit --model resnet152 --scale 0.25
#   bench/cluster/emulate.sh --hosts "4" --cut-host 2 --cut-after 3   # the fault drill
#   bench/cluster/emulate.sh --hosts 4 --ranks-per-host 2 --osu "osu_allreduce -m 1M:64M"
#   bench/cluster/emulate.sh --teardown-only
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PREFIX=psdc
SUBNET=10.213.77  # private, used only inside the namespaces
MAX_HOSTS=8

HOSTS="1 2 4 8"
RATE=1gbit
MODEL=vgg19
SCALE=0.03125
COMPUTE_SCALE=10
GPU=titanx
ITERS=5
WARMUP=1
MODES=dense,dense-overlap,hybrid-overlap
TRAINER="${POSEIDON_BUILD_DIR:-$ROOT/build}/bench/poseidon_model_trainer"
RESULTS="$ROOT/bench/RESULTS.md"
WRITE_RESULTS=1
TIMEOUT_S=240
TEARDOWN_ONLY=0
WORK=""
CUT_HOST=""
CUT_AFTER=""
ITERS_GIVEN=0
TIMEOUT_GIVEN=0
CUT_PEER_TIMEOUT_S=5
CUT_SLACK_S=8
CUT_ITERS=100  # the cut run's default: training must outlast the cut and the bound
OSU=""
RANKS_PER_HOST=1
MAP=slot

usage() {
  cat <<EOF
usage: $0 [--hosts "1 2 4 8"] [--rate 1gbit] [--model vgg19] [--scale 0.03125]
          [--compute-scale 10] [--gpu titanx|k40] [--iters 5] [--warmup 1]
          [--modes dense,dense-overlap,hybrid-overlap] [--trainer PATH] [--timeout 240]
          [--results FILE | --no-results] [--teardown-only]
          [--cut-host I --cut-after S]
          [--osu "PROGRAM ARGS" [--ranks-per-host R] [--map slot|node]]
Needs root (network namespaces). P=1 is the baseline of the scaling efficiency.
--cut-host I --cut-after S: fault drill, no sweep: hybrid-overlap alone at the largest P
(--iters default $CUT_ITERS), host nI's link taken down S s after the launch; checks that the job
ends within POSEIDON_PEER_TIMEOUT_S ($CUT_PEER_TIMEOUT_S) + grace + $CUT_SLACK_S s and names rank I.
Writes no results.
--osu "PROGRAM ARGS": bench/osu's PROGRAM instead of the trainer at each P, R ranks per host,
placed by slot (consecutive) or node (round-robin). Writes no results.
EOF
}

die() { echo "emulate.sh: $*" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --hosts) HOSTS="$2"; shift 2 ;;
    --rate) RATE="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --scale) SCALE="$2"; shift 2 ;;
    --compute-scale) COMPUTE_SCALE="$2"; shift 2 ;;
    --gpu) GPU="$2"; shift 2 ;;
    --iters) ITERS="$2"; ITERS_GIVEN=1; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --modes) MODES="$2"; shift 2 ;;
    --trainer) TRAINER="$2"; shift 2 ;;
    --timeout) TIMEOUT_S="$2"; TIMEOUT_GIVEN=1; shift 2 ;;
    --results) RESULTS="$2"; shift 2 ;;
    --no-results) WRITE_RESULTS=0; shift ;;
    --teardown-only) TEARDOWN_ONLY=1; shift ;;
    --cut-host) CUT_HOST="$2"; shift 2 ;;
    --cut-after) CUT_AFTER="$2"; shift 2 ;;
    --osu) OSU="$2"; shift 2 ;;
    --ranks-per-host) RANKS_PER_HOST="$2"; shift 2 ;;
    --map) MAP="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done

# Link rate in Gbit/s for the trainer's preamble and the report ("1gbit", "500mbit", "2.5gbit").
rate_gbit() {
  local r="${1,,}"
  case "$r" in
    *gbit) echo "${r%gbit}" ;;
    *mbit) awk -v m="${r%mbit}" 'BEGIN { print m / 1000 }' ;;
    *) return 1 ;;
  esac
}

teardown() {
  # Processes still inside our namespaces are ours (trainers, orted): end them by id.
  local ns pids
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${PREFIX}-" || true); do
    pids="$(ip netns pids "$ns" 2>/dev/null || true)"
    if [[ -n "$pids" ]]; then
      kill $pids 2>/dev/null || true
      sleep 0.5
      kill -9 $(ip netns pids "$ns" 2>/dev/null || true) 2>/dev/null || true
    fi
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf /etc/netns/${PREFIX}-* 2>/dev/null || true
  if [[ -n "$WORK" && -d "$WORK" ]]; then rm -rf "$WORK"; fi
}

[[ $EUID -eq 0 ]] || die "needs root for network namespaces (running as uid $EUID)"
command -v ip >/dev/null && command -v tc >/dev/null && command -v unshare >/dev/null ||
  die "needs ip, tc and unshare (iproute2, util-linux)"

teardown  # leftovers of an earlier run
if [[ $TEARDOWN_ONLY -eq 1 ]]; then
  echo "emulate.sh: removed every ${PREFIX}-* namespace and /etc/netns/${PREFIX}-*"
  exit 0
fi
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

LINK_GBIT="$(rate_gbit "$RATE")" || die "--rate '$RATE' is not <number>gbit or <number>mbit"
[[ "$RANKS_PER_HOST" =~ ^[1-9][0-9]*$ ]] ||
  die "--ranks-per-host '$RANKS_PER_HOST': expected a count >= 1"
[[ "$MAP" == slot || "$MAP" == node ]] || die "--map '$MAP': expected slot or node"
if [[ -n "$OSU" ]]; then
  [[ -z "$CUT_HOST" ]] || die "--osu and --cut-host do not go together"
  OSU_BIN="$(dirname "$TRAINER")/osu/${OSU%% *}"
  OSU_ARGS=""
  [[ "$OSU" != *" "* ]] || OSU_ARGS="${OSU#* }"
  [[ -x "$OSU_BIN" ]] || die "--osu: '$OSU_BIN' not found (scripts/build.sh)"
  WRITE_RESULTS=0
elif [[ $RANKS_PER_HOST -ne 1 || $MAP != slot ]]; then
  die "--ranks-per-host and --map go with --osu (the trainer runs one rank per host)"
fi
[[ -x "$TRAINER" ]] || die "trainer '$TRAINER' not found: scripts/build.sh (or pass --trainer)"
NMAX=0
for p in $HOSTS; do
  [[ "$p" =~ ^[0-9]+$ && $p -ge 1 && $p -le $MAX_HOSTS ]] ||
    die "--hosts '$HOSTS' holds '$p'; expected host counts 1..$MAX_HOSTS"
  (( p > NMAX )) && NMAX=$p
done
if [[ -n "$CUT_HOST" || -n "$CUT_AFTER" ]]; then
  [[ -n "$CUT_HOST" && -n "$CUT_AFTER" ]] || die "--cut-host and --cut-after go together"
  [[ "$CUT_HOST" =~ ^[0-9]+$ && $CUT_HOST -ge 1 && $CUT_HOST -lt $NMAX ]] ||
    die "--cut-host '$CUT_HOST': expected a host in [1, $((NMAX - 1))] (n0 runs mpirun; the" \
        "largest P of --hosts is $NMAX)"
  [[ "$CUT_AFTER" =~ ^[0-9]+([.][0-9]+)?$ ]] ||
    die "--cut-after '$CUT_AFTER': expected seconds after the launch (e.g. 3 or 2.5)"
  # The fault drill: the largest P, hybrid-overlap alone, long enough to be cut mid-training.
  HOSTS="$NMAX"
  MODES=hybrid-overlap
  [[ $ITERS_GIVEN -eq 1 ]] || ITERS=$CUT_ITERS
  WRITE_RESULTS=0
  export POSEIDON_PEER_TIMEOUT_S=$CUT_PEER_TIMEOUT_S
  CUT_GRACE_S="${POSEIDON_PEER_LOST_GRACE_S:-2}"
  CUT_BOUND_S=$(awk -v t="$CUT_PEER_TIMEOUT_S" -v g="$CUT_GRACE_S" -v s="$CUT_SLACK_S" \
                  'BEGIN { print t + g + s }')
  # A hang must not cost the full sweep timeout: the cut, the bound and a minute to spare.
  [[ $TIMEOUT_GIVEN -eq 1 ]] ||
    TIMEOUT_S=$(awk -v c="$CUT_AFTER" -v b="$CUT_BOUND_S" 'BEGIN { printf "%d", c + b + 60 }')
fi

WORK="$(mktemp -d /tmp/psd-cluster.XXXXXX)"
LOG="$WORK/runs.log"

echo "emulate.sh: $NMAX hosts, links $RATE ($LINK_GBIT Gbit/s), model $MODEL x$SCALE," \
     "compute-scale $COMPUTE_SCALE ($GPU)"
ip netns add ${PREFIX}-br
ip -n ${PREFIX}-br link add br0 type bridge
ip -n ${PREFIX}-br link set br0 up
ip -n ${PREFIX}-br link set lo up
HOSTS_FILE="$WORK/hosts"
echo "127.0.0.1 localhost" > "$HOSTS_FILE"
for ((i = 0; i < NMAX; i++)); do echo "$SUBNET.$((i + 1)) n$i" >> "$HOSTS_FILE"; done
for ((i = 0; i < NMAX; i++)); do
  ns=${PREFIX}-n$i
  ip netns add $ns
  # Both ends are created inside namespaces: the machine's own namespace never sees them.
  ip -n ${PREFIX}-br link add vh$i type veth peer name eth0 netns $ns
  ip -n ${PREFIX}-br link set vh$i master br0 up
  ip -n $ns addr add $SUBNET.$((i + 1))/24 dev eth0
  ip -n $ns link set eth0 up
  ip -n $ns link set lo up
  # Host -> switch and switch -> host, each at the port rate.
  ip netns exec $ns tc qdisc add dev eth0 root tbf rate "$RATE" burst 256kb latency 50ms
  ip netns exec ${PREFIX}-br tc qdisc add dev vh$i root tbf rate "$RATE" burst 256kb latency 50ms
  mkdir -p /etc/netns/$ns
  cp "$HOSTS_FILE" /etc/netns/$ns/hosts
done

# Open MPI's "ssh": enter the host's namespace with its own hostname (unique session dirs).
AGENT="$WORK/netns-rsh"
cat > "$AGENT" <<EOF
#!/bin/sh
# Called by mpirun as: netns-rsh <host> <command...>
host="\$1"; shift
exec ip netns exec ${PREFIX}-"\$host" unshare --uts sh -c "hostname \$host; \$*"
EOF
chmod +x "$AGENT"

ping_ok=1
if ((NMAX > 1)) && command -v ping >/dev/null; then
  ip netns exec ${PREFIX}-n0 ping -c 1 -W 2 n$((NMAX - 1)) >/dev/null 2>&1 || ping_ok=0
fi
[[ $ping_ok -eq 1 ]] || die "n0 cannot reach n$((NMAX - 1)) through the bridge"

# Trainer processes still running on the hosts other than the cut one.
survivors_alive() {
  local p=$1 name=$2 i pid alive=0
  for ((i = 0; i < p; i++)); do
    ((i == CUT_HOST)) && continue
    for pid in $(ip netns pids ${PREFIX}-n$i 2>/dev/null); do
      [[ "$(cat /proc/$pid/comm 2>/dev/null)" == "${name:0:15}" ]] && alive=$((alive + 1))
    done
  done
  echo "$alive"
}

# The fault drill at P=$1 with the mpirun command $2: launch, cut host n$CUT_HOST's link
# $CUT_AFTER s later, wait for the end (or the outer timeout), check and print the result.
# Two checks, because two parties must end: the ranks (Poseidon's liveness: the trainers on the
# other hosts exit within the bound and name rank $CUT_HOST) and the launcher (mpirun exits
# non-zero within the bound; Open MPI's mpirun also waits for its daemon on the cut host).
cut_run() {
  local p=$1 cmd=$2 out="$WORK/cut.log" launch cut end rc mpid
  local trainer_name survivors_gone="" setup_done=no
  trainer_name="$(basename "$TRAINER")"
  launch=$(date +%s.%N)
  ip netns exec ${PREFIX}-n0 unshare --uts sh -c "hostname n0; $(echo $cmd)" >"$out" 2>&1 &
  mpid=$!
  sleep "$CUT_AFTER"
  if grep -q "^# cost model:" "$out"; then setup_done=yes; fi
  if ! ip -n ${PREFIX}-n$CUT_HOST link set eth0 down; then
    echo "=== FAULT RESULT: FAIL: could not take host n$CUT_HOST's link down"
    return 1
  fi
  cut=$(date +%s.%N)
  echo "=== FAULT: host n$CUT_HOST's link (eth0 in ${PREFIX}-n$CUT_HOST) down" \
       "$(awk -v a="$launch" -v b="$cut" 'BEGIN { printf "%.2f", b - a }') s after the launch" \
       "(trainer set-up done, preamble printed: $setup_done)"
  while kill -0 "$mpid" 2>/dev/null; do
    if [[ -z "$survivors_gone" && "$(survivors_alive "$p" "$trainer_name")" -eq 0 ]]; then
      survivors_gone=$(date +%s.%N)
    fi
    sleep 0.1
  done
  rc=0
  wait "$mpid" || rc=$?
  end=$(date +%s.%N)
  [[ -z "$survivors_gone" ]] && survivors_gone=$end  # gone by the time mpirun was
  cat "$out" >>"$LOG"
  cat "$out"

  local since_cut='BEGIN { printf "%.2f", b - a }' ranks_s launcher_s named=no
  local ranks=PASS launcher=PASS ranks_why="" launcher_why=""
  ranks_s=$(awk -v a="$cut" -v b="$survivors_gone" "$since_cut")
  launcher_s=$(awk -v a="$cut" -v b="$end" "$since_cut")
  within() { awk -v e="$1" -v b="$CUT_BOUND_S" 'BEGIN { exit !(e <= b) }'; }
  grep -q "lost peer rank $CUT_HOST (host n$CUT_HOST)" "$out" && named=yes
  if ! within "$ranks_s"; then
    ranks=FAIL ranks_why="the trainers on the other hosts ran on ${ranks_s} s after the cut"
  elif [[ $named == no ]]; then
    ranks=FAIL ranks_why="no survivor printed 'lost peer rank $CUT_HOST (host n$CUT_HOST)'"
  fi
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    launcher=FAIL launcher_why="mpirun was still running at the outer timeout ($TIMEOUT_S s)"
  elif [[ $rc -eq 0 ]]; then
    launcher=FAIL launcher_why="mpirun exited 0: the job did not notice the cut"
  elif ! within "$launcher_s"; then
    launcher=FAIL launcher_why="mpirun exited ${launcher_s} s after the cut"
  fi
  if [[ $ranks == FAIL && $setup_done == no ]]; then
    ranks_why="$ranks_why; the cut came before the trainer's preamble (inside MPI_Init, before"
    ranks_why="$ranks_why any communicator, so no liveness, runs yet?)"
  fi
  if [[ $ranks == PASS && $launcher == FAIL ]]; then
    launcher_why="$launcher_why: the ranks had ended, mpirun waited for its daemon on the cut"
    launcher_why="$launcher_why host (oob_tcp_keepalive_* should have let it notice)"
  fi
  echo "=== FAULT lines:"
  grep -E "lost peer|MPI_ABORT was invoked|ORTE has lost|abort is already" "$out" |
    head -n 12 | sed 's/^/    /' || true
  echo "=== FAULT bound: ${CUT_BOUND_S} s after the cut (peer timeout $CUT_PEER_TIMEOUT_S + grace" \
       "$CUT_GRACE_S + slack $CUT_SLACK_S)"
  echo "=== FAULT ranks   : $ranks: the trainers on the hosts other than n$CUT_HOST were gone" \
       "${ranks_s} s after the cut; rank $CUT_HOST (host n$CUT_HOST) named as lost: $named" \
       "${ranks_why:+($ranks_why)}"
  echo "=== FAULT launcher: $launcher: mpirun exited $rc ${launcher_s} s after the cut" \
       "${launcher_why:+($launcher_why)}"
  local verdict=PASS
  [[ $ranks == PASS && $launcher == PASS ]] || verdict=FAIL
  echo "=== FAULT RESULT: $verdict: P=$p, host n$CUT_HOST cut $CUT_AFTER s after the launch;" \
       "ranks $ranks, launcher $launcher. (Not written to RESULTS.md.)"
  [[ $verdict == PASS ]]
}

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN_FLAGS="--bind-to none --mca plm_rsh_agent $AGENT --mca plm_rsh_no_tree_spawn 1
  --mca btl tcp,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0
  --mca btl_tcp_links 2 --mca mpi_yield_when_idle 1"
if [[ -n "$CUT_HOST" ]]; then
  # mpirun learns of a silent daemon (the cut host's) only from TCP keepalive on its
  # out-of-band link: probe after 3 s idle, every 1 s, 3 misses (Linux defaults: 2 h).
  MPIRUN_FLAGS="$MPIRUN_FLAGS --mca oob_tcp_keepalive_time 3 --mca oob_tcp_keepalive_intvl 1
  --mca oob_tcp_keepalive_probes 3"
fi
: > "$LOG"
for p in $HOSTS; do
  hostlist="n0"
  for ((i = 1; i < p; i++)); do hostlist="$hostlist,n$i"; done
  export POSEIDON_COST_CACHE="$WORK/cost-P$p.txt"
  # Engine settings of the caller (POSEIDON_TIMELINE, POSEIDON_PIPELINE_NEGOTIATION, ...) reach
  # every emulated host.
  fwd=""
  for v in $(env | sed -n 's/^\(POSEIDON_[A-Z0-9_]*\)=.*/\1/p'); do fwd="$fwd -x $v"; done
  cmd="timeout -k 10 $TIMEOUT_S mpirun -np $p --host $hostlist $(echo $MPIRUN_FLAGS) $fwd
    $TRAINER --model $MODEL --scale $SCALE
    --compute-scale $COMPUTE_SCALE --gpu $GPU --iters $ITERS --warmup $WARMUP --modes $MODES
    --link-gbit $LINK_GBIT --network emulated-hosts-$RATE"
  if [[ -n "$OSU" ]]; then
    hostlist="n0:$RANKS_PER_HOST"
    for ((i = 1; i < p; i++)); do hostlist="$hostlist,n$i:$RANKS_PER_HOST"; done
    btl="--mca btl tcp,self"
    ((RANKS_PER_HOST > 1)) && btl="--mca btl tcp,self,vader"
    cmd="timeout -k 10 $TIMEOUT_S mpirun -np $((p * RANKS_PER_HOST)) --host $hostlist
      --map-by $MAP $(echo $MPIRUN_FLAGS | sed "s/--mca btl tcp,self/$btl/") $fwd
      $OSU_BIN $OSU_ARGS"
  fi
  echo "=== P=$p: $(echo $cmd)" | tee -a "$LOG"
  if [[ -n "$CUT_HOST" ]]; then
    if cut_run "$p" "$cmd"; then exit 0; else exit 1; fi
  fi
  start=$(date +%s)
  if ! ip netns exec ${PREFIX}-n0 unshare --uts sh -c "hostname n0; $(echo $cmd)" \
       2>&1 | tee -a "$LOG"; then
    die "the run at P=$p failed (see above)"
  fi
  echo "=== P=$p took $(( $(date +%s) - start )) s" | tee -a "$LOG"
done

if [[ -n "$OSU" ]]; then
  exit 0
elif [[ $WRITE_RESULTS -eq 1 ]]; then
  python3 "$HERE/report.py" --log "$LOG" --results "$RESULTS" --rate "$RATE" \
    --command "bench/cluster/emulate.sh --hosts \"$HOSTS\" --rate $RATE --model $MODEL --scale $SCALE --compute-scale $COMPUTE_SCALE --gpu $GPU --iters $ITERS"
else
  python3 "$HERE/report.py" --log "$LOG" --rate "$RATE" --command "(not written)"
fi
