#!/usr/bin/env bash
# The verdict of tools/gpu_check.sh, from the logs of a run: one row per check, PASS, FAIL or an
# allowed SKIP, then `RESULT: PASS` only when every required check ran on the GPU and met its
# target. Kept apart from the run so that tests/gpu_check_test.sh can feed it fake runs.
#
# usage: tools/gpu_check_judge.sh DIR      exit 0 (PASS) or 1 (FAIL); 2 for bad usage
#
# DIR holds, as gpu_check.sh writes them (NAME.rc: the exit status of what wrote NAME.log):
#   gpu.txt                       nvidia-smi's line for the GPU
#   gtest.NAME.log, .rc           cuda_test, mapped_arena_test, cuda_test_mapped (the runtime's
#                                 CUDA tests with TIERMEM_HBM_LAYOUT=mapped), copy_test,
#                                 round_trip_test (all required)
#   ref.txt, probe.txt, .rc       bench/cuda_memcpy_ref and tiermem-probe's copy rows; with
#   ref.N.txt, probe.N.txt        rounds, each round's pair (N = 1, 2, ...; ref.txt and
#                                 probe.txt then hold them all)
#   python.txt                    "python VERSION", "torch VERSION", "cuda True|False",
#                                 "pytest VERSION|missing"
#   pytest.cuda.log, .rc          tests/python/test_cuda.py -v -rsxX, TM_TEST_REQUIRE_CUDA=1
#   pytest.all.log, .rc           the other Python tests, -rsxX
#   offload_bench.log, .rc        bench/offload_bench.py (required)
#   optim_bench.log, .rc          bench/optim_bench, or optim_bench.absent when it is not in
#   fit_bench.log, .rc            the tree (a note); either absent and not noted is a FAIL
#   peers_activation.log, .rc     bench/peers/activation_offload.py (required)
#   peers_optimizer.log, .rc      bench/peers/gpu_optimizer.py (required)
#   peers_fsdp.log, .rc           bench/peers/fsdp_offload.py --device cuda --nproc 1 (required)
#   peers_build.log, .rc, .seconds  DeepSpeed's CPU Adam op built for the optimizer bench (a
#                                 note: without it that bench leaves DeepSpeed's side out)
#   elapsed                       seconds the run took
#
# Benchmarks print what is gated as lines `ratio NAME VALUE`; the targets are here (TARGETS),
# never in the benchmark. A required ratio that is missing or not a number is a FAIL. An
# optional benchmark may also print `check NAME VALUE OP TARGET` (OP one of <= >= < >): each is
# evaluated here, and such a benchmark must print at least one.
set -uo pipefail

dir="${1:-}"
[ -n "$dir" ] && [ -d "$dir" ] || { sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

# Skips allowed on a one-GPU machine, each with why. A skip whose reason matches none fails.
ALLOWED_SKIPS=(
  'needs two GPUs|multi-GPU tests on a one-GPU machine'
  'TIERMEM_BUILD_DIR is not set|the install test needs the build tree (ctest runs it on CPU)'
)
# Required ratios: log, name, comparison, target, what it means. The probe's two are the median
# over the rounds of each round's ratio, the reference being the "wall" rows of cuda_memcpy_ref:
# the same pinned copies timed on the host clock from the call to the return of the wait for
# their end, as tiermem-probe times the runtime's acquire and offload (its event-timed rows leave
# out the launch and the host's wake-up; a log without "wall" rows falls back to them). The
# benchmarks' ratios are medians over their rotated rounds of each round's ratio.
TARGETS=(
  'probe|acquire_over_reference|>=|0.95|runtime acquire DRAM->HBM vs pinned cudaMemcpyAsync'
  'probe|offload_over_reference|>=|0.95|runtime offload HBM->DRAM vs pinned cudaMemcpyAsync'
  'offload_bench|dram_step_over_bound|<=|1.15|tiermem DRAM step / its overlap bound'
  'offload_bench|dram_step_over_reference|<|1.0|tiermem DRAM step / the side-stream reference'
  'offload_bench|nvme_step_over_bound|<=|1.25|tiermem NVMe step / its overlap bound'
  'offload_bench|params_step_over_bound|<=|1.25|parameter offload (4x HBM) step / its bound'
  'peers_activation|act_tiermem_over_torchtune|<=|1.0|tiermem DRAM step / torchtune OffloadActivations step, same tensors'
  'peers_activation|act_tiermem_over_bound|<=|1.15|tiermem DRAM step / its overlap bound (peer bench)'
  'peers_optimizer|opt_cpuadam_over_torchao|<=|1.0|GPT step with CPUAdam / with torchao CPUOffloadOptimizer'
  'peers_fsdp|fsdp_step_tiermem_over_cpu_offload_policy|<=|1.0|FSDP2 step with FSDPCPUAdam, state in DRAM / with CPUOffloadPolicy'
)

rows=()
failed=0
pass() { rows+=("PASS  $1"); }
fail() { rows+=("FAIL  $1"); failed=1; }
note() { rows+=("      $1"); }
rc_of() { local f="$dir/$1.rc"; [ -f "$f" ] && tr -dc '0-9' <"$f" || echo missing; }
is_number() { [[ "$1" =~ ^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]]; }
compare() {  # VALUE OP TARGET: exit 0 when it holds
  awk -v v="$1" -v op="$2" -v t="$3" 'BEGIN {
    ok = (op == "<=") ? v <= t : (op == ">=") ? v >= t : (op == "<") ? v < t : (op == ">") ? v > t : 0
    exit ok ? 0 : 1 }'
}
# Allowed skips among the lines given on stdin (one reason a line): prints how many matched,
# and fails a row for each that did not.
judge_skips() {
  local what="$1" n=0 line entry ok
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    ok=""
    for entry in "${ALLOWED_SKIPS[@]}"; do
      if grep -qE "${entry%%|*}" <<<"$line"; then ok="${entry#*|}"; break; fi
    done
    if [ -n "$ok" ]; then note "SKIP  $what: allowed ($ok): $line"; n=$((n + 1))
    else fail "$what: skipped, not on the allow-list: $line"; fi
  done
  echo "$n" >"$dir/.allowed"
}

note "gpu   $(cat "$dir/gpu.txt" 2>/dev/null || echo '(no gpu.txt: nvidia-smi gave nothing)')"
[ -s "$dir/gpu.txt" ] || fail "no GPU named by nvidia-smi"

# GoogleTest suites on the GPU.
gpu_tests=0
for name in cuda_test mapped_arena_test cuda_test_mapped copy_test round_trip_test; do
  log="$dir/gtest.$name.log"
  if [ ! -f "$log" ]; then fail "$name: did not run (no log)"; continue; fi
  rc=$(rc_of "gtest.$name")
  passed=$(grep -cE '^\[       OK \] .* \([0-9]+ ms\)$' "$log")
  skipped=$(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$log")
  failures=$(grep -cE '^\[  FAILED  \] .* \([0-9]+ ms\)$' "$log")
  # A skip's reason is the line after "...: Skipped".
  judge_skips "$name" < <(grep -A1 -E ': Skipped$' "$log" | grep -vE ': Skipped$|^--$')
  allowed=$(cat "$dir/.allowed")
  line="$name: $passed passed, $skipped skipped ($allowed allowed), $failures failed (exit $rc)"
  if [ "$rc" != 0 ] || [ "$passed" -eq 0 ] || [ "$failures" -ne 0 ] || [ "$skipped" -gt "$allowed" ]; then
    fail "$line"
  else
    pass "$line"
    gpu_tests=$((gpu_tests + passed))
  fi
done

# Ratios: `ratio NAME VALUE` lines; the probe's are computed from its GB/s rows below.
ratio_in() { awk -v n="$2" '$1 == "ratio" && $2 == n { print $3; exit }' "$1" 2>/dev/null; }
gbps() { awk -v pat="$2" '$0 ~ pat { for (i = 1; i <= NF; ++i) if ($(i+1) == "GB/s") { print $i; exit } }' "$1" 2>/dev/null; }
# The reference's GB/s for a direction in one round's file: its "wall" row, else its first row.
ref_gbps() {
  local v
  v=$(gbps "$1" "^wall +$2")
  [ -n "$v" ] || v=$(gbps "$1" "$2")
  echo "$v"
}
# NAME then one "probe_gbps ref_gbps" pair a line: `ratio NAME MEDIAN` of the rounds' ratios
# (none when a round's pair is not numbers), and an info line with each round's.
median_ratio() {
  awk -v name="$1" '
    { if ($1 !~ /^[0-9.]+$/ || $2 !~ /^[0-9.]+$/ || $2 <= 0) bad = 1; else r[n++] = $1 / $2 }
    END {
      if (bad || n == 0) exit
      for (i = 0; i < n; ++i) for (j = i + 1; j < n; ++j) if (r[j] < r[i]) { t = r[i]; r[i] = r[j]; r[j] = t }
      m = (n % 2) ? r[int(n / 2)] : (r[n / 2 - 1] + r[n / 2]) / 2
      printf "ratio %s %.3f\n", name, m
      printf "info %s_per_round", name
      for (i = 0; i < n; ++i) printf " %.3f", r[i]
      printf " (sorted)\n"
    }'
}
probe_ratios() {
  local pairs=() n
  if [ -f "$dir/ref.1.txt" ]; then
    for n in $(ls "$dir"/ref.*.txt | sed -n 's/.*ref\.\([0-9][0-9]*\)\.txt$/\1/p' | sort -n); do
      pairs+=("$dir/probe.$n.txt|$dir/ref.$n.txt")
    done
  else
    pairs=("$dir/probe.txt|$dir/ref.txt")
  fi
  for p in "${pairs[@]}"; do
    echo "$(gbps "${p%%|*}" '^runtime +dram -> hbm') $(ref_gbps "${p#*|}" 'dram -> hbm')"
  done | median_ratio acquire_over_reference
  for p in "${pairs[@]}"; do
    echo "$(gbps "${p%%|*}" '^runtime +hbm +-> dram') $(ref_gbps "${p#*|}" 'hbm  -> dram')"
  done | median_ratio offload_over_reference
}
if [ -f "$dir/probe.txt" ] && [ -f "$dir/ref.txt" ]; then
  probe_ratios >"$dir/probe.log"
  while read -r _ name values; do note "probe $name: $values"; done < <(grep '^info ' "$dir/probe.log")
  grep -q '^device *cuda' "$dir/probe.txt" || fail "tiermem-probe did not use the GPU: $(grep -m1 '^device' "$dir/probe.txt")"
  for f in ref probe; do [ "$(rc_of "$f")" = 0 ] || fail "$f exited $(rc_of "$f")"; done
fi

# PyTorch on CUDA: a CUDA torch and pytest are required.
python_v=$(awk '$1 == "python" { print $2 }' "$dir/python.txt" 2>/dev/null)
[ -n "$python_v" ] && note "python $python_v"
torch_v=$(awk '$1 == "torch" { print $2 }' "$dir/python.txt" 2>/dev/null)
torch_cuda=$(awk '$1 == "cuda" { print $2 }' "$dir/python.txt" 2>/dev/null)
pytest_v=$(awk '$1 == "pytest" { print $2 }' "$dir/python.txt" 2>/dev/null)
if [ -z "$torch_v" ] || [ "$torch_cuda" != True ]; then
  fail "PyTorch: no python3 with a CUDA-enabled torch (torch ${torch_v:-missing}, cuda ${torch_cuda:-?})"
elif [ -z "$pytest_v" ] || [ "$pytest_v" = missing ]; then
  fail "PyTorch: pytest is missing"
fi
pytest_summary() { grep -E '(passed|failed|error|skipped|no tests ran).* in [0-9.]+s' "$1" | tail -1 | tr -d '='; }
for suite in cuda all; do
  log="$dir/pytest.$suite.log"
  what="PyTorch tests ($suite, torch ${torch_v:-?})"
  [ "$suite" = cuda ] && what="PyTorch tests on the GPU (test_cuda.py, torch ${torch_v:-?})"
  if [ ! -f "$log" ]; then fail "$what: did not run (no log)"; continue; fi
  rc=$(rc_of "pytest.$suite")
  grep -E '^(XFAIL|XPASS)' "$log" >"$dir/.xs"
  [ -s "$dir/.xs" ] && fail "$what: expected failures mask results: $(head -3 "$dir/.xs" | tr '\n' ' ')"
  judge_skips "$what" < <(sed -nE 's/^SKIPPED \[[0-9]+\] [^:]+:[0-9]+: (.*)$/\1/p' "$log")
  allowed=$(cat "$dir/.allowed")
  skipped=$(pytest_summary "$log" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+' || true)
  passed=$(pytest_summary "$log" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || true)
  line="$what: $(pytest_summary "$log" | sed 's/^ *//;s/ *$//') (exit $rc)"
  if [ "$rc" != 0 ] || [ -z "$passed" ] || [ "${skipped:-0}" -gt "$allowed" ]; then
    fail "$line"
    continue
  fi
  pass "$line"
  if [ "$suite" = cuda ]; then
    ran=$(grep -cE '::.* PASSED' "$log")
    [ "$ran" -gt 0 ] || fail "$what: no test reported PASSED (run with -v)"
    gpu_tests=$((gpu_tests + ran))
  fi
done

# Required ratios against their targets.
for t in "${TARGETS[@]}"; do
  IFS='|' read -r src name op target meaning <<<"$t"
  log="$dir/$src.log"
  value=$(ratio_in "$log" "$name")
  if [ ! -f "$log" ]; then
    fail "$name: $src did not run ($meaning; target $op $target)"
  elif [ "$src" != probe ] && [ "$(rc_of "$src")" != 0 ]; then
    fail "$name: $src exited $(rc_of "$src") ($meaning)"
  elif ! is_number "${value:-}"; then
    fail "$name = '${value:-}' is not a number ($meaning; target $op $target)"
  elif compare "$value" "$op" "$target"; then
    pass "$name = $value $op $target ($meaning)"
  else
    fail "$name = $value, target $op $target ($meaning)"
  fi
done

# DeepSpeed's CPU Adam op, built in the background for the optimizer bench (a note either way:
# without it that bench leaves DeepSpeed's side out, and gates only CPUAdam against torchao).
if [ -f "$dir/peers_build.rc" ]; then
  if [ "$(rc_of peers_build)" = 0 ]; then
    note "peers DeepSpeed's CPU Adam op built in $(cat "$dir/peers_build.seconds" 2>/dev/null || echo ?) s"
  else
    note "peers DeepSpeed's CPU Adam op was not built (exit $(rc_of peers_build)): $(grep -v '^\s*$' "$dir/peers_build.log" 2>/dev/null | tail -1)"
  fi
fi
# The peer benches' NOTE lines (a side left out, bytes that differ between the sides).
while IFS= read -r line; do note "peers ${line#  }"; done < <(
  grep -h '^  NOTE' "$dir/peers_activation.log" "$dir/peers_optimizer.log" 2>/dev/null)

# Optional benchmarks (other issues): absent is a note, present must print checks that hold.
for b in optim_bench fit_bench; do
  log="$dir/$b.log"
  if [ -f "$dir/$b.absent" ] && [ ! -f "$log" ]; then note "SKIP  $b: $(cat "$dir/$b.absent")"; continue; fi
  if [ ! -f "$log" ]; then fail "$b: neither run nor noted absent"; continue; fi
  [ "$(rc_of "$b")" = 0 ] || fail "$b exited $(rc_of "$b")"
  n=0
  while read -r _ name value op target; do
    n=$((n + 1))
    if ! is_number "${value:-}" || ! is_number "${target:-}" || ! [[ "$op" =~ ^(<=|>=|<|>)$ ]]; then
      fail "$b $name: unparsable check: '$value $op $target'"
    elif compare "$value" "$op" "$target"; then pass "$b $name = $value $op $target"
    else fail "$b $name = $value, target $op $target"; fi
  done < <(grep -E '^check ' "$log")
  [ "$n" -gt 0 ] || fail "$b: printed no 'check NAME VALUE OP TARGET' line"
done

if [ "$gpu_tests" -gt 0 ]; then pass "tests that ran on the GPU: $gpu_tests"; else fail "no test ran on the GPU"; fi
elapsed=$(cat "$dir/elapsed" 2>/dev/null || echo 0)
[ "$elapsed" -le 480 ] || fail "took ${elapsed}s, over the 8 minutes allowed"

echo "==== tiermem gpu_check summary (${elapsed}s) ===="
printf '%s\n' "${rows[@]}"
if [ $failed -eq 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
rm -f "$dir/.allowed" "$dir/.xs"
exit $failed
