"""The offload handles beyond training: the optimizer's state_dict / load_state_dict with its
state offloaded, ParameterOffload.gathered(), and tied parameters held once."""

import gc

import pytest
import torch

import tiermem.torch as tt
from tiermem.torch.transfers import _storage_nbytes


class Tied(torch.nn.Module):
    """An embedding whose weight the output head shares (as GPT-2 ties them)."""

    def __init__(self, vocab=96, hidden=48):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, hidden)
        self.mid = torch.nn.Linear(hidden, hidden)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx):
        return self.head(torch.tanh(self.mid(self.emb(idx))))


def batch(step, vocab=96):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(vocab, (8, 12), generator=g), torch.randint(vocab, (8, 12), generator=g)


def train(model, opt, steps, first=0):
    losses = []
    for i in range(first, first + steps):
        x, y = batch(i)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def fresh(seed=0):
    torch.manual_seed(seed)
    model = Tied()
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def state_tensors(sd):
    return [(k, n, v) for k, st in sorted(sd["state"].items()) for n, v in sorted(st.items())
            if torch.is_tensor(v) and v.dim() > 0]


@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_optimizer_state_dict_round_trip(make_runtime, tier):
    rt = make_runtime()
    ref_model, ref_opt = fresh()
    ref_losses = train(ref_model, ref_opt, 3)
    ref_sd = ref_opt.state_dict()

    model, opt = fresh()
    state = tt.offload_optimizer_state(opt, rt, tier, min_bytes=0)
    assert train(model, opt, 2) == ref_losses[:2]
    held = [s.tensor for per in state.records.values() for s in per.values()]
    assert held and all(_storage_nbytes(t) == 0 for t in held)
    sd = opt.state_dict()
    # The copies are whole and the offloaded tensors were let go again.
    assert all(_storage_nbytes(t) == 0 for t in held)
    assert state_tensors(sd) and all(v.numel() and _storage_nbytes(v) for _, _, v in
                                      state_tensors(sd))

    # A second optimizer (offloaded too) loads it and continues as the reference did.
    model2, opt2 = fresh(seed=1)
    model2.load_state_dict(model.state_dict())
    state2 = tt.offload_optimizer_state(opt2, rt, tier, min_bytes=0)
    opt2.load_state_dict(sd)
    assert state2.records, "the loaded state is offloaded again"
    assert all(_storage_nbytes(s.tensor) == 0 for per in state2.records.values()
               for s in per.values())
    assert train(model2, opt2, 1, first=2) == ref_losses[2:]
    got = state_tensors(opt2.state_dict())
    want = state_tensors(ref_sd)
    assert [(k, n) for k, n, _ in got] == [(k, n) for k, n, _ in want]
    assert all(torch.equal(a, b) for (_, _, a), (_, _, b) in zip(got, want))
    for a, b in zip(model2.parameters(), ref_model.parameters()):
        assert torch.equal(a, b)
    state.remove()
    state2.remove()
    gc.collect()
    assert rt.stats()["tensors"] == 0


@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_gathered_reads_and_writes_back(make_runtime, tier):
    rt = make_runtime()
    model, _ = fresh()
    want = {k: v.clone() for k, v in model.state_dict().items()}
    params = tt.offload_parameters(model, rt, tier)
    assert all(_storage_nbytes(p) == 0 for p in model.parameters())
    with params.gathered() as m:
        assert m is model
        got = model.state_dict()
        assert set(got) == set(want)
        assert all(torch.equal(got[k], want[k]) for k in want)
        with torch.no_grad():
            model.mid.weight.add_(1.0)  # a change inside is written back
    assert all(_storage_nbytes(p) == 0 for p in model.parameters())
    with params.gathered():
        assert torch.equal(model.mid.weight, want["mid.weight"] + 1.0)
        assert torch.equal(model.emb.weight, want["emb.weight"])
    params.remove()
    assert torch.equal(model.mid.weight, want["mid.weight"] + 1.0)
    # What state_dict() gave inside views the parameters' copies, which stay valid (and
    # tiermem's tensors alive) as long as it is held, as a plain model's state_dict() would.
    assert torch.equal(got["mid.weight"], want["mid.weight"] + 1.0)
    assert rt.stats()["tensors"] > 0
    del got
    gc.collect()
    assert rt.stats()["tensors"] == 0


@pytest.mark.parametrize("with_optimizer", [False, True], ids=["no-optimizer", "optimizer"])
def test_tied_parameters_held_once(make_runtime, with_optimizer):
    rt = make_runtime()
    ref_model, ref_opt = fresh()
    ref_losses = train(ref_model, ref_opt, 3)

    model, opt = fresh()
    before = rt.stats()["tensors"]
    params = tt.offload_parameters(model, rt, "nvme", optimizer=opt if with_optimizer else None)
    unique = {id(p) for p in model.parameters()}
    assert len(params.records) == len(unique) == 3  # emb/head weight once, mid weight and bias
    assert rt.stats()["tensors"] - before == len(unique)
    assert train(model, opt, 3) == ref_losses
    assert model.head.weight is model.emb.weight
    params.remove()
    assert model.head.weight is model.emb.weight
    for a, b in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(a, b)
    gc.collect()
    assert rt.stats()["tensors"] == 0
