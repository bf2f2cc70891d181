"""python -m tiermem [tiermem-probe's flags]: tiermem-probe, which measures this machine's tiers
and runs the end-to-end offload demo, as `bash tools/build.sh demo` does (docs/probe.md)."""

import sys

from tiermem import _commands

if __name__ == "__main__":
    _commands.run("tiermem-probe", sys.argv[1:])
