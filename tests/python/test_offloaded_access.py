"""Touching a tensor while tiermem holds its bytes (an offloaded parameter outside its unit,
optimizer state between steps): what reads no data works, anything else raises a RuntimeError
that says why, never reads the freed storage (which crashed the process or returned garbage);
state_dict() still works, and training after the error is unchanged."""

import copy

import pytest
import torch

import tiermem
import tiermem.torch as tt

OFFLOADED = "offloaded by tiermem"


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
                                 for _ in range(3)])


def twins(optimizer, **kw):
    """A plain model and one to offload, equal, each with its optimizer."""
    ref, m = model(), model()
    return ref, optimizer(ref.parameters(), **kw), m, optimizer(m.parameters(), **kw)


def units(m):
    return [type(m[0])]  # the three blocks


def offloaded_twins(make_runtime, tier, optimizer, **kw):
    """twins() in a 1 MiB runtime, the second's parameters (and optimizer state) offloaded."""
    rt = make_runtime(hbm_bytes="1MiB", dram_bytes="1MiB")
    ref, ref_opt, m, opt = twins(optimizer, **kw)
    po = tt.offload_parameters(m, rt, tier, optimizer=opt, units=units(m))
    return rt, ref, ref_opt, m, opt, po


def removed_equal(po, m, ref):
    """Removes the offload; whether m's parameters are then ref's, bit for bit."""
    po.remove()
    return all(torch.equal(p, q) for p, q in zip(m.parameters(), ref.parameters()))


def step(m, opt, seed):
    torch.manual_seed(seed)
    loss = m(torch.randn(4, 16)).square().sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


TOUCHES = {
    "sum": lambda m, w: w.sum(),
    "detach-norm": lambda m, w: w.detach().norm(),
    "numpy": lambda m, w: w.detach().numpy().sum(),
    "clone": lambda m, w: w.detach().clone(),
    "data-fill": lambda m, w: w.data.fill_(1.0),
    "copy-from": lambda m, w: torch.zeros(w.shape).copy_(w),
    "index": lambda m, w: w[0, 0].item(),
    "deepcopy": lambda m, w: copy.deepcopy(m),
    "to-vector": lambda m, w: torch.nn.utils.parameters_to_vector(m.parameters()),
    "double": lambda m, w: m.double(),
    "keep-vars": lambda m, w: m.state_dict(keep_vars=True)["0.0.weight"].sum(),
}


@pytest.mark.parametrize("tier", ["dram", "nvme"])
@pytest.mark.parametrize("touch", sorted(TOUCHES))
def test_touching_an_offloaded_parameter_raises(make_runtime, tier, touch):
    rt, ref, ref_opt, m, opt, po = offloaded_twins(make_runtime, tier, torch.optim.SGD, lr=0.1)
    w = m[0][0].weight
    # What reads no data still works.
    assert isinstance(w, torch.nn.Parameter) and w.requires_grad and w.is_leaf
    assert w.shape == (16, 16) and w.dtype == torch.float32 and w.numel() == 256
    assert OFFLOADED in repr(w) and OFFLOADED in str(w.detach())
    with pytest.raises(RuntimeError, match=OFFLOADED):
        TOUCHES[touch](m, w)
    # Nothing changed: the same training as the plain model, bit for bit, and the parameters
    # let go after each step (optimizer= given) refuse again.
    for i in range(2):
        assert step(m, opt, i) == step(ref, ref_opt, i)
        with pytest.raises(RuntimeError, match=OFFLOADED):
            TOUCHES[touch](m, w)
    state = m.state_dict()
    for k, v in ref.state_dict().items():
        assert torch.equal(state[k], v), k
    with po.gathered():
        assert torch.equal(w.detach().clone(), ref[0][0].weight.detach())
    po.remove()
    assert type(w) is torch.nn.Parameter and torch.equal(w.detach(), ref[0][0].weight.detach())
    assert rt.stats()["tensors"] == 0


@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_touching_offloaded_optimizer_state_raises(make_runtime, tier):
    rt = make_runtime(dram_bytes="1MiB")
    ref, ref_opt, m, opt = twins(torch.optim.Adam, lr=0.01)
    state = tt.offload_optimizer_state(opt, rt, tier, min_bytes=0)
    for i in range(2):
        assert step(m, opt, i) == step(ref, ref_opt, i)
    moment = opt.state[m[0][0].weight]["exp_avg"]
    assert moment.shape == (16, 16) and OFFLOADED in repr(moment)
    for touch in (lambda: moment.norm(), lambda: moment.clone(), lambda: moment.add_(1)):
        with pytest.raises(RuntimeError, match=OFFLOADED):
            touch()
    sd = opt.state_dict()  # copies read from tiermem
    ref_sd = ref_opt.state_dict()
    for k, st in ref_sd["state"].items():
        for n, v in st.items():
            assert torch.equal(sd["state"][k][n], v), (k, n)
    assert step(m, opt, 2) == step(ref, ref_opt, 2)
    state.remove()
    assert type(moment) is torch.Tensor
    assert torch.equal(moment, ref_opt.state[ref[0][0].weight]["exp_avg"])
    assert rt.stats()["tensors"] == 0


@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_close_brings_offloads_home(make_runtime, tier):
    # `with tiermem.Runtime(...) as rt:` and the model used after the block: closing the
    # runtime must not take the model's only copy of its weights (nor the optimizer's state).
    rt, ref, ref_opt, m, opt, params = offloaded_twins(make_runtime, tier, torch.optim.Adam,
                                                       lr=0.01)
    state = tt.offload_optimizer_state(opt, rt, tier, min_bytes=0)
    for i in range(2):
        assert step(m, opt, i) == step(ref, ref_opt, i)
    assert OFFLOADED in repr(m[1][0].weight)
    rt.close()
    assert rt.closed
    for (k, v), (_, r) in zip(m.state_dict().items(), ref.state_dict().items()):
        assert type(v) is torch.Tensor and torch.equal(v, r), k
    for p, q in zip(m.parameters(), ref.parameters()):
        assert type(p) is torch.nn.Parameter
        assert torch.equal(opt.state[p]["exp_avg"], ref_opt.state[q]["exp_avg"])
    # Training goes on without tiermem, as the plain model does; remove() is a no-op now.
    assert step(m, opt, 2) == step(ref, ref_opt, 2)
    params.remove()
    state.remove()


@pytest.mark.parametrize("tier", ["dram", "nvme"])
@pytest.mark.parametrize("views", [True, False], ids=["views", "copies"])
def test_converting_a_model_in_offload_is_refused_not_undone(make_runtime, tier, views):
    # Without optimizer=, the backward leaves the units in; model.double() then converts the
    # parameters in place. Letting them go would put float32 bytes back under them: refused,
    # and remove() keeps the converted parameters.
    rt = make_runtime(hbm_bytes="1MiB", dram_bytes="1MiB")
    ref = model()
    m = model()
    po = tt.offload_parameters(m, rt, tier, units=units(m), views=views)
    for net in (ref, m):
        torch.manual_seed(0)
        net(torch.randn(4, 16)).sum().backward()
    assert OFFLOADED not in repr(m[0][0].weight)  # in: kept since the backward
    m.double()
    ref.double()
    with pytest.raises(RuntimeError, match="changed from float32 on cpu, shape \\[16, 16\\], "
                                           "to float64"):
        m(torch.randn(4, 16, dtype=torch.float64))
    po.remove()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert p.dtype == torch.float64 and torch.equal(p, q)
    torch.manual_seed(1)
    x = torch.randn(4, 16, dtype=torch.float64)
    assert torch.equal(m(x), ref(x))
    assert rt.stats()["tensors"] == 0


@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_what_reads_no_data_works_while_out(make_runtime, tier):
    rt, ref, ref_opt, m, opt, po = offloaded_twins(make_runtime, tier, torch.optim.SGD, lr=0.1)
    assert step(m, opt, 0) == step(ref, ref_opt, 0)
    w = m[0][0].weight
    assert OFFLOADED in f"{w}" and OFFLOADED in "%s" % w
    assert torch.is_floating_point(w) and w.type() == "torch.FloatTensor"
    assert torch.zeros_like(w).shape == w.shape and w.new_zeros(3).shape == (3,)
    # Conversions to what the model is already return it (an eval helper's model.to(device)).
    assert m.to("cpu") is m and m.cpu() is m and m.float() is m and m.to(torch.float32) is m
    with pytest.raises(RuntimeError, match="^T \\(read\\) on a float32 tensor of shape "
                                           "\\[16, 16\\]: .*" + OFFLOADED):
        w.T.sum()
    assert step(m, opt, 1) == step(ref, ref_opt, 1)
    assert removed_equal(po, m, ref)


@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_close_between_forward_and_backward(make_runtime, tier):
    # The backward's let-go runs after close() brought the parameters home: it must leave them.
    rt, ref, ref_opt, m, opt, _ = offloaded_twins(make_runtime, tier, torch.optim.Adam, lr=0.01)
    assert step(m, opt, 0) == step(ref, ref_opt, 0)
    torch.manual_seed(1)
    loss = m(torch.randn(4, 16)).square().sum()
    rt.close()
    loss.backward()
    opt.step()
    step(ref, ref_opt, 1)
    for p, q in zip(m.parameters(), ref.parameters()):
        assert type(p) is torch.nn.Parameter and torch.equal(p, q)
    assert step(m, opt, 2) == step(ref, ref_opt, 2)


@pytest.mark.parametrize("views", [True, False])
def test_a_backward_after_close_says_the_runtime_was_closed(make_runtime, views):
    # Saved tensors offloaded, then the runtime closed before the backward: the unpack fails,
    # and says why (an outside client got "runtime handle 0x... is zero, destroyed or invalid").
    rt = make_runtime(hbm_bytes="8MiB", dram_bytes="8MiB")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128))
    with tt.offload_saved_tensors(rt, "dram", views=views) as hooks:
        loss = m(torch.randn(64, 128)).square().sum()
    assert hooks.packed > 0
    rt.close()
    with pytest.raises((RuntimeError, tiermem.TiermemError), match="the runtime was closed"):
        loss.backward()


@pytest.mark.parametrize("tier", ["dram", "nvme"])
@pytest.mark.parametrize("optimizer_aware", [False, True], ids=["kept", "optimizer"])
def test_a_held_state_dict_and_hooks_of_ones_own(make_runtime, tier, optimizer_aware):
    # A checkpoint's state_dict() held across steps (views of HBM copies held for writing),
    # and hooks of the user's own on a unit: a pre-hook registered before offload_parameters,
    # a forward hook after; both read the unit's parameters.
    rt = make_runtime(hbm_bytes="1MiB", dram_bytes="1MiB")
    ref, ref_opt, m, opt = twins(torch.optim.SGD, lr=0.1)
    seen = {id(ref): [], id(m): []}
    for net in (ref, m):
        net[1].register_forward_pre_hook(lambda mod, i, s=seen[id(net)]: s.append(
            mod[0].weight.detach().norm().item()))
    po = tt.offload_parameters(m, rt, tier, optimizer=opt if optimizer_aware else None,
                               units=units(m))
    for net in (ref, m):
        net[1].register_forward_hook(lambda mod, i, o, s=seen[id(net)]: s.append(
            mod[0].weight.detach().norm().item()))
    assert step(m, opt, 0) == step(ref, ref_opt, 0)
    held = m.state_dict()
    for i in range(1, 4):
        assert step(m, opt, i) == step(ref, ref_opt, i)
    assert seen[id(m)] == seen[id(ref)] and len(seen[id(m)]) == 8
    del held
    assert removed_equal(po, m, ref)


@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_a_deepcopy_made_inside_gathered_is_a_plain_model(make_runtime, tier):
    rt, ref, ref_opt, m, opt, po = offloaded_twins(make_runtime, tier, torch.optim.SGD, lr=0.1)
    assert step(m, opt, 0) == step(ref, ref_opt, 0)
    with po.gathered():
        twin = copy.deepcopy(m)  # carries tiermem's hooks: they must leave it alone
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(2)  # the twin's own weights now: its state_dict() must give them
    for (k, a), b in zip(twin.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, 2 * b), k
    acquires = rt.stats()["acquires"]
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    step(twin, twin_opt, 1)  # the original's units are not brought in for it
    twin.load_state_dict(ref.state_dict())
    assert rt.stats()["acquires"] == acquires
    assert OFFLOADED in repr(m[0][0].weight)  # the original stayed out throughout
    assert step(m, opt, 1) == step(ref, ref_opt, 1)
    assert removed_equal(po, m, ref)


def test_any_error_part_way_through_the_bucketed_step_notes_which_parameters_it_updated(
        make_runtime):
    """An exception not tiermem's (the optimizer's own, a KeyboardInterrupt) in a bucket of the
    step still says which parameters the buckets before it updated: in a note (an outside
    client's Ctrl-C came back bare, and its step, repeated, updated parameter 0 twice)."""
    class Failing(torch.optim.AdamW):
        calls = 0

        def step(self, closure=None):
            Failing.calls += 1
            if Failing.calls == 3:
                raise KeyboardInterrupt
            return super().step(closure)

    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(32, 32, bias=False) for _ in range(4)])
    opt = Failing(m.parameters(), lr=0.01)
    rt = make_runtime(dram_bytes="1MiB")
    state = tt.offload_optimizer_state(opt, rt, "dram", min_bytes=0, bucket_bytes=0)
    m(torch.randn(4, 32)).sum().backward()
    with pytest.raises(KeyboardInterrupt) as e:
        state.step()
    notes = getattr(e.value, "__notes__", None)
    if hasattr(e.value, "add_note"):  # Python 3.11 and later
        assert notes == ["tiermem: the step is taken in part: parameters 0-1 of 4 (their index "
                         "in param_groups, in order) updated, the others not; parameter 2 (the "
                         "bucket being stepped when the optimizer raised) may be updated in "
                         "part; the state of those updated is as the step left it"], notes
    state.remove()
    # One bucket (the default bucket_bytes on a small model), failing: it had no note, though
    # torch's step had updated some of its parameters before it raised (an outside client).
    Failing.calls = 2
    opt = Failing(m.parameters(), lr=0.01)
    state = tt.offload_optimizer_state(opt, rt, "dram", min_bytes=0)
    m(torch.randn(4, 32)).sum().backward()
    with pytest.raises(KeyboardInterrupt) as e:
        state.step()
    if hasattr(e.value, "add_note"):
        assert e.value.__notes__ == [
            "tiermem: the step is taken in part: no bucket's update finished; parameters 0-3 "
            "(the bucket being stepped when the optimizer raised) may be updated in part"]
    state.remove()


def test_both_offloads_step_in_the_smaller_bucket(make_runtime):
    """offload_optimizer_state and offload_parameters share one step driver: its buckets are
    the smaller of the two bucket_bytes (an outside client's bucket_bytes=0 on the state was
    ignored beside offload_parameters' 64 MiB default: one bucket of everything)."""
    torch.manual_seed(0)
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    rt = make_runtime(hbm_bytes="1MiB", dram_bytes="1MiB")
    params = tt.offload_parameters(m, rt, "dram", optimizer=opt, units=units(m))
    state = tt.offload_optimizer_state(opt, rt, "dram", min_bytes=0, bucket_bytes=0)
    buckets = []
    hook = opt.register_step_pre_hook(lambda o, a, k: buckets.append(
        sum(len(g["params"]) for g in o.param_groups)))
    with rt.step():
        m(torch.randn(4, 16)).sum().backward()
        params.step()
    assert buckets == [1] * 6, buckets  # one parameter a bucket: 3 weights and 3 biases
    hook.remove()
    params.remove()
    state.remove()


def test_grad_scaler_steps_through_the_parameters_handle(make_runtime):
    """torch.amp.GradScaler.step(params) (the handle of offload_parameters(optimizer=)) unscales
    the optimizer's gradients and takes the bucketed step: bit-identical to scaler.step(opt) on
    the plain model (an outside client's raised: no param_groups), an overflowing step skipped
    alike. The handle's zero_grad() is the optimizer's."""
    def run(offload):
        rt = make_runtime(hbm_bytes="1MiB", dram_bytes="1MiB") if offload else None
        m = model()
        opt = torch.optim.AdamW(m.parameters(), lr=0.01)
        stepper = tt.offload_parameters(m, rt, "dram", optimizer=opt, units=units(m)) \
            if offload else opt
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=1)
        g = torch.Generator().manual_seed(3)
        for i in range(4):
            x = torch.randn(8, 16, generator=g) * (1e36 if i == 2 else 1)  # step 2 overflows
            loss = m(x).square().mean()
            scaler.scale(loss).backward()
            scaler.step(stepper)
            scaler.update()
            stepper.zero_grad()
        assert all(p.grad is None for p in m.parameters())
        if offload:
            stepper.remove()
        return [p.detach().clone() for p in m.parameters()], scaler.get_scale()

    want, want_scale = run(False)
    got, got_scale = run(True)
    assert got_scale == want_scale
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_step_whose_state_finds_no_room_after_its_last_update_says_it_is_whole(make_runtime):
    """Neither NVMe nor DRAM can hold the state: the step raises after its last bucket's update
    (sending the state back), and says the step was taken whole and must not be repeated (an
    outside client read "taken in part", stepped again and updated every parameter twice)."""
    torch.manual_seed(0)
    m, ref = torch.nn.Linear(512, 512), torch.nn.Linear(512, 512)
    ref.load_state_dict(m.state_dict())
    rt = make_runtime(dram_bytes="1MiB", nvme_bytes="1MiB")
    state = tt.offload_optimizer_state(torch.optim.Adam(m.parameters(), lr=1e-2), rt, "nvme")
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    x = torch.randn(2, 512)
    m(x).sum().backward()
    ref(x).sum().backward()
    ref_opt.step()
    with pytest.raises(tiermem.TiermemError) as e:
        state.step()
    assert "the step was taken whole: all 2 parameters updated, so do not repeat it" in \
        e.value.message, e.value.message
    assert "the others not" not in e.value.message
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), ref.parameters()))
    state.remove()


def test_a_step_that_fills_nvme_part_way_says_which_parameters_it_updated(make_runtime):
    """The bucketed step of offload_optimizer_state is taken bucket by bucket: when NVMe fills
    part way (the first step's state for the later buckets finds no room), the error says which
    parameters were updated and which were not (an outside client had only the one tensor the
    error named), and those updated are exactly those."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(64, 64, bias=False) for _ in range(8)])
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    rt = make_runtime(dram_bytes="160KiB", nvme_bytes="1MiB", dram_inclusive="off")
    filler = rt.tensor((1 << 20) - (160 << 10), cls="other", home="nvme", name="filler")
    filler.write(bytearray(filler.nbytes))  # written: a tensor never written takes no room
    filler.offload("nvme")
    filler.sync()
    state = tt.offload_optimizer_state(opt, rt, "nvme", min_bytes=0, bucket_bytes=16 << 10)
    before = [p.detach().clone() for p in m.parameters()]
    m(torch.randn(4, 64)).sum().backward()
    with pytest.raises(tiermem.TiermemError) as e:
        state.step()
    assert e.value.status_name == "TM_ERR_NO_SPACE", e.value
    changed = [not torch.equal(b, p.detach()) for b, p in zip(before, m.parameters())]
    k = changed.index(False) if False in changed else len(changed)
    assert 0 < k < len(changed) and not any(changed[k:]), changed
    want = "%s of 8 (their index in param_groups, in order) updated, the others not" % (
        "parameter 0" if k == 1 else "parameters 0-%d" % (k - 1))
    assert want in e.value.message, e.value.message
    # NVMe still full: a checkpoint can be taken. The failed offloads of that bucket's state
    # left it whole in DRAM; reported when state_dict reads it, they are warnings (they made
    # state_dict raise, so that no checkpoint could be taken until NVMe had room).
    with pytest.warns(tiermem.TiermemWarning, match="nothing was lost"):
        sd = state.state_dict()
    assert len(sd["state"]) == k
    filler.destroy()
    rt.sync()
    state.remove()


def test_an_optimizer_of_another_model_is_refused(make_runtime):
    """offload_parameters(optimizer=) holding none of the module's parameters: refused (its
    step() through the handle never trained the model, silently: an outside client)."""
    m, other = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    rt = make_runtime()
    with pytest.raises(ValueError, match="steps none of this Linear's parameters"):
        tt.offload_parameters(m, rt, optimizer=torch.optim.SGD(other.parameters(), lr=0.1))
    assert type(m.weight) is torch.nn.Parameter  # nothing offloaded
    tt.offload_parameters(m, rt, optimizer=torch.optim.SGD(m.parameters(), lr=0.1)).remove()
