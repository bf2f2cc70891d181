"""transformers' LlamaForCausalLM and GPT2LMHeadModel (tiny configs built in place, no download,
dropout 0, fixed seed, deterministic algorithms) go through every offload of tiermem.torch:
activations (offload_saved_tensors, DRAM and NVMe), optimizer state (offload_optimizer_state,
DRAM and NVMe), parameters (offload_parameters, DRAM and NVMe), all three at once, CPUAdam (state
in DRAM and on NVMe) and fit (with a plan that recomputes one block and offloads the other),
each with transformers' gradient checkpointing off, non-reentrant and reentrant. Every run
trains a few AdamW steps bit-identically to plain training (torch.equal on the losses and on
every parameter after), CPUAdam within AdamW's tolerance. fit refuses a model that hands its
blocks a KV cache (use_cache=True), which a recompute would update twice."""

import contextlib
import gc
import warnings

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not importable: these tests train its Llama and GPT-2")

import tiermem.torch as tt  # noqa: E402
from tiermem.torch import CPUAdam  # noqa: E402
from tiermem.torch.fit import DRAM, NVME, RECOMPUTE  # noqa: E402

VOCAB, SEQ, BATCH, STEPS = 128, 16, 2, 3
# test_cpu_adam.py's hyperparameters: AdamW with decoupled weight decay, as the models train.
HYPER = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

MODELS = ["llama", "gpt2"]
# transformers' own gradient checkpointing (torch.utils.checkpoint around each decoder layer's
# forward): off, non-reentrant (transformers' default) and reentrant.
CHECKPOINTING = ["no-ckpt", "ckpt-nonreentrant", "ckpt-reentrant"]
OFFLOADS = {
    "saved-dram": dict(saved="dram"),
    "saved-nvme": dict(saved="nvme"),
    "optim-dram": dict(optim="dram"),
    "optim-nvme": dict(optim="nvme"),
    "params-dram": dict(params="dram"),
    "params-nvme": dict(params="nvme"),
    "all-nvme": dict(saved="nvme", optim="nvme", params="nvme"),
    "cpuadam-dram": dict(cpuadam="dram"),
    "cpuadam-nvme": dict(cpuadam="nvme"),
    # fit profiles the model, then the plan is set by hand so that every run recomputes a
    # block (fit's own torch.utils.checkpoint) and offloads the other's activations.
    "fit-recompute+dram": dict(fit=[RECOMPUTE, DRAM]),
    "fit-nvme+recompute": dict(fit=[NVME, RECOMPUTE]),
}


def build(kind, ckpt):
    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
            attention_dropout=0.0, attn_implementation="sdpa")
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
            attn_implementation="eager")
        model = transformers.GPT2LMHeadModel(config)  # head tied to the token embedding
    model.train()
    if ckpt != "no-ckpt":
        with warnings.catch_warnings():  # transformers 5 names it activation_checkpointing_...
            warnings.simplefilter("ignore", FutureWarning)
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": ckpt == "ckpt-reentrant"})
    return model


def batches():
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(VOCAB, (BATCH, SEQ), generator=g) for _ in range(STEPS)]


def blocks_of(model):
    return model.model.layers if hasattr(model, "model") else model.transformer.h


def next_token_loss(x):
    """fit's loss_fn for model(x) (its inputs are positional, and the models order their
    forward's arguments differently): the causal LM loss on x."""
    return lambda out: torch.nn.functional.cross_entropy(out.logits[:, :-1].flatten(0, 1),
                                                         x[:, 1:].flatten())


def train(kind, ckpt, rt=None, saved=None, optim=None, params=None, cpuadam=None, fit=None,
          use_cache=None, seen=None):
    """STEPS steps of AdamW (or CPUAdam); the losses and the parameters after. Plain training
    without rt. seen collects what each offload did, for the caller to check."""
    torch.use_deterministic_algorithms(True)
    model = build(kind, ckpt)
    if cpuadam:
        opt = CPUAdam(model.parameters(), runtime=rt, state_tier=cpuadam, threads=1,
                      **HYPER)
    else:
        opt = torch.optim.AdamW(model.parameters(), foreach=False, **HYPER)
    handles = []
    if params:
        handles.append(tt.offload_parameters(model, rt, params, optimizer=opt))
    if optim:
        handles.append(tt.offload_optimizer_state(opt, rt, optim))
    step_with = handles[-1] if handles else opt  # the offloads' bucketed step
    if use_cache is not None:
        model.config.use_cache = use_cache  # also for fit's model(*inputs)
    data = batches()
    plan = None
    if fit:
        plan = tt.fit(model, rt, 1 << 40, (data[0],), loss_fn=next_token_loss(data[0]),
                      min_bytes=1024, profile_steps=1, check_steps=1, max_replans=0,
                      log=lambda line: None)
        plan.apply(fit)
        if seen is not None:
            # Forwards of each block's MLP: a recomputed block's runs again in backward.
            seen["forwards"] = [0] * len(fit)
            for i, b in enumerate(blocks_of(model)):
                b.mlp.register_forward_pre_hook(
                    lambda m, a, i=i: seen["forwards"].__setitem__(i, seen["forwards"][i] + 1))
    losses = []
    for x in data:
        step = rt.step() if rt is not None else contextlib.nullcontext()
        with step:
            if saved:
                ctx = tt.offload_saved_tensors(rt, saved, min_bytes=1024)
            else:
                ctx = plan if plan is not None else contextlib.nullcontext()
            with ctx:
                loss = model(input_ids=x, labels=x, use_cache=use_cache).loss
                if plan is not None:
                    loss.backward()  # inside the plan: the recompute's tensors are its too
            if plan is None:
                loss.backward()
            step_with.step()
            opt.zero_grad()
        losses.append(loss.detach())
        if seen is not None and saved:
            seen.setdefault("packed", []).append(ctx.packed)
    if seen is not None:
        for h in handles:
            if hasattr(h, "views"):
                seen["param_bring_ins"] = h.views + h.copies
    for h in handles:
        h.remove()
    if plan is not None:
        plan.remove()
        assert all("forward" not in b.__dict__ for b in blocks_of(model))
    if cpuadam:
        opt.close()
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.fixture(scope="module", autouse=True)
def quick():
    """One intra-op thread, as test_cpu_adam.py: these models' ops are far too small to split,
    and on a loaded 2-core machine torch's spinning workers slow every step several times. And
    the objects of torch and transformers (their lazy imports done by building each model once)
    frozen out of the garbage collector: each test's gc.collect() then takes milliseconds, not
    the 0.2 s of scanning them all, a third of this file's time."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    for kind in MODELS:
        build(kind, "no-ckpt")
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def plain():
    """Plain training, once per model, checkpointing and use_cache, shared by the tests."""
    runs = {}

    def get(kind, ckpt, use_cache=None):
        key = kind, ckpt, use_cache
        if key not in runs:
            runs[key] = train(kind, ckpt, use_cache=use_cache)
        return runs[key]

    return get


def assert_bit_identical(got, want):
    (losses, params), (ref_losses, ref_params) = got, want
    assert len(losses) == len(ref_losses) == STEPS
    for i, (a, b) in enumerate(zip(losses, ref_losses)):
        assert torch.equal(a, b), "step %d: loss %r, plain %r" % (i, a.item(), b.item())
    assert len(params) == len(ref_params)
    for i, (a, b) in enumerate(zip(params, ref_params)):
        assert torch.equal(a, b), "parameter %d differs from plain training by up to %g" % (
            i, (a - b).abs().max().item())


# CPUAdam's step is AdamW's formula in tiermem's vectorized kernel, rounded in another order, so
# it is compared within AdamW's tolerance rather than bit for bit:
# - the losses within test_cpu_adam.py's 1e-5 relative (its 200-step curves follow AdamW's that
#   closely; an lr 1% off already moves these 3 steps' losses by 2-5e-5);
# - the parameters by their updates (p after - p before), as relative errors against AdamW's:
#   over the whole model at most 1e-4, and per tensor at most 1e-2. Measured: 5e-7 (Llama) and
#   1.7e-5 (GPT-2) over the model, per tensor 8e-6 (Llama) and 4e-4 (GPT-2's c_attn.bias: its
#   key part gets a gradient that is rounding noise, softmax being blind to it, which Adam scales
#   up towards lr * noise / eps, so that last-bit differences in the weights show there). An lr
#   1% off gives 1e-2 over the model; a tensor stepped once too often or not at all, 0.3 and more.
#   A plain elementwise rtol/atol cannot tell that noise (2.6e-6 on a bias near 0, a quarter of a
#   percent of lr) from a wrong step.
LOSS_RTOL = 1e-5
UPDATE_RTOL_MODEL, UPDATE_RTOL_TENSOR = 1e-4, 1e-2


def assert_within_adamw_tolerance(got, want, start):
    (losses, params), (ref_losses, ref_params) = got, want
    assert len(losses) == len(ref_losses) == STEPS
    assert torch.equal(losses[0], ref_losses[0])  # before any step: the same model
    worst = max(abs(a.item() - b.item()) / abs(b.item()) for a, b in zip(losses, ref_losses))
    assert worst <= LOSS_RTOL, "losses differ from AdamW by %.3g relative" % worst
    assert len(params) == len(ref_params) == len(start)
    err = ref = 0.0
    for i, (a, b, s) in enumerate(zip(params, ref_params, start)):
        e, r = (a - b).norm().item() ** 2, (b - s).norm().item() ** 2
        assert r > 0, "parameter %d: AdamW did not move it" % i
        assert e <= UPDATE_RTOL_TENSOR ** 2 * r, (
            "parameter %d: update differs from AdamW's by %.3g relative" % (i, (e / r) ** 0.5))
        err, ref = err + e, ref + r
    assert err <= UPDATE_RTOL_MODEL ** 2 * ref, (
        "the model's update differs from AdamW's by %.3g relative" % (err / ref) ** 0.5)


def runtime_for(make_runtime, config):
    # The conftest's small budgets (DRAM 256 KiB, 128 KiB of it beside staging) make even "dram"
    # spill to NVMe: the optimizer's state (2 x 350-430 KiB) and the parameters go through it.
    # Parameters: HBM below the model's (353 KiB Llama, 430 KiB GPT-2) so that units come and go.
    # CPUAdam: DRAM for all of its state with "dram" (a step pins DRAM-only state); with "nvme",
    # 1 MiB, below the state (1.06 MB Llama, 1.3 MB GPT-2), which then streams through NVMe, and
    # room for the largest parameter's state and its shadow (2 x 144 KiB, GPT-2's c_attn) beside
    # the pinned copies (at 512 KiB a step found no hole for the shadow: TM_ERR_OUT_OF_MEMORY).
    settings = {}
    if config.get("saved") == "nvme":
        # "nvme" writes down all but the last 2 x prefetch_depth packs: under checkpointing,
        # where only the 8 tensors outside the layers are saved, depth 1 still sends most down.
        settings["prefetch_depth"] = 1
    if config.get("params"):
        settings["hbm_bytes"] = "320KiB"
    if config.get("cpuadam"):
        settings["dram_bytes"] = "4MiB" if config["cpuadam"] == "dram" else "1MiB"
    if config.get("fit"):
        settings.update(hbm_bytes="32MiB", dram_bytes="64MiB")
    return make_runtime(**settings)


@pytest.mark.parametrize("offload", list(OFFLOADS))
@pytest.mark.parametrize("ckpt", CHECKPOINTING)
@pytest.mark.parametrize("kind", MODELS)
def test_trains_like_plain(make_runtime, plain, kind, ckpt, offload):
    config = OFFLOADS[offload]
    rt = runtime_for(make_runtime, config)
    # fit needs use_cache=False (test_fit_refuses_a_kv_cache), and so does its reference.
    use_cache = False if "fit" in config else None
    seen = {}
    got = train(kind, ckpt, rt, use_cache=use_cache, seen=seen, **config)
    want = plain(kind, ckpt, use_cache)
    if "cpuadam" in config:
        start = [p.detach() for p in build(kind, ckpt).parameters()]
        assert_within_adamw_tolerance(got, want, start)
    else:
        assert_bit_identical(got, want)
    # The offloads did something.
    moved = rt.stats()["bytes_moved"]
    if "saved" in config:
        assert all(n > 0 for n in seen["packed"]), seen
        if ckpt == "no-ckpt":  # ~1 MB saved a step against 128 KiB of DRAM: through NVMe
            assert moved["dram"]["nvme"] > 0 and moved["nvme"]["dram"] > 0, moved
    if "params" in config:
        assert seen["param_bring_ins"] > 0
    if "fit" in config:
        # fit recomputed its block: one forward more a step than the offloaded block's (3
        # against 2 under transformers' own checkpointing, which recomputes both in backward).
        rec = config["fit"].index(RECOMPUTE)
        per_step = 2 if ckpt != "no-ckpt" else 1
        assert seen["forwards"][1 - rec] == per_step * STEPS, seen
        assert seen["forwards"][rec] == (per_step + 1) * STEPS, seen
    if config.get("optim") or config.get("params") or config.get("cpuadam") == "nvme":
        assert moved["dram"]["nvme"] > 0 and moved["nvme"]["dram"] > 0, moved
    gc.collect()
    assert rt.stats()["tensors"] == 0


@pytest.mark.parametrize("kind", MODELS)
def test_fit_refuses_a_kv_cache(make_runtime, kind):
    """Without gradient checkpointing transformers' models build a KV cache in training too
    (use_cache defaults to True), and each decoder layer appends to it in its forward: a block
    fit recomputes would append a second time in backward and attend over both (wrong gradients
    on Llama's sdpa, a shape error on GPT-2's eager attention). fit says so, the model
    unchanged."""
    rt = make_runtime(hbm_bytes="32MiB", dram_bytes="64MiB")
    model = build(kind, "no-ckpt")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = batches()[0]
    with pytest.raises(tt.FitError, match=r"KV cache \(DynamicCache.*use_cache=False"):
        tt.fit(model, rt, 1 << 40, (x,), loss_fn=next_token_loss(x), min_bytes=1024,
               profile_steps=1, check_steps=1, log=lambda line: None)
    assert all("forward" not in b.__dict__ for b in blocks_of(model))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_fit_under_torch_compile(make_runtime):
    """A fitted GPT-2 compiled after fit (aot_eager): fit's hooks run eagerly, so its blocks'
    saved tensors still go to DRAM every step (traced by dynamo, they routed nothing, and an
    outside client's compiled model kept every activation in HBM, over the budget), and
    training is bit-identical to the plain model compiled the same way."""
    torch.use_deterministic_algorithms(True)
    torch._dynamo.reset()
    data = batches()

    def run(model, call, rt=None, plan=None):
        losses = []
        for x in data:
            if plan is None:
                losses.append(call(input_ids=x, labels=x, use_cache=False).loss)
                losses[-1].backward()
                continue
            before = rt.stats()["copied_in_bytes"]  # saved tensors copied into DRAM
            with rt.step(), plan:
                losses.append(call(input_ids=x, labels=x, use_cache=False).loss)
                losses[-1].backward()
            assert rt.stats()["copied_in_bytes"] > before, "no saved tensor was offloaded"
        return [loss.detach() for loss in losses], [p.grad.clone() for p in model.parameters()]

    plain = build("gpt2", "no-ckpt")
    want = run(plain, torch.compile(plain, backend="aot_eager"))
    torch._dynamo.reset()
    rt = make_runtime(hbm_bytes="32MiB", dram_bytes="64MiB")
    model = build("gpt2", "no-ckpt")
    model.config.use_cache = False
    plan = tt.fit(model, rt, 1 << 40, (data[0],), loss_fn=next_token_loss(data[0]),
                  min_bytes=1024, profile_steps=1, check_steps=1, max_replans=0,
                  log=lambda line: None)
    plan.apply([DRAM, DRAM])
    got = run(model, torch.compile(model, backend="aot_eager"), rt, plan)
    plan.remove()
    torch._dynamo.reset()
    assert all(torch.equal(a, b) for a, b in zip(got[0], want[0]))
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))

