#!/usr/bin/env bash
# The main job: install what is missing, build, and train the example MLP with 4 ranks.
#   scripts/run-main.sh [trainer flags...]      (NP=<ranks> to change the rank count)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
build="${POSEIDON_BUILD_DIR:-$root/build}"
exec timeout -k 10 "${POSEIDON_MAIN_TIMEOUT:-900}" "$root/scripts/mpirun.sh" -np "${NP:-4}" \
  "$build/examples/poseidon_mlp" "$@"
