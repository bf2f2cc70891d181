#!/usr/bin/env bash
# Bounded fuzzing: builds the fuzz targets with clang, libFuzzer, ASan and UBSan, then runs each
# for a fixed time starting from its checked-in corpus. Any crash, leak, sanitizer report or
# mismatch fails the script; the input that caused it is kept under $FUZZ_BUILD_DIR/artifacts.
#   tools/scripts/fuzz.sh [SECONDS] [TARGET...]   (default 60 s each; targets: api_fuzz config_fuzz)
# Environment: FUZZ_BUILD_DIR (default build-fuzz), FUZZ_CORPUS_OUT (keep the grown corpus in
# this directory instead of a temporary one), JOBS, and the targets' own variables
# (API_FUZZ_DIR, API_FUZZ_SKIP_OPEN: see tests/fuzz/api_fuzz.cc).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(api_fuzz config_fuzz)
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
jobs=${JOBS:-$(nproc)}

for tool in clang-14 clang++-14; do
  command -v "$tool" >/dev/null || { echo "fuzz.sh: $tool missing: apt-get install clang-14 libfuzzer-14-dev" >&2; exit 1; }
done

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DTIERMEM_FUZZ=ON \
  -DTIERMEM_BUILD_BENCH=OFF -DTIERMEM_WITH_CUDA=OFF -DTIERMEM_UNITY_BUILD=ON >/dev/null
cmake --build "$build" -j "$jobs" --target "${targets[@]}"

failed=()
for t in "${targets[@]}"; do
  seeds=$root/tests/fuzz/corpus/$t
  corpus=${FUZZ_CORPUS_OUT:+$FUZZ_CORPUS_OUT/$t}
  tmp=""
  if [ -z "$corpus" ]; then
    tmp=$(mktemp -d /tmp/tiermem-fuzz-XXXXXX)
    corpus=$tmp
  fi
  mkdir -p "$corpus" "$build/artifacts/$t"
  echo "== $t: ${seconds} s from $(find "$seeds" -type f | wc -l) seeds"
  # -timeout: one input running 30 s is a hang; -rss_limit_mb: a runaway allocation is a finding.
  # Only new coverage is logged (-reduce_inputs keeps the corpus small); the last lines say why
  # a run failed.
  if ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1} \
     UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
     "$build/tests/fuzz/$t" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 \
       -max_len=4096 -print_final_stats=1 -artifact_prefix="$build/artifacts/$t/" \
       "$corpus" "$seeds" >"$build/artifacts/$t.log" 2>&1; then
    grep -E "^(Done|stat::number_of_executed_units|stat::peak_rss_mb)" "$build/artifacts/$t.log" || true
  else
    echo "== $t FAILED; its log: $build/artifacts/$t.log" >&2
    grep -v -E "^#[0-9]+|NEW_FUNC|^INFO" "$build/artifacts/$t.log" | tail -60 >&2
    failed+=("$t")
  fi
  [ -n "$tmp" ] && rm -rf "$tmp"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: findings in ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: ${targets[*]}: ${seconds} s each, no finding"
