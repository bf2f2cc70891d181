"""A tiny GPT (dropout on, fixed seed, deterministic algorithms) trained a few Adam steps gives
bit-identical losses and parameters with and without each offload, and all three at once, to
DRAM and to NVMe; bytes reach NVMe, the schedule is replayed, nothing is left behind."""

import gc

import pytest
import torch

import tiermem.torch as tt
from tinygpt import TinyGPT, batches

STEPS = 4


def train(rt=None, saved=None, optim=None, params=None, per_step=None, stepper="offload"):
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    model = TinyGPT(vocab=128, seq=32, hidden=64, heads=4, blocks=2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    handles = []
    if params:
        handles.append(tt.offload_parameters(model, rt, params, optimizer=opt))
    if optim:
        handles.append(tt.offload_optimizer_state(opt, rt, optim))
    # The offloads' bucketed step (the handle wraps the optimizer), or the optimizer's own
    # step (stepper="optimizer": everything offloaded brought in at once by its step hooks).
    step_with = handles[-1] if handles and stepper == "offload" else opt
    losses = []
    for x, y in batches(STEPS, 4, 32, 128):
        step = rt.step() if rt is not None else torch.autograd.graph.saved_tensors_hooks(
            lambda t: t, lambda t: t)
        with step:
            if saved:
                with tt.offload_saved_tensors(rt, saved, min_bytes=1024):
                    loss = model(x, y)
            else:
                loss = model(x, y)
            loss.backward()
            step_with.step()
            opt.zero_grad()
        losses.append(loss.item())
        if per_step is not None:
            per_step.append(rt.stats())
    for h in handles:
        h.remove()
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.fixture(scope="module")
def reference():
    return train()


CONFIGS = [
    dict(saved="dram"), dict(saved="nvme"),
    dict(optim="dram"), dict(optim="nvme"),
    dict(params="dram"), dict(params="nvme"),
    dict(saved="dram", optim="dram", params="dram"),
    dict(saved="nvme", optim="nvme", params="nvme"),
    dict(optim="nvme", params="nvme", stepper="optimizer"),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "+".join("%s-%s" % kv for kv in c.items()))
def test_bit_identical(make_runtime, reference, config):
    # DRAM 256 KiB (128 KiB beside staging): even "dram" spills to NVMe. Offloaded parameters
    # view their HBM copies while in: HBM below the model's 431 KiB of them, so they come and go.
    rt = make_runtime(**({"hbm_bytes": "320KiB"} if "params" in config else {}))
    stats = []
    losses, params = train(rt, per_step=stats, **config)
    assert losses == reference[0]
    assert all(torch.equal(a, b) for a, b in zip(params, reference[1]))
    # Bytes really reached NVMe, and came back.
    assert stats[-1]["bytes_moved"]["dram"]["nvme"] > 0
    assert stats[-1]["bytes_moved"]["nvme"]["dram"] > 0
    # The schedule is replayed: scheduled prefetches in every step after the first replayed one
    # (the optimizer's state appears during step one, so a state-only run learns it in step
    # two). The first replay may find every tensor it wants still on its way down from the step
    # before (a prefetch skips a tensor being moved), on a slow or shared disk: CI once saw it.
    first = 2 if set(config) - {"stepper"} == {"optim"} else 1
    assert len(stats) >= first + 2  # (a pair of replayed steps at least)
    for before, after in zip(stats[first:], stats[first + 1:]):
        assert after["prefetches"] > before["prefetches"]
    gc.collect()
    assert rt.stats()["tensors"] == 0
