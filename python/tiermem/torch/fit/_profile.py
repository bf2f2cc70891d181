"""The measurements tiermem.torch.fit plans from: per block forward and backward time and saved
bytes (one profiled step), and the link and NVMe bandwidths (given, from the runtime's settings,
from the probe's env file, or measured here)."""

import os
import re
import statistics
import time

import torch

from ... import TiermemError

_GB = 1e9


class Clock:
    """Timestamps on the compute stream (CUDA events) or the host's clock (CPU); seconds between
    them once the step is done."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.marks = {}

    def mark(self, key):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks[key] = e
        else:
            self.marks[key] = time.perf_counter()

    def between(self, a, b):
        if self.cuda:
            return self.marks[a].elapsed_time(self.marks[b]) * 1e-3
        return self.marks[b] - self.marks[a]


class _GradMark(torch.autograd.Function):
    """Identity; its backward marks the clock when the gradient of the marked tensor arrives."""

    @staticmethod
    def forward(ctx, clock, key, x):
        ctx.clock, ctx.key = clock, key
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.clock.mark(ctx.key)
        return None, None, grad


def _mark_tensor(clock, key, out):
    if isinstance(out, torch.Tensor):
        return _GradMark.apply(clock, key, out) if out.requires_grad else out
    if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor) and out[0].requires_grad:
        return (_GradMark.apply(clock, key, out[0]),) + out[1:]
    return out


class BlockTimer:
    """Forward hooks that mark each block's start and end on a Clock, and its output and the
    first block's input so that backward marks when their gradients arrive: block i's backward
    runs from its output's gradient to block i-1's (block 0's: to its input's)."""

    def __init__(self, blocks, clock):
        self.clock, self.n = clock, len(blocks)
        self.handles = []
        for i, b in enumerate(blocks):
            def pre(module, args, i=i):
                clock.mark(("f0", i))
                if i == 0 and args and isinstance(args[0], torch.Tensor):
                    return (_mark_tensor(clock, ("gin", 0), args[0]),) + tuple(args[1:])
                return None

            def post(module, args, out, i=i):
                clock.mark(("f1", i))
                return _mark_tensor(clock, ("g", i), out)

            self.handles.append(b.register_forward_pre_hook(pre))
            self.handles.append(b.register_forward_hook(post))

    def remove(self):
        for h in self.handles:
            h.remove()

    def spans(self):
        """(pre_f, [f_i], post_f, pre_b, [b_i], post_b, fwd, bwd) in seconds, from the marks
        "start", "fwd_end" and "end" set around the step."""
        c, n = self.clock, self.n
        have = c.marks
        f = [c.between(("f0", i), ("f1", i)) for i in range(n)]
        pre_f = c.between("start", ("f0", 0))
        post_f = c.between(("f1", n - 1), "fwd_end")
        last = ("g", n - 1) if ("g", n - 1) in have else "fwd_end"
        post_b = c.between("fwd_end", last)
        b = []
        for i in reversed(range(n)):
            begin = ("g", i) if ("g", i) in have else last
            end = ("g", i - 1) if i > 0 else ("gin", 0)
            if end not in have:
                end = "end"
            b.append(c.between(begin, end))
            last = end
        b.reverse()
        pre_b = c.between(last, "end")
        return (pre_f, f, post_f, pre_b, b, post_b, c.between("start", "fwd_end"),
                c.between("fwd_end", "end"))


def _env_file_nvme(path):
    """(write, read) bytes/s from the comment tiermem-probe --tune writes in its env file
    ("# DRAM <-> NVMe, write / read GB/s: tuned W / R"), or None."""
    try:
        with open(path) as f:
            text = f.read(1 << 20)
    except OSError:
        return None
    m = re.search(r"write / read GB/s: tuned ([0-9.]+) / ([0-9.]+)", text)
    return (float(m.group(1)) * _GB, float(m.group(2)) * _GB) if m else None


def _measure_link(cuda, nbytes):
    """(d2h, h2d) bytes/s: pinned copies timed with events (CUDA), or a host memory copy."""
    n = nbytes // 4
    host = torch.empty(n, dtype=torch.float32, pin_memory=cuda).fill_(1)
    dev = torch.empty(n, dtype=torch.float32, device="cuda" if cuda else "cpu")
    out = []
    for dst, src in ((host, dev), (dev, host)):
        times = []
        for _ in range(4):
            clock = Clock(cuda)
            clock.mark(0)
            dst.copy_(src, non_blocking=cuda)
            clock.mark(1)
            if cuda:
                torch.cuda.synchronize()
            times.append(clock.between(0, 1))
        out.append(nbytes / statistics.median(times[1:]))
    return tuple(out)


def nvme_round_trips(t, src_ptr, nbytes, repeats):
    """([write], [read]) bytes/s of a DRAM tensor t of nbytes: filled from src_ptr, offloaded
    to NVMe, then read back into DRAM, `repeats` times, each move waited for alone. A move that
    did not cross (the fill landed on NVMe already, or the read back was dropped for want of
    DRAM room, or inclusive DRAM kept the copy) gives None in its place: its time is not the
    drive's."""
    rt = t._rt
    w, r = [], []

    def moved(src, dst):
        return rt.stats()["bytes_moved"][src][dst]

    for _ in range(repeats):
        t.copy_in(src_ptr)
        t.sync()
        down, up = moved("dram", "nvme"), moved("nvme", "dram")
        t0 = time.perf_counter()
        t.offload("nvme")
        t.sync()
        t1 = time.perf_counter()
        wrote = moved("dram", "nvme") - down
        t.prefetch("dram")
        t.sync()
        t2 = time.perf_counter()
        read = moved("nvme", "dram") - up
        w.append(nbytes / (t1 - t0) if wrote >= nbytes else None)
        r.append(nbytes / (t2 - t1) if read >= nbytes else None)
    return w, r


_MIN_PROBE = 1 << 20


def _measure_nvme(runtime, nbytes):
    """(write, read) bytes/s through the runtime: a DRAM tensor offloaded to NVMe and read
    back, of nbytes or what DRAM has free beside the rest of the run (half of it; at least
    1 MiB); None when the runtime has no NVMe tier, no room, or no move reached the drive."""
    tiers = runtime.stats()["tiers"]
    free = min(tiers["dram"]["capacity"] - tiers["dram"]["used"],
               tiers["nvme"]["capacity"] - tiers["nvme"]["used"])
    nbytes = min(nbytes, free // 2 // _MIN_PROBE * _MIN_PROBE)
    if nbytes < _MIN_PROBE:
        return None
    src = torch.zeros(nbytes, dtype=torch.uint8)
    try:
        t = runtime.tensor(nbytes, "activation", "dram", runtime.next_name("fit-nvme-probe"))
    except TiermemError:
        return None
    try:
        w, r = nvme_round_trips(t, src.data_ptr(), nbytes, 2)
    finally:
        t.destroy()
    w, r = [x for x in w if x is not None], [x for x in r if x is not None]
    if not w:
        return None  # the copy never stayed in DRAM to be written down: no figure
    # No read crossed: inclusive DRAM (TIERMEM_DRAM_INCLUSIVE) kept a clean copy. The write's
    # figure stands in for it (drives read at least as fast as they write).
    return max(w), max(r) if r else max(w)


def bandwidths(runtime, cuda, link_gbps=None, nvme_gbps=None):
    """(d2h, h2d, nvme_write, nvme_read) in bytes/s and where each came from. The link: the
    argument; the emulated device's cap (TIERMEM_EMU_LINK_GBPS); or measured. NVMe: the
    argument; the probe's env file (TIERMEM_ENV_FILE); or measured through the runtime; None
    without an NVMe tier."""
    src = {}
    if link_gbps is not None:
        d2h = h2d = float(link_gbps) * _GB
        src["link"] = "link_gbps=%g" % link_gbps
    elif cuda:
        d2h, h2d = _measure_link(True, 256 << 20)
        src["link"] = "measured (pinned copies)"
    else:
        # The emulated device: torch's tensors are host memory, so a pack is a host-to-host
        # copy (the copy engine's uncapped lane); only the prefetch into the HBM tier crosses
        # the capped link (TIERMEM_EMU_LINK_GBPS; uncapped when 0).
        d2h, h2d = _measure_link(False, 32 << 20)
        cap = float(runtime.config_value("TIERMEM_EMU_LINK_GBPS") or 0)
        src["link"] = "D2H a host copy (measured)"
        if cap > 0:
            h2d = min(h2d, cap * _GB)
            src["link"] += ", H2D TIERMEM_EMU_LINK_GBPS=%g" % cap
    nvme = None
    if nvme_gbps is not None:
        nvme = (float(nvme_gbps) * _GB,) * 2
        src["nvme"] = "nvme_gbps=%g" % nvme_gbps
    elif runtime.stats()["tiers"]["nvme"]["capacity"] > 0:
        env = os.environ.get("TIERMEM_ENV_FILE")
        nvme = _env_file_nvme(env) if env else None
        if nvme is not None:
            src["nvme"] = "TIERMEM_ENV_FILE %s" % env
        else:
            nvme = _measure_nvme(runtime, 32 << 20)
            src["nvme"] = ("measured through the runtime" if nvme else
                           "not measured: DRAM had no room to stage a probe, or none of its "
                           "moves reached the drive (pass nvme_gbps=)")
    else:
        src["nvme"] = "no NVMe tier"
    nw, nr = nvme if nvme else (None, None)
    return d2h, h2d, nw, nr, src
