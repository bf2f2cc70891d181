#!/usr/bin/env bash
# tiermem's DRAM <-> NVMe path against fio (io_uring, O_DIRECT, fixed buffers, registered files),
# same directory, block size, queue depth and total size, run interleaved A B A B in one run.
# Prints the median of each and the ratio tiermem / fio.
#   bench/fio_compare.sh [-d DIR] [-s SIZE] [-q DEPTH] [-n PAIRS] [-b "1M 4M"] [-B BUILD_DIR]
set -euo pipefail
dir=/var/tmp size=1G depth=32 pairs=5 blocks="1M 4M"
build=$(cd "$(dirname "$0")/.." && pwd)/build
while getopts "d:s:q:n:b:B:h" o; do
  case $o in
    d) dir=$OPTARG ;; s) size=$OPTARG ;; q) depth=$OPTARG ;; n) pairs=$OPTARG ;;
    b) blocks=$OPTARG ;; B) build=$OPTARG ;;
    *) sed -n '2,5p' "$0"; exit 2 ;;
  esac
done
bench=$build/bench/tiermem_io_bench
command -v fio >/dev/null || { echo "fio not found: apt-get install fio" >&2; exit 1; }
[ -x "$bench" ] || { echo "$bench not built" >&2; exit 1; }
work=$(mktemp -d "$dir/tiermem-fio-XXXXXX")
trap 'rm -rf "$work"' EXIT

median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
fio_gbps() {  # rw bs -> GB/s
  fio --name=ref --filename="$work/fio.dat" --ioengine=io_uring --direct=1 --fixedbufs \
    --registerfiles --rw="$1" --bs="$2" --iodepth="$depth" --size="$size" \
    --output-format=terse --terse-version=3 |
    awk -F';' -v rw="$1" '{printf "%.4f\n", (rw=="write" ? $48 : $7) * 1024 / 1e9}'
}
tm_gbps() {  # bs -> "write read" GB/s
  TIERMEM_NVME_PATHS=$work TIERMEM_IO_BLOCK_SIZE=$1 TIERMEM_IO_QUEUE_DEPTH=$depth "$bench" "$size" 1 |
    awk '/^write/ {w=$2/1e9} /^read/ {r=$2/1e9} END {printf "%.4f %.4f\n", w, r}'
}

printf "tiermem vs fio: %s working set, queue depth %s, %s pairs, directory %s\n" "$size" "$depth" "$pairs" "$dir"
printf "%-6s %-6s %14s %14s %8s\n" block dir "tiermem GB/s" "fio GB/s" ratio
for bs in $blocks; do
  fio_gbps write "$bs" >/dev/null  # warm-up pair, discarded: lays out fio's file, tiermem's
  tm_gbps "$bs" >/dev/null         # first write converts fallocated extents
  : >"$work/tw"; : >"$work/tr"; : >"$work/fw"; : >"$work/fr"
  for ((i = 0; i < pairs; i++)); do
    read -r w r < <(tm_gbps "$bs")
    echo "$w" >>"$work/tw"; echo "$r" >>"$work/tr"
    fio_gbps write "$bs" >>"$work/fw"
    fio_gbps read "$bs" >>"$work/fr"
  done
  for d in write read; do
    t=$(median <"$work/t${d:0:1}") f=$(median <"$work/f${d:0:1}")
    awk -v b="$bs" -v d="$d" -v t="$t" -v f="$f" 'BEGIN {printf "%-6s %-6s %14.2f %14.2f %8.2f\n", b, d, t, f, t / f}'
  done
done
