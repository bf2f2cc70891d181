"""offload_parameters' parameters view their HBM copy: while a unit runs, each parameter's data
is the runtime's acquired HBM copy of its tiermem tensor (no copy into torch's memory, no
copy_in / copy_out in the steps); when the unit is done nothing stays acquired; a parameter the
step wrote is marked changed (its stale DRAM copy freed) and an unchanged one stays clean;
gradients accumulate across the releases; CPUAdam steps viewed parameters; what cannot view
is copied in, explicitly, and trains the same."""

import gc

import pytest
import torch
import torch.nn.functional as F

import tiermem
import tiermem.torch as tt
from test_param_units import SEQ, VOCAB, Model


def make_model(opt_cls=torch.optim.Adam):
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    model = Model("encoder")
    return model, opt_cls(model.parameters(), lr=1e-2)


def run(model, opt, rt=None, steps=3, micro=1, between=None):
    """steps optimizer steps of micro micro-batches each (gradients accumulate across them);
    between(step) after each."""
    g = torch.Generator().manual_seed(5)
    losses = []
    for i in range(steps):
        ctx = rt.step() if rt is not None else torch.autograd.graph.saved_tensors_hooks(
            lambda t: t, lambda t: t)
        with ctx:
            for _ in range(micro):
                x = torch.randint(VOCAB, (4, SEQ), generator=g)
                y = torch.randint(VOCAB, (4, SEQ), generator=g)
                loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
                loss.backward()
                losses.append(loss.item())
            opt.step()
            opt.zero_grad()
        if between is not None:
            between(i)
    return losses


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_forward_views_the_acquired_hbm_copy(make_runtime, monkeypatch):
    rt = make_runtime(hbm_bytes="8MiB", dram_bytes="1MiB")
    ref, ref_opt = make_model()
    ref_losses = run(ref, ref_opt)
    model, opt = make_model()
    h = tt.offload_parameters(model, rt, optimizer=opt)
    block = model.blocks[1]
    views_seen = []

    def inside(module, inputs, output):
        # linear1 runs inside block 1's unit: every parameter of the unit is in, viewing the
        # copy tiermem holds in HBM (a second acquire of it gives its address).
        for p in block.parameters():
            tm = h.records[id(p)].tm
            address = tm.acquire("hbm", "read")
            try:
                views_seen.append(p.data_ptr() == address)
            finally:
                tm.release("hbm")

    block.linear1.register_forward_hook(inside)
    copies = []
    for name in ("copy_in", "copy_out", "copy_in_async"):
        real = getattr(tiermem.Tensor, name)

        def counted(self, *args, _real=real, _name=name, **kw):
            copies.append((_name, self.name))
            return _real(self, *args, **kw)
        monkeypatch.setattr(tiermem.Tensor, name, counted)

    total = sum(s.nbytes for s in h.records.values())
    moved = [rt.stats()["bytes_moved"]]

    def after_step(i):
        moved.append(rt.stats()["bytes_moved"])
        # Nothing stays acquired after the step: every copy can be moved down (an acquired
        # one refuses with TM_ERR_BUSY). Each step then starts with the parameters in DRAM.
        for s in h.records.values():
            s.tm.offload("dram")
        rt.sync()
        moved.append(rt.stats()["bytes_moved"])

    assert run(model, opt, rt, between=after_step) == ref_losses
    assert views_seen and all(views_seen), "a parameter of the running unit is not its HBM copy"
    assert copies == [], "parameters were copied in or out: %s" % copies[:4]
    assert h.views > 0 and h.copies == 0
    # Each parameter byte crossed DRAM -> HBM exactly once a step (HBM holds them all: the
    # backward and the optimizer's step find them there) and nothing was written down in it.
    for start, end in zip(moved[0::2], moved[1::2]):
        assert end["dram"]["hbm"] - start["dram"]["hbm"] == total
        assert end["hbm"]["dram"] == start["hbm"]["dram"]
    h.remove()
    assert same(model, ref)
    gc.collect()
    assert rt.stats()["tensors"] == 0


def test_written_parameters_are_dirty_and_unchanged_ones_clean(make_runtime):
    rt = make_runtime(hbm_bytes="8MiB", dram_bytes="1MiB")  # room for all: nothing evicted
    model, _ = make_model()
    frozen = list(model.blocks[0].parameters())
    for p in frozen:
        p.requires_grad_(False)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    h = tt.offload_parameters(model, rt, optimizer=opt)
    before = rt.stats()["bytes_moved"]["hbm"]["dram"]
    run(model, opt, rt, steps=2)
    for p in model.parameters():
        where = h.records[id(p)].tm.residency()
        if any(p is q for q in frozen):
            assert where == {"dram", "hbm"}, "an unchanged parameter's copies stay (clean)"
        else:
            assert where == {"hbm"}, "a stepped parameter's stale DRAM copy was kept"
    assert rt.stats()["bytes_moved"]["hbm"]["dram"] == before  # nothing written down
    # The changes reach DRAM when the HBM copies go: the values are the stepped ones.
    with h.gathered():
        want = {id(p): p.detach().clone() for p in model.parameters()}
    for s in h.records.values():
        s.tm.offload("dram")
    with h.gathered():
        assert all(torch.equal(p, want[id(p)]) for p in model.parameters())
    h.remove()
    gc.collect()
    assert rt.stats()["tensors"] == 0


@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_gradients_accumulate_across_releases(make_runtime, tier):
    ref, ref_opt = make_model()
    ref_losses = run(ref, ref_opt, micro=2)
    rt = make_runtime(hbm_bytes="64KiB", dram_bytes="1MiB")  # below the 108 KiB of parameters
    model, opt = make_model()
    h = tt.offload_parameters(model, rt, tier, optimizer=opt)
    assert run(model, opt, rt, micro=2) == ref_losses
    assert h.views > 0
    h.remove()
    assert same(model, ref)


def test_cpu_adam_steps_viewed_parameters(make_runtime):
    ref, ref_opt = make_model(tt.CPUAdam)
    ref_losses = run(ref, ref_opt)
    rt = make_runtime(hbm_bytes="64KiB", dram_bytes="4MiB")
    model, opt = make_model(tt.CPUAdam)
    h = tt.offload_parameters(model, rt, optimizer=opt)
    assert run(model, opt, rt) == ref_losses
    assert h.views > 0
    h.remove()
    assert same(model, ref)
    ref_opt.close()
    opt.close()


@pytest.mark.parametrize("case", ["views-off", "hbm-too-small", "under-outer-hooks"])
def test_what_cannot_view_is_copied(make_runtime, case):
    ref, ref_opt = make_model()
    ref_losses = run(ref, ref_opt)
    # A block's largest parameter (in_proj_weight) is 12 KiB: an 8 KiB HBM holds no block's.
    rt = make_runtime(hbm_bytes="8KiB" if case == "hbm-too-small" else "8MiB",
                      dram_bytes="1MiB")
    model, opt = make_model()
    h = tt.offload_parameters(model, rt, optimizer=opt, views=case != "views-off")
    if case == "under-outer-hooks":
        seen = []

        def pack(t):
            seen.append(1)
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            losses = run(model, opt, rt)
        assert seen, "the hooks set outside were not called"
    else:
        losses = run(model, opt, rt)
    assert losses == ref_losses
    if case == "views-off":
        assert h.views == 0 and h.copies > 0
    elif case == "hbm-too-small":
        assert h.copies > 0
    else:
        # torch 2.8+ reads the hooks set outside and passes other tensors on to them; older
        # torch cannot, and copies the parameters in for such a forward and its backward.
        readable = hasattr(torch._C._autograd, "_top_saved_tensors_default_hooks")
        assert (h.views > 0) == readable and (h.copies > 0) != readable
    h.remove()
    assert same(model, ref)
    gc.collect()
    assert rt.stats()["tensors"] == 0


def test_a_view_held_beyond_its_unit(make_runtime):
    ref, ref_opt = make_model()
    ref_losses = run(ref, ref_opt)
    rt = make_runtime(hbm_bytes="8MiB", dram_bytes="1MiB")
    model, opt = make_model()
    h = tt.offload_parameters(model, rt, optimizer=opt)
    with h.gathered():
        held = model.state_dict()  # views of the HBM copies, kept past gathered()
    assert run(model, opt, rt) == ref_losses
    h.remove()  # reads the copies the held views pin (written through them)
    assert same(model, ref)
    # They followed the parameters through the steps, as a plain model's state_dict() does.
    assert all(torch.equal(held[k], v) for k, v in model.state_dict().items())
    assert rt.stats()["tensors"] > 0  # destroyed when the last view goes
    del held
    gc.collect()
    assert rt.stats()["tensors"] == 0


@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_state_dict_and_load_state_dict_while_offloaded(make_runtime, tier):
    ref, ref_opt = make_model()
    run(ref, ref_opt, steps=2)
    want = {k: v.clone() for k, v in ref.state_dict().items()}
    rt = make_runtime(hbm_bytes="64KiB", dram_bytes="1MiB")
    model, opt = make_model()
    h = tt.offload_parameters(model, rt, tier, optimizer=opt)
    run(model, opt, rt, steps=2)
    got = model.state_dict()  # outside any unit: copies read from tiermem
    assert set(got) == set(want) and "head.weight" in got  # the tied name too
    assert all(torch.equal(got[k], want[k]) for k in want)
    # A second offloaded model loads it, and its parameters are written back.
    other, _ = make_model()
    torch.manual_seed(1)
    for p in other.parameters():
        torch.nn.init.normal_(p)
    h2 = tt.offload_parameters(other, rt, tier)
    other.load_state_dict(got)
    assert all(not s.resident for s in h2.records.values())
    assert all(torch.equal(v, want[k]) for k, v in other.state_dict().items())
    h2.remove()
    h.remove()
    assert all(torch.equal(a, want[k]) for k, a in other.state_dict().items())
    del got
    gc.collect()
    assert rt.stats()["tensors"] == 0


def test_saved_tensor_offload_around_viewed_parameters(make_runtime, monkeypatch):
    """offload_saved_tensors around the forward: the activations go to its hooks, the parameters'
    saved views stay with offload_parameters. torch 2.8+ reads the hooks on top of the stack;
    here a reader standing in for it gives them, so that torch 1.13 runs the same path."""
    from tiermem.torch.params import _views as param_views
    ref, ref_opt = make_model()
    ref_losses = run(ref, ref_opt)
    rt = make_runtime(hbm_bytes="8MiB", dram_bytes="1MiB")
    model, opt = make_model()
    h = tt.offload_parameters(model, rt, optimizer=opt)
    top = []
    monkeypatch.setattr(param_views, "_top_hooks",
                        lambda *ignore: (top[-1].pack_hook, top[-1].unpack_hook) if top else None)
    g = torch.Generator().manual_seed(5)
    losses, packed = [], 0
    for _ in range(3):
        x = torch.randint(VOCAB, (4, SEQ), generator=g)
        y = torch.randint(VOCAB, (4, SEQ), generator=g)
        with rt.step():
            with tt.offload_saved_tensors(rt, "dram", min_bytes=1024) as saved:
                top.append(saved)
                loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
                top.pop()
            loss.backward()
            opt.step()
            opt.zero_grad()
        losses.append(loss.item())
        packed += saved.packed
    assert losses == ref_losses
    assert packed > 0, "no activation reached the outer hooks"
    assert h.views > 0 and h.copies == 0
    h.remove()
    assert same(model, ref)
    gc.collect()
    assert rt.stats()["tensors"] == 0


class _ConjWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(32, 32, dtype=torch.complex64))

    def forward(self, x):  # mul saves w.conj(), a conjugate view, and w.conj().imag, a negated one
        return (x * self.w.conj()).real.sum() + (x.real * self.w.conj().imag).sum()


def test_conjugate_views_of_a_parameter_keep_their_values(make_runtime):
    # A saved view of a parameter is kept by its place, unless it is a conjugate or negated view
    # (its flag is not in its place): the gradients are plain torch's.
    torch.manual_seed(0)
    model = _ConjWeight()
    x = torch.randn(32, 32, dtype=torch.complex64, requires_grad=True)
    model(x).backward()
    plain, x.grad = x.grad.clone(), None
    rt = make_runtime(hbm_bytes="8MiB", dram_bytes="8MiB")
    params = tt.offload_parameters(model, rt)
    with rt.step():
        model(x).backward()
    assert torch.equal(x.grad, plain)
    params.remove()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_a_ctrl_c_in_a_release_is_neither_lost_nor_leaves_a_pin(make_runtime, monkeypatch, tier):
    """A KeyboardInterrupt that lands in a view's release (a finalizer: Python would print it and
    drop it) right after its C call: the release is finished, nothing stays acquired, and the
    interrupt reaches the training loop (raised by the parameter's let-go). One that lands before the release's first step: the
    next remove() finishes it. Either way the model comes home with the values it was stepped
    to, and the runtime closes."""
    from tiermem import _hot
    ref, ref_opt = make_model()
    run(ref, ref_opt, steps=1)
    rt = make_runtime(hbm_bytes="8MiB", dram_bytes="1MiB")
    model, opt = make_model()
    h = tt.offload_parameters(model, rt, tier=tier, optimizer=opt)
    real, calls = _hot.release_written, []

    def interrupted_after(*args):
        status = real(*args)
        calls.append(status)
        if len(calls) == 1:
            raise KeyboardInterrupt  # where Python raises a Ctrl-C: after the call returned
        return status

    monkeypatch.setattr(_hot, "release_written", interrupted_after)
    with pytest.raises(KeyboardInterrupt, match="held while tiermem released"):
        run(model, opt, rt, steps=1)
    assert calls and calls[0] == 0, calls
    monkeypatch.undo()
    h.remove()
    assert same(model, ref)  # the step's writes kept (the copy released as written)
    gc.collect()
    assert rt.stats()["tensors"] == 0

    # A release stopped before its first step (the Ctrl-C at the finalizer's entry).
    model, opt = make_model()
    h = tt.offload_parameters(model, rt, tier=tier, optimizer=opt)
    from tiermem.torch.params import _views
    real_released = _views._ViewState.released
    stopped = []

    def stopped_at_entry(self):
        if not stopped:
            stopped.append(self)
            raise KeyboardInterrupt  # lost in the finalizer, as Python loses it
        real_released(self)

    monkeypatch.setattr(_views._ViewState, "released", stopped_at_entry)
    run(model, opt, rt, steps=1)
    monkeypatch.undo()
    assert stopped and stopped[0].made == 0
    h.remove()  # finishes it (settle)
    assert stopped[0].made > 0
    assert same(model, ref)
    gc.collect()
    assert rt.stats()["tensors"] == 0
    rt.close()


@pytest.mark.parametrize("hbm", ["4KiB", "1MiB"])
def test_a_numpy_array_of_a_parameter_read_in_gathered(make_runtime, hbm):
    """.numpy() of parameters inside gathered(), the place to read them: torch makes a storage
    it exports to NumPy fixed-size, so a parameter copied in (4 KiB of HBM: no room for views)
    could not be let go: gathered() raised torch's 'storage that is not resizable' and so did
    every later step (an outside client). It takes a new storage now; the array keeps the bytes
    read, and training goes on as with views (1 MiB) and as without tiermem."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(3)])
    x = torch.randn(8, 64)
    rt = make_runtime(hbm_bytes=hbm, dram_bytes="1MiB")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    params = tt.offload_parameters(m, rt, optimizer=opt, units=list(m))
    with rt.step():
        m(x).sum().backward()
        params.step()
        params.zero_grad()
    with params.gathered():
        arrays = [p.detach().numpy() for p in m.parameters()]
        total = sum(float(a.sum()) for a in arrays)
    losses = []
    for _ in range(2):
        with rt.step():
            loss = m(x).sum()
            loss.backward()
            params.step()
            params.zero_grad()
        losses.append(loss.item())
    params.remove()
    torch.manual_seed(0)
    plain = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(3)])
    sgd = torch.optim.SGD(plain.parameters(), lr=0.1)
    want = []
    for i in range(3):
        if i == 1:
            assert total == sum(float(p.detach().numpy().sum()) for p in plain.parameters())
        loss = plain(x).sum()
        loss.backward()
        sgd.step()
        sgd.zero_grad()
        want.append(loss.item())
    assert losses == want[1:]
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), plain.parameters()))
