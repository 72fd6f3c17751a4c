#!/usr/bin/env bash
# Configures and builds Poseidon into ${POSEIDON_BUILD_DIR:-build}. Safe to run again.
# Extra arguments go to cmake's configure step (e.g. -DPOSEIDON_WITH_CUDA=OFF).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${POSEIDON_BUILD_DIR:-$root/build}"
gen=()
command -v ninja >/dev/null && [[ ! -f "$build/Makefile" ]] && gen=(-G Ninja)
cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build" -j "$(nproc)"
