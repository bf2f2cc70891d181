"""The commands a pip install puts on the PATH, tiermem-probe and tiermem-plan, and
`python -m tiermem`: each runs the C++ program of that name, which the wheel carries in
tiermem/bin/ (beside the package, so that it finds the bundled libraries and the nvidia wheels'
CUDA runtime as the library does).

Elsewhere the program is a source checkout's own build (<root>/build/tools/, or $BUILD_DIR/tools/,
when this package is <root>/python/tiermem), else an executable of that name on the PATH
(cmake --install puts both in <prefix>/bin).
"""

import os
import shutil
import sys

PROGRAMS = ("tiermem-probe", "tiermem-plan")


def _is_program(path):
    """An ELF executable: never this module's own command (a Python script of the same name on
    the PATH), which would run itself."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF" and os.access(path, os.X_OK)
    except OSError:
        return False


def find(name):
    """The path of program `name` (one of PROGRAMS). Raises FileNotFoundError naming the places
    tried."""
    if name not in PROGRAMS:
        raise ValueError("tiermem: no program %r; the programs are %s" % (name, ", ".join(PROGRAMS)))
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "bin", name)]
    root = os.path.dirname(os.path.dirname(here))
    if os.path.basename(os.path.dirname(here)) == "python" and \
            os.path.exists(os.path.join(root, "lib", "api", "tiermem.map")):
        build = os.environ.get("BUILD_DIR") or os.path.join(root, "build")
        candidates.append(os.path.join(build, "tools", name))
    on_path = shutil.which(name)
    if on_path:
        candidates.append(on_path)
    for path in candidates:
        if _is_program(path):
            return path
    raise FileNotFoundError(
        "tiermem: no %s program found; tried %s%s. Install tiermem's wheel (pip install "
        "tiermem), build this checkout (bash tools/build.sh demo), cmake --install it, or put "
        "the directory holding it on PATH" %
        (name, ", ".join(candidates), "" if on_path else " and PATH (none there)"))


def run(name, args):
    """Replaces this process with program `name` given `args` (its exit status is the
    command's)."""
    try:
        path = find(name)
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        sys.exit(127)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, [name] + list(args))


def probe():
    """tiermem-probe: what this machine's tiers can do, and the end-to-end demo (docs/probe.md)."""
    run("tiermem-probe", sys.argv[1:])


def plan():
    """tiermem-plan: recompute or offload for a model, from measurements (docs/planner.md)."""
    run("tiermem-plan", sys.argv[1:])
