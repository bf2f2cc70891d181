#!/usr/bin/env python3
"""The README's PyTorch snippet ("In your own training loop"), as written there, on a small model:
its parameters on NVMe (ZeRO-Infinity), Adam's state in DRAM (ZeRO-Offload), its activations in
DRAM. Budgets are the snippet's, made small; the NVMe path is a temporary directory. Prints the
losses and what moved; exits 1 if the loss did not fall or nothing reached NVMe.

    python3 readme_snippet.py [--nvme-dir DIR] [--steps 5]
"""

import argparse
import sys
import tempfile

import torch
from torch import nn

import tiermem
import tiermem.torch as tt


class Model(nn.Module):
    def __init__(self, hidden=256, blocks=4):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(hidden, hidden), nn.GELU())
                                    for _ in range(blocks))
        self.head = nn.Linear(hidden, 1)

    def forward(self, x, y):
        for b in self.blocks:
            x = b(x)
        return nn.functional.mse_loss(self.head(x), y)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nvme-dir", default=None)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = Model()
    x = torch.randn(64, 256)
    data = [(x, x[:, :8].sum(1, keepdim=True))] * args.steps
    losses = []
    with tempfile.TemporaryDirectory(dir=args.nvme_dir) as nvme:
        rt = tiermem.Runtime(dram_bytes="64MiB", nvme_paths=nvme)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        # From here on, the README's lines.
        tt.offload_parameters(model, rt, tier="nvme", optimizer=opt)    # ZeRO-Infinity
        opt = tt.offload_optimizer_state(opt, rt, tier="dram")          # ZeRO-Offload: opt wrapped
        for x, y in data:
            with rt.step():                                 # from step two, the schedule prefetches
                with tt.offload_saved_tensors(rt, tier="dram"):          # like save_on_cpu
                    loss = model(x, y)
                loss.backward()
                opt.step()                                  # bucket by bucket, the state brought in
                opt.zero_grad()
            losses.append(loss.item())
        moved = rt.stats()["bytes_moved"]
        rt.close()
    print("losses " + " ".join("%.4f" % v for v in losses))
    print("moved  " + ", ".join("%s->%s %d KiB" % (a, b, moved[a][b] >> 10)
                                for a in moved for b in moved[a] if moved[a][b]))
    ok = losses[-1] < losses[0] and moved["dram"]["nvme"] > 0
    print("readme_snippet: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
