# Shell functions the comparison scripts share (sourced, not run).

# Numbers on stdin, one per line -> their median.
median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

# tiermem_io_bench's write / read lines on stdin -> "write read" GB/s, medians (the first write of
# a run goes to fresh, unwritten extents; with three runs the median is an overwrite, as fio's
# figure is).
io_bench_medians() {
  awk '/^write/ {w[++nw]=$2/1e9} /^read/ {r[++nr]=$2/1e9}
       function mid(a, n,   i, j, t) {
         for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) {t=a[i]; a[i]=a[j]; a[j]=t}
         return a[int((n + 1) / 2)]
       }
       END {printf "%.4f %.4f\n", mid(w, nw), mid(r, nr)}'
}
