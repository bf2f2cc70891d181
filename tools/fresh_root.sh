#!/usr/bin/env bash
# Runs the README's commands on a fresh minimal Debian 12: a debootstrap --variant=minbase root
# with only ca-certificates and git added, a git clone of this repository in it, and
# `bash tools/build.sh demo` then `bash tools/build.sh test` run there through chroot. It proves
# that the scripts install everything they need (a newcomer's machine has no make, no clang...).
#   sudo tools/fresh_root.sh [demo|test|both]     (default both)
# Environment: MIRROR (default: this machine's Debian mirror from /etc/apt), FRESH_DIR (where the
# root is made, kept afterwards; default a new directory under /var/tmp, removed unless KEEP=1),
# JOBS (passed to build.sh). Clones the committed HEAD: uncommitted changes are not tested.
# Needs root (debootstrap, chroot, mount) and debootstrap (apt-get install debootstrap).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
what=${1:-both}
case "$what" in
  demo) commands=(demo) ;;
  test) commands=(test) ;;
  both) commands=(demo test) ;;
  *) echo "usage: tools/fresh_root.sh [demo|test|both]" >&2; exit 2 ;;
esac
[ "$(id -u)" -eq 0 ] || { echo "fresh_root.sh: needs root (debootstrap, chroot, mount)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "fresh_root.sh: apt-get install debootstrap" >&2; exit 1; }

# The mirror this machine's apt uses for Debian (deb822 .sources or one-line .list files).
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
  KEEP=1  # never remove a directory this script did not make
  mkdir -p "$root"
else
  root=$(mktemp -d /var/tmp/tiermem-fresh-XXXXXX)
fi
chmod 755 "$root"  # a root file system: apt's _apt user must be able to enter it
mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
  if [ "${KEEP:-0}" = 1 ]; then
    echo "fresh_root.sh: root kept at $root"
  elif findmnt -rn -o TARGET | grep -q "^$root/"; then
    echo "fresh_root.sh: something is still mounted under $root: not removing it" >&2
  else
    rm -rf "$root"
  fi
}
trap cleanup EXIT

echo "== debootstrap --variant=minbase bookworm from $mirror into $root"
start=$SECONDS
debootstrap --variant=minbase --include=ca-certificates,git bookworm "$root" "$mirror" \
  >"$root.debootstrap.log" 2>&1 || { tail -20 "$root.debootstrap.log" >&2; exit 1; }
rm -f "$root.debootstrap.log"
echo "   $((SECONDS - start)) s"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# pip reaches PyPI from the root as it does from this machine: where this machine's pip trusts a
# certificate bundle of its own (PIP_CERT, or `cert` in /etc/pip.conf: a proxy's authority, say),
# the root's pip is given a copy of it. A machine whose pip needs none passes nothing.
host_cert=${PIP_CERT:-$(awk -F' *= *' '$1 == "cert" {print $2; exit}' /etc/pip.conf 2>/dev/null)}
pip_cert=()
if [ -n "$host_cert" ] && [ -f "$host_cert" ]; then
  cp "$host_cert" "$root/etc/ssl/host-pip-ca.crt"
  pip_cert=(PIP_CERT=/etc/ssl/host-pip-ca.crt)
fi

echo "== git clone $repo (HEAD $(git -C "$repo" rev-parse --short HEAD))"
git clone -q --no-hardlinks "$repo" "$root/src/tiermem"

for m in proc sys dev dev/pts dev/shm; do  # dev/pts: apt and dpkg want a terminal log
  mkdir -p "$root/$m"
  case $m in
    proc) mount -t proc proc "$root/proc" ;;
    sys) mount -t sysfs sysfs "$root/sys" ;;
    *) mount --bind "/$m" "$root/$m" ;;
  esac
  mounted+=("$root/$m")
done

in_root() {  # command... : runs in the root with a clean environment
  chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin ${JOBS:+JOBS=$JOBS} \
    "${pip_cert[@]}" "$@"
}

# Swap files need a file system that takes O_DIRECT at /var/tmp (where the tests put them).
if in_root dd if=/dev/zero of=/var/tmp/fresh-root-probe bs=4096 count=16 oflag=direct status=none; then
  echo "== /var/tmp in the root takes O_DIRECT writes"
else
  echo "fresh_root.sh: /var/tmp in the root refuses O_DIRECT: the tests would fail there" >&2
  exit 1
fi
in_root rm -f /var/tmp/fresh-root-probe

status=0
summary=()
for c in "${commands[@]}"; do
  echo "== bash tools/build.sh $c"
  start=$SECONDS
  if in_root bash -c "cd /src/tiermem && bash tools/build.sh $c"; then
    summary+=("build.sh $c: PASS ($((SECONDS - start)) s)")
  else
    summary+=("build.sh $c: FAIL ($((SECONDS - start)) s)")
    status=1
  fi
done
echo "== fresh Debian 12 root ($mirror)"
printf '   %s\n' "${summary[@]}"
exit $status
