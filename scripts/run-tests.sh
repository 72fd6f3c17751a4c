#!/usr/bin/env bash
# The whole test suite: install what is missing, build, run every test (each mpirun has a
# timeout), then the engine's and liveness monitor's multi-rank tests again under
# ThreadSanitizer in a second build.
#   scripts/run-tests.sh [ctest args...]    e.g. -R collectives, -L gpu
#   POSEIDON_TSAN=0 scripts/run-tests.sh    skips the ThreadSanitizer pass
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -f "$root/bindings/python/CMakeLists.txt" ]]; then
  "$root/scripts/install-deps.sh" --python
else
  "$root/scripts/install-deps.sh"
fi
"$root/scripts/build.sh"
build="${POSEIDON_BUILD_DIR:-$root/build}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
(cd "$build" && ctest --output-on-failure --timeout 600 "$@")

if [[ "${POSEIDON_TSAN:-1}" != "0" && $# -eq 0 ]]; then
  echo "== ThreadSanitizer: the engine under mpirun"
  tsan="${build}-tsan"
  gen=()
  command -v ninja >/dev/null && [[ ! -f "$tsan/Makefile" ]] && gen=(-G Ninja)
  cmake -S "$root" -B "$tsan" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPOSEIDON_SANITIZE=thread -DPOSEIDON_WITH_CUDA=OFF -DPOSEIDON_BUILD_PYTHON=OFF \
    -DPOSEIDON_BUILD_BENCH=OFF -DPOSEIDON_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$tsan" -j "$(nproc)" --target engine_test liveness_test
  (cd "$tsan" && ctest --output-on-failure --timeout 600 -R '^(engine_test|liveness_test)_np')
fi
