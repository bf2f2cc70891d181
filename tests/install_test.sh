#!/usr/bin/env bash
# Installs the built tree into a temporary prefix, then builds two outside consumers against it:
# one with find_package(tiermem), one with pkg-config. Both must run. The library must not link
# the CUDA runtime.
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /var/tmp/tiermem-install-XXXXXX)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -f "$work/prefix/include/tiermem/tiermem.h"
libdir=$(ls -d "$work"/prefix/lib*/ | head -n 1)
test -f "$libdir/cmake/tiermem/tiermemConfig.cmake"
test -f "$libdir/pkgconfig/tiermem.pc"
# The CUDA runtime is loaded at run time (io/cudart.h), never linked: the installed library must
# load where CUDA is absent.
if readelf -d "$libdir/libtiermem.so" | grep -q 'NEEDED.*libcudart'; then
  echo "install_test: the installed libtiermem.so links libcudart (NEEDED):" >&2
  readelf -d "$libdir/libtiermem.so" | grep NEEDED >&2
  exit 1
fi

flags=${CONSUMER_FLAGS:-}
# Ninja, as the main build: a minimal machine has no make.
cmake -S "$src/consumer" -B "$work/cmake-build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >/dev/null
cmake --build "$work/cmake-build" >/dev/null
"$work/cmake-build/consumer" "$work"

export PKG_CONFIG_PATH="$libdir/pkgconfig"
# shellcheck disable=SC2046,SC2086
cc $flags -std=c11 -Wall -Werror -o "$work/pc-consumer" "$src/consumer/main.c" $(pkg-config --cflags --libs tiermem) \
  -Wl,-rpath,"$libdir"
"$work/pc-consumer" "$work"
echo "install_test: find_package and pkg-config consumers both work"
