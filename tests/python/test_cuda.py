"""On a GPU (skipped without a CUDA-enabled torch and a tiermem built with CUDA): CUDA tensors
move with copy_in / copy_out on the current stream, device memory straight to and from pinned
DRAM; the tiny GPT trains bit-identically on the GPU with each offload and all three; layouts
come back exact; a CUDA tensor and an emulated runtime are refused, not crashed on; the
backward's unpacks are views of HBM copies prefetched ahead, a pack does not wait for its copy,
parameters offloaded by unit train bit-identically and view their HBM copies, and the HBM tier
can draw from PyTorch's caching allocator.

TM_TEST_REQUIRE_CUDA=1 (set by tools/gpu_check.sh) turns every such skip into a failure: on a GPU
machine a runtime that cannot be created on CUDA is a fault, not a reason to pass."""

import gc
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts

import pytest  # noqa: E402
import torch  # noqa: E402

import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402
from tinygpt import TinyGPT, batches  # noqa: E402

REQUIRE_CUDA = os.environ.get("TM_TEST_REQUIRE_CUDA") == "1"
pytestmark = pytest.mark.skipif(not torch.cuda.is_available() and not REQUIRE_CUDA,
                                reason="no CUDA-enabled torch/GPU")


@pytest.fixture(autouse=True)
def _cuda_is_there():
    if REQUIRE_CUDA and not torch.cuda.is_available():
        pytest.fail("TM_TEST_REQUIRE_CUDA=1 but torch %s has no usable CUDA device" %
                    torch.__version__)


@pytest.fixture
def cuda_runtime(nvme_dir):
    made = []

    def make(**settings):
        base = dict(device="cuda", hbm_bytes="64MiB", dram_bytes="8MiB",
                    nvme_paths=str(nvme_dir), nvme_bytes="256MiB", log_level="error")
        base.update(settings)
        try:
            rt = tiermem.Runtime(**base)
        except tiermem.TiermemError as e:
            if REQUIRE_CUDA:
                pytest.fail("TM_TEST_REQUIRE_CUDA=1 and no CUDA runtime of tiermem: %s" % e)
            pytest.skip("no CUDA runtime of tiermem: %s" % e)
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.close()
    assert os.listdir(nvme_dir) == [], "swap files left behind"


def train(rt=None, saved=None, optim=None, params=None, steps=3, counts=None):
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(0)
    torch.cuda.manual_seed(0)
    model = TinyGPT(vocab=128, seq=32, hidden=64, heads=4, blocks=2).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    handles = []
    if params:
        handles.append(tt.offload_parameters(model, rt, params, optimizer=opt))
    if optim:
        handles.append(tt.offload_optimizer_state(opt, rt, optim))
    step_with = handles[-1] if handles else opt  # the offloads' bucketed step
    losses = []
    for x, y in batches(steps, 4, 32, 128):
        x, y = x.cuda(), y.cuda()
        if rt is not None:
            with rt.step():
                if saved:
                    with tt.offload_saved_tensors(rt, saved, min_bytes=1024) as hooks:
                        loss = model(x, y)
                    if counts is not None:
                        counts["packed"] = counts.get("packed", 0) + hooks.packed
                        counts["packed_bytes"] = (counts.get("packed_bytes", 0) +
                                                  hooks.packed_bytes)
                else:
                    loss = model(x, y)
                loss.backward()
                step_with.step()
                opt.zero_grad()
        else:
            loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        losses.append(loss.item())
    for h in handles:
        h.remove()
    torch.cuda.synchronize()
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("config", [dict(saved="dram"), dict(saved="nvme"),
                                    dict(optim="nvme"), dict(params="nvme"),
                                    dict(saved="nvme", optim="nvme", params="nvme")],
                         ids=lambda c: "+".join("%s-%s" % kv for kv in c.items()))
def test_gpt_bit_identical_on_the_gpu(cuda_runtime, config):
    reference = train()
    rt = cuda_runtime()
    counts = {}
    losses, params = train(rt, counts=counts, **config)
    assert losses == reference[0]
    assert all(torch.equal(a, b) for a, b in zip(params, reference[1]))
    stats = rt.stats()
    # Bit-identical training proves nothing if nothing left the GPU: something was offloaded.
    if "saved" in config:
        assert counts.get("packed", 0) > 0 and counts["packed_bytes"] > 0, counts
    if "dram" in config.values():
        assert stats["tiers"]["dram"]["peak"] > 0, "nothing was ever held in DRAM"
    if "nvme" in config.values():
        assert stats["bytes_moved"]["dram"]["nvme"] > 0
    # Device memory went straight to DRAM (D2H); only the backward's unpacks (views of HBM
    # copies) and the parameters' prefetches use tiermem's HBM tier.
    if set(config) == {"optim"}:
        assert stats["tiers"]["hbm"]["peak"] == 0
    if "saved" in config:
        assert stats["tiers"]["hbm"]["peak"] > 0


def test_layouts_on_the_gpu(cuda_runtime):
    rt = cuda_runtime()
    base = torch.arange(4 * 6 * 5, dtype=torch.float32, device="cuda").view(4, 6, 5)
    cases = [base, base.transpose(0, 2), base[:, ::2, 1:], base[1:3].expand(2, 6, 5),
             base.to(torch.bfloat16), (base > 7), base.to(torch.int64)[::3]]
    for t in cases:
        seen = []

        class Save(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(t)
                return x.clone()

            @staticmethod
            def backward(ctx, g):
                (u,) = ctx.saved_tensors
                seen.append(u)
                return g

        x = torch.ones(3, device="cuda", requires_grad=True)
        with tt.offload_saved_tensors(rt, "nvme", min_bytes=0):
            y = Save.apply(x)
        y.sum().backward()
        (u,) = seen
        assert u.device == t.device and u.dtype == t.dtype
        assert tuple(u.size()) == tuple(t.size()) and tuple(u.stride()) == tuple(t.stride())
        assert torch.equal(u, t)


def test_cuda_tensor_with_an_emulated_runtime_is_refused(make_runtime):
    rt = make_runtime()
    x = torch.ones(1024, device="cuda", requires_grad=True)
    with pytest.raises((ValueError, tiermem.TiermemError, RuntimeError)):
        with tt.offload_saved_tensors(rt, "dram", min_bytes=0):
            y = (x * x).sum()
        y.backward()


def test_saved_views_hit_prefetched_hbm_on_the_gpu(cuda_runtime):
    rt = cuda_runtime(hbm_bytes="256MiB", dram_bytes="256MiB", prefetch_depth=8)
    torch.manual_seed(0)
    model = TinyGPT(vocab=128, seq=32, hidden=64, heads=4, blocks=2).cuda()
    for i, (x, y) in enumerate(batches(4, 4, 32, 128)):
        before = rt.stats()
        with rt.step():
            with tt.offload_saved_tensors(rt, "dram", min_bytes=1024) as hooks:
                loss = model(x.cuda(), y.cuda())
            loss.backward()
        del loss
        gc.collect()
        torch.cuda.synchronize()
        rt.sync()
        after = rt.stats()
        acquires = after["acquires"] - before["acquires"]
        hits = after["acquire_hits"] - before["acquire_hits"]
        # A save that shares an earlier copy (log_softmax's output, saved by nll_loss too) is
        # one more unpack of that copy.
        saves = hooks.packed + hooks.shared
        assert hooks.unpacked_views == saves and hooks.packed > 0 and hooks.unpacked_copies == 0
        assert acquires == saves
        if i >= 1:
            assert hits >= 0.9 * acquires, "step %d: %d of %d hit" % (i + 1, hits, acquires)
        moved = after["bytes_moved"]["dram"]["hbm"] - before["bytes_moved"]["dram"]["hbm"]
        assert moved == hooks.packed_bytes
        assert after["tensors"] == 0 and after["tiers"]["hbm"]["used"] == 0


def test_pack_does_not_wait_for_its_copy_on_the_gpu(cuda_runtime):
    rt = cuda_runtime(hbm_bytes="64MiB", dram_bytes="1GiB")
    t = torch.randn(128 << 20, device="cuda")  # 512 MiB: several ms over any link
    x = torch.ones(3, device="cuda", requires_grad=True)
    seen = []

    class Save(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(t)
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            seen.append(ctx.saved_tensors[0].clone())
            return g

    torch.cuda.synchronize()
    hooks = tt.offload_saved_tensors(rt, "dram", min_bytes=0, views=False)
    with hooks:
        y = Save.apply(x)
    in_flight = len(hooks.stash)
    assert in_flight == 1, "the pack returned after its copy had landed"
    hooks.stash.flush()
    y.sum().backward()
    assert torch.equal(seen[0], t)


def test_parameters_by_unit_on_the_gpu(cuda_runtime):
    def run(rt=None):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(64, 32), *[
            torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
            for _ in range(3)]).cuda()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        h = None if rt is None else tt.offload_parameters(
            model, rt, "dram", optimizer=opt, units={torch.nn.TransformerEncoderLayer})
        g = torch.Generator().manual_seed(3)
        losses = []
        for _ in range(3):
            idx = torch.randint(64, (4, 8), generator=g).cuda()
            loss = model(idx).square().mean()
            loss.backward()
            (opt if h is None else h).step()  # the offload's bucketed step
            opt.zero_grad()
            losses.append(loss.item())
        if h is not None:
            h.remove()
        return losses, [p.detach().clone() for p in model.parameters()]

    torch.use_deterministic_algorithms(True, warn_only=True)
    ref = run()
    got = run(cuda_runtime())
    assert got[0] == ref[0] and all(torch.equal(a, b) for a, b in zip(got[1], ref[1]))


def test_parameters_view_their_hbm_copy_on_the_gpu(cuda_runtime):
    """While a unit runs, each CUDA parameter is a tensor over the device pointer of its acquired
    HBM copy; no copy in or out; bit-identical with plain training; nothing left acquired."""
    def run(rt=None):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(64, 32), *[
            torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
            for _ in range(3)]).cuda()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        h = None if rt is None else tt.offload_parameters(
            model, rt, "dram", optimizer=opt, units={torch.nn.TransformerEncoderLayer})
        seen = []
        if h is not None:
            block = model[2]

            def inside(module, inputs, output):
                for p in block.parameters():
                    tm = h.records[id(p)].tm
                    address = tm.acquire("hbm", "read")
                    seen.append(p.data_ptr() == address)
                    tm.release("hbm")
            block.linear1.register_forward_hook(inside)
        g = torch.Generator().manual_seed(3)
        losses = []
        for _ in range(3):
            idx = torch.randint(64, (4, 8), generator=g).cuda()
            loss = model(idx).square().mean()
            loss.backward()
            (opt if h is None else h).step()  # the offload's bucketed step
            opt.zero_grad()
            losses.append(loss.item())
        if h is not None:
            torch.cuda.synchronize()
            for s in h.records.values():
                s.tm.offload("dram")  # an acquired copy would refuse (TM_ERR_BUSY)
            assert seen and all(seen) and h.views > 0 and h.copies == 0
            h.remove()
        return losses, [p.detach().clone() for p in model.parameters()]

    torch.use_deterministic_algorithms(True, warn_only=True)
    ref = run()
    got = run(cuda_runtime())
    assert got[0] == ref[0] and all(torch.equal(a, b) for a, b in zip(got[1], ref[1]))


def test_hbm_tier_from_the_caching_allocator(nvme_dir):
    with tt.runtime(device="cuda", hbm_bytes="64MiB", dram_bytes="64MiB",
                    nvme_paths=str(nvme_dir), nvme_bytes="64MiB", log_level="error") as rt:
        assert rt.info()["device_allocator"]
        t = torch.randn(1 << 20, device="cuda")
        x = torch.ones(3, device="cuda", requires_grad=True)
        seen = []

        class Save(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(t)
                return x.clone()

            @staticmethod
            def backward(ctx, g):
                seen.append(ctx.saved_tensors[0])
                return g

        with tt.offload_saved_tensors(rt, "dram", min_bytes=0) as hooks:
            y = Save.apply(x)
        cached = torch.cuda.memory_allocated()
        y.sum().backward()
        assert hooks.unpacked_views == 1 and torch.equal(seen[0], t)
        # The HBM copy the view shows came from PyTorch's allocator.
        assert torch.cuda.memory_allocated() >= cached + t.numel() * 4
        seen.clear()
        del y
        gc.collect()
        torch.cuda.synchronize()
        rt.sync()
        assert rt.stats()["tensors"] == 0
