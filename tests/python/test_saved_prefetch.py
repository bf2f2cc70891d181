"""offload_saved_tensors at the link's speed, on the emulated device (HBM is host memory): the
backward's unpacks are served by HBM copies the schedule prefetched ahead, as tensors viewing
them; each saved byte crosses each link once per step; a pack returns while its copy is still
on the (slowed) link and its source stays alive until the copy has passed; views are released
when PyTorch frees them."""

import ctypes
import gc
import weakref

import pytest
import torch

import tiermem
import tiermem.torch as tt
from tinygpt import TinyGPT, batches

STEPS = 5


def delta(after, before):
    moved = {(a, b): after["bytes_moved"][a][b] - before["bytes_moved"][a][b]
             for a in ("hbm", "dram", "nvme") for b in ("hbm", "dram", "nvme")}
    return dict(acquires=after["acquires"] - before["acquires"],
                hits=after["acquire_hits"] - before["acquire_hits"],
                prefetches=after["prefetches"] - before["prefetches"],
                dropped=after["prefetches_dropped"] - before["prefetches_dropped"], moved=moved)


def train(rt, tier):
    torch.manual_seed(0)
    model = TinyGPT(vocab=128, seq=32, hidden=64, heads=4, blocks=2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    steps = []
    for x, y in batches(STEPS, 4, 32, 128):
        before = rt.stats()
        with rt.step():
            with tt.offload_saved_tensors(rt, tier, min_bytes=1024) as hooks:
                loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        del loss
        gc.collect()
        after = rt.stats()
        steps.append((hooks, delta(after, before), after))
    return steps


@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_backward_unpacks_hit_prefetched_hbm_views(make_runtime, tier):
    # To DRAM, a depth that covers the tiny model's whole backward (39 saved tensors, 1.8 MiB):
    # test machines are shared, and a prefetch is only ahead if its mover thread gets a core.
    # To NVMe a smaller one, so that the packs outside the last 2 x depth (7 of 39) are written
    # there and read back ahead of their unpacks. A prefetch's lead is depth unpacks of host
    # time: since the lean pack/unpack path (tm_tensor_create_copy_in_async) made them cheaper,
    # depth 12 hit 143-156 of 156 on the loaded VM (the bound is 141), depth 16 152-156.
    depth = 32 if tier == "dram" else 16
    rt = make_runtime(hbm_bytes="32MiB", dram_bytes="64MiB", prefetch_depth=depth)
    steps = train(rt, tier)
    # From step two on (the schedule was learned in step one), the schedule queues a prefetch
    # for every unpack, and none is dropped (HBM has room for all): that is behaviour, the same
    # on any machine. Whether a prefetch lands before its unpack is timing: its lead is depth
    # unpacks of host time, and a prefetch is only ahead if its mover thread gets a core. On a
    # quiet machine all 39 of 39 hit from step two on, with three busy loops beside it 34-39;
    # CI's 2 cores, running other tests beside this one, gave 137 of 156 (88%), and 111 of 156
    # (71%) once with a build running beside the suite. So 60% is asserted here: clearly above
    # what step one hits without prefetches to NVMe (14-16 of 39, 36-41%: the packs not yet
    # written down), which is what tells prefetching from none; the hit rate itself is a
    # benchmark's (bench/saved_tensors.py).
    # A tensor saved twice (log_softmax's output, saved by it and by nll_loss) is one copy that
    # two unpacks acquire: prefetched once, for the first. The context's exit starts the last
    # packs into HBM itself (a hint, which the schedule's count leaves out): here it takes one
    # copy that the schedule would have started at the next use, so one fewer may be counted.
    later = [(h, d) for h, d, _ in steps[1:]]
    for h, d in later:
        assert h.shared > 0 and d["acquires"] == h.packed + h.shared, (h.packed, h.shared, d)
        assert h.packed - 1 <= d["prefetches"] <= h.packed, (h.packed, d)
        assert d["dropped"] == 0, d
    later = [d for _, d in later]
    hits, acquires = sum(d["hits"] for d in later), sum(d["acquires"] for d in later)
    assert hits >= 0.6 * acquires, "%d of %d unpacks hit" % (hits, acquires)
    if tier == "nvme":
        assert sum(d["moved"]["dram", "nvme"] for _, d, _ in steps) > 0
    for i, (hooks, d, after) in enumerate(steps):
        assert hooks.packed > 20
        # Every unpack views the acquired HBM copy; nothing is copied out.
        saves = hooks.packed + hooks.shared
        assert hooks.unpacked_views == saves and hooks.unpacked_copies == 0
        assert d["acquires"] == saves
        # Views were released when PyTorch freed them: the saved tensors were all destroyed
        # (a pinned one cannot be), and no HBM copy is left.
        assert after["tensors"] == 0
        assert after["tiers"]["hbm"]["used"] == 0


@pytest.mark.parametrize("tier,inclusive", [("dram", "on"), ("nvme", "on"), ("nvme", "off")],
                         ids=["dram", "nvme", "nvme-exclusive"])
def test_each_saved_byte_crosses_each_link_once(make_runtime, tier, inclusive):
    rt = make_runtime(hbm_bytes="32MiB", dram_bytes="64MiB", dram_inclusive=inclusive)
    written = rewritten = total = 0
    steps = train(rt, tier)
    for hooks, d, _ in steps:
        moved, packed = d["moved"], hooks.packed_bytes
        total += packed
        if tier == "dram":
            assert moved["dram", "hbm"] == packed  # up the link once, for the backward
            assert moved["hbm", "dram"] == 0  # the HBM copies are clean: dropped, not written
            assert moved["dram", "nvme"] == moved["nvme", "dram"] == 0
        else:
            # What went down to NVMe came back once (exclusive tiers), or not at all: inclusive
            # DRAM (the default) kept clean copies, and DRAM has room for all. The last packs
            # (the backward's first unpacks) stay in DRAM, as does one the backward reaches
            # before its write did.
            if inclusive == "off":
                assert moved["dram", "nvme"] == moved["nvme", "dram"] <= packed
            else:
                assert moved["nvme", "dram"] == 0 and moved["dram", "nvme"] <= packed
            assert moved["dram", "hbm"] >= packed
            written += moved["dram", "nvme"]
            # Under load an offload that runs after the schedule's prefetch into HBM drops the
            # HBM copy, which then crosses again: rare (seen once in many runs), bounded here.
            rewritten += moved["dram", "hbm"] - packed + moved["hbm", "dram"]
    assert tier == "dram" or (written > 0 and rewritten <= total // 20)
    if tier == "nvme" and inclusive == "on":
        assert steps[-1][2]["clean_read_bytes"] > 0


class Save(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, t, seen):
        ctx.save_for_backward(t)
        ctx.seen = seen
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        (t,) = ctx.saved_tensors
        ctx.seen.append(t)
        return g, None, None


def device_tensor(rt, values):
    """A float32 tensor in the emulated device's memory (an acquired HBM copy), as an activation
    lives in GPU memory: its copy into DRAM crosses the (capped) link."""
    n = values.numel() * 4
    src = rt.tensor(n, "other", "hbm", "activation")
    src.write(values.numpy().tobytes())
    ptr = src.acquire("hbm", "read")
    t = torch.frombuffer((ctypes.c_char * n).from_address(ptr), dtype=torch.float32)
    return src, t


def test_pack_returns_before_its_copy_lands_and_keeps_the_source(make_runtime):
    # 4 MiB at 0.02 GB/s: about 200 ms on the link.
    rt = make_runtime(hbm_bytes="32MiB", dram_bytes="32MiB", emu_link_gbps=0.02)
    values = torch.randn(1 << 20)
    src, t = device_tensor(rt, values)
    source = weakref.ref(t)
    x = torch.ones(3, requires_grad=True)
    seen = []
    hooks = tt.offload_saved_tensors(rt, "dram", min_bytes=0)
    with hooks:
        y = Save.apply(x, t, seen)
    del t
    assert hooks.packed == 1
    stash = hooks.stash
    assert len(stash) == 1, "the pack returned with its copy done: nothing was asynchronous"
    (packed, _, _), = list(stash._entries)
    assert not packed.tm.copy_done()
    gc.collect()
    assert source() is not None, "the source was let go while its copy still read it"
    stash.flush()
    assert packed.tm.copy_done() and len(stash) == 0
    gc.collect()
    assert source() is None, "the stash kept the source after its copy had passed"
    y.sum().backward()
    assert torch.equal(seen[0], values)
    src.release("hbm")
    del seen, y, packed
    gc.collect()
    src.destroy()
    assert rt.stats()["tensors"] == 0


def test_stash_is_bounded(make_runtime):
    rt = make_runtime(hbm_bytes="32MiB", dram_bytes="32MiB", emu_link_gbps=0.05)
    srcs = [device_tensor(rt, torch.full((1 << 18,), float(i))) for i in range(4)]  # 1 MiB each
    x = torch.ones(3, requires_grad=True)
    seen = []
    hooks = tt.offload_saved_tensors(rt, "dram", min_bytes=0, stash_bytes=2 << 20)
    with hooks:
        ys = [Save.apply(x, t, seen) for _, t in srcs]
    assert hooks.stash.bytes <= 2 << 20
    assert hooks.stash.waits >= 1
    sum(y.sum() for y in ys).backward()
    assert sorted(float(s[0]) for s in seen) == [0.0, 1.0, 2.0, 3.0]
    hooks.stash.flush()
    del seen, ys
    gc.collect()
    for src, _ in srcs:
        src.release("hbm")
        src.destroy()
    assert rt.stats()["tensors"] == 0


def test_views_are_released_when_pytorch_frees_them(make_runtime):
    rt = make_runtime(hbm_bytes="8MiB", dram_bytes="8MiB")
    base = rt.stats()["tensors"]
    t = torch.randn(64, 64)
    x = torch.ones(3, requires_grad=True)
    seen = []
    with tt.offload_saved_tensors(rt, "dram", min_bytes=0) as hooks:
        y = Save.apply(x, t, seen)
    y.sum().backward()
    assert hooks.unpacked_views == 1
    view = seen.pop()
    assert torch.equal(view, t)
    # The graph is gone, but the view still holds the acquired HBM copy (and its tensor, which
    # was destroyed: its DRAM copy, which nothing views, is freed at once).
    del y
    gc.collect()
    assert rt.stats()["tensors"] == base + 1
    assert rt.stats()["tiers"]["hbm"]["used"] > 0
    assert rt.stats()["tiers"]["dram"]["used"] == 0
    assert torch.equal(view, t)
    del view
    gc.collect()
    assert rt.stats()["tensors"] == base
    assert rt.stats()["tiers"]["hbm"]["used"] == 0


def test_no_room_in_hbm_copies_out(make_runtime):
    rt = make_runtime(hbm_bytes="1MiB", dram_bytes="8MiB")
    t = torch.randn(1 << 19)  # 2 MiB: more than the whole HBM tier
    x = torch.ones(3, requires_grad=True)
    seen = []
    with tt.offload_saved_tensors(rt, "dram", min_bytes=0) as hooks:
        y = Save.apply(x, t, seen)
    y.sum().backward()
    assert hooks.unpacked_views == 0 and hooks.unpacked_copies == 1
    assert torch.equal(seen[0], t)


def test_views_off_copies_out(make_runtime):
    rt = make_runtime()
    t = torch.randn(64, 64)
    x = torch.ones(3, requires_grad=True)
    seen = []
    with tt.offload_saved_tensors(rt, "dram", min_bytes=0, views=False) as hooks:
        y = Save.apply(x, t, seen)
    y.sum().backward()
    assert hooks.unpacked_views == 0 and hooks.unpacked_copies == 1
    assert torch.equal(seen[0], t)
    assert rt.stats()["acquires"] == 0
    assert isinstance(hooks, tt.SavedTensorOffload) and tiermem.version()


def test_hbm_tier_from_a_framework_allocator(nvme_dir):
    """device_alloc / device_free as Python callables (tiermem.torch.runtime passes PyTorch's
    caching allocator this way on CUDA): every HBM copy a view serves came from the callback,
    and went back to it."""
    blocks = {}

    def alloc(nbytes, device, stream):
        buf = ctypes.create_string_buffer(nbytes)
        blocks[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    def free(ptr, nbytes, device, stream):
        del blocks[ptr]

    with tiermem.Runtime(device="emulated", hbm_bytes="8MiB", dram_bytes="8MiB",
                         nvme_paths=str(nvme_dir), nvme_bytes="8MiB", log_level="error",
                         device_alloc=alloc, device_free=free) as rt:
        assert rt.info()["device_allocator"]
        t = torch.randn(128, 64)
        x = torch.ones(3, requires_grad=True)
        seen = []
        with tt.offload_saved_tensors(rt, "dram", min_bytes=0) as hooks:
            y = Save.apply(x, t, seen)
        y.sum().backward()
        assert hooks.unpacked_views == 1 and len(blocks) == 1
        (ptr,) = blocks
        assert seen[0].data_ptr() == ptr and torch.equal(seen[0], t)
        del seen, y
        gc.collect()
        assert not blocks and rt.stats()["tensors"] == 0
    with pytest.raises(TypeError, match="two callables"):
        tiermem.Runtime(device="emulated", device_alloc=alloc)


def test_torch_runtime_helper(nvme_dir):
    with tt.runtime(device="emulated", hbm_bytes="8MiB", dram_bytes="8MiB",
                    nvme_paths=str(nvme_dir), nvme_bytes="8MiB", log_level="error") as rt:
        assert not rt.info()["device_allocator"]  # the emulated device keeps its own memory
    assert set(tt.caching_allocator()) == {"device_alloc", "device_free"}


def test_last_packs_start_into_hbm_when_the_forward_ends(make_runtime):
    """The backward's first unpacks are the forward's last packs, which the schedule cannot
    prefetch: the context starts them into HBM when it exits, as many as the prefetch depth.
    Checked in a first step (no schedule yet), after waiting for the moves."""
    rt = make_runtime(hbm_bytes="8MiB", dram_bytes="8MiB", prefetch_depth=4)
    ts = [torch.full((64, 64), float(i)) for i in range(6)]
    x = torch.ones(3, requires_grad=True)
    seen = []
    with rt.step():
        with tt.offload_saved_tensors(rt, "dram", min_bytes=0) as hooks:
            y = x
            for t in ts:
                y = Save.apply(y, t, seen)
        rt.sync()
        before = rt.stats()
        y.sum().backward()
        after = rt.stats()
    assert hooks.unpacked_views == 6
    assert after["acquires"] - before["acquires"] == 6
    assert after["acquire_hits"] - before["acquire_hits"] == 4  # the last 4 packs, not the rest
    assert [float(s[0, 0]) for s in seen] == [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]


def test_a_ctrl_c_in_a_saved_tensors_finalizer_reaches_the_main_thread(make_runtime, monkeypatch):
    """Python passes an exception raised in a finalizer to sys.unraisablehook, which printed
    "Exception ignored" and dropped it: a third of an outside client's Ctrl-Cs with
    offload_saved_tensors did nothing (the interrupt landed in a saved tensor's finalizer).
    tiermem.torch's hook hands a KeyboardInterrupt from one of its finalizers on to the main
    thread; anything else goes to the hook that was there."""
    import sys
    import time

    from tiermem import _hot
    from tiermem.torch.activations import saved_tensors as st

    rt = make_runtime(dram_bytes="1MiB")
    x = torch.randn(64, 64, requires_grad=True)
    with tt.offload_saved_tensors(rt, "dram", min_bytes=0) as hooks:
        y = (x * x).sum()
    assert hooks.packed > 0
    destroy = _hot.destroy

    def interrupted(bits, h):
        destroy(bits, h)
        raise KeyboardInterrupt

    monkeypatch.setattr(_hot, "destroy", interrupted)
    seen = []
    monkeypatch.setattr(sys, "__unraisablehook__", lambda u: seen.append(u.exc_type))
    with pytest.raises(KeyboardInterrupt):
        del y  # frees the graph, and with it the saved copies
        for _ in range(5000):  # it comes 10 ms later, at an instruction of the main thread
            time.sleep(0.001)
    assert seen == [], "handed to the default hook, which drops it"
    monkeypatch.setattr(_hot, "destroy", destroy)
    assert st._Packed.__module__.startswith("tiermem.")
