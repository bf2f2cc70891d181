#!/usr/bin/env python3
"""Per-tensor cost of offload_saved_tensors' pack + unpack, as the host pays it: a step saving
many small tensors (so that bytes cost little and the hooks' own work shows), timed with
tiermem's hooks and with pass-through hooks in the same run; the difference per saved tensor is
the hooks' overhead. A GPU step of 20 ms that saves 20 tensors per layer cannot afford 100 us
each.

    python3 python/examples/pack_overhead.py [--tensors 256] [--bytes 16384] [--steps 20]

Runs on the emulated device (CPU tensors); run it against another checkout's package with
PYTHONPATH to compare (docs/benchmarks.md).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import tiermem  # installed (cmake --install, pip install ./python)
except ImportError:
    sys.path.insert(0, os.path.dirname(HERE))  # run from a source tree

import torch  # noqa: E402

import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402


class SaveMany(torch.autograd.Function):
    """Saves each of `tensors` for backward; backward reads one element of each."""

    @staticmethod
    def forward(ctx, x, *tensors):
        ctx.save_for_backward(*tensors)
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        acc = 0.0
        for t in ctx.saved_tensors:
            acc += float(t.view(-1)[0])
        return (g + acc * 0.0,) + (None,) * len(ctx.saved_tensors)


def one_step(rt, saved, hooks):
    x = torch.ones(4, requires_grad=True)
    with rt.step():
        with hooks():
            y = SaveMany.apply(x, *saved)
        y.sum().backward()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tensors", type=int, default=256, help="saved tensors per step")
    ap.add_argument("--bytes", type=int, default=16384, help="bytes per saved tensor")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5, help="medians over this many rounds")
    args = ap.parse_args()
    torch.set_num_threads(1)
    saved = [torch.randn(args.bytes // 4) for _ in range(args.tensors)]
    total = args.tensors * args.bytes
    with tempfile.TemporaryDirectory() as nvme, tiermem.Runtime(
            device="emulated", hbm_bytes=max(64 << 20, 4 * total),
            dram_bytes=max(64 << 20, 4 * total), nvme_paths=nvme, nvme_bytes="64MiB",
            log_level="error") as rt:
        plain = lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
        offload = lambda: tt.offload_saved_tensors(rt, "dram", min_bytes=0)
        for _ in range(3):  # the schedule is learned in the first step
            one_step(rt, saved, offload)
            one_step(rt, saved, plain)
        per = {"plain": [], "tiermem": []}
        for _ in range(args.repeats):
            for name, hooks in (("plain", plain), ("tiermem", offload)):
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    one_step(rt, saved, hooks)
                per[name].append((time.perf_counter() - t0) / args.steps)
        s = rt.stats()
    plain_s, tm_s = statistics.median(per["plain"]), statistics.median(per["tiermem"])
    print("library: %s" % tiermem.library_path())
    print("package: %s" % os.path.dirname(tt.__file__))
    print("saved tensors per step: %d of %d bytes" % (args.tensors, args.bytes))
    print("step, pass-through hooks: %.3f ms" % (plain_s * 1e3))
    print("step, tiermem hooks:      %.3f ms" % (tm_s * 1e3))
    print("pack + unpack per tensor: %.1f us" % ((tm_s - plain_s) / args.tensors * 1e6))
    print("acquire hits / misses: %d / %d" % (s["acquire_hits"], s["acquire_misses"]))


if __name__ == "__main__":
    main()
