#!/usr/bin/env bash
# install_test.sh <build dir> <external project dir> <cmake> <mpiexec> <c compiler>
# Installs Poseidon's C API component into a temporary prefix, then builds the external
# consumer against it twice (CMake find_package, then pkg-config) and runs each under mpirun.
set -euo pipefail
build="$1" external="$2" cmake="$3" mpiexec="$4" cc="$5"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/psd-install.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
read -r -a mpirun_flags <<< "${POSEIDON_MPIRUN_FLAGS//;/ }"

echo "== install into $prefix"
"$cmake" --install "$build" --prefix "$prefix" --component Poseidon
for f in include/poseidon.h lib/libposeidon.so lib/cmake/Poseidon/PoseidonConfig.cmake \
         lib/cmake/Poseidon/PoseidonConfigVersion.cmake lib/cmake/Poseidon/PoseidonTargets.cmake \
         lib/pkgconfig/poseidon.pc; do
  [[ -e "$prefix/$f" ]] || { echo "missing installed file: $f" >&2; exit 1; }
done

echo "== find_package(Poseidon)"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
"$cmake" -S "$external" -B "$tmp/cmake-build" "${gen[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_RPATH="$prefix/lib" >/dev/null
"$cmake" --build "$tmp/cmake-build"
"$mpiexec" -n 2 "${mpirun_flags[@]}" "$tmp/cmake-build/consumer"

echo "== pkg-config poseidon"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
flags="$(pkg-config --cflags --libs poseidon)"
echo "pkg-config: $flags"
# shellcheck disable=SC2086
"$cc" -std=c99 -Wall -Werror "$external/consumer.c" -o "$tmp/consumer-pc" $flags \
  -Wl,-rpath,"$prefix/lib"
"$mpiexec" -n 2 "${mpirun_flags[@]}" "$tmp/consumer-pc"
echo "install_test: both consumers passed"
