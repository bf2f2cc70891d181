#!/usr/bin/env bash
# tiermem's DRAM <-> NVMe figures against fio (io_uring, O_DIRECT, fixed buffers, registered
# files), same directory, block size, queue depth and bytes, interleaved in one run:
#   probe    tiermem-probe --sweep-only: the raw engine on fresh swap files (the probe's figure)
#   runtime  tiermem_io_bench: offload / acquire through the runtime
#   fio      a fresh file per run, written twice (the first discarded) then read, once with
#            malloc'd buffers and once on 2 MiB huge pages (--iomem=shmhuge, when they can be
#            reserved: tiermem's DRAM pool is on transparent huge pages). "best fio" is the
#            better of the two in each round: the reference is fio at its best on this disk.
# Each round runs the three in a rotated order (on a virtual disk the host's writeback of one
# run's writes slows the next). Prints, per block size and direction, the median of the rounds
# with their range [min-max], and the ratios to best fio as the median [min-max] of the rounds'
# own ratios.
#   bench/fio_compare.sh [-d DIR] [-s SIZE] [-q DEPTH] [-n ROUNDS] [-b "1M 4M"] [-B BUILD_DIR]
set -euo pipefail
dir=/var/tmp size=1G depth=32 pairs=3 blocks="1M 4M"
build=$(cd "$(dirname "$0")/.." && pwd)/build
while getopts "d:s:q:n:b:B:h" o; do
  case $o in
    d) dir=$OPTARG ;; s) size=$OPTARG ;; q) depth=$OPTARG ;; n) pairs=$OPTARG ;;
    b) blocks=$OPTARG ;; B) build=$OPTARG ;;
    *) sed -n '2,15p' "$0"; exit 2 ;;
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

# fio's huge-page buffers: depth x the largest block on 2 MiB pages, reserved for this run only.
kinds=malloc
max_kib=0
for bs in $blocks; do k=$(numfmt --from=iec "$bs"); k=$((k / 1024)); [ "$k" -gt "$max_kib" ] && max_kib=$k; done
need=$(((max_kib * depth + 2047) / 2048 + 8))
if [ -w "$hugepages" ] && echo $((saved_huge + need)) >"$hugepages" 2>/dev/null &&
   [ "$(cat "$hugepages")" -ge $((saved_huge + need)) ]; then
  kinds="malloc shmhuge"
fi

# shellcheck source=bench/medians.sh
source "$(dirname "$0")/medians.sh"
fio_gbps() {  # rw bs iomem -> GB/s
  fio --name=ref --filename="$work/fio.dat" --ioengine=io_uring --direct=1 --fixedbufs \
    --registerfiles --iomem="$3" --rw="$1" --bs="$2" --iodepth="$depth" --size="$size" \
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

# Numbers on stdin -> "median [min-max]" with the given printf format.
spread() { sort -g | awk -v f="$1" '{v[NR]=$1} END {
  m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
  printf f " [" f "-" f "]", m, v[1], v[NR]}'; }
# Two files of numbers, line by line -> their ratios, one per line.
ratios() { paste "$1" "$2" | awk '{printf "%.4f\n", $1 / $2}'; }
# Two files of numbers, line by line -> the larger of each pair.
larger() { paste "$1" "$2" | awk '{print ($1 > $2) ? $1 : $2}'; }

printf "tiermem vs fio: %s, queue depth %s, %s rounds, directory %s, fio buffers: %s\n" \
  "$size" "$depth" "$pairs" "$dir" "$kinds"
printf "GB/s, median [min-max] of the rounds; ratios: median [min-max] of each round's ratio\n"
for bs in $blocks; do
  for f in pw pr rw rr fmallocw fmallocr fshmhugew fshmhuger; do : >"$work/$f"; done
  run_probe() { read -r w r < <(probe_gbps "$bs"); echo "$w" >>"$work/pw"; echo "$r" >>"$work/pr"; }
  run_runtime() { read -r w r < <(runtime_gbps "$bs"); echo "$w" >>"$work/rw"; echo "$r" >>"$work/rr"; }
  run_fio() {  # iomem
    # A fresh file each time, as tiermem's swap files are fresh each run; its first write (into
    # fallocated, unwritten extents) is discarded, as the probe's median discards its first.
    rm -f "$work/fio.dat"
    fio_gbps write "$bs" "$1" >/dev/null
    fio_gbps write "$bs" "$1" >>"$work/f${1}w"
    fio_gbps read "$bs" "$1" >>"$work/f${1}r"
  }
  runs=(run_probe run_runtime)
  for k in $kinds; do runs+=("run_fio $k"); done
  for ((i = 0; i < pairs; i++)); do
    for ((j = 0; j < ${#runs[@]}; j++)); do ${runs[(i + j) % ${#runs[@]}]}; done
  done
  for d in w r; do
    if [ "$kinds" = malloc ]; then cp "$work/fmalloc$d" "$work/fbest$d"
    else larger "$work/fmalloc$d" "$work/fshmhuge$d" >"$work/fbest$d"; fi
    name=$([ $d = w ] && echo write || echo read)
    printf "%-4s %-5s probe %s  runtime %s  fio malloc %s" "$bs" "$name" \
      "$(spread %.2f <"$work/p$d")" "$(spread %.2f <"$work/r$d")" "$(spread %.2f <"$work/fmalloc$d")"
    [ "$kinds" = malloc ] || printf "  fio huge %s" "$(spread %.2f <"$work/fshmhuge$d")"
    printf "\n%-4s %-5s runtime / best fio %s  probe / best fio %s\n" "$bs" "$name" \
      "$(ratios "$work/r$d" "$work/fbest$d" | spread %.3f)" \
      "$(ratios "$work/p$d" "$work/fbest$d" | spread %.3f)"
  done
done
