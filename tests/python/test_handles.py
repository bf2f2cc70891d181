"""The offload handles beyond training: the optimizer's state_dict / load_state_dict with its
state offloaded, ParameterOffload.gathered(), and tied parameters held once. The optimizer is
wrapped, never patched: its own step, an LR scheduler's wrapper of it and its state_dict keep
working, before, during and after the offload."""

import gc
import warnings

import pytest
import torch

import tiermem
import tiermem.torch as tt
from tiermem.torch._shared.transfers import _storage_nbytes


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


def train(model, opt, steps, first=0, sched=None):
    """steps steps with opt (an optimizer, or an offload's handle: its bucketed step), and
    sched.step() after each when given."""
    losses = []
    for i in range(first, first + steps):
        x, y = batch(i)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
    return losses


def fresh(seed=0, cls=torch.optim.Adam):
    torch.manual_seed(seed)
    model = Tied()
    return model, cls(model.parameters(), lr=1e-2)


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


# --- The optimizer wrapped, never patched ------------------------------------------------------

_HOOKS = ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks",
          "_optimizer_state_dict_pre_hooks", "_optimizer_state_dict_post_hooks",
          "_optimizer_load_state_dict_pre_hooks", "_optimizer_load_state_dict_post_hooks")


def held_out(state):
    """Whether every state tensor the offload holds has its memory freed."""
    held = [s.tensor for per in state.records.values() for s in per.values()]
    return bool(held) and all(_storage_nbytes(t) == 0 for t in held)


def test_offload_leaves_the_optimizer_unpatched(make_runtime):
    rt = make_runtime()
    model, opt = fresh()
    attributes = set(vars(opt))
    hooks = {name: len(getattr(opt, name)) for name in _HOOKS}
    params = tt.offload_parameters(model, rt, "nvme", optimizer=opt)
    state = tt.offload_optimizer_state(opt, rt, "nvme", min_bytes=0)
    # No step, state_dict or load_state_dict (nor anything else) set on the instance: its own
    # methods are the class's; tiermem is in torch's removable hooks.
    assert set(vars(opt)) == attributes
    assert opt.step.__func__ is type(opt).step
    assert opt.state_dict.__func__ is type(opt).state_dict
    assert opt.load_state_dict.__func__ is type(opt).load_state_dict
    assert isinstance(state, torch.optim.Optimizer)
    assert state.optimizer is opt and state.param_groups is opt.param_groups
    assert state.state is opt.state and state.defaults is opt.defaults
    train(model, state, 2)
    assert set(vars(opt)) == attributes
    state.remove()
    params.remove()
    assert {name: len(getattr(opt, name)) for name in _HOOKS} == hooks
    with pytest.raises(ValueError, match="optimizer"):
        params.step()
    gc.collect()
    assert rt.stats()["tensors"] == 0


def test_offload_parameters_takes_the_wrapped_optimizer(make_runtime):
    # The handle stands in for the optimizer (as torchao's does): offload_parameters given it
    # steps the optimizer inside, its parameters and state in bucket by bucket; offloading its
    # state again is refused.
    rt = make_runtime()
    ref_model, ref_opt = fresh()
    ref_losses = train(ref_model, ref_opt, 3)
    model, opt = fresh()
    state = tt.offload_optimizer_state(opt, rt, "nvme", min_bytes=0, bucket_bytes=1)
    params = tt.offload_parameters(model, rt, "nvme", optimizer=state)
    with pytest.raises(ValueError, match="offloaded already"):
        tt.offload_optimizer_state(state, rt)
    with pytest.raises(ValueError, match="offloaded already"):
        tt.offload_optimizer_state(opt, rt)
    assert train(model, state, 3) == ref_losses
    assert held_out(state)
    assert all(_storage_nbytes(p) == 0 for p in model.parameters())
    params.remove()
    state.remove()
    for a, b in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(a, b)
    gc.collect()
    assert rt.stats()["tensors"] == 0


@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_bucketed_and_own_step_follow_adamw(make_runtime, tier):
    # The handle's step runs the optimizer's own step once per bucket (each parameter a bucket
    # here), the optimizer's own step() once with everything in: both AdamW's bits, the state
    # let go after each. A step pre-hook of the caller's own, registered before offloading,
    # finds the state of the parameters it steps in.
    rt = make_runtime()
    ref_model, ref_opt = fresh(cls=torch.optim.AdamW)
    ref_losses = train(ref_model, ref_opt, 4)

    model, opt = fresh(cls=torch.optim.AdamW)
    calls = []

    def reads_state(optimizer, args, kwargs):
        stepped = [p for g in optimizer.param_groups for p in g["params"]]
        calls.append(len(stepped))
        for p in stepped:
            for v in optimizer.state.get(p, {}).values():
                v.sum()  # raises when the state is out

    opt.register_step_pre_hook(reads_state)
    state = tt.offload_optimizer_state(opt, rt, tier, min_bytes=0, bucket_bytes=1)
    losses = train(model, state, 2)
    assert calls == [1, 1, 1] * 2  # emb/head weight (tied: once), mid weight, mid bias
    assert held_out(state)
    del calls[:]
    losses += train(model, opt, 2, first=2)
    assert calls == [3, 3]
    assert held_out(state)
    assert losses == ref_losses
    for a, b in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(a, b)

    # state_dict() of the handle and of the optimizer: AdamW's, loaded by a plain AdamW.
    ref_sd = ref_opt.state_dict()
    for sd in (state.state_dict(), opt.state_dict()):
        assert held_out(state)
        assert sd["param_groups"] == ref_sd["param_groups"]
        assert [(k, sorted(st)) for k, st in sd["state"].items()] == \
            [(k, sorted(st)) for k, st in ref_sd["state"].items()]
        for k, st in ref_sd["state"].items():
            for n, v in st.items():
                assert torch.equal(sd["state"][k][n], v), (k, n)
        _, plain = fresh(cls=torch.optim.AdamW)
        plain.load_state_dict(sd)
    state.load_state_dict(ref_sd)  # loaded and offloaded again
    assert held_out(state)
    state.remove()
    gc.collect()
    assert rt.stats()["tensors"] == 0


@pytest.mark.parametrize("built,stepper", [
    ("before", "optimizer"), ("after", "optimizer"), ("before", "handle"), ("after", "handle"),
    ("on-the-handle", "handle")])
def test_lr_scheduler_keeps_working_through_remove(make_runtime, built, stepper):
    # An LR scheduler wraps optimizer.step (an attribute on the instance) to see it called.
    # Built before the offload, after it, or on the handle (an Optimizer to torch's schedulers,
    # as torchao's offload optimizer is), it schedules as on a plain optimizer, whether the
    # optimizer's own step or the handle's bucketed one steps, never warns that the step was
    # overridden or not called, and remove() leaves its wrapper in place: the schedule goes on.
    rt = make_runtime()
    sched = lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5)  # noqa: E731
    ref_model, ref_opt = fresh()
    ref_sched = sched(ref_opt)
    ref_losses = train(ref_model, ref_opt, 4, sched=ref_sched)

    model, opt = fresh()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = sched(opt) if built == "before" else None
        state = tt.offload_optimizer_state(opt, rt, "nvme", min_bytes=0, bucket_bytes=1)
        s = s or sched(state if built == "on-the-handle" else opt)
        losses = train(model, state if stepper == "handle" else opt, 3, sched=s)
        state.remove()
        wrapped = state if built == "on-the-handle" else opt
        assert hasattr(wrapped.step, "_wrapped_by_lr_sched"), "the scheduler's wrapper is gone"
        losses += train(model, wrapped, 1, first=3, sched=s)
    assert losses == ref_losses
    assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"] == 1e-2 * 0.5 ** 4
    for a, b in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(a, b)
    gc.collect()
    assert rt.stats()["tensors"] == 0


@pytest.mark.parametrize("on", ["state-handle", "optimizer"])
def test_lr_scheduler_sees_the_parameters_handles_step(make_runtime, on):
    # offload_parameters(optimizer=<the state's handle>) stepped through the parameters' handle
    # (params.step()): a scheduler built on the state's handle, or on the optimizer, sees that
    # step (an outside client once had torch warn "lr_scheduler.step() before
    # optimizer.step()" at every step), and the schedule is a plain optimizer's.
    rt = make_runtime()
    sched = lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5)  # noqa: E731
    ref_model, ref_opt = fresh()
    ref_losses = train(ref_model, ref_opt, 3, sched=sched(ref_opt))
    model, opt = fresh()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state = tt.offload_optimizer_state(opt, rt, "nvme", min_bytes=0)
        params = tt.offload_parameters(model, rt, "dram", optimizer=state)
        s = sched(state if on == "state-handle" else opt)
        losses = []
        for i in range(3):
            x, y = batch(i)
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            params.step()
            state.zero_grad()
            s.step()
            losses.append(loss.item())
    assert losses == ref_losses
    assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]
    rt.close()  # brings the parameters and the state home
    for a, b in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(tiermem.TiermemError, match="the runtime was closed"):
        params.step()  # (close() brought them home: not "was not given the optimizer")


@pytest.mark.parametrize("stepper", ["handle", "optimizer"])
def test_failed_step_leaves_the_state_whole(make_runtime, stepper):
    # A step pre-hook of the caller's own raises once: no parameter changed, the state is let go
    # (the handle's step at once; the optimizer's own by its next step), and the step taken
    # again with the same gradients gives AdamW's bits.
    rt = make_runtime()
    ref_model, ref_opt = fresh(cls=torch.optim.AdamW)
    ref_losses = train(ref_model, ref_opt, 3)

    model, opt = fresh(cls=torch.optim.AdamW)
    fail = []

    def refuse(optimizer, args, kwargs):
        if fail:
            fail.pop()
            raise RuntimeError("refused")

    opt.register_step_pre_hook(refuse)
    state = tt.offload_optimizer_state(opt, rt, "nvme", min_bytes=0, bucket_bytes=1)
    step_with = state if stepper == "handle" else opt
    losses = train(model, step_with, 1)
    x, y = batch(1)
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    before = [p.detach().clone() for p in model.parameters()]
    fail.append(True)
    with pytest.raises(RuntimeError, match="refused"):
        step_with.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))
    if stepper == "handle":
        assert held_out(state)
    step_with.step()
    opt.zero_grad()
    losses.append(loss.item())
    assert held_out(state)
    losses += train(model, step_with, 1, first=2)
    assert losses == ref_losses
    for a, b in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(a, b)
    state.remove()
    gc.collect()
    assert rt.stats()["tensors"] == 0
