#!/usr/bin/env python3
"""Trains a small GPT a few steps with tiermem's three offloads (activations, optimizer state,
parameters) and prints what moved where. Runs on CPU (the emulated device) or CUDA.

    python3 python/examples/gpt_offload.py [--tier nvme] [--nvme-dir /var/tmp] [--steps 5]

The model is defined here, from stock torch.nn modules, so that this file is all there is to
read: tiermem needs nothing of the model but its modules and parameters.
"""

import argparse
import os
import sys
import tempfile
import time

try:
    import tiermem  # installed (cmake --install, pip install ./python)
except ImportError:  # run from a source tree: the package is in <root>/python
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402


class SmallGPT(nn.Module):
    """A decoder-only transformer: token and position embeddings, pre-norm
    nn.TransformerEncoderLayer blocks (attention under a causal mask, a GELU feed-forward), a final
    LayerNorm and a linear head. forward(tokens, targets) returns the next-token loss. The blocks
    are an nn.ModuleList (TransformerEncoder.layers), which offload_parameters brings in one at a
    time by default."""

    def __init__(self, vocab, seq, hidden, heads, blocks, dropout=0.1):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, hidden)
        self.position_embedding = nn.Embedding(seq, hidden)
        block = nn.TransformerEncoderLayer(hidden, heads, dim_feedforward=4 * hidden,
                                           dropout=dropout, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.decoder = nn.TransformerEncoder(block, blocks, enable_nested_tensor=False)
        self.final_norm = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens, targets):
        length = tokens.shape[1]
        positions = torch.arange(length, device=tokens.device)
        h = self.token_embedding(tokens) + self.position_embedding(positions)
        causal = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        h = self.decoder(h, mask=causal, is_causal=True)
        logits = self.lm_head(self.final_norm(h))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def token_batches(count, batch, seq, vocab):
    """count (inputs, next tokens) pairs of random tokens, the same on every run."""
    rng = torch.Generator().manual_seed(2024)
    for _ in range(count):
        tokens = torch.randint(vocab, (batch, seq + 1), generator=rng)
        yield tokens[:, :seq], tokens[:, 1:]


def mib(n):
    return "%.1f MiB" % (n / (1 << 20))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "),
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--tier", choices=["dram", "nvme"], default="nvme",
                    help="where the offloads go")
    ap.add_argument("--steps", type=int, default=5, help="training steps")
    ap.add_argument("--nvme-dir", default=None, help="swap file directory (none: a temporary one)")
    ap.add_argument("--dram", default="8MiB", help="DRAM tier budget")
    args = ap.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = SmallGPT(vocab=512, seq=64, hidden=128, heads=4, blocks=4).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with tempfile.TemporaryDirectory(dir=args.nvme_dir) as swap, \
            tiermem.Runtime(dram_bytes=args.dram, nvme_paths=swap, nvme_bytes="1GiB",
                            hbm_bytes="64MiB") as rt:
        info = rt.info()
        print("tiermem %s (%s): %s, DRAM %s, NVMe %s in %s" %
              (".".join(map(str, tiermem.version())), tiermem.library_path(),
               info["device_name"], mib(info["tier_bytes"]["dram"]),
               mib(info["tier_bytes"]["nvme"]), swap))
        params = tt.offload_parameters(model, rt, args.tier, optimizer=opt)
        state = tt.offload_optimizer_state(opt, rt, args.tier)
        for i, (x, y) in enumerate(token_batches(args.steps, 8, 64, 512)):
            x, y = x.to(device), y.to(device)
            t0 = time.perf_counter()
            with rt.step():
                saved = tt.offload_saved_tensors(rt, args.tier)
                with saved:
                    loss = model(x, y)
                loss.backward()
                state.step()  # the optimizer's step, bucket by bucket with its state in
                opt.zero_grad()
            s = rt.stats()
            print("step %d  loss %.4f  %6.1f ms  saved %3d tensors (%s)  prefetches so far %d" %
                  (i + 1, loss.item(), 1e3 * (time.perf_counter() - t0), saved.packed,
                   mib(saved.packed_bytes), s["prefetches"]))
        held = (len(params.records), sum(len(v) for v in state.records.values()))
        # Handed back to the model and the optimizer before the figures are read, so that they
        # are the whole run's, as a TIERMEM_TRACE of it (written when the runtime closes) sums.
        params.remove()
        state.remove()
        s = rt.stats()
        print("\nheld by tiermem: %d parameters, %d optimizer state tensors" % held)
        print("moved (all steps, and the parameters and state handed back):")
        for a in tiermem._capi.TIER_NAMES:
            for b in tiermem._capi.TIER_NAMES:
                if s["bytes_moved"][a][b]:
                    print("  %-4s -> %-4s %s" % (a, b, mib(s["bytes_moved"][a][b])))
        print("peak use: " + ", ".join("%s %s of %s" % (n, mib(t["peak"]), mib(t["capacity"]))
                                      for n, t in s["tiers"].items()))
        print("scheduled prefetches %d (dropped %d), evictions %d (%s), schedule of %d uses" %
              (s["prefetches"], s["prefetches_dropped"], s["evictions"],
               mib(s["eviction_bytes"]), s["schedule_length"]))


if __name__ == "__main__":
    main()
