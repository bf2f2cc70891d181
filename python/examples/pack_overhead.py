#!/usr/bin/env python3
"""Per-tensor cost of offload_saved_tensors' pack + unpack, as the host pays it: a step saving
many small tensors (so that bytes cost little and the hooks' own work shows), timed with
tiermem's hooks and with pass-through hooks in the same run; the difference per saved tensor is
the hooks' overhead. A GPU step of 20 ms that saves 20 tensors per layer cannot afford 100 us
each.

    python3 python/examples/pack_overhead.py [--tensors 256] [--bytes 16384] [--steps 20]
        [--before old_torch.py]

Runs on the emulated device (CPU tensors). --before names another version of the saved-tensor
hooks (e.g. main's python/tiermem/torch.py, from git show) loaded beside this one, so that both
are timed side by side in one run, round by round, against the same runtime (docs/benchmarks.md).
"""

import argparse
import importlib.util
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

import tiermem  # noqa: E402,F811
import tiermem.torch as tt  # noqa: E402


class SaveMany(torch.autograd.Function):
    """Saves each of `tensors` for backward; backward reads one element of each."""

    @staticmethod
    def forward(ctx, x, *tensors):
        ctx.save_for_backward(*tensors)
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        saved = ctx.saved_tensors  # each access unpacks every saved tensor: once here
        acc = 0.0
        for t in saved:
            acc += float(t.view(-1)[0])
        return (g + acc * 0.0,) + (None,) * len(saved)


def one_step(rt, saved, hooks):
    x = torch.ones(4, requires_grad=True)
    with rt.step():
        with hooks():
            y = SaveMany.apply(x, *saved)
        y.sum().backward()


def load_before(path):
    """Another version of tiermem.torch, as a submodule of this tiermem (its relative imports
    find this package's Runtime and bindings)."""
    spec = importlib.util.spec_from_file_location("tiermem._torch_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tensors", type=int, default=256, help="saved tensors per step")
    ap.add_argument("--bytes", type=int, default=16384, help="bytes per saved tensor")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5, help="medians over this many rounds")
    ap.add_argument("--before", default=None,
                    help="a file with another version of tiermem.torch to time side by side")
    ap.add_argument("--prefetch-depth", type=int, default=None,
                    help="TIERMEM_PREFETCH_DEPTH (default: the library's); 0: no prefetching")
    args = ap.parse_args()
    torch.set_num_threads(1)
    saved = [torch.randn(args.bytes // 4) for _ in range(args.tensors)]
    total = args.tensors * args.bytes
    with tempfile.TemporaryDirectory() as nvme:
        # One runtime per variant: each learns its own schedule.
        make = lambda: tiermem.Runtime(
            device="emulated", hbm_bytes=max(64 << 20, 4 * total),
            dram_bytes=max(64 << 20, 4 * total), nvme_paths=nvme, nvme_bytes="64MiB",
            log_level="error", prefetch_depth=args.prefetch_depth)
        plain = lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
        rt = make()
        runtimes = [rt]
        variants = [("plain", rt, plain),
                    ("tiermem", rt, lambda: tt.offload_saved_tensors(rt, "dram", min_bytes=0))]
        if args.before:
            before, rt_before = load_before(args.before), make()
            runtimes.append(rt_before)
            variants.append(("before", rt_before, lambda: before.offload_saved_tensors(
                rt_before, "dram", min_bytes=0)))
        for _ in range(3):  # the schedule is learned in the first step
            for _, r, hooks in variants:
                one_step(r, saved, hooks)
        # Wall time, and the CPU time of this (the training) thread alone: what the hooks cost
        # the thread that would launch the GPU's work, less sensitive to other load.
        # And the CPU time of the whole process: tiermem's own threads (movers, copy engine)
        # too, which take cores from the training thread on a machine with few.
        per = {name: [] for name, _, _ in variants}
        cpu = {name: [] for name, _, _ in variants}
        proc = {name: [] for name, _, _ in variants}
        for _ in range(args.repeats):
            for name, r, hooks in variants:
                t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
                for _ in range(args.steps):
                    one_step(r, saved, hooks)
                per[name].append((time.perf_counter() - t0) / args.steps)
                cpu[name].append((time.thread_time() - c0) / args.steps)
                proc[name].append((time.process_time() - p0) / args.steps)
        s = rt.stats()
        for r in runtimes:
            r.close()
    med = {name: statistics.median(v) for name, v in per.items()}
    med_cpu = {name: statistics.median(v) for name, v in cpu.items()}
    med_proc = {name: statistics.median(v) for name, v in proc.items()}
    print("library: %s" % tiermem.library_path())
    print("package: %s" % os.path.dirname(tt.__file__))
    print("saved tensors per step: %d of %d bytes; medians of %d rounds of %d steps" % (
        args.tensors, args.bytes, args.repeats, args.steps))
    print("step, pass-through hooks: %.3f ms" % (med["plain"] * 1e3))
    for name in med:
        if name != "plain":
            print("pack + unpack per tensor, %-8s %6.1f us wall, %6.1f us CPU of this thread, "
                  "%6.1f us CPU of all threads (step %.3f ms)" % (
                      name + ":", (med[name] - med["plain"]) / args.tensors * 1e6,
                      (med_cpu[name] - med_cpu["plain"]) / args.tensors * 1e6,
                      (med_proc[name] - med_proc["plain"]) / args.tensors * 1e6, med[name] * 1e3))
    print("acquire hits / misses: %d / %d (prefetch depth %s)" % (
        s["acquire_hits"], s["acquire_misses"], "default" if args.prefetch_depth is None
        else args.prefetch_depth))
    # A miss whose prefetch was issued (and not dropped) is a late one: the lead, depth unpacks
    # of host time, was shorter than the mover's wake-up and copy.
    print("prefetches issued / dropped: %d / %d; acquire stall %.1f ms in all" % (
        s["prefetches"], s["prefetches_dropped"], s["acquire_stall_ns"] / 1e6))


if __name__ == "__main__":
    main()
