#!/usr/bin/env bash
# The two commands of the README.
#   tools/build.sh demo   install what is missing, build, run tiermem-probe (probe + offload demo)
#   tools/build.sh test   install what is missing, build with -Werror, run every test, then again
#                         under ASan+UBSan, then under TSan; then compile lib/ and io/ with clang's
#                         -Wthread-safety, fuzz each target for FUZZ_SECONDS, check the format;
#                         then build the wheel and check it from a clean venv (tools/wheel/check.sh)
#   tools/build.sh wheel  install what is missing, build the manylinux wheel into dist/
#                         (pip + scikit-build-core, then auditwheel repair; docs/building.md)
# Environment: BUILD_DIR (default build), JOBS (default: all cores), TIERMEM_WITH_CUDA (AUTO),
#   FUZZ_SECONDS (per fuzz target, default 30; 0 skips the fuzz run),
#   FORMAT_CHECK (1, the default: tools/scripts/format.sh --check is a step of test; 0 skips
#   it), TIERMEM_VENV (default .venv in the checkout: the Python environment made from
#   python/requirements.txt, torch 2.x; TIERMEM_VENV=none leaves Python out),
#   WHEEL_BUILD_DIR (default build-wheel: the wheel's build environment and CMake build),
#   WHEEL_DIST (default dist: where the wheel goes), WHEEL_CHECK (1, the default: the wheel stage
#   is a step of test; 0 skips it).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=${1:-demo}
build=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}
cuda=${TIERMEM_WITH_CUDA:-AUTO}
fuzz_seconds=${FUZZ_SECONDS:-30}
format_check=${FORMAT_CHECK:-1}

packages=(cmake ninja-build g++ pkg-config binutils liburing-dev libhwloc-dev libabsl-dev
          libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev fio
          python3 python3-venv)
# Only test needs these: clang for the thread-safety check and libFuzzer, the formatter.
test_packages=(clang-14 libclang-rt-14-dev libfuzzer-14-dev clang-format-14)

install_missing() {
  local missing=()
  for p in "$@"; do
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

# Each step's header says how long the run has taken so far: CI's budget is watched step by step.
stage() { echo "== $* (at ${SECONDS} s)"; }

# The Python side runs in a virtual environment inside the checkout (ignored by git), made from
# the one pinned requirements file: torch 2.x from PyPI, numpy, pytest, transformers. It is made
# again only when that file changes (its hash is kept in the environment).
venv=${TIERMEM_VENV:-$root/.venv}
python_env() {
  [ "$venv" = none ] && return 0
  local req="$root/python/requirements.txt" stamp="$venv/.tiermem-requirements"
  local want
  want=$(sha256sum "$req" | cut -d' ' -f1)
  if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  stage "python environment $venv (python/requirements.txt)"
  local base=/usr/bin/python3
  [ -x "$base" ] || base=$(command -v python3)
  "$base" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
  echo "$want" >"$stamp"
}
python_args() {
  if [ "$venv" = none ]; then echo "-DTIERMEM_PYTHON="; else echo "-DTIERMEM_PYTHON=$venv/bin/python"; fi
}

configure_and_build() {  # dir, extra cmake args...
  local dir=$1
  shift
  stage "build $(basename "$dir")"
  cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTIERMEM_WERROR=ON \
    -DTIERMEM_WITH_CUDA="$cuda" "$(python_args)" "$@"
  cmake --build "$dir" -j "$jobs"
}

run_tests() {  # dir, label
  stage "ctest ($2)"
  ctest --test-dir "$1" --output-on-failure -j "$jobs" --timeout 600
}

# lib/ and io/ compiled by clang with -Wthread-safety as an error: every ABSL_GUARDED_BY and
# lock annotation is checked. Compile only; nothing runs.
thread_safety_check() {
  stage "clang -Wthread-safety (lib/, io/)"
  cmake -S "$root" -B "$build-thread-safety" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DTIERMEM_THREAD_SAFETY=ON \
    -DTIERMEM_WERROR=ON -DTIERMEM_BUILD_TESTS=OFF -DTIERMEM_BUILD_BENCH=OFF \
    -DTIERMEM_WITH_CUDA="$cuda" >/dev/null
  cmake --build "$build-thread-safety" -j "$jobs" --target tiermem_io tiermem_core tiermem
}

# The test builds keep line tables only (-g1): a failure's or a report's stack still names file
# and line, and each build compiles about a fifth faster than with full debug information
# (pressure_test.cc: 16.2 -> 12.7 s). (The demo configures build/ with CMake's defaults, so a
# build/ configured by a test run keeps -g1 until the cache is cleared.) The sanitized builds
# optimize at -O1, as the sanitizers' documentation allows: their test files compile in a
# sixth to a third less time (ASan config_test 28.6 -> 18.5 s, TSan pressure_test 12.5 -> 10.0 s)
# and their slowest tests run no slower (ASan stress_test 31.8 -> 31.5 s; TSan errors_test,
# inclusive_client_test, Pressure.NoDemand* within each other's spread, two runs each).
line_tables=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
             -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG")
sanitized_flags=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
                 -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG")
# The three test builds compile lib/ and io/ as unity sources (TIERMEM_UNITY_BUILD): their files
# share heavy headers (Abseil, the runtime's), which a unity source parses once for up to eight
# files. Building libtiermem took 122 s of CPU instead of 251 s. The thread-safety check still
# compiles every file alone, so a file that leans on an include of its unity neighbour fails
# there.
unity=(-DTIERMEM_UNITY_BUILD=ON)
# The release test build compiles the test programs at -O1 (TIERMEM_TEST_OPTIMIZE), the library at
# -O2: GoogleTest files compile in about 30% less time.
test_optimize=(-DTIERMEM_TEST_OPTIMIZE=-O1)
# The three test builds compile the test programs with one shared precompiled header
# (TIERMEM_TEST_PCH: GoogleTest, Abseil's status, the common standard headers). The release
# build's test programs took 168 s of user CPU instead of 236 s.
pch=(-DTIERMEM_TEST_PCH=ON)

# The wheel: built by pip through scikit-build-core (pyproject.toml) in a build environment of its
# own (tools/wheel/requirements.txt, pinned; made again when that file changes), then repaired by
# auditwheel into a manylinux wheel in dist/: the shared libraries it needs beyond the manylinux
# policy's (liburing, hwloc, Abseil, xxHash) copied into tiermem.libs/, the platform tag from the
# newest glibc symbol used. `build.sh wheel` requires the CUDA backend (TIERMEM_WITH_CUDA=ON
# unless set): one wheel serves machines with and without a GPU. The test stage builds it as the
# suite's builds are (AUTO unless set), so that a machine without the toolkit still runs it.
wheel_dir=${WHEEL_BUILD_DIR:-$root/build-wheel}
dist=${WHEEL_DIST:-$root/dist}
build_wheel() {  # TIERMEM_WITH_CUDA for the wheel
  stage "wheel (TIERMEM_WITH_CUDA=$1)"
  local env="$wheel_dir/venv" req="$root/tools/wheel/requirements.txt" want
  want=$(sha256sum "$req" | cut -d' ' -f1)
  if ! [ -x "$env/bin/python" ] || [ "$(cat "$env/.tiermem-requirements" 2>/dev/null)" != "$want" ]; then
    /usr/bin/python3 -m venv --clear "$env"
    "$env/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
    echo "$want" >"$env/.tiermem-requirements"
  fi
  rm -rf "$wheel_dir/raw"
  CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$env/bin/python" -m pip wheel -q --disable-pip-version-check \
    --no-deps --no-build-isolation --config-settings=build-dir="$wheel_dir/cmake" \
    --config-settings=cmake.define.TIERMEM_WITH_CUDA="$1" -w "$wheel_dir/raw" "$root"
  mkdir -p "$dist"
  rm -f "$dist"/tiermem-*.whl
  PATH="$env/bin:$PATH" auditwheel repair -w "$dist" "$wheel_dir"/raw/tiermem-*.whl
  PATH="$env/bin:$PATH" auditwheel show "$dist"/tiermem-*.whl
  ls -l "$dist"/tiermem-*.whl
}

case "$mode" in
  demo | wheel) install_missing "${packages[@]}" ;;
  test) install_missing "${packages[@]}" "${test_packages[@]}" ;;
esac
case "$mode" in
  demo | test) python_env ;;
esac
case "$mode" in
  demo)
    configure_and_build "$build"
    echo "== tiermem-probe"
    "$build/tools/tiermem-probe"
    ;;
  test)
    configure_and_build "$build" "${line_tables[@]}" "${unity[@]}" "${test_optimize[@]}" "${pch[@]}"
    run_tests "$build" "release, -Werror"
    configure_and_build "$build-asan" -DTIERMEM_SANITIZE=ON -DTIERMEM_BUILD_BENCH=OFF "${sanitized_flags[@]}" \
      "${unity[@]}" "${pch[@]}"
    # A sanitizer report fails the test that triggered it.
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      run_tests "$build-asan" "ASan+UBSan"
    configure_and_build "$build-tsan" -DTIERMEM_TSAN=ON -DTIERMEM_BUILD_BENCH=OFF "${sanitized_flags[@]}" \
      "${unity[@]}" "${pch[@]}"
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 run_tests "$build-tsan" "TSan"
    thread_safety_check
    if [ "$fuzz_seconds" != 0 ]; then
      stage "fuzz (${fuzz_seconds} s per target)"
      FUZZ_BUILD_DIR="$build-fuzz" JOBS="$jobs" bash "$root/tools/scripts/fuzz.sh" "$fuzz_seconds"
    fi
    if [ "$format_check" != 0 ]; then
      stage "format"
      bash "$root/tools/scripts/format.sh" --check
    fi
    if [ "${WHEEL_CHECK:-1}" != 0 ]; then
      build_wheel "$cuda"
      stage "wheel check (a clean venv outside the checkout)"
      bash "$root/tools/wheel/check.sh" "$dist"/tiermem-*.whl
    fi
    stage "test: done"
    ;;
  wheel)
    build_wheel "${TIERMEM_WITH_CUDA:-ON}"
    ;;
  *)
    echo "usage: tools/build.sh demo|test|wheel" >&2
    exit 2
    ;;
esac
