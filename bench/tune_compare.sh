#!/usr/bin/env bash
# tiermem-probe --tune against the defaults: tunes, then runs the same benchmarks with and without
# the env file it wrote, interleaved A B A B in one run, and prints medians and ratios:
#   tiermem_io_bench SIZE   DRAM <-> NVMe through the runtime (the block size, depth, threads)
#   step_bench              the emulated ZeRO-Infinity step (I/O settings and prefetch depth)
#   bench/tune_compare.sh [-d DIR] [-s SIZE] [-n PAIRS] [-t BUDGET_SECONDS] [-B BUILD_DIR]
set -euo pipefail
dir=/var/tmp size=1G pairs=7 budget=60
build=$(cd "$(dirname "$0")/.." && pwd)/build
while getopts "d:s:n:t:B:h" o; do
  case $o in
    d) dir=$OPTARG ;; s) size=$OPTARG ;; n) pairs=$OPTARG ;; t) budget=$OPTARG ;; B) build=$OPTARG ;;
    *) sed -n '2,7p' "$0"; exit 2 ;;
  esac
done
for b in tools/tiermem-probe bench/tiermem_io_bench bench/step_bench; do
  [ -x "$build/$b" ] || { echo "$build/$b not built" >&2; exit 1; }
done
work=$(mktemp -d "$dir/tiermem-tune-XXXXXX")
trap 'rm -rf "$work"' EXIT
unset TIERMEM_ENV_FILE TIERMEM_IO_BLOCK_SIZE TIERMEM_IO_QUEUE_DEPTH TIERMEM_IO_THREADS TIERMEM_PREFETCH_DEPTH
export TIERMEM_NVME_PATHS=$work

echo "== tiermem-probe --tune (budget ${budget} s)"
"$build/tools/tiermem-probe" --tune --tune-budget "$budget" --tune-out "$work/tuned.env" 2>/dev/null |
  sed -n '/^tune/,$p'
grep '^export' "$work/tuned.env"

# shellcheck source=bench/medians.sh
source "$(dirname "$0")/medians.sh"
io() {  # [env file] -> "write read" GB/s
  env ${1:+TIERMEM_ENV_FILE=$1} "$build/bench/tiermem_io_bench" "$size" 3 | io_bench_medians
}
step() {  # [env file] -> step ms at the configured prefetch depth
  env ${1:+TIERMEM_ENV_FILE=$1} "$build/bench/step_bench" --depths config --steps 5 |
    awk 'f {print $2; exit} /^ *depth/ {f=1}'
}
for f in dw dr tw tr ds ts; do : >"$work/$f"; done
run() {  # d|t
  local file=""
  [ "$1" = t ] && file=$work/tuned.env
  read -r w r < <(io "$file"); echo "$w" >>"$work/${1}w"; echo "$r" >>"$work/${1}r"
  step "$file" >>"$work/${1}s"
}
# Each side goes first in every other pair.
for ((i = 0; i < pairs; i++)); do
  if ((i % 2 == 0)); then run d; run t; else run t; run d; fi
done
printf "\n%d interleaved pairs, working set %s, directory %s\n" "$pairs" "$size" "$dir"
printf "%-28s %12s %12s %10s\n" benchmark defaults tuned "tuned/def"
for k in w:"io write GB/s" r:"io read GB/s"; do
  d=$(median <"$work/d${k%%:*}") t=$(median <"$work/t${k%%:*}")
  awk -v n="${k#*:}" -v d="$d" -v t="$t" 'BEGIN {printf "%-28s %12.2f %12.2f %10.3f\n", n, d, t, t / d}'
done
# Both directions: bytes over time of a write plus a read, per pair, then the median.
both() { paste "$work/${1}w" "$work/${1}r" | awk '{print 2 / (1 / $1 + 1 / $2)}' | median; }
d=$(both d) t=$(both t)
awk -v d="$d" -v t="$t" 'BEGIN {printf "%-28s %12.2f %12.2f %10.3f\n", "io write+read GB/s", d, t, t / d}'
d=$(median <"$work/ds") t=$(median <"$work/ts")
awk -v d="$d" -v t="$t" 'BEGIN {printf "%-28s %12.1f %12.1f %10.3f  (default ms / tuned ms)\n", "step_bench step ms", d, t, d / t}'
