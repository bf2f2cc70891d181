#!/usr/bin/env python3
"""A small PyTorch training with each of tiermem's offloads, against plain torch, run from an
installed tiermem (tools/wheel/check.sh runs it from a clean venv outside the checkout, and
tools/fresh_root_wheel.sh in a fresh root). Exits 1 naming any offload that trained differently.

Each run trains the same MLP on the same batches for --steps steps, its tensors in tiermem on
NVMe (a swap file in a temporary directory) with a DRAM tier too small to hold them:
  offload_saved_tensors     activations, torch.optim.Adam           bit-identical to plain
  offload_optimizer_state   Adam's moments                          bit-identical to plain
  offload_parameters        the parameters (ZeRO-Infinity)          bit-identical to plain
  CPUAdam                   the step on the CPU, its state on NVMe  the loss curve of AdamW
                                                                    within 1e-5 relative

    python3 train_check.py [--steps 6] [--nvme-dir DIR]
"""

import argparse
import sys
import tempfile

import torch
from torch import nn

import tiermem
import tiermem.torch as tt

HIDDEN, BATCH = 256, 64


def model():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.GELU()) for _ in range(4)],
                         nn.Linear(HIDDEN, 1))


def batches(steps):
    """One batch, seen every step: the loss must fall."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, HIDDEN, generator=g)
    return [(x, x[:, :8].sum(1, keepdim=True))] * steps


def train(m, step, data, saved=None):
    """The losses of a training on `data`; `step` steps the optimizer and zeroes the gradients;
    `saved`, when given, makes the context the forward runs in."""
    losses = []
    for x, y in data:
        if saved is None:
            loss = nn.functional.mse_loss(m(x), y)
        else:
            with saved():
                loss = nn.functional.mse_loss(m(x), y)
        loss.backward()
        step()
        losses.append(loss.item())
    return losses


def params_of(m):
    return [p.detach().clone() for p in m.parameters()]


def plain(data, adamw=False):
    m = model()
    opt = (torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01, foreach=False) if adamw
           else torch.optim.Adam(m.parameters(), lr=1e-3))
    losses = train(m, lambda: (opt.step(), opt.zero_grad()), data)
    return losses, params_of(m)


def saved_tensors(rt, data):
    m = model()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    ctx = {}

    def saved():
        ctx["last"] = tt.offload_saved_tensors(rt, tier="nvme", min_bytes=4096)
        return ctx["last"]
    losses = train(m, lambda: (opt.step(), opt.zero_grad()), data, saved)
    if ctx["last"].packed == 0:
        raise AssertionError("offload_saved_tensors packed no tensor")
    return losses, params_of(m)


def optimizer_state(rt, data):
    m = model()
    opt = tt.offload_optimizer_state(torch.optim.Adam(m.parameters(), lr=1e-3), rt, tier="nvme")
    losses = train(m, lambda: (opt.step(), opt.zero_grad()), data)
    if not opt.records:
        raise AssertionError("offload_optimizer_state holds no state tensor")
    return losses, params_of(m)


def parameters(rt, data):
    m = model()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    held = tt.offload_parameters(m, rt, tier="nvme", optimizer=opt, units={nn.Sequential})
    losses = train(m, lambda: (opt.step(), opt.zero_grad()), data)
    if not held.records:
        raise AssertionError("offload_parameters holds no parameter")
    with held.gathered():
        got = params_of(m)
    held.remove()
    return losses, got


def cpu_adam(rt, data):
    m = model()
    opt = tt.CPUAdam(m.parameters(), lr=1e-3, weight_decay=0.01, runtime=rt, state_tier="nvme")
    losses = train(m, lambda: (opt.step(), opt.zero_grad()), data)
    return losses, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--nvme-dir", default=None, help="swap file directory (default: a temp dir)")
    args = ap.parse_args()
    data = batches(args.steps)
    want_losses, want_params = plain(data)
    adamw_losses, _ = plain(data, adamw=True)
    print("tiermem %s from %s; torch %s" % (".".join(map(str, tiermem.version())),
                                           tiermem.library_path(), torch.__version__))
    failed = []
    for name, run in (("offload_saved_tensors", saved_tensors),
                      ("offload_optimizer_state", optimizer_state),
                      ("offload_parameters", parameters), ("CPUAdam", cpu_adam)):
        with tempfile.TemporaryDirectory(dir=args.nvme_dir) as swap, \
                tiermem.Runtime(dram_bytes="256KiB", nvme_paths=swap, nvme_bytes="256MiB",
                                hbm_bytes="64MiB") as rt:
            losses, got = run(rt, data)
            moved = rt.stats()["bytes_moved"]
            to_nvme = moved["dram"]["nvme"]
        if got is None:  # CPUAdam: the curve of AdamW, not its bits
            worst = max(abs(a - b) / abs(b) for a, b in zip(losses, adamw_losses))
            ok = worst <= 1e-5 and losses[-1] < losses[0]
            how = "loss curve within %.2g of AdamW's" % worst
        else:
            ok = losses == want_losses and all(torch.equal(a, b) for a, b in zip(got, want_params))
            how = "bit-identical to plain torch" if ok else "differs from plain torch"
        ok = ok and to_nvme > 0
        print("%-24s %s  loss %.5f -> %.5f, %d KiB to NVMe: %s" %
              (name, "ok  " if ok else "FAIL", losses[0], losses[-1], to_nvme >> 10, how))
        if not ok:
            failed.append(name)
    if failed:
        print("train_check: FAILED: " + ", ".join(failed))
        return 1
    print("train_check: every offload trained as plain torch does")
    return 0


if __name__ == "__main__":
    sys.exit(main())
