"""torchrun --nproc_per_node=2 (gloo): DDP with tiermem's three offloads is bit-identical to DDP
without them, on each rank."""

import os
import re
import socket
import subprocess
import sys

import torch.distributed as dist
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_two_ranks_bit_identical(tmp_path):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch")
    env = dict(os.environ, TIERMEM_TEST_NVME=str(tmp_path), OMP_NUM_THREADS="1")
    # Debian ships torchrun as the module torch.distributed.run.
    # --redirects/--tee: torch 1.13 on Python 3.11 cannot parse their defaults ("0", Std.NONE,
    # is not iterated by IntFlag any more), so give values it can: stderr teed to a log file.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--redirects=2", "--tee=2",
           "--master_addr=127.0.0.1", "--master_port=%d" % free_port(),
           os.path.join(HERE, "ddp_worker.py")]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("bit-identical True") == 2
    ranks = sorted(re.findall(r"local_rank (\d+) of (\d+)", r.stdout))
    assert ranks == [("0", "2"), ("1", "2")]
