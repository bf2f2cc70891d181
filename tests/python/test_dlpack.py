"""tiermem.Tensor.acquire_dlpack (tm_tensor_acquire_dlpack): an acquired copy as a DLPack capsule
that torch.from_dlpack takes, released when the tensor PyTorch made is freed, or when the capsule
is dropped untaken; the tiermem tensor outliving destroy() until then."""

import gc

import pytest
import torch

import tiermem


def filled(rt, values, name="x"):
    t = rt.tensor(values.numel() * values.element_size(), cls="activation", name=name)
    t.write(values.numpy().tobytes())
    return t


@pytest.mark.parametrize("tier", ["hbm", "dram"])
def test_a_view_with_its_shape_and_strides(make_runtime, tier):
    rt = make_runtime()
    src = torch.arange(24, dtype=torch.float32)
    t = filled(rt, src)
    v = torch.from_dlpack(t.acquire_dlpack(tier, torch.float32, (4, 6)))
    assert v.shape == (4, 6) and v.stride() == (6, 1) and v.device.type == "cpu"
    assert torch.equal(v.flatten(), src)
    w = torch.from_dlpack(t.acquire_dlpack(tier, "float32", (6, 4), strides=(1, 6)))
    assert torch.equal(w, src.view(4, 6).t())
    h = torch.from_dlpack(t.acquire_dlpack(tier, torch.int16, (2,), byte_offset=8))
    assert h.tolist() == [0, 16384]  # the two halves of 2.0f, little-endian
    with pytest.raises(tiermem.TiermemError, match="DLPack exports"):
        t.release(tier)  # an export's pin is its deleter's
    del v, w, h
    gc.collect()
    t.destroy()  # nothing pins it now


def test_destroy_while_a_view_is_out_frees_at_the_view(make_runtime):
    rt = make_runtime()
    base = rt.stats()
    src = torch.randn(64, 64)
    t = filled(rt, src)
    v = torch.from_dlpack(t.acquire_dlpack("hbm", torch.float32, (64, 64)))
    view = v[3:9, ::2]  # a view of the view keeps it too
    del v
    t.destroy()
    with pytest.raises(tiermem.TiermemError, match="destroyed"):
        t.read(4)
    gc.collect()
    assert rt.stats()["tensors"] == base["tensors"] + 1
    assert rt.stats()["tiers"]["dram"]["used"] == base["tiers"]["dram"]["used"]
    assert torch.equal(view, src[3:9, ::2])
    del view
    gc.collect()
    assert rt.stats()["tensors"] == base["tensors"]
    assert rt.stats()["tiers"]["hbm"]["used"] == base["tiers"]["hbm"]["used"]


def test_an_untaken_capsule_releases_when_dropped(make_runtime):
    rt = make_runtime()
    t = filled(rt, torch.zeros(16))
    capsule = t.acquire_dlpack("hbm", "float32", (16,))
    with pytest.raises(tiermem.TiermemError, match="only by DLPack exports"):
        t.release("hbm")
    del capsule
    gc.collect()
    with pytest.raises(tiermem.TiermemError, match="is not acquired in hbm"):
        t.release("hbm")  # the capsule's acquire went with it
    t.destroy()


def test_bad_layouts_and_dtypes_are_refused(make_runtime):
    rt = make_runtime()
    t = filled(rt, torch.zeros(16))
    with pytest.raises(tiermem.TiermemError, match="reaches byte 68 of a tensor of 64"):
        t.acquire_dlpack("hbm", "float32", (17,))
    with pytest.raises(tiermem.TiermemError, match="negative"):
        t.acquire_dlpack("hbm", "float32", (4, 4), strides=(-4, 1))
    with pytest.raises(tiermem.TiermemError, match="nvme"):
        t.acquire_dlpack("nvme", "float32", (16,))
    with pytest.raises(ValueError, match="no DLPack code"):
        t.acquire_dlpack("hbm", "float7", (16,))
    with pytest.raises(ValueError, match="2 strides for 1"):
        t.acquire_dlpack("hbm", "float32", (16,), strides=(1, 1))
    t.destroy()  # none of them acquired anything


def test_a_saved_tensor_kept_past_close_keeps_its_bytes(make_runtime):
    """A view of an HBM copy kept past close() (a custom Function stashing ctx.saved_tensors)
    keeps the runtime's memory: it reads its own bytes after a new runtime wrote its tensors (it
    read another tensor's bytes, silently, before: an outside client)."""
    import tiermem.torch as tt

    kept = []

    class Keep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            kept.append(ctx.saved_tensors[0])
            return g * 2

    rt = make_runtime(dram_bytes="16MiB")
    x = torch.randn(256, 256, requires_grad=True)
    with rt.step():
        with tt.offload_saved_tensors(rt, tier="dram") as hooks:
            y = Keep.apply(x * 1.0).sum()
        y.backward()
    assert hooks.unpacked_views >= 1
    assert rt.stats()["dlpack_exports"] == 1  # the kept one; the others were freed
    want = kept[0].clone()
    rt.close()
    rt2 = make_runtime(dram_bytes="16MiB")
    for i in range(4):
        t = rt2.tensor(256 * 256 * 4, cls="activation", home="hbm", name="other.%d" % i)
        t.write(bytes(256 * 256 * 4))
    assert torch.equal(kept[0], want)
    kept.clear()
    gc.collect()  # the last view: the closed runtime goes with it
