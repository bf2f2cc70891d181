#!/usr/bin/env python3
"""GPU activation offload: tiermem against torchtune's OffloadActivations and save_on_cpu, on the
same tensors, side by side in one run.

One GPT training step (forward + backward of bench/tinygpt.py's model, no optimizer
step, so that every side runs the same weights on the same batch) under each of:

  plain              no hooks: the compute alone
  torchtune          torchtune.training.OffloadActivations (torchtune 0.6.1, its code as shipped:
                     copies to pinned memory on a side stream, a stash of 5, reloads on a side
                     stream), one instance entered every step as torchtune's recipes do, with
                     min_offload_size = --min-bytes so that it offloads what tiermem offloads
  save_on_cpu same   save_on_cpu's mechanism (a pinned host tensor per saved tensor, copied back
                     with non_blocking) over tiermem's selection (bench/offload_hooks.py)
  save_on_cpu        stock torch.autograd.graph.save_on_cpu(pin_memory=True): every saved tensor,
                     the weights too, so it moves more (shown, not compared)
  tiermem dram       tiermem.torch.offload_saved_tensors(rt, "dram", --min-bytes)

The same tensors: torchtune offloads what is --min-bytes or larger and not a Parameter or Buffer,
tiermem what is --min-bytes or larger and not a parameter or a view of one; the bench counts the
bytes each side moved down and back every step and prints a NOTE when torchtune's and tiermem's
differ. Every side runs --rounds rounds (at least 3) of --steps steps after --warmup untimed steps,
the order rotated each round; each clock starts and stops on a synchronized device with tiermem's
copies done (bench/offload_bench.py's Mode, whose rows this reuses); medians with the min-max
spread.

Overlap bound of a side: offload_bench.py's (bound_ms): max(plain forward, D2H bytes / D2H link)
+ max(plain backward, H2D bytes / H2D link), the plain step's forward and backward and the
pinned-copy link all measured in this run. The gated ratios are medians over the rounds of each
round's ratio (offload_bench.py's round_ratios): `ratio act_tiermem_over_torchtune` (tiermem's
step / torchtune's; tools/gpu_check_judge.sh wants <= 1.0) and `ratio act_tiermem_over_bound`
(<= 1.15); the per-round values and the other sides' ratios follow as `info` lines.

Why torchtune's module is loaded without torchtune's package __init__ files: torchtune 0.6.1's
torchtune/__init__.py imports its datasets (Hugging Face datasets, pyarrow, ...) and
torchtune/training/__init__.py its quantization recipes, which import names torchao 0.17 removed
(int4_weight_only); the offloading module itself needs only torchtune.modules, torchtune.utils,
torchao and psutil. load_offload_activations() runs torchtune/training/_activation_offloading.py
unmodified under its own name, with bare parent packages.

Needs CUDA: without it (torchtune's OffloadActivations takes CUDA streams) it prints `skip: ...`
and exits 77. tiermem against save_on_cpu on a CPU is offload_bench.py's CPU run (no link there,
so no overlap to measure). `--check-imports` imports the peers and exits (on any machine).

    python3 bench/peers/activation_offload.py [--hidden 1024] [--blocks 4] [--seq 512]
        [--batch 4] [--rounds 5] [--steps 3] [--warmup 2] [--min-bytes 16384]
"""

import argparse
import importlib
import importlib.util
import os
import statistics
import sys
import tempfile
import types

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))  # tinygpt, offload_bench, offload_hooks
try:
    import tiermem  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402

MIB = 1 << 20


def load_offload_activations():
    """torchtune's OffloadActivations class, from its module as installed (see the docstring)."""
    spec = importlib.util.find_spec("torchtune")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("torchtune is not installed (bench/peers/requirements.txt)")
    base = list(spec.submodule_search_locations)[0]
    name = "torchtune.training._activation_offloading"
    if name in sys.modules:
        return sys.modules[name].OffloadActivations
    for pkg, path in (("torchtune", base), ("torchtune.training", os.path.join(base, "training"))):
        if pkg not in sys.modules:  # a bare package: its submodules load, its __init__ does not
            m = types.ModuleType(pkg)
            m.__path__ = [path]
            m.__file__ = os.path.join(path, "__init__.py")
            sys.modules[pkg] = m
    return importlib.import_module(name).OffloadActivations


def versions():
    """The peers' versions, as their distributions say."""
    from importlib.metadata import PackageNotFoundError, version
    out = []
    for dist in ("torch", "torchtune", "torchao"):
        try:
            out.append("%s %s" % (dist, version(dist)))
        except PackageNotFoundError:
            out.append("%s ?" % dist)
    return ", ".join(out)


def counting_offload_activations(min_bytes):
    """One torchtune OffloadActivations, counting the bytes it copied down (packed_bytes) and
    back (unpacked_bytes: only reloads from the host; a tensor still in its forward stash is
    handed back as it is), reset by reset()."""
    OffloadActivations = load_offload_activations()

    class Counting(OffloadActivations):
        def __init__(self):
            super().__init__(min_offload_size=min_bytes)
            pack, unpack = self.pack_hook, self.unpack_hook

            def counted_pack(t):
                tid = pack(t)
                if self.tracker[tid][1]:  # True: copied to the host
                    self.packed_bytes += t.numel() * t.element_size()
                return tid

            def counted_unpack(tid):
                host, offloaded = self.tracker[tid]
                if offloaded and tid not in getattr(self, "fwd_stash", {}):
                    self.unpacked_bytes += host.numel() * host.element_size()
                return unpack(tid)

            self.pack_hook, self.unpack_hook = counted_pack, counted_unpack
            self.reset()

        def reset(self):
            self.packed_bytes = self.unpacked_bytes = 0
            return self

    return Counting()


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5, help="rounds, the side order rotated")
    ap.add_argument("--steps", type=int, default=3, help="timed steps of each side per round")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps of each side first")
    ap.add_argument("--min-bytes", type=int, default=16384,
                    help="tiermem's min_bytes and torchtune's min_offload_size")
    ap.add_argument("--dram-bytes", default="4GiB", help="tiermem's DRAM budget")
    ap.add_argument("--probe-mib", type=int, default=256, help="bytes of the link measurement")
    ap.add_argument("--nvme-dir", default=None, help="where tiermem's runtime keeps swap files")
    ap.add_argument("--check-imports", action="store_true",
                    help="import the peers, print their versions and exit")
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error("--rounds must be at least 3 (the order is rotated over them)")
    return args


def main():
    args = parse_args()
    if args.check_imports:  # everything the GPU run imports
        load_offload_activations()
        import tiermem.torch  # noqa: F401
        import offload_bench  # noqa: F401
        import offload_hooks  # noqa: F401
        import tinygpt  # noqa: F401
        print("imports: torchtune OffloadActivations, tiermem.torch, offload_bench, "
              "offload_hooks, tinygpt (%s)" % versions())
        return 0
    if not torch.cuda.is_available():
        print("skip: no CUDA device (torch %s): torchtune's OffloadActivations copies on CUDA "
              "streams; tiermem against save_on_cpu on the CPU is bench/offload_bench.py's "
              "CPU run" % torch.__version__, flush=True)
        return 77

    import tiermem
    import tiermem.torch as tt
    from offload_bench import Mode, bound_ms, link_gbps, round_ratios
    from offload_hooks import CountingSaveOnCpu, SaveOnCpuLikeForLike
    from tinygpt import TinyGPT, batches

    tune = counting_offload_activations(args.min_bytes)
    torch.manual_seed(0)
    model = TinyGPT(vocab=1024, seq=args.seq, hidden=args.hidden, heads=args.heads,
                    blocks=args.blocks).cuda()
    x, y = next(batches(1, args.batch, args.seq, 1024))
    data = (x.cuda(), y.cuda())
    mb = args.min_bytes
    with tempfile.TemporaryDirectory(dir=args.nvme_dir) as swap, \
            tiermem.Runtime(dram_bytes=args.dram_bytes, nvme_paths=swap, nvme_bytes="8GiB",
                            hbm_bytes="256MiB") as rt:
        plain = Mode("plain", model, data)
        sides = [
            plain,
            Mode("torchtune", model, data, tune.reset,
                 label="torchtune.training.OffloadActivations(min_offload_size=%d), one "
                       "instance entered every step" % mb),
            Mode("save_on_cpu same", model, data, lambda: SaveOnCpuLikeForLike(mb),
                 label="save_on_cpu's copies over tiermem's tensors (like for like)"),
            Mode("save_on_cpu", model, data, lambda: CountingSaveOnCpu(pin_memory=True),
                 label="stock, pin_memory=True: every saved tensor, weights too (moves more)"),
            Mode("tiermem dram", model, data,
                 lambda: tt.offload_saved_tensors(rt, "dram", mb), runtime=rt,
                 label="tiermem.torch.offload_saved_tensors(rt, \"dram\", %d)" % mb),
        ]
        for s in sides:
            s.plain = plain
        for _ in range(args.warmup):
            for s in sides:
                s.run(record=False)
        link = link_gbps(args.probe_mib * MIB)
        nvme = (1.0, 1.0)  # no NVMe bytes: the bound's NVMe terms are 0
        for r in range(args.rounds):
            k = r % len(sides)
            for s in sides[k:] + sides[:k]:
                s.round = r
                for _ in range(args.steps):
                    s.run(record=True)
        report(args, sides, link, nvme, bound_ms, round_ratios)
    return 0


def report(args, sides, link, nvme, bound_ms, round_ratios):
    by = {s.name: s for s in sides}
    print("activation_offload: GPT hidden %d, %d blocks, seq %d, batch %d on %s (%s); %d rounds "
          "x %d steps per side after %d warm-up, order rotated each round; medians [min-max]" %
          (args.hidden, args.blocks, args.seq, args.batch, torch.cuda.get_device_name(),
           versions(), args.rounds, args.steps, args.warmup))
    print("link (pinned cudaMemcpyAsync, this run): H2D %.2f GB/s, D2H %.2f GB/s" % tuple(link))
    print("%-17s %9s %9s %23s %9s %9s %9s %7s %8s" % (
        "side", "fwd ms", "bwd ms", "step ms [min-max]", "D2H MiB", "H2D MiB", "bound ms",
        "/bound", "/plain"))
    plain_step = statistics.median(by["plain"].step)
    for s in sides:
        step = statistics.median(s.step)
        bound = bound_ms(s, link, nvme)
        d2h, h2d, _, _ = s.per_step()
        print("%-17s %9.2f %9.2f %9.2f [%5.1f-%5.1f] %9.1f %9.1f %9.2f %7.3f %8.3f" % (
            s.name, statistics.median(s.fwd), statistics.median(s.bwd), step, min(s.step),
            max(s.step), d2h / MIB, h2d / MIB, bound, step / bound, step / plain_step))
    for s in sides:
        if s.label:
            print("  %s: %s" % (s.name, s.label))
    ours, theirs = by["tiermem dram"].per_step()[0], by["torchtune"].per_step()[0]
    if abs(ours - theirs) > 0.01 * max(ours, theirs):
        print("  NOTE tiermem moved %.1f MiB down a step, torchtune %.1f MiB: not the same "
              "tensors" % (ours / MIB, theirs / MIB))
    else:
        print("  same tensors: tiermem and torchtune each moved %.1f MiB down a step" %
              (ours / MIB))

    def line(kind, name, values):
        print("%s %s %.3f" % (kind, name, statistics.median(values)))
        print("info %s_per_round %s" % (name, " ".join("%.3f" % v for v in values)))

    line("ratio", "act_tiermem_over_torchtune",
         round_ratios(by["tiermem dram"], link, nvme, by["torchtune"]))
    line("ratio", "act_tiermem_over_bound", round_ratios(by["tiermem dram"], link, nvme))
    line("info", "act_torchtune_over_bound", round_ratios(by["torchtune"], link, nvme))
    line("info", "act_tiermem_over_save_on_cpu_same",
         round_ratios(by["tiermem dram"], link, nvme, by["save_on_cpu same"]))
    line("info", "act_tiermem_over_save_on_cpu",
         round_ratios(by["tiermem dram"], link, nvme, by["save_on_cpu"]))
    line("info", "act_tiermem_over_plain", round_ratios(by["tiermem dram"], link, nvme,
                                                        by["plain"]))


if __name__ == "__main__":
    sys.exit(main())
