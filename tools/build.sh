#!/usr/bin/env bash
# The two commands of the README.
#   tools/build.sh demo   install what is missing, build, run tiermem-probe (probe + offload demo)
#   tools/build.sh test   install what is missing, build with -Werror, run every test, then again
#                         under ASan+UBSan, then under TSan
# Environment: BUILD_DIR (default build), JOBS (default: all cores), TIERMEM_WITH_CUDA (AUTO).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=${1:-demo}
build=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}
cuda=${TIERMEM_WITH_CUDA:-AUTO}

packages=(cmake ninja-build g++ pkg-config binutils liburing-dev libhwloc-dev libabsl-dev
          libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev fio)

install_missing() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "== installing: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    sudo=sudo
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

configure_and_build() {  # dir, extra cmake args...
  local dir=$1
  shift
  cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTIERMEM_WERROR=ON \
    -DTIERMEM_WITH_CUDA="$cuda" "$@"
  cmake --build "$dir" -j "$jobs"
}

run_tests() {  # dir, label
  echo "== ctest ($2)"
  ctest --test-dir "$1" --output-on-failure -j "$jobs" --timeout 600
}

install_missing
case "$mode" in
  demo)
    configure_and_build "$build"
    echo "== tiermem-probe"
    "$build/tools/tiermem-probe"
    ;;
  test)
    configure_and_build "$build"
    run_tests "$build" "release, -Werror"
    configure_and_build "$build-asan" -DTIERMEM_SANITIZE=ON -DTIERMEM_BUILD_BENCH=OFF
    # A sanitizer report fails the test that triggered it.
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      run_tests "$build-asan" "ASan+UBSan"
    configure_and_build "$build-tsan" -DTIERMEM_TSAN=ON -DTIERMEM_BUILD_BENCH=OFF
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 run_tests "$build-tsan" "TSan"
    ;;
  *)
    echo "usage: tools/build.sh demo|test" >&2
    exit 2
    ;;
esac
