#!/usr/bin/env python3
"""One GPT training step (forward + backward, no optimizer step, so every mode runs the same
weights) under each way of offloading, side by side in one run, with the bytes each moves and the
overlap bound each is held to.

Modes: plain; stock save_on_cpu(pin_memory=True) (moves more: it packs every saved tensor, the
weights included); save_on_cpu's mechanism over the tensors tiermem offloads (like for like); a
side-stream reference in the manner of torchtune's OffloadActivations (bench/offload_hooks.py);
tiermem to DRAM; tiermem to NVMe; and, on a second model, parameter offload with the parameters 4x
the HBM budget, beside that model's plain step.

Fair by construction: every mode runs --rounds rounds of --steps steps after --warmup, the mode
order rotated each round; each clock stops only after the device and tiermem have finished
(torch.cuda.synchronize, Runtime.sync); forward and backward are timed apart (CUDA events on a
GPU, the wall clock on a CPU); medians with the min-max spread.

Overlap bound of a mode: max(fwd, D2H bytes / D2H link, NVMe write bytes / NVMe write bw)
+ max(bwd, H2D bytes / H2D link, NVMe read bytes / NVMe read bw), with fwd and bwd the plain
step's (of the same model), the link from a pinned-copy measurement and the NVMe bandwidths
through tiermem, all in this run. `ratio NAME VALUE` lines at the end are what tools/gpu_check.sh
gates; each is the median over the rounds of that round's ratio (the mode's steps in the round
against the bound from the plain steps of the same round, or against the reference's steps of
the same round), so that a machine that drifts between rounds (clocks, other load) moves both
sides of a ratio alike; the per-round values follow on an `info` line.

    python3 bench/offload_bench.py [--rounds 3] [--steps 3] [--nvme-dir /var/tmp]
"""

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:
    import tiermem  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))  # run from a source tree

import torch  # noqa: E402

import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402
from tiermem.torch.fit._profile import nvme_round_trips  # noqa: E402
from offload_hooks import (CountingSaveOnCpu, SaveOnCpuLikeForLike,  # noqa: E402
                           SideStreamReference)
from tinygpt import TinyGPT, batches  # noqa: E402

MIB = 1 << 20
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def sync():
    if CUDA:
        torch.cuda.synchronize()


class Clock:
    """Marks on the compute stream (CUDA events) or the wall clock (CPU): ms between marks."""

    def __init__(self):
        self.marks = []

    def mark(self):
        if CUDA:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def spans(self):
        sync()
        if CUDA:
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [1e3 * (b - a) for a, b in zip(self.marks, self.marks[1:])]


class Mode:
    """One row: how to run a step, and the bytes it moved (D2H, H2D, NVMe write, NVMe read)."""

    def __init__(self, name, model, data, hooks=None, runtime=None, label=""):
        self.name, self.model, self.data, self.make_hooks = name, model, data, hooks
        self.runtime, self.label = runtime, label
        self.fwd, self.bwd, self.step = [], [], []
        self.rounds = []  # the round of each recorded step (parallel to fwd, bwd, step)
        self.round = 0  # the round being run
        self.bytes = [0, 0, 0, 0]
        self.clean = 0  # bytes read from clean DRAM copies instead of NVMe (inclusive DRAM)
        self.steps_counted = 0
        self.plain = None  # the plain mode of the same model: its compute times make the bound
        self.check = None  # like-for-like bytes, compared with tiermem's
        self.peak = 0  # the most CUDA memory torch held during a step (GPU only)

    def run(self, record):
        x, y = self.data
        rt = self.runtime
        before = self._counters()
        clean_before = rt.stats()["clean_read_bytes"] if rt is not None else 0
        clock = Clock()
        sync()
        if CUDA:
            torch.cuda.reset_peak_memory_stats()
        clock.mark()
        if rt is not None:
            rt.step_begin()
        hooks = self.make_hooks() if self.make_hooks else None
        if hooks is not None:
            with hooks:
                loss = self.model(x, y)
        else:
            loss = self.model(x, y)
        clock.mark()
        loss.backward()
        if hasattr(hooks, "finish"):
            hooks.finish()
        if rt is not None:
            rt.step_end()
            rt.sync()  # tm_step_end does not wait: the step's moves count in its own clock
        clock.mark()
        fwd, bwd = clock.spans()
        if CUDA:
            self.peak = max(self.peak, torch.cuda.max_memory_allocated())
        for p in self.model.parameters():
            p.grad = None
        if not record:
            return
        self.fwd.append(fwd)
        self.bwd.append(bwd)
        self.step.append(fwd + bwd)
        self.rounds.append(self.round)
        after = self._counters()
        if hooks is not None and not isinstance(hooks, tt.SavedTensorOffload):
            after = [hooks.packed_bytes, hooks.unpacked_bytes, 0, 0]
            before = [0, 0, 0, 0]
        for i in range(4):
            self.bytes[i] += after[i] - before[i]
        if rt is not None:
            self.clean += rt.stats()["clean_read_bytes"] - clean_before
        self.steps_counted += 1
        if isinstance(hooks, tt.SavedTensorOffload):
            self.check = hooks.packed_bytes

    def _counters(self):
        # The runtime counts every caller's copy (copied_in/out_bytes) on its one copy path, and
        # bytes_moved the moves between tiers: no path of the package goes uncounted.
        if self.runtime is None:
            return [0, 0, 0, 0]
        s = self.runtime.stats()
        m = s["bytes_moved"]
        return [s["copied_in_bytes"] + m["hbm"]["dram"], s["copied_out_bytes"] + m["dram"]["hbm"],
                m["dram"]["nvme"], m["nvme"]["dram"]]

    def per_step(self):
        return [b / max(1, self.steps_counted) for b in self.bytes]


def link_gbps(nbytes):
    """Pinned host <-> device copies timed with events (GPU), or a host memory copy (CPU: no
    link), median of 5 each way, in GB/s: (h2d, d2h)."""
    n = nbytes // 4
    host = torch.empty(n, dtype=torch.float32, pin_memory=CUDA).fill_(1)
    dev = torch.empty(n, dtype=torch.float32, device=DEVICE)
    out = []
    for dst, src in ((dev, host), (host, dev)):
        times = []
        for _ in range(6):
            clock = Clock()
            sync()
            clock.mark()
            dst.copy_(src, non_blocking=CUDA)
            clock.mark()
            times.append(clock.spans()[0])
        out.append(nbytes / (statistics.median(times[1:]) * 1e-3) / 1e9)
    return out


@contextlib.contextmanager
def exclusive_tiers():
    """Runtimes created inside have exclusive tiers (TIERMEM_DRAM_INCLUSIVE=off)."""
    saved = os.environ.get("TIERMEM_DRAM_INCLUSIVE")
    os.environ["TIERMEM_DRAM_INCLUSIVE"] = "off"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TIERMEM_DRAM_INCLUSIVE"]
        else:
            os.environ["TIERMEM_DRAM_INCLUSIVE"] = saved


def nvme_gbps(swap, nbytes):
    """Through tiermem, in this run: a DRAM copy offloaded to NVMe (write) and prefetched back
    (read), median of 3, in GB/s."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    # Exclusive DRAM for the probe: its prefetch must read NVMe, not a clean DRAM copy.
    with exclusive_tiers(), tiermem.Runtime(dram_bytes=2 * nbytes + 64 * MIB, nvme_paths=swap,
                         nvme_bytes=2 * nbytes + 64 * MIB, hbm_bytes="64MiB",
                         device="emulated", prefetch_depth=0) as rt:
        t = rt.tensor(nbytes, "activation", "dram", "nvme-probe")
        w, r = nvme_round_trips(t, src.data_ptr(), nbytes, 3)
        t.destroy()
    if None in w + r:
        raise RuntimeError("the NVMe probe's moves did not all reach the drive: %r, %r" % (w, r))
    return statistics.median(w) / 1e9, statistics.median(r) / 1e9


def in_round(mode, values, r):
    """The values of `mode`'s steps (one of its fwd, bwd, step lists) recorded in round r."""
    return [v for v, rr in zip(values, mode.rounds) if rr == r]


def bound_ms(mode, link, nvme, r=None):
    """The overlap bound of a mode (see the module docstring), from its bytes per step; with the
    plain step's compute of round r alone when r is given, else of every round."""
    d2h, h2d, nw, nr = mode.per_step()
    plain = mode.plain
    fwd = statistics.median(plain.fwd if r is None else in_round(plain, plain.fwd, r))
    bwd = statistics.median(plain.bwd if r is None else in_round(plain, plain.bwd, r))
    f = max(fwd, 1e3 * d2h / (link[1] * 1e9), 1e3 * nw / (nvme[0] * 1e9))
    b = max(bwd, 1e3 * h2d / (link[0] * 1e9), 1e3 * nr / (nvme[1] * 1e9))
    return f + b


def round_ratios(mode, link, nvme, against=None):
    """Per round: the median of `mode`'s steps in it over its bound from that round's plain
    steps, or over the median of `against`'s steps in that round."""
    out = []
    for r in sorted(set(mode.rounds)):
        step = statistics.median(in_round(mode, mode.step, r))
        if against is None:
            out.append(step / bound_ms(mode, link, nvme, r))
        else:
            out.append(step / statistics.median(in_round(against, against.step, r)))
    return out


def print_ratio(kind, name, ratios):
    """`kind NAME median` and, as info, the per-round values it is the median of."""
    print("%s %s %.3f" % (kind, name, statistics.median(ratios)))
    print("info %s_per_round %s" % (name, " ".join("%.3f" % v for v in ratios)))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the mode order rotated")
    ap.add_argument("--steps", type=int, default=3, help="steps of each mode per round")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps of each mode first")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--param-hidden", type=int, default=None,
                    help="hidden size of the parameter-offload model (default: --hidden)")
    ap.add_argument("--min-bytes", type=int, default=16384,
                    help="offload_saved_tensors' min_bytes, and the like-for-like rows'")
    ap.add_argument("--nvme-dir", default=None)
    ap.add_argument("--dram-bytes", default="1GiB", help="the DRAM run's DRAM budget")
    ap.add_argument("--nvme-bytes", default="4GiB", help="each run's NVMe budget")
    ap.add_argument("--nvme-run-dram-bytes", default="16MiB",
                    help="the NVMe run's DRAM budget (small: every saved tensor goes to NVMe)")
    ap.add_argument("--probe-mib", type=int, default=None,
                    help="bytes of the link and NVMe measurements (default 256 GPU, 64 CPU)")
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error("--rounds must be at least 3 (the order is rotated over them)")
    return args


def make_modes(args, swap, stack):
    torch.manual_seed(0)
    model = TinyGPT(vocab=1024, seq=args.seq, hidden=args.hidden, heads=8,
                    blocks=args.blocks).to(DEVICE)
    x, y = next(batches(1, args.batch, args.seq, 1024))
    data = (x.to(DEVICE), y.to(DEVICE))
    rt_dram = stack(tiermem.Runtime(dram_bytes=args.dram_bytes, nvme_paths=swap,
                                    nvme_bytes=args.nvme_bytes, hbm_bytes="256MiB"))
    rt_nvme = stack(tiermem.Runtime(dram_bytes=args.nvme_run_dram_bytes, nvme_paths=swap,
                                    nvme_bytes=args.nvme_bytes, hbm_bytes="256MiB"))
    # The same NVMe run with exclusive tiers, side by side: what inclusive DRAM's clean copies
    # save (backward reads them instead of NVMe).
    with exclusive_tiers():
        rt_nvme_excl = stack(tiermem.Runtime(dram_bytes=args.nvme_run_dram_bytes, nvme_paths=swap,
                                             nvme_bytes=args.nvme_bytes, hbm_bytes="256MiB"))
    mb = args.min_bytes
    plain = Mode("plain", model, data)
    modes = [
        plain,
        Mode("save_on_cpu", model, data, lambda: CountingSaveOnCpu(pin_memory=True),
             label="stock, pin_memory=True: packs every saved tensor, weights too (moves more)"),
        Mode("save_on_cpu same", model, data, lambda: SaveOnCpuLikeForLike(mb),
             label="save_on_cpu's copies over tiermem's tensors (like for like)"),
        Mode("side-stream ref", model, data, lambda: SideStreamReference(mb),
             label="the reference: torchtune-style side stream, on-demand reload"),
        Mode("tiermem dram", model, data, lambda: tt.offload_saved_tensors(rt_dram, "dram", mb),
             runtime=rt_dram),
        Mode("tiermem nvme", model, data, lambda: tt.offload_saved_tensors(rt_nvme, "nvme", mb),
             runtime=rt_nvme),
        Mode("tiermem nvme excl", model, data,
             lambda: tt.offload_saved_tensors(rt_nvme_excl, "nvme", mb), runtime=rt_nvme_excl,
             label="the same with exclusive tiers (TIERMEM_DRAM_INCLUSIVE=off)"),
    ]
    # Parameter offload: a second model, its parameters 4x the HBM budget of its runtime.
    torch.manual_seed(0)
    big = TinyGPT(vocab=1024, seq=args.seq, hidden=args.param_hidden or args.hidden, heads=8,
                  blocks=args.blocks).to(DEVICE)
    pbytes = sum(p.numel() * p.element_size() for p in big.parameters())
    budget = -(-pbytes // 4 // 4096) * 4096  # a quarter of the parameters, in whole pages
    rt_params = stack(tiermem.Runtime(dram_bytes=2 * pbytes + 256 * MIB, nvme_paths=swap,
                                      nvme_bytes=args.nvme_bytes, hbm_bytes=budget))
    # Its plain row runs an identical model of its own: offload_parameters hooks the modules of
    # the one it offloads, so running that one would offload in the plain row too.
    torch.manual_seed(0)
    big_ref = TinyGPT(vocab=1024, seq=args.seq, hidden=args.param_hidden or args.hidden, heads=8,
                      blocks=args.blocks).to(DEVICE)
    big_plain = Mode("params plain", big_ref, data,
                     label="the same model (a copy), all parameters resident")
    off = Mode("params offload", big, data, runtime=rt_params,
               label="offload_parameters, parameters %.1f MiB = %.1fx the %.1f MiB HBM budget" %
               (pbytes / MIB, pbytes / budget, budget / MIB))
    off.handle = tt.offload_parameters(big, rt_params, "dram")
    # The same with the parameters copied into torch's memory instead of viewing their HBM
    # copies (views=False), on a copy of the model with its own runtime: what the views save.
    torch.manual_seed(0)
    big_copies = TinyGPT(vocab=1024, seq=args.seq, hidden=args.param_hidden or args.hidden,
                         heads=8, blocks=args.blocks).to(DEVICE)
    rt_copies = stack(tiermem.Runtime(dram_bytes=2 * pbytes + 256 * MIB, nvme_paths=swap,
                                      nvme_bytes=args.nvme_bytes, hbm_bytes=budget))
    copied = Mode("params copies", big_copies, data, runtime=rt_copies,
                  label="the same, views=False: each parameter copied into torch's memory")
    copied.handle = tt.offload_parameters(big_copies, rt_copies, "dram", views=False)
    modes += [big_plain, off, copied]
    for m in modes:
        m.plain = big_plain if m.model in (big, big_copies, big_ref) else plain
    return modes, pbytes


def report(args, modes, link, nvme, pbytes):
    print("offload_bench: GPT hidden %d, %d blocks, seq %d, batch %d on %s (torch %s); "
          "%d rounds x %d steps per mode after %d warm-up, mode order rotated each round; "
          "medians [min-max]" % (args.hidden, args.blocks, args.seq, args.batch,
                                 torch.cuda.get_device_name() if CUDA else "cpu",
                                 torch.__version__, args.rounds, args.steps, args.warmup))
    what = "pinned cudaMemcpyAsync" if CUDA else "host memory copy (a CPU run has no link)"
    print("link (%s, this run): H2D %.2f GB/s, D2H %.2f GB/s; NVMe through tiermem (this run): "
          "write %.2f GB/s, read %.2f GB/s" % (what, link[0], link[1], nvme[0], nvme[1]))
    print("%-17s %9s %9s %21s %9s %9s %9s %9s %9s %6s %8s" %
          ("mode", "fwd ms", "bwd ms", "step ms [min-max]", "D2H MiB", "H2D MiB", "NVMe w",
           "NVMe r", "bound ms", "/bound", "/plain"))
    for m in modes:
        step = statistics.median(m.step)
        bound = bound_ms(m, link, nvme)
        d2h, h2d, nw, nr = m.per_step()
        print("%-17s %9.2f %9.2f %9.2f [%.1f-%.1f] %9.1f %9.1f %9.1f %9.1f %9.2f %6.2f %8.2f" %
              (m.name, statistics.median(m.fwd), statistics.median(m.bwd), step, min(m.step),
               max(m.step), d2h / MIB, h2d / MIB, nw / MIB, nr / MIB, bound, step / bound,
               step / statistics.median(m.plain.step)))
    for m in modes:
        if m.label:
            print("  %s: %s" % (m.name, m.label))
    for m in modes:
        if m.runtime is not None and "nvme" in m.name:
            print("  %s: %.1f MiB a step read back from clean DRAM copies instead of NVMe "
                  "(inclusive DRAM, TIERMEM_DRAM_INCLUSIVE=%s)" %
                  (m.name, m.clean / max(1, m.steps_counted) / MIB,
                   m.runtime.config_value("TIERMEM_DRAM_INCLUSIVE")))
    same = next(m for m in modes if m.name == "save_on_cpu same").per_step()[0]
    for m in modes:
        if m.check is not None and m.check != same:
            print("  NOTE %s packed %.1f MiB a step, the like-for-like rows %.1f MiB: tiermem "
                  "copies a tensor saved twice once and a view's whole span, save_on_cpu each "
                  "save's elements" %
                  (m.name, m.check / MIB, same / MIB))
    for m in modes:
        if m.check is not None and m.per_step()[0] < m.check:
            print("  NOTE %s: %.1f MiB a step counted leaving the device, %.1f MiB packed: some "
                  "bytes moved by a path the bench does not count (its bound is then too low)" %
                  (m.name, m.per_step()[0] / MIB, m.check / MIB))
    print("  params: %.1f MiB of parameters; the bound counts the bytes moved as measured" %
          (pbytes / MIB))
    runs = args.warmup + args.rounds * args.steps
    for m in modes:
        h = getattr(m, "handle", None)
        if h is not None:
            print("  %s: a step brings %.1f parameters in as views of their HBM copies, %.1f by "
                  "a copy (no room in HBM, or views=False)" % (m.name, h.views / runs,
                                                              h.copies / runs))
    if CUDA:
        for m in modes:
            if m.name.startswith("params"):
                print("  %s: peak CUDA memory in a step %.1f MiB (torch's allocator: parameters, "
                      "activations and gradients)" % (m.name, m.peak / MIB))
    by = {m.name: m for m in modes}

    def per_round(name, against=None):
        return round_ratios(by[name], link, nvme, by[against] if against else None)

    print_ratio("ratio", "dram_step_over_bound", per_round("tiermem dram"))
    print_ratio("ratio", "dram_step_over_reference", per_round("tiermem dram", "side-stream ref"))
    # Shown, not gated (no target): `info` lines, so that every `ratio` line has a target.
    print_ratio("info", "dram_step_over_like_for_like",
                per_round("tiermem dram", "save_on_cpu same"))
    print_ratio("ratio", "nvme_step_over_bound", per_round("tiermem nvme"))
    print_ratio("info", "nvme_inclusive_step_over_exclusive",
                per_round("tiermem nvme", "tiermem nvme excl"))
    print_ratio("ratio", "params_step_over_bound", per_round("params offload"))
    print_ratio("info", "params_views_step_over_copies", per_round("params offload",
                                                                   "params copies"))


def main():
    args = parse_args()
    probe = (args.probe_mib or (256 if CUDA else 64)) * MIB
    opened = []
    with tempfile.TemporaryDirectory(dir=args.nvme_dir) as swap:
        try:
            modes, pbytes = make_modes(args, swap, lambda rt: opened.append(rt) or rt)
            for _ in range(args.warmup):
                for m in modes:
                    m.run(record=False)
            link = link_gbps(probe)
            nvme = nvme_gbps(swap, probe)
            for r in range(args.rounds):
                order = modes[r % len(modes):] + modes[:r % len(modes)]
                for m in order:
                    m.round = r
                    for _ in range(args.steps):
                        m.run(record=True)
            report(args, modes, link, nvme, pbytes)
            for m in modes:
                if hasattr(m, "handle"):
                    m.handle.remove()
        finally:
            for rt in opened:
                rt.close()


if __name__ == "__main__":
    main()
