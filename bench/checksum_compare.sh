#!/usr/bin/env bash
# The cost of TIERMEM_CHECKSUM=xxh3: tiermem_io_bench (one tensor offloaded DRAM -> NVMe and
# acquired back through the runtime, medians of three per run) with checksums off and xxh3,
# interleaved in one run, each side first in every other pair; medians over the pairs and the
# ratio xxh3 / off.
#   bench/checksum_compare.sh [-d DIR] [-s SIZE] [-n PAIRS] [-B BUILD_DIR]
set -euo pipefail
dir=/var/tmp size=1G pairs=7
build=$(cd "$(dirname "$0")/.." && pwd)/build
while getopts "d:s:n:B:h" o; do
  case $o in
    d) dir=$OPTARG ;; s) size=$OPTARG ;; n) pairs=$OPTARG ;; B) build=$OPTARG ;;
    *) sed -n '2,6p' "$0"; exit 2 ;;
  esac
done
bench=$build/bench/tiermem_io_bench
[ -x "$bench" ] || { echo "$bench not built" >&2; exit 1; }
work=$(mktemp -d "$dir/tiermem-checksum-XXXXXX")
trap 'rm -rf "$work"' EXIT
unset TIERMEM_ENV_FILE TIERMEM_CHECKSUM
export TIERMEM_NVME_PATHS=$work

# shellcheck source=bench/medians.sh
source "$(dirname "$0")/medians.sh"
for f in ow or xw xr; do : >"$work/$f"; done
run() {  # off|xxh3
  local w r
  read -r w r < <(TIERMEM_CHECKSUM=$1 "$bench" "$size" 3 | io_bench_medians)
  echo "$w" >>"$work/${1:0:1}w"
  echo "$r" >>"$work/${1:0:1}r"
}
for ((i = 0; i < pairs; i++)); do
  if ((i % 2 == 0)); then run off; run xxh3; else run xxh3; run off; fi
done
printf "TIERMEM_CHECKSUM off vs xxh3: %s, %s pairs, directory %s\n" "$size" "$pairs" "$dir"
printf "%-6s %10s %10s %11s\n" dir "off GB/s" "xxh3 GB/s" "xxh3 / off"
for d in write read; do
  x=${d:0:1}
  o=$(median <"$work/o$x") c=$(median <"$work/x$x")
  awk -v d="$d" -v o="$o" -v c="$c" 'BEGIN {printf "%-6s %10.2f %10.2f %11.3f\n", d, o, c, c / o}'
done
