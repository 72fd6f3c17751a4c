#!/usr/bin/env bash
# The whole test suite: install what is missing, build, run every test (each mpirun has a
# timeout). Extra arguments go to ctest (e.g. -R collectives, -L gpu).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -d "$root/bindings/python" && -f "$root/bindings/python/CMakeLists.txt" ]]; then
  "$root/scripts/install-deps.sh" --python
else
  "$root/scripts/install-deps.sh"
fi
"$root/scripts/build.sh"
build="${POSEIDON_BUILD_DIR:-$root/build}"
cd "$build"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --output-on-failure --timeout 600 "$@"
