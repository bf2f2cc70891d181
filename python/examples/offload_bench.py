#!/usr/bin/env python3
"""Per-step time of one GPT training step: plain, torch.autograd.graph.save_on_cpu, and tiermem's
saved-tensor offload to DRAM and to NVMe, interleaved (one step of each in turn, so drift hits
all alike), medians over --steps after --warmup. Prints the ratios to plain and save_on_cpu.

    python3 python/examples/offload_bench.py [--steps 20] [--nvme-dir /var/tmp]
"""

import argparse
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
    sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402
from tinygpt import TinyGPT, batches  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--nvme-dir", default=None)
    ap.add_argument("--dram-bytes", default="1GiB", help="the DRAM run's DRAM budget")
    ap.add_argument("--nvme-bytes", default="4GiB", help="each run's NVMe budget")
    ap.add_argument("--nvme-run-dram-bytes", default="16MiB",
                    help="the NVMe run's DRAM budget (small: every saved tensor goes to NVMe)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = TinyGPT(vocab=1024, seq=args.seq, hidden=args.hidden, heads=8,
                    blocks=args.blocks).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x, y = next(batches(1, args.batch, args.seq, 1024))
    x, y = x.to(device), y.to(device)
    pin = device == "cuda"

    with tempfile.TemporaryDirectory(dir=args.nvme_dir) as swap, \
            tiermem.Runtime(dram_bytes=args.dram_bytes, nvme_paths=swap,
                            nvme_bytes=args.nvme_bytes, hbm_bytes="256MiB") as rt_dram, \
            tiermem.Runtime(dram_bytes=args.nvme_run_dram_bytes, nvme_paths=swap,
                            nvme_bytes=args.nvme_bytes,
                            hbm_bytes="256MiB") as rt_nvme:
        modes = {
            "plain": lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t),
            "save_on_cpu": lambda: torch.autograd.graph.save_on_cpu(pin_memory=pin),
            "tiermem dram": lambda: tt.offload_saved_tensors(rt_dram, "dram"),
            "tiermem nvme": lambda: tt.offload_saved_tensors(rt_nvme, "nvme"),
        }
        steps = {"tiermem dram": rt_dram, "tiermem nvme": rt_nvme}
        times = {m: [] for m in modes}
        saved = {}
        for i in range(args.warmup + args.steps):
            for name, make in modes.items():
                rt = steps.get(name)
                if device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                if rt is not None:
                    rt.step_begin()
                hooks = make()
                with hooks:
                    loss = model(x, y)
                loss.backward()
                opt.zero_grad(set_to_none=True)  # no step: every mode runs the same weights
                if rt is not None:
                    rt.step_end()
                    saved[name] = hooks.packed_bytes
                if device == "cuda":
                    torch.cuda.synchronize()
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - t0)
        med = {m: statistics.median(t) for m, t in times.items()}
        moved = rt_nvme.stats()["bytes_moved"]
    print("GPT hidden %d, %d blocks, seq %d, batch %d on %s; %d steps after %d warm-up, "
          "medians; %.1f MiB saved per step" %
          (args.hidden, args.blocks, args.seq, args.batch, device, args.steps, args.warmup,
           saved["tiermem dram"] / (1 << 20)))
    for m in modes:
        print("  %-13s %8.2f ms   x%.3f of plain   x%.3f of save_on_cpu" %
              (m, 1e3 * med[m], med[m] / med["plain"], med[m] / med["save_on_cpu"]))
    print("  nvme run: dram->nvme %.1f MiB, nvme->dram %.1f MiB over all its steps" %
          (moved["dram"]["nvme"] / (1 << 20), moved["nvme"]["dram"] / (1 << 20)))


if __name__ == "__main__":
    main()
