#!/usr/bin/env bash
# Installs the Debian packages Poseidon needs, only those missing. Safe to run again.
# Works as root or as a user with sudo (sudo is used only when a package must be installed).
#   scripts/install-deps.sh [--python]    --python adds what the Python bindings need
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config openmpi-bin libopenmpi-dev
          libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev python3)
if [[ "${1:-}" == "--python" ]]; then
  packages+=(python3-dev python3-numpy python3-mpi4py pybind11-dev python3-torch python3-pip python3-venv)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
