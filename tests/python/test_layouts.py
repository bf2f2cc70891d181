"""offload_saved_tensors: every dtype and layout comes back bit-exact with its strides, twice
under retain_graph, nothing leaks, parameters stay with autograd, errors surface as
TiermemError."""

import gc

import pytest
import torch

import tiermem
import tiermem.torch as tt

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
          torch.complex128, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
          torch.bool]


class Save(torch.autograd.Function):
    """Saves t for backward and hands what backward unpacked to seen."""

    @staticmethod
    def forward(ctx, x, t, seen):
        ctx.save_for_backward(t)
        ctx.seen = seen
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        (t,) = ctx.saved_tensors
        ctx.seen.append(t.clone() if t.numel() else t)
        ctx.seen.append((tuple(t.size()), tuple(t.stride()), t.dtype))
        return g, None, None


def random_tensor(shape, dtype):
    g = torch.Generator().manual_seed(7)
    if dtype == torch.bool:
        return torch.randint(2, shape, generator=g).bool()
    if dtype.is_complex or dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype) if not \
            dtype.is_complex else torch.randn(shape, generator=g, dtype=dtype)
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=g).to(dtype)


def round_trip(rt, t, tier="dram", retain=False):
    x = torch.ones(3, requires_grad=True)
    seen = []
    hooks = tt.offload_saved_tensors(rt, tier, min_bytes=0)
    with hooks:
        y = Save.apply(x, t, seen)
    assert hooks.packed == 1
    y.sum().backward(retain_graph=retain)
    if retain:
        y.sum().backward()
    return seen


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[1])
def test_every_dtype(make_runtime, dtype):
    rt = make_runtime()
    t = random_tensor((33, 17), dtype)
    seen = round_trip(rt, t, "nvme")
    assert torch.equal(seen[0], t)
    assert seen[1] == ((33, 17), (17, 1), dtype)


LAYOUTS = {
    "transposed": lambda b: b.t(),
    "gaps_small": lambda b: b[:, ::2],
    "gaps_large": lambda b: b[::4, 1:3],
    "view_offset": lambda b: b[5:9],
    "expanded": lambda b: b[:1].expand(40, 64),
    "expanded_middle": lambda b: b[:, :1].unsqueeze(1).expand(40, 3, 1),
    "scalar_like": lambda b: b[3, 4:5],
    "permuted_3d": lambda b: b.view(8, 5, 64).permute(2, 0, 1),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_layouts_keep_values_and_strides(make_runtime, layout, tier):
    rt = make_runtime()
    base = random_tensor((40, 64), torch.float32)
    t = LAYOUTS[layout](base)
    seen = round_trip(rt, t, tier)
    assert torch.equal(seen[0], t)
    assert seen[1] == (tuple(t.size()), tuple(t.stride()), t.dtype)
    gc.collect()
    assert rt.stats()["tensors"] == 0


@pytest.mark.parametrize("views", [True, False])
def test_conjugate_and_negated_views_keep_their_values(make_runtime, views):
    # A conjugate view (a.conj()) and a negated one (a.conj().imag) hold their values as a flag
    # over a's bytes: what comes back holds the same values, and the gradients are plain torch's.
    rt = make_runtime(dram_bytes="8MiB")
    a = random_tensor((32, 32), torch.complex64)
    for t in (a.conj(), a.conj().imag, a.conj().t()):
        x = torch.ones(3, requires_grad=True)
        seen = []
        with tt.offload_saved_tensors(rt, "dram", min_bytes=0, views=views):
            y = Save.apply(x, t, seen)
        y.sum().backward()
        assert torch.equal(seen[0], t)
    a = a.clone().requires_grad_()
    b = random_tensor((32, 32), torch.complex64).requires_grad_()
    for f in (lambda: (a.conj() * b).real.sum(), lambda: (a.conj().imag * b.real).sum()):
        f().backward()
        plain = b.grad.clone()
        b.grad = None
        with tt.offload_saved_tensors(rt, "dram", min_bytes=0, views=views):
            loss = f()
        loss.backward()
        assert torch.equal(b.grad, plain)
        a.grad = b.grad = None


def test_retain_graph_unpacks_twice(make_runtime):
    rt = make_runtime()
    t = random_tensor((64, 64), torch.float32)
    seen = round_trip(rt, t, "nvme", retain=True)
    assert len(seen) == 4
    assert torch.equal(seen[0], t) and torch.equal(seen[2], t)
    gc.collect()
    assert rt.stats()["tensors"] == 0


def test_graph_freed_without_backward_leaks_nothing(make_runtime):
    rt = make_runtime()
    baseline = rt.stats()["tensors"]
    w = torch.randn(64, 64, requires_grad=True)
    with tt.offload_saved_tensors(rt, "nvme", min_bytes=0):
        y = (torch.randn(32, 64) @ w).tanh().exp().sum()
    assert rt.stats()["tensors"] > baseline
    del y
    gc.collect()
    assert rt.stats()["tensors"] == baseline


def test_parameters_and_small_tensors_stay(make_runtime):
    rt = make_runtime()
    lin = torch.nn.Linear(64, 64)
    x = torch.randn(16, 64, requires_grad=True)
    hooks = tt.offload_saved_tensors(rt, "dram", min_bytes=16 * 64 * 4)
    with hooks:
        y = lin(x).relu()  # saves x (4 KiB), the weight's transposed view, relu's output
    # The parameter (a view of it) stays; x and relu's output (16x64 floats) are offloaded.
    assert hooks.packed == 2 and hooks.skipped == 1
    y.sum().backward()
    expected_x = x.grad.clone()
    x.grad = None
    y2 = lin(x).relu()
    y2.sum().backward()
    assert torch.equal(x.grad, expected_x)


def test_library_error_surfaces_and_training_state_is_intact(nvme_dir):
    """An offload that cannot find room raises TiermemError as the context exits; the model, its
    gradients and the runtime stay usable."""
    rt = tiermem.Runtime(device="emulated", hbm_bytes="1MiB", dram_bytes="256KiB",
                         nvme_paths=str(nvme_dir), nvme_bytes="256KiB", io_block_size="64KiB",
                         log_level="error")
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(),
                                    torch.nn.Linear(256, 256))
        before = [p.detach().clone() for p in model.parameters()]
        x = torch.randn(1024, 256)  # 1 MiB activations: more than DRAM and NVMe together
        saves = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saves.append(t.shape) or t,
                                                      lambda t: t):
            model(x).sum()
        hooks = tt.offload_saved_tensors(rt, "dram", min_bytes=0)
        with pytest.raises(tiermem.TiermemError) as e:
            with hooks:
                loss = model(x).sum()
        assert e.value.status in (tiermem.TM_ERR_OUT_OF_MEMORY, tiermem.TM_ERR_NO_SPACE)
        # The first saved tensor that found no room is named (DRAM too small, NVMe full).
        assert "\"saved." in e.value.message and hooks.error is e.value
        # Every save is counted: the one whose pack failed, and those after it, as skipped.
        assert hooks.packed + hooks.shared + hooks.skipped == len(saves), (
            hooks.packed, hooks.shared, hooks.skipped, len(saves))
        # The error's traceback holds the tensor being packed, hence the graph and the tensors
        # packed before it (saved.0 went to NVMe): let go of it with the graph.
        hooks.error = None
        del loss, e
        gc.collect()
        assert rt.stats()["tensors"] == 0
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        assert all(p.grad is None for p in model.parameters())
        # The same batch in pieces that fit works, through the same runtime.
        with tt.offload_saved_tensors(rt, "dram", min_bytes=0):
            model(x[:64]).sum().backward()
        assert all(p.grad is not None for p in model.parameters())
    finally:
        rt.close()


@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_a_tensor_saved_twice_is_copied_once(make_runtime, tier):
    """A ReLU's output is saved by the ReLU and by the next Linear (its input), and y * y saves y
    twice: one copy each, shared by both saves, and the gradients are plain torch's, bit for bit."""
    rt = make_runtime()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    x = torch.randn(32, 64, requires_grad=True)

    def loss():
        h = net(x)
        return (h * h).mean()

    loss().backward()
    plain = [t.grad.clone() for t in (x, *net.parameters())]
    for t in (x, *net.parameters()):
        t.grad = None
    hooks = tt.offload_saved_tensors(rt, tier, min_bytes=0)
    with rt.step():
        with hooks:
            out = loss()
        # x, the ReLU's output (saved twice), the last Linear's output h (saved twice by h * h)
        assert (hooks.packed, hooks.shared, hooks.skipped) == (3, 2, 2)
        out.backward()
    assert all(torch.equal(t.grad, g) for t, g in zip((x, *net.parameters()), plain))
    assert hooks.unpacked_views + hooks.unpacked_copies == 5
    del out
    gc.collect()
    assert rt.stats()["tensors"] == 0


def test_a_tensor_changed_in_place_between_saves_is_copied_again(make_runtime):
    """A save after an in-place change (its version moved on) is not the earlier save's bytes:
    sin's backward reads y as it was, cos's as it is (plain torch refuses this graph; under the
    hooks each save keeps the bytes it was handed, as documented)."""
    rt = make_runtime()
    a = torch.randn(64, 64, dtype=torch.float64, requires_grad=True)
    hooks = tt.offload_saved_tensors(rt, "dram", min_bytes=0)
    with hooks:
        y = a * 1
        u = y.sin()
        y.add_(1)
        w = y.cos()
    assert (hooks.packed, hooks.shared) == (2, 0)
    (u.sum() + w.sum()).backward()
    with torch.no_grad():
        expected = a.cos() - (a + 1).sin()
    assert torch.equal(a.grad, expected)


@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_views_of_the_same_bytes_share_one_copy(make_runtime, tier):
    """3-D activations: each Linear saves its input reshaped to 2-D (a new view of the same
    bytes), so one hidden state feeding q, k and v, and a ReLU's output feeding the next Linear,
    are saved as different tensors over the same elements: one copy each, viewed in each save's
    shape. Different elements of one tensor (its halves) are copies of their own. Gradients are
    plain torch's, bit for bit, and nothing is left."""
    rt = make_runtime()
    torch.manual_seed(0)
    q, k, v = (torch.nn.Linear(64, 64) for _ in range(3))
    relu, out = torch.nn.ReLU(), torch.nn.Linear(64, 64)
    x = torch.randn(4, 8, 64, requires_grad=True)

    def loss():
        h = relu(x * 2)  # saved by the ReLU (3-D) and as q, k and v's input (2-D views)
        a = q(h) * k(h) + v(h)  # mul saves q(h) and k(h)
        lo, hi = a.chunk(2, dim=-1)  # different elements of a: copies of their own
        # out saves a as a 2-D view, square a itself: one copy; then lo and hi, each its own.
        return out(a).sum() + a.square().sum() + (lo * hi).sum()

    params = [x, *q.parameters(), *k.parameters(), *v.parameters(), *out.parameters()]
    loss().backward()
    plain = [t.grad.clone() for t in params]
    for t in params:
        t.grad = None
    hooks = tt.offload_saved_tensors(rt, tier, min_bytes=0)
    with rt.step():
        with hooks:
            y = loss()
        # Copies: h, q(h), k(h), a, lo, hi; shared: h by q, k and v (2-D views), a by square.
        assert (hooks.packed, hooks.shared) == (6, 4), (hooks.packed, hooks.shared)
        y.backward()
    assert all(torch.equal(t.grad, g) for t, g in zip(params, plain))
    del y
    gc.collect()
    assert rt.stats()["tensors"] == 0


def test_another_save_of_the_same_tensor_in_between_keeps_the_share(make_runtime):
    """y, then y.t() (its own copy: another layout), then y again: the third save shares the
    first copy, whichever other views of y were copied in between."""
    rt = make_runtime()
    a = torch.randn(64, 64, requires_grad=True)

    def loss():
        y = a * 2
        return y.sin().sum() + y.t().cos().sum() + y.square().sum()

    loss().backward()
    plain, a.grad = a.grad, None
    hooks = tt.offload_saved_tensors(rt, "dram", min_bytes=0)
    with hooks:
        out = loss()
    assert (hooks.packed, hooks.shared) == (2, 1)
    out.backward()
    assert torch.equal(a.grad, plain)


@pytest.mark.parametrize("between,shared", [(15, 1), (16, 0)])
def test_a_save_shares_one_of_the_last_16_copies(make_runtime, between, shared):
    """The window is counted in copies, whatever their addresses: x saved again after 15 other
    copies shares its copy, after 16 it is copied again."""
    rt = make_runtime()
    x = torch.randn(32, 32, requires_grad=True)
    others = [torch.randn(32, 32, requires_grad=True) for _ in range(between)]
    hooks = tt.offload_saved_tensors(rt, "dram", min_bytes=0)
    with hooks:
        h = x * 1
        loss = h.sin().sum()
        loss = loss + sum((o * 1).sin().sum() for o in others)
        loss = loss + h.cos().sum()
    assert (hooks.packed, hooks.shared) == (between + 2 - shared, shared)
    loss.backward()
    with torch.no_grad():
        assert torch.equal(x.grad, x.cos() - x.sin())


def test_share_false_copies_a_save_written_behind_its_version(make_runtime):
    """A write through .data does not move the tensor's version: a later save would share the
    earlier copy (its bytes from before the write). share=False copies every save."""
    rt = make_runtime()
    a = torch.randn(64, 64, dtype=torch.float64, requires_grad=True)
    for share in (True, False):
        a.grad = None
        hooks = tt.offload_saved_tensors(rt, "dram", min_bytes=0, share=share)
        with hooks:
            y = a * 1.5
            u = y.sin()
            y.data.add_(1)
            w = y.cos()
        assert (hooks.packed, hooks.shared) == ((1, 1) if share else (2, 0))
        (u.sum() + w.sum()).backward()
        with torch.no_grad():
            y0 = a * 1.5
            later = y0 if share else y0 + 1  # the bytes cos's backward reads
            expected = 1.5 * (y0.cos() - later.sin())
        assert torch.allclose(a.grad, expected, rtol=0, atol=1e-12)
