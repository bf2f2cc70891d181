#!/usr/bin/env bash
# Everything of tiermem that needs an NVIDIA GPU, in one run of at most 8 minutes, ending with one
# verdict (tools/gpu_check_judge.sh): the CUDA tests; the C-API copy and round-trip suites on the
# GPU; tiermem-probe's HBM copy rows beside a plain pinned cudaMemcpyAsync loop timed with events
# (the reference, in the same run); the PyTorch tests on CUDA (a CUDA-enabled torch and pytest
# are required: without them the run fails); bench/offload_bench.py; bench/optim_bench and
# bench/fit_bench.py when the tree has them; the GPU peer benches,
# bench/peers/activation_offload.py (tiermem against torchtune's OffloadActivations) and
# bench/peers/gpu_optimizer.py (CPUAdam against torchao's CPUOffloadOptimizer and DeepSpeed's
# CPU Adam) and bench/peers/fsdp_offload.py (FSDP2 with FSDPCPUAdam against CPUOffloadPolicy). Every ratio meets its target or fails. The probe and its reference run in three
# rounds, in alternating order.
#
# usage:
#   tools/gpu_check.sh                  build with CUDA here (needs the build dependencies of
#                                       docs/building.md and the toolkit), then run the checks
#   tools/gpu_check.sh --bundle DIR     build here and pack the binaries with the shared libraries
#                                       they need into DIR, for a GPU machine without the build
#                                       dependencies, and the peers' Python packages from the
#                                       checkout's .venv (DIR/peers.tar.xz); runs nothing
#   tools/gpu_check.sh --from DIR       run the checks from such a bundle
# Logs: the build's in build-gpu/ (gpu_check.configure.log, gpu_check.build.log); the run's in a
# fresh folder, packed (logs.tar.gz) beside the whole output and the verdict in $OUT/gpu_check/
# when OUT is set.
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
  *) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
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

# The peer benches' packages (bench/peers/requirements.txt, installed in the checkout's .venv by
# bench/peers/run.sh) for a Python that has torch and the GPU machine's image (numpy, psutil,
# packaging, msgpack, einops, setuptools...) but not these: their pure-Python trees without
# caches (torchao without its compiled extensions, which CPUOffloadOptimizer does not use), their
# metadata (torchao reads its version from it), pydantic_core's compiled module for the .venv's
# Python and for the GPU machine's Python 3.12 (one wheel, fetched once into
# build-gpu/wheels), and the ninja binary that DeepSpeed's JIT build of its CPU Adam runs.
peer_pythons=3.12
stage_peers() {
  local dest="$1" venv_py="$root/.venv/bin/python"
  [ -x "$venv_py" ] || { log "peers: no .venv (tools/build.sh makes it, bench/peers/run.sh adds the peers)"; return 1; }
  rm -rf "$dest" && mkdir -p "$dest/bin" "$root/build-gpu/wheels" || return 1
  "$venv_py" - "$dest" "$root/build-gpu/wheels" "$peer_pythons" <<'EOF' || return 1
import glob, importlib.metadata as md, os, shutil, subprocess, sys, zipfile
dest, wheels, pythons = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
dists = {"torchtune": "torchtune", "torchao": "torchao", "torchdata": "torchdata",
         "deepspeed": "deepspeed", "hjson": "hjson", "pydantic": "pydantic",
         "pydantic-core": "pydantic_core", "annotated-types": "annotated_types",
         "typing-inspection": "typing_inspection", "py-cpuinfo": "cpuinfo",
         # pydantic needs typing_extensions >= 4.16, newer than the image may have: a newer
         # one serves torch as well.
         "typing-extensions": "typing_extensions.py"}
def ignore(d, names):
    return [n for n in names if n == "__pycache__" or n.endswith(".pyc") or
            (os.path.basename(d) == "torchao" and n.startswith("_C") and n.endswith(".so"))]
for dist, pkg in dists.items():
    try:
        d = md.distribution(dist)
    except md.PackageNotFoundError:
        sys.exit("peers: %s is not in the .venv (bash bench/peers/run.sh installs "
                 "bench/peers/requirements.txt)" % dist)
    site = str(d.locate_file(""))
    if pkg.endswith(".py"):
        shutil.copy2(os.path.join(site, pkg), os.path.join(dest, pkg))
    else:
        shutil.copytree(os.path.join(site, pkg), os.path.join(dest, pkg), ignore=ignore)
    meta = str(getattr(d, "_path", ""))
    if os.path.isdir(meta):
        shutil.copytree(meta, os.path.join(dest, os.path.basename(meta)), ignore=ignore)
v = md.version("pydantic-core")
for py in pythons:
    tag = "cp" + py.replace(".", "")
    pattern = os.path.join(wheels, "pydantic_core-%s-%s-*.whl" % (v, tag))
    if not glob.glob(pattern):
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "--python-version", py, "--implementation", "cp",
                        "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
                        "-d", wheels, "pydantic_core==%s" % v], check=False)
    found = glob.glob(pattern)
    if not found:
        sys.exit("peers: no pydantic_core %s wheel for Python %s in %s (pip download failed)" %
                 (v, py, wheels))
    with zipfile.ZipFile(found[0]) as z:
        for name in z.namelist():
            if name.startswith("pydantic_core/") and name.endswith(".so"):
                z.extract(name, dest)
EOF
  cp "$root/.venv/bin/ninja" "$dest/bin/" || return 1
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
    # Packed (xz: 5 MB instead of 33, for a bundle carried to the GPU machine), unpacked into
    # the run's folder by --from with Python's tarfile (no xz binary needed there).
    stage_peers "$dir/peers" && tar -C "$dir/peers" -cJf "$dir/peers.tar.xz" . &&
      rm -rf "$dir/peers" || { log "bundle: the peers could not be packed"; exit 1; }
    du -sh "$dir/peers.tar.xz"; du -sh "$dir"
    exit 0
    ;;
  from)
    bin="$(cd "$dir" && pwd)"
    libdir="$bin/lib"
    peers=""  # unpacked below, into the run's folder
    export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    ;;
  build)
    log "building with CUDA in build-gpu"
    build || exit 1
    peers="$root/build-gpu/peers"
    stage_peers "$peers" || log "the peer benches will fail: their packages could not be staged"
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

# PyTorch: the first python3 with a CUDA-enabled torch; the judge fails the run without one.
py=python3
for cand in python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null &&
    "$cand" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    py="$cand"; break
  fi
done
if [ "$mode" = from ]; then
  peers="$work/peers"
  mkdir -p "$peers"
  "$py" -c '
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    t.extractall(sys.argv[2], **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
' "$bin/peers.tar.xz" "$peers" || log "the peer benches will fail: $bin/peers.tar.xz did not unpack"
fi
# The peer benches see the peers' packages first, and DeepSpeed's JIT build the shipped ninja
# (after the machine's own). Its CPU Adam op is built now, in the background, into this run's
# torch extensions folder while the gtests run (two compiler jobs; the gtests check behaviour,
# not speed); the probe waits for it, so that no compiler runs beside a timed check.
peerenv=(PYTHONPATH="$peers:$root/python" PATH="$PATH:$peers/bin"
  TORCH_EXTENSIONS_DIR="$work/torch_extensions")
(
  start_build=$SECONDS
  env "${peerenv[@]}" timeout 300 "$py" -c '
from deepspeed.ops.op_builder import CPUAdamBuilder
CPUAdamBuilder().load(verbose=True)' >"$logs/peers_build.log" 2>&1
  echo $? >"$logs/peers_build.rc"
  echo $((SECONDS - start_build)) >"$logs/peers_build.seconds"
) &
peers_build_pid=$!

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

wait "$peers_build_pid"
log "probe HBM rows beside the cudaMemcpyAsync reference, three rounds in alternating order"
# Round N: ref.N.txt and probe.N.txt; the judge takes each round's ratio and their median.
ref_rc=0 probe_rc=0
run_ref() {
  timeout 120 "$(exe cuda_memcpy_ref)" $((256 << 20)) 10 >"$logs/ref.$1.txt" 2>&1 || ref_rc=$?
}
run_probe() {
  timeout 180 env TIERMEM_DEVICE=cuda TIERMEM_NVME_PATHS="$work" TIERMEM_DRAM_BYTES=2GiB \
    "$(exe tiermem-probe)" --no-sweep --no-demo --bench-bytes 256MiB >"$logs/probe.$1.txt" 2>&1 ||
    probe_rc=$?
}
for r in 1 2 3; do
  if [ $((r % 2)) -eq 1 ]; then run_ref $r; run_probe $r; else run_probe $r; run_ref $r; fi
done
cat "$logs"/ref.[123].txt >"$logs/ref.txt"
cat "$logs"/probe.[123].txt >"$logs/probe.txt"
echo $ref_rc >"$logs/ref.rc"
echo $probe_rc >"$logs/probe.rc"

"$py" -c '
import sys
print("python", sys.version.split()[0])
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
  record offload_bench timeout 200 "${pyenv[@]}" "$py" "$root/bench/offload_bench.py" \
    --hidden 1024 --blocks 4 --seq 512 --batch 4 --rounds 5 --steps 3 --warmup 2 \
    --dram-bytes 4GiB --nvme-bytes 8GiB --nvme-run-dram-bytes 512MiB --nvme-dir "$work"
  if [ -f "$root/bench/fit_bench.py" ]; then
    log "fit_bench on CUDA"
    record fit_bench timeout 200 "${pyenv[@]}" "$py" "$root/bench/fit_bench.py" \
      --nvme-dir "$work"
  fi
  log "GPU peers: activation offload against torchtune, optimizer offload against torchao and DeepSpeed"
  record peers_activation timeout 200 "${pyenv[@]}" "${peerenv[@]}" "$py" \
    "$root/bench/peers/activation_offload.py" --hidden 1024 --blocks 4 --seq 512 --batch 4 \
    --rounds 3 --steps 3 --warmup 2 --nvme-dir "$work"
  record peers_optimizer timeout 300 "${pyenv[@]}" "${peerenv[@]}" "$py" \
    "$root/bench/peers/gpu_optimizer.py" --hidden 1024 --blocks 4 --seq 512 --batch 4 \
    --rounds 3 --steps 3 --warmup 2
  # FSDP2 on one GPU (NCCL, world size 1): FSDPCPUAdam with its state in DRAM and on NVMe
  # against CPUOffloadPolicy and no offload, a model of about 0.1B parameters so that the run
  # stays within its minutes (shards on NVMe are not run on CUDA yet: their gradients refuse it).
  log "GPU peers: FSDP2 with FSDPCPUAdam against CPUOffloadPolicy"
  record peers_fsdp timeout 280 "${pyenv[@]}" "$py" "$root/bench/peers/fsdp_offload.py" \
    --device cuda --nproc 1 --modes no_offload,cpu_offload_policy,tiermem,tiermem_nvme \
    --vocab 32000 --hidden 1024 --layers 6 --heads 8 --batch 4 --seq 512 --rounds 3 --steps 2 \
    --warmup 2 --mem-steps 1 --nvme-dir "$work" --timeout 240
fi
[ -f "$root/bench/fit_bench.py" ] ||
  echo "bench/fit_bench.py is not in this tree" >"$logs/fit_bench.absent"
if [ -f "$root/bench/optim_bench.cc" ]; then  # in the tree: it must run (and be bundled)
  log "optim_bench"
  # torch's reference under the Python that has torch (not /usr/bin/python3), by absolute path.
  record optim_bench timeout 200 env TIERMEM_NVME_PATHS="$work" "$(exe optim_bench)" \
    --python="$py" --torch="$root/bench/optim_torch_ref.py"
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
  # In one archive beside the verdict and the whole output: the lent device machine hands back
  # at most 8 files from $OUT, and the run writes some 50 logs.
  mkdir -p "$OUT/gpu_check" && cp "$logs/summary.txt" "$OUT/gpu_check/" &&
    tar -C "$logs" -czf "$OUT/gpu_check/logs.tar.gz" .
  if [ "$mode" = build ]; then
    tar -C "$bin" -czf "$OUT/gpu_check/build_logs.tar.gz" gpu_check.configure.log \
      gpu_check.build.log 2>/dev/null
  fi
fi
exit "$failed"
