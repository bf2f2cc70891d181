#!/usr/bin/env bash
# tools/gpu_check_judge.sh on fake runs: the run where every required check ran on the GPU and
# met its target passes; each way a run can look fine without being so fails: a PyTorch suite
# that skipped, a skip that is not on the allow-list, an expected failure, a CPU-only torch, a
# missing pytest, a ratio below its target, a value that is not a number, a missing benchmark, a
# gtest suite that skipped. Runs on CPU (ctest: gpu_check_logic).
set -uo pipefail

judge="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tools/gpu_check_judge.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0

gtest_log() {  # passed skipped [reason]
  local i
  echo "[==========] Running tests."
  for ((i = 0; i < $1; ++i)); do echo "[ RUN      ] S.P$i"; echo "[       OK ] S.P$i (3 ms)"; done
  for ((i = 0; i < $2; ++i)); do
    echo "[ RUN      ] S.K$i"; echo "/src/x.cc:1: Skipped"; echo "${3:-no device}"
    echo "[  SKIPPED ] S.K$i (0 ms)"
  done
}

# A run in which everything ran on the GPU and met its target.
good_run() {
  local d="$1"
  mkdir -p "$d"
  echo "NVIDIA H200, 143771 MiB, 580.159.04" >"$d/gpu.txt"
  for t in cuda_test mapped_arena_test cuda_test_mapped copy_test round_trip_test; do gtest_log 5 0 >"$d/gtest.$t.log"; echo 0 >"$d/gtest.$t.rc"; done
  gtest_log 3 1 "needs two GPUs" >"$d/gtest.cuda_test.log"
  printf 'dram -> hbm  55.30 GB/s\nhbm  -> dram 55.20 GB/s\n' >"$d/ref.txt"
  printf 'device      cuda (NVIDIA H200)\nruntime  dram -> hbm   54.10 GB/s\nruntime  hbm  -> dram  53.90 GB/s\n' >"$d/probe.txt"
  echo 0 >"$d/ref.rc"; echo 0 >"$d/probe.rc"
  printf 'torch 2.11.0+cu130\ncuda True\npytest 8.3.5\n' >"$d/python.txt"
  cat >"$d/pytest.cuda.log" <<'EOF'
tests/python/test_cuda.py::test_gpt_bit_identical_on_the_gpu[saved-dram] PASSED [ 50%]
tests/python/test_cuda.py::test_layouts_on_the_gpu PASSED [100%]
============================== 2 passed in 9.10s ===============================
EOF
  echo 0 >"$d/pytest.cuda.rc"
  cat >"$d/pytest.all.log" <<'EOF'
....s.....
=========================== short test summary info ============================
SKIPPED [1] tests/python/test_runtime.py:83: TIERMEM_BUILD_DIR is not set (ctest sets it)
======================== 9 passed, 1 skipped in 20.00s =========================
EOF
  echo 0 >"$d/pytest.all.rc"
  cat >"$d/offload_bench.log" <<'EOF'
ratio dram_step_over_bound 1.100
ratio dram_step_over_reference 0.910
ratio nvme_step_over_bound 1.200
ratio params_step_over_bound 1.050
EOF
  echo 0 >"$d/offload_bench.rc"
  echo "bench/optim_bench.cc is not in this tree" >"$d/optim_bench.absent"
  printf 'check fitted_over_best 1.01 <= 1.03\n' >"$d/fit_bench.log"; echo 0 >"$d/fit_bench.rc"
  echo 300 >"$d/elapsed"
}

# expect NAME WANT(0|1) EDIT: a good run changed by EDIT (run in the run's folder).
expect() {
  local name="$1" want="$2" edit="$3" d="$tmp/$1"
  good_run "$d"
  (cd "$d" && eval "$edit")
  "$judge" "$d" >"$d.out" 2>&1
  local got=$?
  if [ "$got" -ne "$want" ] || { [ "$want" -eq 0 ] && ! grep -q '^RESULT: PASS$' "$d.out"; } ||
    { [ "$want" -eq 1 ] && ! grep -q '^RESULT: FAIL$' "$d.out"; }; then
    echo "FAILED: $name: exit $got, wanted $want"; cat "$d.out"; failures=$((failures + 1))
  else
    echo "ok: $name ($(grep -m1 '^FAIL' "$d.out" || echo 'RESULT: PASS'))"
  fi
}

expect all_ran_and_passed 0 ':'
expect pytorch_suite_skipped 1 'printf "ss\nSKIPPED [2] tests/python/test_cuda.py:31: no CUDA runtime of tiermem\n==== 2 skipped in 1.00s ====\n" >pytest.cuda.log'
expect pytorch_suite_not_run 1 'rm pytest.cuda.log pytest.cuda.rc'
expect skip_not_allowed 1 'sed -i "s/TIERMEM_BUILD_DIR is not set (ctest sets it)/torch too old/" pytest.all.log'
expect expected_failure 1 'sed -i "s/^SKIPPED.*/XFAIL tests\/python\/test_ddp.py::test_ddp - ranks/" pytest.all.log'
expect cpu_torch 1 'printf "torch 2.11.0+cpu\ncuda False\npytest 8.3.5\n" >python.txt'
expect no_pytest 1 'printf "torch 2.11.0\ncuda True\npytest missing\n" >python.txt'
expect ratio_below_target 1 'sed -i "s/nvme_step_over_bound 1.200/nvme_step_over_bound 1.400/" offload_bench.log'
expect acquire_below_target 1 'sed -i "s/54.10 GB\/s/50.00 GB\/s/" probe.txt'
expect unparsable_ratio 1 'sed -i "s/params_step_over_bound 1.050/params_step_over_bound ?/" offload_bench.log'
expect missing_ratio 1 'sed -i "/dram_step_over_reference/d" offload_bench.log'
expect probe_unparsable 1 'sed -i "s/53.90 GB\/s/nan GB\/s/" probe.txt'
expect bench_failed 1 'echo 1 >offload_bench.rc'
expect gtest_skipped 1 'gtest_log 0 5 "no CUDA device" >gtest.copy_test.log'
expect gtest_missing 1 'rm gtest.round_trip_test.log'
expect optional_check_fails 1 'printf "check fitted_over_best 1.09 <= 1.03\n" >fit_bench.log'
expect optional_unparsable 1 'printf "check fitted_over_best n/a <= 1.03\n" >fit_bench.log'
expect optional_silent 1 'echo "fit_bench: done" >fit_bench.log'
expect optional_not_noted 1 'rm optim_bench.absent'
expect no_gpu 1 ': >gpu.txt'
expect too_slow 1 'echo 600 >elapsed'

if [ $failures -ne 0 ]; then echo "$failures case(s) judged wrongly"; exit 1; fi
echo "all cases judged as expected"
