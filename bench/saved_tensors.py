#!/usr/bin/env python3
"""The host cost of offload_saved_tensors per saved tensor, pack plus unpack: a stack of stock
nn.Linear + nn.ReLU layers whose activations are small (so that bytes cost little and what the
hooks do per tensor shows), its step timed with and without the hooks, the two alternating step
by step in one process. Per saved tensor: (offload step - plain step) / tensors offloaded, the
median of a round's step pairs.

    .venv/bin/python bench/saved_tensors.py [--layers 200] [--width 128] [--batch 64]
        [--steps 10] [--rounds 7] [--tier dram] [--profile FILE]

The default activation is 64 x 128 fp32 = 32 KiB. Runs on the emulated device (CPU tensors):
HBM is host memory, and a prefetch into it is a copy by tiermem's own threads, which share this
machine's cores with the training thread. Prints the median of the rounds and their spread, the
training thread's CPU time beside the wall time, and the schedule's hits. --profile writes a
cProfile of 5 offloaded steps (sorted by internal time) to FILE.
"""

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import tempfile
import time

try:
    import tiermem
except ImportError:  # run from a source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import tiermem

import torch  # noqa: E402
from torch import nn  # noqa: E402

import tiermem.torch as tt  # noqa: E402


def model(layers, width):
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())])


def step(rt, net, x, hooks):
    with rt.step():
        with hooks():
            loss = net(x).square().mean()
        loss.backward()
    for p in net.parameters():
        p.grad = None
    return loss


def timed(rt, net, x, hooks):
    w0, c0 = time.perf_counter(), time.thread_time()
    step(rt, net, x, hooks)
    return time.perf_counter() - w0, time.thread_time() - c0


def spread(values, scale=1e6):
    return "%.1f [%.1f-%.1f]" % (statistics.median(values) * scale, min(values) * scale,
                                 max(values) * scale)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=200)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10, help="step pairs (one plain, one offloaded) a round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tier", default="dram", choices=("dram", "nvme"))
    ap.add_argument("--profile", default=None, help="write a profile of 5 offloaded steps here")
    args = ap.parse_args()
    torch.set_num_threads(1)  # the hooks' cost, not the matmuls' threads, is the subject
    net = model(args.layers, args.width)
    x = torch.randn(args.batch, args.width)
    act = args.batch * args.width * 4
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/var/tmp")) as nvme:
        rt = tiermem.Runtime(device="emulated", hbm_bytes="256MiB", dram_bytes="256MiB",
                             nvme_paths=nvme, nvme_bytes="512MiB", log_level="error")
        counts = {}

        def offload():
            h = tt.offload_saved_tensors(rt, args.tier, min_bytes=act)
            counts["hooks"] = h
            return h

        def plain():
            return torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)

        variants = (("plain", plain), ("tiermem", offload))
        for _ in range(3):  # the first step learns the schedule
            for _, hooks in variants:
                step(rt, net, x, hooks)
        # Per saved tensor: each save autograd hands the hooks (and does not keep), whether it
        # made a copy or shared an earlier one of the same tensor.
        packed = counts["hooks"].packed + counts["hooks"].shared
        copies = counts["hooks"].packed
        # Steps alternate one by one (the order of each pair rotated), so that a drift of the
        # machine's speed, which on a VM moves step times by more than the hooks cost, falls on
        # both alike: a round's figure is the median of its pairs' differences.
        wall = {name: [] for name, _ in variants}
        per_wall, per_cpu = [], []
        before = rt.stats()
        for r in range(args.rounds):
            dw, dc = [], []
            for s in range(args.steps):
                order = variants if (r + s) % 2 == 0 else variants[::-1]
                got = {}
                for name, hooks in order:
                    got[name] = timed(rt, net, x, hooks)
                    wall[name].append(got[name][0])
                dw.append(got["tiermem"][0] - got["plain"][0])
                dc.append(got["tiermem"][1] - got["plain"][1])
            per_wall.append(statistics.median(dw) / packed)
            per_cpu.append(statistics.median(dc) / packed)
        after = rt.stats()
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(5):
                step(rt, net, x, offload)
            prof.disable()
        rt.close()
    print("torch %s, %d x (Linear(%d, %d) + ReLU), activations %d KiB, tier %s" % (
        torch.__version__, args.layers, args.width, args.width, act >> 10, args.tier))
    print("saved tensors offloaded a step: %d (%d copies: a tensor saved twice is copied once); "
          "%d rounds of %d step pairs, order rotated" % (packed, copies, args.rounds, args.steps))
    print("step ms, plain hooks: %s" % spread(wall["plain"], 1e3))
    print("step ms, offload:     %s" % spread(wall["tiermem"], 1e3))
    print("pack + unpack per saved tensor, us: wall %s; training thread CPU %s" % (
        spread(per_wall), spread(per_cpu)))
    acquires = after["acquire_hits"] + after["acquire_misses"] - (
        before["acquire_hits"] + before["acquire_misses"])
    print("unpacks that hit a prefetched copy: %d of %d" % (
        after["acquire_hits"] - before["acquire_hits"], acquires))
    if args.profile:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
        with open(args.profile, "w") as f:
            f.write(out.getvalue())
        print("profile of 5 offloaded steps: %s" % args.profile)


if __name__ == "__main__":
    main()
