#!/usr/bin/env bash
# The README's pip path on a fresh minimal Debian 12: a debootstrap --variant=minbase root with
# only python3 and python3-venv added (no compiler, no -dev package), and in it a non-root user
# who makes a venv, pip installs the wheel (built here, outside the root), then torch from PyPI,
# and runs: python -m tiermem (the probe and the demo), tiermem-probe --json --no-demo,
# tiermem-plan with the README's 7B case (on that probe, and on the README's figures, whose
# recommendation must be the README's), the README's PyTorch snippet on a small model
# (tools/wheel/readme_snippet.py) and a training with each offload (tools/wheel/train_check.py).
# Also: before torch, that the probe says why it has no GPU (no CUDA runtime found), and that
# pip install . of the committed source fails naming the Debian package (no compiler there);
# after torch, that the library finds the CUDA runtime of torch's wheels; at the end, that pip
# uninstall leaves nothing.
#   sudo tools/fresh_root_wheel.sh [WHEEL]     (default: the one tiermem wheel in dist/;
#                                               make it with bash tools/build.sh wheel)
# Environment: MIRROR, FRESH_DIR, KEEP as for tools/fresh_root.sh; TORCH (pip requirement for
# torch, default python/requirements.txt's). Needs root (debootstrap, chroot, mount) and
# debootstrap; the user in the root has none of it.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ "$(id -u)" -eq 0 ] || { echo "fresh_root_wheel.sh: needs root (debootstrap, chroot, mount)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "fresh_root_wheel.sh: apt-get install debootstrap" >&2; exit 1; }
if [ $# -gt 0 ]; then
  wheel=$(realpath "$1")
else
  shopt -s nullglob
  wheels=("$repo"/dist/tiermem-*.whl)
  [ ${#wheels[@]} -eq 1 ] ||
    { echo "fresh_root_wheel.sh: want one tiermem wheel in dist/ (bash tools/build.sh wheel), found ${#wheels[@]}" >&2; exit 1; }
  wheel=${wheels[0]}
fi
torch_req=${TORCH:-$(grep -E '^torch[=<>~ ]' "$repo/python/requirements.txt" | head -n 1)}

# The mirror this machine's apt uses, as tools/fresh_root.sh finds it.
default_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk '/^URIs:/ {uri=$2} /^Suites:/ && /bookworm/ && uri !~ /security/ {print uri; exit}' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk '$1 == "deb" && $3 == "bookworm" {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}' "$f"
  done
}
mirror=${MIRROR:-$(default_mirror | head -n 1)}
mirror=${mirror:-http://deb.debian.org/debian}

if [ -n "${FRESH_DIR:-}" ]; then
  root=$FRESH_DIR
  KEEP=1
  mkdir -p "$root"
else
  root=$(mktemp -d /var/tmp/tiermem-fresh-wheel-XXXXXX)
fi
chmod 755 "$root"
mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
  if [ "${KEEP:-0}" = 1 ]; then
    echo "fresh_root_wheel.sh: root kept at $root"
  elif findmnt -rn -o TARGET | grep -q "^$root/"; then
    echo "fresh_root_wheel.sh: something is still mounted under $root: not removing it" >&2
  else
    rm -rf "$root"
  fi
}
trap cleanup EXIT

echo "== debootstrap --variant=minbase --include=python3,python3-venv bookworm from $mirror"
start=$SECONDS
debootstrap --variant=minbase --include=python3,python3-venv bookworm "$root" "$mirror" \
  >"$root.debootstrap.log" 2>&1 || { tail -20 "$root.debootstrap.log" >&2; exit 1; }
rm -f "$root.debootstrap.log"
echo "   $((SECONDS - start)) s"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# pip reaches PyPI from the root as it does from here: this machine's pip certificate bundle
# (PIP_CERT, or `cert` in /etc/pip.conf), and its find-links folder when it has wheels, are
# handed to the root's pip. The root has no ca-certificates package of its own.
host_cert=${PIP_CERT:-$(awk -F' *= *' '$1 == "cert" {print $2; exit}' /etc/pip.conf 2>/dev/null)}
pip_env=()
if [ -n "$host_cert" ] && [ -f "$host_cert" ]; then
  cp "$host_cert" "$root/etc/ssl/host-pip-ca.crt"
  pip_env+=(PIP_CERT=/etc/ssl/host-pip-ca.crt)
fi
if [ -n "${PIP_FIND_LINKS:-}" ] && [ -d "$PIP_FIND_LINKS" ] && [ -n "$(ls -A "$PIP_FIND_LINKS")" ]; then
  mkdir -p "$root/opt/find-links"
  cp "$PIP_FIND_LINKS"/* "$root/opt/find-links/"
  pip_env+=(PIP_FIND_LINKS=/opt/find-links)
fi

for m in proc sys dev dev/pts dev/shm; do
  mkdir -p "$root/$m"
  case $m in
    proc) mount -t proc proc "$root/proc" ;;
    sys) mount -t sysfs sysfs "$root/sys" ;;
    *) mount --bind "/$m" "$root/$m" ;;
  esac
  mounted+=("$root/$m")
done

echo "== a user, the wheel ($(basename "$wheel")) and the scripts in their home"
chroot "$root" useradd --create-home --shell /bin/bash --uid 1500 tiermem
home=$root/home/tiermem
cp "$wheel" "$repo/tools/wheel/readme_snippet.py" "$repo/tools/wheel/train_check.py" "$home/"
# The committed source too, for pip install . where the build dependencies are missing.
mkdir "$home/tiermem-src"
git -C "$repo" archive HEAD | tar -x -C "$home/tiermem-src"
chroot "$root" chown -R tiermem:tiermem /home/tiermem

as_user() {  # script: runs as the user in the root, in their home, with a clean environment
  chroot --userspec=tiermem:tiermem "$root" /usr/bin/env -i HOME=/home/tiermem USER=tiermem \
    LANG=C.UTF-8 TERM=dumb PATH=/home/tiermem/venv/bin:/usr/local/bin:/usr/bin:/bin \
    "${pip_env[@]}" TORCH_REQ="$torch_req" WHEEL="$(basename "$wheel")" \
    /bin/bash -euo pipefail -c "cd /home/tiermem && $1"
}

status=0
run() {  # label, script
  echo "== $1"
  local start=$SECONDS
  if as_user "$2"; then
    echo "   PASS ($((SECONDS - start)) s)"
  else
    echo "   FAIL ($((SECONDS - start)) s)"
    status=1
  fi
}

run "what the root has: no compiler, no -dev package, not root" '
  id
  [ "$(id -u)" -ne 0 ]
  for c in cc gcc g++ c++ clang cmake make; do
    if command -v $c >/dev/null; then echo "unexpected: $c"; exit 1; fi
  done
  dev=$(dpkg-query -W -f="\${Package}\n" | grep -- "-dev$" || true)
  [ -z "$dev" ] || { echo "unexpected -dev packages: $dev"; exit 1; }
  echo "no compiler, no -dev package; $(dpkg-query -W | wc -l) Debian packages"
  python3 --version'
run "python3 -m venv venv; pip install $(basename "$wheel")" '
  python3 -m venv venv
  pip install -q "$WHEEL"
  pip list 2>/dev/null | grep -i tiermem'
run "no CUDA libraries yet: the emulated device, saying why" '
  python -c "import tiermem; print(tiermem.library_path())"
  tiermem-probe --no-bench --no-sweep --no-demo 2>&1 | tee probe.txt
  grep -q "^gpu  *none used (no CUDA runtime (libcudart.so.13) found" probe.txt'
run "pip install . from the source, with no build dependencies: names the Debian package" '
  out=$(pip install --no-cache-dir ./tiermem-src 2>&1) && { echo "pip install . built with no compiler?"; exit 1; }
  echo "$out" | grep -E "FATAL_ERROR|CMake Error|apt-get install" | head -5
  echo "$out" | grep -q "no C++ compiler found (.*): apt-get install g++"'
run "pip install $torch_req" '
  pip install -q "$TORCH_REQ"
  python -c "import torch; print(\"torch\", torch.__version__)"'
run "the CUDA runtime of torch's wheels is found, with no torch imported" '
  TIERMEM_LOG_LEVEL=debug tiermem-probe --no-bench --no-sweep --no-demo 2>&1 | grep -E "^tiermem: debug: CUDA runtime|^gpu" | tee cudart.txt
  grep -q "CUDA runtime: .*/site-packages/nvidia/cu13/lib/libcudart.so.13" cudart.txt'
run "python -m tiermem" '
  python -m tiermem'
run "tiermem-probe --json --no-demo" '
  tiermem-probe --json --no-demo >probe.json
  python -c "import json; d = json.load(open(\"probe.json\")); print(\"probe.json:\", \", \".join(sorted(d)))"'
run "tiermem-plan, the README's 7B case on this probe" '
  tiermem-plan --layers 32 --hidden 4096 --heads 32 --seq 4096 --micro-batch 8 --params 7B \
    --hbm 80GiB --tflops 400 --probe probe.json | tee plan.txt
  grep -q "^recommended:" plan.txt'
run "tiermem-plan, the README's 7B case on the README's figures" '
  tiermem-plan --layers 32 --hidden 4096 --heads 32 --seq 4096 --micro-batch 8 --params 7B \
    --hbm 80GiB --tflops 400 --link-gbps 25 --nvme-gbps 6 --dram-gbps 100 | tee plan.txt
  grep -qF "recommended: per-layer recompute + optimizer-state offload (38.33 GiB, +1.4074 s/step, +38.1%)" plan.txt'
run "the README's PyTorch snippet on a small model" '
  python readme_snippet.py --nvme-dir /var/tmp'
run "a training with each offload" '
  python train_check.py --nvme-dir /var/tmp'
run "pip uninstall tiermem leaves nothing behind" '
  site=$(python -c "import sysconfig; print(sysconfig.get_path(\"purelib\"))")
  mapfile -t files < <(cut -d, -f1 "$site"/tiermem-*.dist-info/RECORD)
  pip uninstall -q -y tiermem
  left=$( { for f in "${files[@]}"; do [ -e "$site/$f" ] && echo "$f"; done; find venv -iname "*tiermem*"; } || true)
  [ -z "$left" ] || { echo "left behind: $left"; exit 1; }
  echo "${#files[@]} files installed, none left"'

echo "== fresh Debian 12 root, pip path: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
