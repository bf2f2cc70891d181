"""Shared fixtures of the Python tests: the tiny GPT on the path (bench/tinygpt.py, the benchmarks'
model), runtimes with small budgets whose swap files go to a per-test directory."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import tiermem  # noqa: E402

# The runtimes here keep the default tiers (inclusive DRAM, TIERMEM_DRAM_INCLUSIVE=on), as users
# get them. A test that counts the bytes read back from NVMe, or fails an NVMe read on purpose,
# asks for exclusive tiers itself (dram_inclusive="off"): with inclusive DRAM a clean DRAM copy
# serves those reads instead.


@pytest.fixture
def nvme_dir(tmp_path):
    d = tmp_path / "nvme"
    d.mkdir()
    return d


@pytest.fixture
def make_runtime(nvme_dir):
    """Runtimes on the emulated device with budgets small enough that offloads spill to NVMe;
    each is closed at the end of the test, and its swap directory must then be empty."""
    made = []

    def make(dram_inclusive=None, **settings):
        """dram_inclusive: "on" / "off" sets TIERMEM_DRAM_INCLUSIVE for this runtime (an
        environment-only setting); None leaves the environment's (default: on)."""
        base = dict(device="emulated", hbm_bytes="8MiB", dram_bytes="256KiB",
                    nvme_paths=str(nvme_dir), nvme_bytes="64MiB", log_level="error")
        base.update(settings)
        saved = os.environ.get("TIERMEM_DRAM_INCLUSIVE")
        if dram_inclusive is not None:
            os.environ["TIERMEM_DRAM_INCLUSIVE"] = dram_inclusive
        try:
            rt = tiermem.Runtime(**base)
        finally:
            if saved is None:
                os.environ.pop("TIERMEM_DRAM_INCLUSIVE", None)
            else:
                os.environ["TIERMEM_DRAM_INCLUSIVE"] = saved
        if dram_inclusive is not None:
            assert rt.config_value("TIERMEM_DRAM_INCLUSIVE") == dram_inclusive
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.close()
    assert os.listdir(nvme_dir) == [], "swap files left behind"
