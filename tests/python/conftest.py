"""Shared fixtures of the Python tests: the tiny GPT on the path, runtimes with small budgets whose
swap files go to a per-test directory."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "python", "examples"))

import tiermem  # noqa: E402

# Exclusive tiers for these tests' runtimes: they count the bytes that cross NVMe and the
# prefetches that bring them back, which inclusive DRAM's clean copies would stand in for
# (tests/inclusive_test.cc covers those). A test that wants inclusive DRAM sets it itself.
os.environ.setdefault("TIERMEM_DRAM_INCLUSIVE", "off")


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

    def make(**settings):
        base = dict(device="emulated", hbm_bytes="8MiB", dram_bytes="256KiB",
                    nvme_paths=str(nvme_dir), nvme_bytes="64MiB", log_level="error")
        base.update(settings)
        rt = tiermem.Runtime(**base)
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.close()
    assert os.listdir(nvme_dir) == [], "swap files left behind"
