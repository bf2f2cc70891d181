#!/usr/bin/env bash
# tiermem's DRAM <-> NVMe figures against fio (io_uring, O_DIRECT, fixed buffers, registered
# files), same directory, block size, queue depth and bytes, interleaved A B A B in one run:
#   probe    tiermem-probe --sweep-only: the raw engine on fresh swap files (the probe's figure)
#   runtime  tiermem_io_bench: offload / acquire through the runtime
#   fio      a fresh file per pair, written twice (the first discarded) then read; buffers on
#            huge pages (--iomem=shmhuge) when they can be reserved, as tiermem's DRAM pool is on
#            transparent huge pages. Each side goes first in every other pair.
# Prints the median of each and the ratios to fio.
#   bench/fio_compare.sh [-d DIR] [-s SIZE] [-q DEPTH] [-n PAIRS] [-b "1M 4M"] [-B BUILD_DIR]
set -euo pipefail
dir=/var/tmp size=1G depth=32 pairs=5 blocks="1M 4M"
build=$(cd "$(dirname "$0")/.." && pwd)/build
while getopts "d:s:q:n:b:B:h" o; do
  case $o in
    d) dir=$OPTARG ;; s) size=$OPTARG ;; q) depth=$OPTARG ;; n) pairs=$OPTARG ;;
    b) blocks=$OPTARG ;; B) build=$OPTARG ;;
    *) sed -n '2,11p' "$0"; exit 2 ;;
  esac
done
probe=$build/tools/tiermem-probe bench=$build/bench/tiermem_io_bench
command -v fio >/dev/null || { echo "fio not found: apt-get install fio" >&2; exit 1; }
for b in "$probe" "$bench"; do [ -x "$b" ] || { echo "$b not built" >&2; exit 1; }; done
work=$(mktemp -d "$dir/tiermem-fio-XXXXXX")
hugepages=/proc/sys/vm/nr_hugepages
saved_huge=$(cat "$hugepages" 2>/dev/null || echo 0)
cleanup() {
  rm -rf "$work"
  [ -w "$hugepages" ] && echo "$saved_huge" >"$hugepages" 2>/dev/null || true
}
trap cleanup EXIT
unset TIERMEM_ENV_FILE
export TIERMEM_NVME_PATHS=$work TIERMEM_IO_QUEUE_DEPTH=$depth

# fio's buffers: depth x the largest block on 2 MiB huge pages, reserved for this run only.
iomem=malloc
max_kib=0
for bs in $blocks; do k=$(numfmt --from=iec "$bs"); k=$((k / 1024)); [ "$k" -gt "$max_kib" ] && max_kib=$k; done
need=$(((max_kib * depth + 2047) / 2048 + 8))
if [ -w "$hugepages" ] && echo $((saved_huge + need)) >"$hugepages" 2>/dev/null &&
   [ "$(cat "$hugepages")" -ge $((saved_huge + need)) ]; then
  iomem=shmhuge
fi

# shellcheck source=bench/medians.sh
source "$(dirname "$0")/medians.sh"
fio_gbps() {  # rw bs -> GB/s
  fio --name=ref --filename="$work/fio.dat" --ioengine=io_uring --direct=1 --fixedbufs \
    --registerfiles --iomem="$iomem" --rw="$1" --bs="$2" --iodepth="$depth" --size="$size" \
    --output-format=terse --terse-version=3 |
    awk -F';' -v rw="$1" '{printf "%.4f\n", (rw=="write" ? $48 : $7) * 1024 / 1e9}'
}
probe_gbps() {  # bs -> "write read" GB/s: the sweep's one point
  "$probe" --sweep-only --json --sweep-bytes "$size" --sweep-blocks "$1" --sweep-depths "$depth" 2>/dev/null |
    grep -m1 '"write_gbps"' | sed 's/.*"write_gbps": \([0-9.]*\), "read_gbps": \([0-9.]*\)}.*/\1 \2/'
}
runtime_gbps() {  # bs -> "write read" GB/s
  TIERMEM_IO_BLOCK_SIZE=$1 "$bench" "$size" 3 | io_bench_medians
}

printf "tiermem vs fio: %s, queue depth %s, %s pairs, directory %s, fio buffers %s\n" \
  "$size" "$depth" "$pairs" "$dir" "$iomem"
printf "%-6s %-6s %12s %12s %12s %9s %9s\n" block dir "probe GB/s" "runtime GB/s" "fio GB/s" \
  "probe/fio" "rt/fio"
for bs in $blocks; do
  for f in pw pr rw rr fw fr; do : >"$work/$f"; done
  run_tiermem() {
    read -r w r < <(probe_gbps "$bs"); echo "$w" >>"$work/pw"; echo "$r" >>"$work/pr"
    read -r w r < <(runtime_gbps "$bs"); echo "$w" >>"$work/rw"; echo "$r" >>"$work/rr"
  }
  run_fio() {
    # A fresh file each time, as tiermem's swap files are fresh each run; its first write (into
    # fallocated, unwritten extents) is discarded, as the probe's median discards its first.
    rm -f "$work/fio.dat"
    fio_gbps write "$bs" >/dev/null
    fio_gbps write "$bs" >>"$work/fw"
    fio_gbps read "$bs" >>"$work/fr"
  }
  # Each side goes first in every other pair: on a virtual disk the host's writeback of one
  # run's writes slows the next run.
  for ((i = 0; i < pairs; i++)); do
    if ((i % 2 == 0)); then run_tiermem; run_fio; else run_fio; run_tiermem; fi
  done
  for d in write read; do
    x=${d:0:1}
    p=$(median <"$work/p$x") r=$(median <"$work/r$x") f=$(median <"$work/f$x")
    awk -v b="$bs" -v d="$d" -v p="$p" -v r="$r" -v f="$f" \
      'BEGIN {printf "%-6s %-6s %12.2f %12.2f %12.2f %9.2f %9.2f\n", b, d, p, r, f, p / f, r / f}'
  done
done
