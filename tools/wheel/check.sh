#!/usr/bin/env bash
# The wheel as a user gets it: installed into a clean virtual environment outside the checkout,
# then run from there (cwd outside the source tree, no PYTHONPATH, no TIERMEM_LIBRARY): the demo
# (python -m tiermem), the probe's JSON, tiermem-plan on it with the README's 7B case, a small
# PyTorch training with each offload (tools/wheel/train_check.py); then pip uninstall must leave
# nothing of tiermem behind. tools/build.sh test runs it after building the wheel.
#   tools/wheel/check.sh [WHEEL]     (default: the one tiermem wheel in dist/)
# Environment: TORCH (the pip requirement for torch; default python/requirements.txt's, which
# pip's cache usually holds already), WHEEL_CHECK_DIR (where the venv is made; default a new
# directory under /var/tmp, removed afterwards).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [ $# -gt 0 ]; then
  wheel=$(realpath "$1")
else
  shopt -s nullglob
  wheels=("$root"/dist/tiermem-*.whl)
  [ ${#wheels[@]} -eq 1 ] || { echo "check.sh: want one tiermem wheel in dist/, found ${#wheels[@]}" >&2; exit 1; }
  wheel=${wheels[0]}
fi
torch_req=${TORCH:-$(grep -E '^torch[=<>~ ]' "$root/python/requirements.txt" | head -n 1)}
work=${WHEEL_CHECK_DIR:-$(mktemp -d /var/tmp/tiermem-wheel-check-XXXXXX)}
[ -n "${WHEEL_CHECK_DIR:-}" ] || trap 'rm -rf "$work"' EXIT
step() { echo "== wheel check: $* (at ${SECONDS} s)"; }

unset PYTHONPATH TIERMEM_LIBRARY LD_LIBRARY_PATH BUILD_DIR
step "venv in $work, pip install $(basename "$wheel") and $torch_req"
/usr/bin/python3 -m venv "$work/venv"
export PATH="$work/venv/bin:$PATH"
python -m pip install -q --disable-pip-version-check "$wheel" "$torch_req"
cp "$root/tools/wheel/train_check.py" "$work/"
cd "$work"  # nothing of the checkout on the path from here on

step "where the package and its library come from"
python - <<'PY'
import os, tiermem
lib = tiermem.library_path()
print("tiermem", ".".join(map(str, tiermem.version())), "from", os.path.dirname(tiermem.__file__))
print("library", lib)
assert "site-packages/tiermem/lib/" in lib, "the wheel's own library was not the one loaded"
PY

step "python -m tiermem --no-bench --no-sweep (the demo)"
python -m tiermem --no-bench --no-sweep | tee demo.txt
grep -q "tensors came back bit-exact" demo.txt

step "tiermem-probe --json --no-demo --no-sweep; tiermem-plan (the README's 7B case)"
tiermem-probe --json --no-demo --no-sweep --bench-bytes 64MiB >probe.json
python -c "import json; json.load(open('probe.json'))"
tiermem-plan --layers 32 --hidden 4096 --heads 32 --seq 4096 --micro-batch 8 --params 7B \
  --hbm 80GiB --tflops 400 --probe probe.json | tee plan.txt
grep -q "^recommended:" plan.txt

step "a small training with each offload (train_check.py)"
python train_check.py --nvme-dir "$work"

step "pip uninstall tiermem leaves nothing behind"
site=$(python -c "import sysconfig; print(sysconfig.get_path('purelib'))")
record=$(ls -d "$site"/tiermem-*.dist-info)/RECORD
mapfile -t installed < <(cut -d, -f1 "$record")
python -m pip uninstall -q -y tiermem
left=()
for f in "${installed[@]}"; do
  [ -e "$site/$f" ] && left+=("$f")
done
mapfile -t -O "${#left[@]}" left < <(find "$work/venv" -iname '*tiermem*')
if [ ${#left[@]} -ne 0 ]; then
  printf 'left behind: %s\n' "${left[@]}" >&2
  exit 1
fi
echo "   ${#installed[@]} files installed, none left"
step "passed"
