#!/usr/bin/env bash
# Everything of tiermem that needs an NVIDIA GPU, in one run of at most 8 minutes, ending with one
# verdict (tools/gpu_check_judge.sh): the CUDA tests; the C-API copy and round-trip suites on the
# GPU; tiermem-probe's HBM copy rows beside a plain pinned cudaMemcpyAsync loop timed with events
# (the reference, in the same run); the PyTorch tests on CUDA (a CUDA-enabled torch and pytest
# are required: without them the run fails); python/examples/offload_bench.py; bench/optim_bench
# and python/examples/fit_bench.py when the tree has them. Every ratio meets its target or fails.
#
# usage:
#   tools/gpu_check.sh                  build with CUDA here (needs the build dependencies of
#                                       docs/building.md and the toolkit), then run the checks
#   tools/gpu_check.sh --bundle DIR     build here and pack the binaries with the shared libraries
#                                       they need into DIR, for a GPU machine without the build
#                                       dependencies; runs nothing
#   tools/gpu_check.sh --from DIR       run the checks from such a bundle
# Logs: the build's in build-gpu/ (gpu_check.configure.log, gpu_check.build.log); the run's in a
# fresh folder, copied with the whole output to $OUT/gpu_check/ when OUT is set.
# Exit status: 0 when every check ran and passed (a skip on a GPU machine fails unless it is on
# the judge's short allow-list), 1 otherwise, 2 for bad usage.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode=build
dir=""
case "${1:-}" in
  --bundle) mode=bundle; dir="${2:?--bundle needs a directory}" ;;
  --from) mode=from; dir="${2:?--from needs a directory}" ;;
  "") ;;
  *) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac

if [ -n "${OUT:-}" ] && [ -z "${GPU_CHECK_TEED:-}" ] && [ "$mode" != bundle ]; then
  mkdir -p "$OUT/gpu_check"  # the whole output as an artifact, beside the run's logs
  GPU_CHECK_TEED=1 "$0" "$@" 2>&1 | tee "$OUT/gpu_check/output.log"
  exit "${PIPESTATUS[0]}"
fi

# stream_test is not here: it runs on the emulated device, so it proves nothing about the GPU.
targets=(tiermem cuda_test mapped_arena_test copy_test round_trip_test tiermem-probe cuda_memcpy_ref python_abi_layout)
[ -f "$root/bench/optim_bench.cc" ] && targets+=(optim_bench)
start=$SECONDS
log() { printf 'gpu_check: %s\n' "$*" >&2; }

build() {
  local b="$root/build-gpu"
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  mkdir -p "$b"
  cmake -S "$root" -B "$b" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTIERMEM_WITH_CUDA=ON \
    -DTIERMEM_WERROR=ON >"$b/gpu_check.configure.log" 2>&1 ||
    { cat "$b/gpu_check.configure.log"; log "configure failed (TIERMEM_WITH_CUDA=ON needs the toolkit)"; return 1; }
  cmake --build "$b" -j"$(nproc)" --target "${targets[@]}" >"$b/gpu_check.build.log" 2>&1 ||
    { tail -40 "$b/gpu_check.build.log"; log "build failed"; return 1; }
  bin="$b"
  libdir="$b/lib"
}

case "$mode" in
  bundle)
    build || exit 1
    rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib"
    for t in cuda_test mapped_arena_test copy_test round_trip_test; do cp "$bin/tests/$t" "$dir/bin/"; done
    cp "$bin/tools/tiermem-probe" "$bin/bench/cuda_memcpy_ref" \
      "$bin/tests/python/python_abi_layout" "$dir/bin/"
    if [ -x "$bin/bench/optim_bench" ]; then cp "$bin/bench/optim_bench" "$dir/bin/"; fi
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
    for d in tests tools bench tests/python; do
      [ -x "$bin/$d/$1" ] && { echo "$bin/$d/$1"; return; }
    done
    echo "$bin/$1"  # not built: running it fails, and the judge says so
  fi
}

work="$(mktemp -d /var/tmp/tiermem-gpu-check-XXXXXX 2>/dev/null || mktemp -d)"
logs="$work/logs"
mkdir -p "$logs"
trap 'rm -rf "$work"' EXIT
# NAME CMD...: CMD's output goes to logs/NAME.log, its exit status to logs/NAME.rc.
record() {
  local name="$1"; shift
  "$@" >"$logs/$name.log" 2>&1
  echo $? >"$logs/$name.rc"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null |
  head -1 >"$logs/gpu.txt"

log "CUDA tests; copy_in/copy_out and round trips on the GPU"
record gtest.cuda_test timeout 240 "$(exe cuda_test)" --gtest_color=no
# HBM mapped in chunks (cuMemCreate/cuMemMap): the arena on the GPU, and the runtime's tests on it.
record gtest.mapped_arena_test timeout 240 "$(exe mapped_arena_test)" --gtest_color=no
record gtest.cuda_test_mapped timeout 240 env TIERMEM_HBM_LAYOUT=mapped "$(exe cuda_test)" \
  --gtest_color=no --gtest_filter='CudaRuntime.*:Cuda.RuntimeRoundTrip'
record gtest.copy_test timeout 240 env TIERMEM_TEST_DEVICE=cuda TIERMEM_NVME_PATHS="$work" \
  "$(exe copy_test)" --gtest_color=no
record gtest.round_trip_test timeout 240 env TIERMEM_TEST_DEVICE=cuda \
  "$(exe round_trip_test)" --gtest_color=no

log "probe HBM rows beside the cudaMemcpyAsync reference"
timeout 120 "$(exe cuda_memcpy_ref)" $((256 << 20)) 10 >"$logs/ref.txt" 2>&1
echo $? >"$logs/ref.rc"
timeout 180 env TIERMEM_DEVICE=cuda TIERMEM_NVME_PATHS="$work" TIERMEM_DRAM_BYTES=2GiB \
  "$(exe tiermem-probe)" --no-sweep --no-demo --bench-bytes 256MiB >"$logs/probe.txt" 2>&1
echo $? >"$logs/probe.rc"

# PyTorch: the first python3 with a CUDA-enabled torch; the judge fails the run without one.
py=python3
for cand in python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null &&
    "$cand" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    py="$cand"; break
  fi
done
"$py" -c '
try:
    import torch
    print("torch", torch.__version__)
    print("cuda", torch.cuda.is_available())
except Exception as e:
    print("error", e)
try:
    import pytest
    print("pytest", pytest.__version__)
except Exception:
    print("pytest missing")' >"$logs/python.txt" 2>&1
lib="$(ls "$libdir"/libtiermem.so.*.* 2>/dev/null | head -1)"
pyenv=(env TIERMEM_LIBRARY="$lib" PYTHONPATH="$root/python" TIERMEM_NVME_PATHS="$work"
  TIERMEM_ABI_LAYOUT="$(exe python_abi_layout)" PYTHONDONTWRITEBYTECODE=1)
[ "$mode" = build ] && pyenv+=(TIERMEM_BUILD_DIR="$bin")
if grep -q '^cuda True' "$logs/python.txt" && grep -q '^pytest [0-9]' "$logs/python.txt"; then
  log "PyTorch tests on CUDA ($py)"
  # A runtime that cannot be created on CUDA fails these tests instead of skipping them.
  record pytest.cuda timeout 200 "${pyenv[@]}" TM_TEST_REQUIRE_CUDA=1 "$py" -m pytest -v -rsxX \
    -p no:cacheprovider "$root/tests/python/test_cuda.py"
  record pytest.all timeout 240 "${pyenv[@]}" "$py" -m pytest -rsxX -p no:cacheprovider \
    --ignore="$root/tests/python/test_cuda.py" "$root/tests/python"
  log "offload_bench on CUDA"
  record offload_bench timeout 200 "${pyenv[@]}" "$py" "$root/python/examples/offload_bench.py" \
    --hidden 1024 --blocks 4 --seq 512 --batch 4 --rounds 3 --steps 3 --warmup 2 \
    --dram-bytes 4GiB --nvme-bytes 8GiB --nvme-run-dram-bytes 512MiB --nvme-dir "$work"
  if [ -f "$root/python/examples/fit_bench.py" ]; then
    log "fit_bench on CUDA"
    record fit_bench timeout 200 "${pyenv[@]}" "$py" "$root/python/examples/fit_bench.py" \
      --nvme-dir "$work"
  fi
fi
[ -f "$root/python/examples/fit_bench.py" ] ||
  echo "python/examples/fit_bench.py is not in this tree" >"$logs/fit_bench.absent"
if [ -f "$root/bench/optim_bench.cc" ]; then  # in the tree: it must run (and be bundled)
  log "optim_bench"
  record optim_bench timeout 200 env TIERMEM_NVME_PATHS="$work" "$(exe optim_bench)"
else
  echo "bench/optim_bench.cc is not in this tree" >"$logs/optim_bench.absent"
fi

echo $((SECONDS - start)) >"$logs/elapsed"
for f in "$logs"/*.log "$logs"/*.txt; do
  [ -f "$f" ] && { echo "---- ${f##*/}"; tail -60 "$f"; } >&2
done
echo
"$root/tools/gpu_check_judge.sh" "$logs" | tee "$logs/summary.txt"
failed=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ]; then  # the run's logs as an artifact
  mkdir -p "$OUT/gpu_check" && cp -a "$logs"/. "$OUT/gpu_check/"
  if [ "$mode" = build ]; then cp "$bin"/gpu_check.*.log "$OUT/gpu_check/" 2>/dev/null; fi
fi
exit "$failed"
