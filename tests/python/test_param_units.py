"""offload_parameters by unit: models whose modules read a child's parameters without calling
the child (nn.MultiheadAttention reads out_proj.weight; nn.TransformerEncoderLayer is built on
it), tied embeddings, and a custom module doing the same, train bit-identically with their
parameters offloaded, with every unit policy; the next units' parameters are prefetched into
HBM."""

import gc

import pytest
import torch
import torch.nn.functional as F

import tiermem.torch as tt

HIDDEN, VOCAB, SEQ = 32, 64, 8
# HBM budgets below each model's parameters (108, 58 and 20 KiB) and above its largest unit.
HBM_BELOW_PARAMS = {"encoder": "64KiB", "mha": "40KiB", "direct": "16KiB"}


class AttnBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(HIDDEN)
        self.attn = torch.nn.MultiheadAttention(HIDDEN, 4, batch_first=True)

    def forward(self, x):
        h = self.ln(x)
        return x + self.attn(h, h, h, need_weights=False)[0]


class Direct(torch.nn.Module):
    """Uses its child's weight directly, never calling the child."""

    def __init__(self):
        super().__init__()
        self.child = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        return x + torch.tanh(F.linear(x, self.child.weight * 0.5, self.child.bias))


class Model(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, HIDDEN)
        if kind == "encoder":
            make = lambda: torch.nn.TransformerEncoderLayer(HIDDEN, 4, 2 * HIDDEN, dropout=0.0,
                                                            batch_first=True)
        elif kind == "mha":
            make = AttnBlock
        else:
            make = Direct
        self.blocks = torch.nn.ModuleList(make() for _ in range(3))
        self.head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
        self.head.weight = self.emb.weight  # tied

    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def train(kind, rt=None, steps=3, frozen=None, watch=None, **offload):
    """frozen(name): the parameters left out of training (requires_grad False, not in the
    optimizer); watch(model, handle, x): called with the embedding's output of each step."""
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    model = Model(kind)
    for name, p in model.named_parameters():
        if frozen is not None and frozen(name):
            p.requires_grad_(False)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    handle = None
    step_with = opt
    if rt is not None:
        with_opt = offload.pop("with_optimizer", True)
        handle = tt.offload_parameters(model, rt, optimizer=opt if with_opt else None,
                                       **offload)
        if with_opt:
            step_with = handle  # its bucketed step
    losses = []
    g = torch.Generator().manual_seed(5)
    for _ in range(steps):
        x, y = torch.randint(VOCAB, (4, SEQ), generator=g), torch.randint(VOCAB, (4, SEQ),
                                                                         generator=g)
        ctx = rt.step() if rt is not None else torch.autograd.graph.saved_tensors_hooks(
            lambda t: t, lambda t: t)
        if watch is not None:
            hook = model.emb.register_forward_hook(lambda m, i, out: watch(model, handle, out))
        with ctx:
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            step_with.step()
            opt.zero_grad()
        losses.append(loss.item())
        if watch is not None:
            hook.remove()
    units = None if handle is None else [u.module for u in handle.units]
    if handle is not None:
        handle.remove()
    assert model.head.weight is model.emb.weight
    return losses, [p.detach().clone() for p in model.parameters()], units


@pytest.mark.parametrize("kind", ["encoder", "mha", "direct"])
@pytest.mark.parametrize("tier,inclusive", [("dram", "on"), ("nvme", "on"), ("nvme", "off")],
                         ids=["dram", "nvme", "nvme-exclusive"])
@pytest.mark.parametrize("with_optimizer", [True, False], ids=["optimizer", "no-optimizer"])
def test_bit_identical_by_unit(make_runtime, kind, tier, inclusive, with_optimizer):
    ref_losses, ref_params, _ = train(kind)
    # HBM below the parameters (which view their HBM copies while in, where HBM holds two
    # units): units come and go, and the next ones are prefetched.
    rt = make_runtime(hbm_bytes=HBM_BELOW_PARAMS[kind], dram_bytes="1MiB",
                      dram_inclusive=inclusive)
    losses, params, units = train(kind, rt, tier=tier, with_optimizer=with_optimizer)
    assert losses == ref_losses
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
    # Default policy: the root (embedding, tied head) and each block of the ModuleList.
    assert len(units) == 4 and all(type(u).__name__ != "ModuleList" for u in units[1:])
    s = rt.stats()
    if tier == "nvme" and inclusive == "on":
        # Written down to NVMe, and served back from the clean DRAM copies that inclusive DRAM
        # kept: nothing to prefetch from NVMe.
        assert s["bytes_moved"]["dram"]["nvme"] > 0 and s["clean_reads"] > 0
    else:
        assert s["prefetches"] > 0
    assert s["bytes_moved"]["dram"]["hbm"] > 0  # the next units' parameters went up ahead
    gc.collect()
    assert rt.stats()["tensors"] == 0


# Frozen parameters that a unit's backward reads after its last gradient came: the norm at the
# start of each attention block; the attention of each encoder layer (LoRA-style: the MLP trains);
# a weight read beside a trained bias.
FROZEN = {"mha": lambda n: ".ln." in n, "encoder": lambda n: ".self_attn." in n,
          "direct": lambda n: n.endswith("child.weight")}


@pytest.mark.parametrize("kind", ["mha", "encoder", "direct"])
@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_frozen_parameters_with_the_optimizer(make_runtime, kind, tier):
    """With optimizer=, a unit is let go once its parameters' gradients came; frozen ones get
    none, yet the unit's backward may still read them (an outside client's frozen norms raised
    "this tensor's memory is offloaded by tiermem" in backward). Such a unit is let go once its
    inputs' gradients came too: before the backward ends (the later blocks are out by the time
    the embedding's gradient comes), and the run is bit-identical to plain training."""
    ref_losses, ref_params, _ = train(kind, frozen=FROZEN[kind])
    rt = make_runtime(hbm_bytes=HBM_BELOW_PARAMS[kind], dram_bytes="1MiB")
    seen = []

    def watch(model, handle, out):
        def at_the_embedding(grad):  # every block's backward has run
            seen.append([any(handle.records[id(p)].resident for p in b.parameters())
                         for b in model.blocks[1:]])
        out.register_hook(at_the_embedding)

    losses, params, _ = train(kind, rt, frozen=FROZEN[kind], watch=watch, tier=tier)
    assert losses == ref_losses
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
    assert seen == [[False, False]] * 3, "blocks held until the backward ended: %s" % seen


@pytest.mark.parametrize("units", [
    {torch.nn.TransformerEncoderLayer},
    lambda m: isinstance(m, torch.nn.TransformerEncoderLayer),
], ids=["classes", "callable"])
def test_unit_policies(make_runtime, units):
    ref_losses, ref_params, _ = train("encoder")
    rt = make_runtime(hbm_bytes="8MiB", dram_bytes="1MiB")
    losses, params, chosen = train("encoder", rt, tier="dram", units=units)
    assert losses == ref_losses
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
    assert [type(u).__name__ for u in chosen[1:]] == ["TransformerEncoderLayer"] * 3


def test_explicit_modules_and_bad_policies(make_runtime):
    rt = make_runtime()
    model = Model("direct")
    handle = tt.offload_parameters(model, rt, units=[model.blocks[0], model.blocks[2]])
    assert [u.module for u in handle.units] == [model, model.blocks[0], model.blocks[2]]
    # The root holds what the chosen blocks do not: the embedding (tied head) and block 1.
    assert len(handle.units[0].records) == 1 + 2
    handle.remove()
    with pytest.raises(ValueError, match="not a submodule"):
        tt.offload_parameters(model, rt, units=[torch.nn.Linear(2, 2)])
    with pytest.raises(TypeError, match="units"):
        tt.offload_parameters(model, rt, units=[3])
    gc.collect()
    assert rt.stats()["tensors"] == 0


def test_offloads_never_removed_free_their_runtime_when_dropped(tmp_path):
    """A sweep that drops the model, the optimizer and the runtime without remove() or close():
    a table of what offload_parameters holds, and one of each optimizer's step driver, kept
    their keys alive through their values, and with them the runtime (its DRAM tier, threads
    and swap file) for the life of the process (an outside client). Both hold them weakly."""
    import weakref

    import tiermem

    def run():
        rt = tiermem.Runtime(device="emulated", hbm_bytes="4MiB", dram_bytes="4MiB",
                             nvme_paths=str(tmp_path), nvme_bytes="16MiB", log_level="error")
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        state = tt.offload_optimizer_state(opt, rt, "nvme")
        params = tt.offload_parameters(m, rt, tier="dram", optimizer=state)
        for i in range(2):
            with rt.step():
                m(torch.randn(8, 16)).sum().backward()
                params.step()
                params.zero_grad()
        return weakref.ref(rt), weakref.ref(m), weakref.ref(opt)

    refs = run()
    gc.collect()
    assert [r() is None for r in refs] == [True, True, True]
