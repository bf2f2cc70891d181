#!/usr/bin/env bash
# tiermem against the peers a user would pick instead, each runner measuring both sides in one
# run (docs/benchmarks.md, "Against the peers"). Installs what is missing first: Debian's fio and
# libaio-dev (DeepNVMe's I/O), the checkout's .venv (tools/build.sh makes it) and the peers'
# pinned packages (bench/peers/requirements.txt) into that same .venv, and builds tiermem when
# build/ has no library yet.
#   bash bench/peers/run.sh [RUNNER...]     RUNNER: cpu_adam nvme fsdp_offload activation_offload
#                                           gpu_optimizer
#                                           (default: all five; the GPU ones skip without CUDA)
# Environment: BUILD_DIR (default build), TIERMEM_VENV (default .venv), PEERS_NVME_DIR (default
#   /var/tmp), PEERS_ARGS_<RUNNER> (extra arguments for one runner, e.g.
#   PEERS_ARGS_cpu_adam="--sizes 16M --rounds 3").
# Each runner prints `ratio ...` lines; a runner that exits 77 was skipped (its reason printed).
# The exit status is 1 when any runner failed, else 0.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
venv=${TIERMEM_VENV:-$root/.venv}
nvme_dir=${PEERS_NVME_DIR:-/var/tmp}
runners=("$@")
[ ${#runners[@]} -eq 0 ] && runners=(cpu_adam nvme fsdp_offload activation_offload gpu_optimizer)
for r in "${runners[@]}"; do
  [ -f "$root/bench/peers/$r.py" ] || { echo "run.sh: no runner bench/peers/$r.py" >&2; exit 2; }
done

missing=()
for p in fio libaio-dev g++ ninja-build; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    { echo "run.sh: could not install ${missing[*]}" >&2; exit 1; }
fi

if [ ! -x "$venv/bin/python" ] || [ ! -f "$build/lib/libtiermem.so" ]; then
  echo "== bash tools/build.sh demo (no .venv or no build yet)"
  BUILD_DIR="$build" TIERMEM_VENV="$venv" bash "$root/tools/build.sh" demo >/dev/null ||
    { echo "run.sh: tools/build.sh demo failed" >&2; exit 1; }
fi

# The peers' packages, installed again only when their requirements change. DeepSpeed is an
# sdist: its ops are JIT-built at first use (ninja, -march=native), none at install.
req=$root/bench/peers/requirements.txt stamp=$venv/.tiermem-peers-requirements
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "== pip install -r bench/peers/requirements.txt into $venv"
  DS_BUILD_OPS=0 "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req" ||
    { echo "run.sh: installing the peers failed" >&2; exit 1; }
  echo "$want" >"$stamp"
fi

export TIERMEM_LIBRARY=$build/lib/libtiermem.so PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
export PATH=$venv/bin:$PATH  # ds_io, and DeepSpeed's JIT build finds the venv's ninja
unset TIERMEM_ENV_FILE       # the defaults, as the peers run theirs

status=0
summary=()
for r in "${runners[@]}"; do
  args_var=PEERS_ARGS_$r
  read -r -a extra <<<"${!args_var:-}"
  echo "== bench/peers/$r.py ${extra[*]}"
  start=$SECONDS
  case $r in
    nvme) "$venv/bin/python" "$root/bench/peers/$r.py" --dir "$nvme_dir" "${extra[@]}" ;;
    *) "$venv/bin/python" "$root/bench/peers/$r.py" "${extra[@]}" ;;
  esac
  rc=$?
  case $rc in
    0) summary+=("$r: ran ($((SECONDS - start)) s)") ;;
    77) summary+=("$r: skipped (reason above)") ;;
    *) summary+=("$r: FAILED (exit $rc)"); status=1 ;;
  esac
done
echo "== peers"
printf '   %s\n' "${summary[@]}"
exit $status
