#!/usr/bin/env bash
# Everything of tiermem that needs an NVIDIA GPU, in one run of at most 8 minutes, ending with one
# summary: the CUDA tests; the C-API copy and round-trip suites on the GPU; tiermem-probe's HBM
# copy rows beside a plain pinned cudaMemcpyAsync loop timed with events (the reference, in the
# same run); the PyTorch tests on CUDA when a CUDA-enabled torch is there.
#
# usage:
#   tools/gpu_check.sh                  build with CUDA here (needs the build dependencies of
#                                       docs/building.md and the toolkit), then run the checks
#   tools/gpu_check.sh --bundle DIR     build here and pack the binaries with the shared libraries
#                                       they need into DIR, for a GPU machine without the build
#                                       dependencies; runs nothing
#   tools/gpu_check.sh --from DIR       run the checks from such a bundle
# Exit status: 0 when every check passed (skips on a GPU machine count as failures), 1 otherwise,
# 2 for bad usage.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode=build
dir=""
case "${1:-}" in
  --bundle) mode=bundle; dir="${2:?--bundle needs a directory}" ;;
  --from) mode=from; dir="${2:?--from needs a directory}" ;;
  "") ;;
  *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac

targets=(tiermem cuda_test copy_test round_trip_test stream_test tiermem-probe cuda_memcpy_ref)
start=$SECONDS
log() { printf 'gpu_check: %s\n' "$*" >&2; }

build() {
  local b="$root/build-gpu"
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S "$root" -B "$b" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTIERMEM_WITH_CUDA=ON \
    -DTIERMEM_WERROR=ON >"$b.configure.log" 2>&1 ||
    { cat "$b.configure.log"; log "configure failed (TIERMEM_WITH_CUDA=ON needs the toolkit)"; return 1; }
  cmake --build "$b" -j"$(nproc)" --target "${targets[@]}" >"$b.build.log" 2>&1 ||
    { tail -40 "$b.build.log"; log "build failed"; return 1; }
  bin="$b"
  libdir="$b/lib"
}

case "$mode" in
  bundle)
    build || exit 1
    rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib"
    for t in cuda_test copy_test round_trip_test stream_test; do cp "$bin/tests/$t" "$dir/bin/"; done
    cp "$bin/tools/tiermem-probe" "$bin/bench/cuda_memcpy_ref" "$dir/bin/"
    cp -a "$libdir"/libtiermem.so* "$dir/lib/"
    # Every shared library they need except the C and C++ runtimes and the driver, which the GPU
    # machine has (newer ones run what was built against older).
    for f in "$dir"/bin/* "$dir"/lib/libtiermem.so.*.*; do
      ldd "$f" | awk '/=> \//{print $3}'
    done | sort -u | grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*|libcuda)\.so' |
      while read -r l; do cp -L "$l" "$dir/lib/"; done
    strip --strip-unneeded "$dir"/bin/* "$dir"/lib/* 2>/dev/null
    du -sh "$dir"
    exit 0
    ;;
  from)
    bin="$(cd "$dir" && pwd)"
    libdir="$bin/lib"
    export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    ;;
  build)
    log "building with CUDA in build-gpu"
    build || exit 1
    ;;
esac

exe() {  # path of a binary in a build tree or a bundle
  if [ "$mode" = from ]; then echo "$bin/bin/$1"; else
    for d in tests tools bench; do [ -x "$bin/$d/$1" ] && { echo "$bin/$d/$1"; return; }; done
  fi
}

summary=()
failed=0
note() { summary+=("$1"); }
fail() { summary+=("FAIL  $1"); failed=1; }

# The GPU.
gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
[ -n "$gpu" ] || gpu="(nvidia-smi gave nothing)"
note "gpu   $gpu"

work="$(mktemp -d /var/tmp/tiermem-gpu-check-XXXXXX 2>/dev/null || mktemp -d)"
trap 'rm -rf "$work"' EXIT

# A gtest binary: passed / skipped / failed counts; skips count as failures here (a GPU is there).
gtest() {
  local name="$1"; shift
  local out="$work/$name.log"
  timeout 240 env "$@" "$(exe "$name")" --gtest_color=no >"$out" 2>&1
  local rc=$?
  local passed skipped failures
  # One line per test as it ends: "[  SKIPPED ] Suite.Test (12 ms)".
  passed=$(grep -cE '^\[       OK \] .* \([0-9]+ ms\)$' "$out")
  skipped=$(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$out")
  failures=$(grep -cE '^\[  FAILED  \] .* \([0-9]+ ms\)$' "$out")
  # A skip is a failure on a GPU machine, unless it needs more than one GPU.
  local multi
  multi=$(grep -c 'needs two GPUs' "$out" || true)
  grep -E '^\[  (FAILED|SKIPPED) \] .* ms\)$|Failure|Expected|Which is|Value of|Actual|error|Skipped' "$out" |
    head -60 >&2
  local line="$name${*:+ ($*)}: $passed passed, $skipped skipped, $failures failed (exit $rc)"
  if [ $rc -ne 0 ] || [ "$passed" -eq 0 ] || [ "$skipped" -gt "$multi" ]; then
    fail "$line"
  else
    note "ok    $line"
  fi
}

log "CUDA tests"
gtest cuda_test
log "copy_in/copy_out and round trips on the GPU"
gtest copy_test TIERMEM_TEST_DEVICE=cuda TIERMEM_NVME_PATHS="$work"
gtest round_trip_test TIERMEM_TEST_DEVICE=cuda
gtest stream_test

log "probe HBM rows beside the cudaMemcpyAsync reference"
ref="$work/ref.txt"
probe="$work/probe.txt"
timeout 120 "$(exe cuda_memcpy_ref)" $((256 << 20)) 10 >"$ref" 2>&1 || fail "cuda_memcpy_ref: $(tail -1 "$ref")"
timeout 180 env TIERMEM_DEVICE=cuda TIERMEM_NVME_PATHS="$work" TIERMEM_DRAM_BYTES=2GiB \
  "$(exe tiermem-probe)" --no-sweep --no-demo --bench-bytes 256MiB >"$probe" 2>&1 ||
  fail "tiermem-probe: $(tail -3 "$probe" | tr '\n' ' ')"
cat "$ref" "$probe" >&2
gbps() { awk -v pat="$2" '$0 ~ pat { for (i = 1; i <= NF; ++i) if ($(i+1) == "GB/s") { print $i; exit } }' "$1"; }
ref_h2d=$(gbps "$ref" 'dram -> hbm')
ref_d2h=$(gbps "$ref" 'hbm  -> dram')
p_h2d=$(gbps "$probe" '^copy +dram -> hbm +pinned')
p_d2h=$(gbps "$probe" '^copy +hbm +-> dram pinned')
r_h2d=$(gbps "$probe" '^runtime +dram -> hbm')
r_d2h=$(gbps "$probe" '^runtime +hbm +-> dram')
ratio() { awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "n/a" }'; }
note "$(printf 'copy  dram->hbm pinned: reference %s GB/s, probe %s (%s), runtime acquire %s (%s)' \
  "${ref_h2d:-?}" "${p_h2d:-?}" "$(ratio "$p_h2d" "$ref_h2d")" "${r_h2d:-?}" "$(ratio "$r_h2d" "$ref_h2d")")"
note "$(printf 'copy  hbm->dram pinned: reference %s GB/s, probe %s (%s), runtime offload %s (%s)' \
  "${ref_d2h:-?}" "${p_d2h:-?}" "$(ratio "$p_d2h" "$ref_d2h")" "${r_d2h:-?}" "$(ratio "$r_d2h" "$ref_d2h")")"
grep -q '^device *cuda' "$probe" || fail "tiermem-probe did not use the GPU: $(grep -m1 '^device' "$probe")"

# PyTorch on CUDA, when the package and a CUDA-enabled torch are there.
py=""
for cand in python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null &&
    "$cand" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    py="$cand"; break
  fi
done
if [ -z "$py" ]; then
  note "skip  PyTorch tests: no python3 with a CUDA-enabled torch"
elif [ ! -d "$root/tests/python" ]; then
  note "skip  PyTorch tests: tests/python is not in this tree"
elif ! "$py" -c 'import pytest' 2>/dev/null; then
  note "skip  PyTorch tests: pytest is missing"
else
  log "PyTorch tests on CUDA ($py)"
  lib="$(ls "$libdir"/libtiermem.so.*.* 2>/dev/null | head -1)"
  pylog="$work/pytest.log"
  timeout 240 env TIERMEM_LIBRARY="$lib" PYTHONPATH="$root/python" TIERMEM_NVME_PATHS="$work" \
    "$py" -m pytest -q -p no:cacheprovider "$root/tests/python" >"$pylog" 2>&1
  rc=$?
  tail -25 "$pylog" >&2
  line="PyTorch tests ($("$py" -c 'import torch; print(torch.__version__)')): $(tail -1 "$pylog")"
  if [ $rc -eq 0 ]; then note "ok    $line"; else fail "$line"; fi
  # Activation offload against torch.autograd.graph.save_on_cpu on the GPU, interleaved.
  log "offload_bench on CUDA"
  blog="$work/offload_bench.log"
  timeout 150 env TIERMEM_LIBRARY="$lib" PYTHONPATH="$root/python" "$py" \
    "$root/python/examples/offload_bench.py" --hidden 1024 --blocks 4 --seq 512 --batch 4 \
    --steps 8 --warmup 2 --dram-bytes 4GiB --nvme-bytes 16GiB --nvme-run-dram-bytes 512MiB \
    --nvme-dir "$work" >"$blog" 2>&1
  rc=$?
  cat "$blog" >&2
  if [ $rc -eq 0 ]; then
    note "bench $(grep -m1 '^GPT' "$blog" | cut -c1-90)"
    while read -r l; do note "bench   $l"; done < <(grep -E '^ +(plain|save_on_cpu|tiermem)' "$blog")
  else
    fail "offload_bench (exit $rc): $(tail -1 "$blog")"
  fi
fi

elapsed=$((SECONDS - start))
[ $elapsed -le 480 ] || fail "took ${elapsed}s, over the 8 minutes allowed"
echo
echo "==== tiermem gpu_check summary ($(date -u +%FT%TZ), ${elapsed}s) ===="
printf '%s\n' "${summary[@]}"
if [ $failed -eq 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
exit $failed
