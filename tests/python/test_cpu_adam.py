"""tiermem.torch.CPUAdam: the tiny GPT trains to torch.optim.AdamW's loss curve (state in DRAM
and on NVMe, with and without clipping), checkpoints move between the two optimizers, bf16
parameters are the fp32 master rounded to nearest even, each kernel gives the same curve, and a
step whose NVMe state cannot be read changes nothing."""

import copy
import ctypes
import io
import json
import os
import subprocess

import pytest
import torch

import tiermem
import tiermem.torch as tt
from tiermem import _optim_capi
from tiermem.torch import CPUAdam
from tiermem.torch.cpu_adam import isa, set_isa_limit
from swap_files import flip_swap_files, restore
from tinygpt import TinyGPT, batches

# One intra-op thread: the tiny GPT's ops are far too small to split, and on a shared 2-core
# machine torch's spinning workers made a step 8x slower under load (60 s against 7 s per 100
# steps at load average 13). Every run here, the references included, uses the same setting.
torch.set_num_threads(1)

# 200 steps of the tiny GPT take ~12 s per run on this 2-core machine. lr 1e-3 (torch's default):
# at 1e-2 this model's training is chaotic enough that last-bit differences (which torch's own
# vectorized and scalar paths also have: FMA or not) grow past 1e-5 after ~140 steps, even for
# the baseline kernel, which rounds every operation on its own as torch's scalar code does.
STEPS = 200
# A small tiny GPT (27k parameters in 28 tensors: every kind of layer, with biases and norms of
# odd sizes) on 4 x 16 tokens, so that the 200-step curves stay cheap: the curve's check is the
# same for any size, and bigger sizes are the benchmarks' and the kernel tests' business.
SEQ, BATCH, VOCAB = 16, 4, 128
HYPER = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
CLIP = 0.5


def model():
    torch.manual_seed(0)
    return TinyGPT(vocab=VOCAB, seq=SEQ, hidden=32, heads=4, blocks=2)


def run(m, opt, steps, clip=None, start=0, torch_clip=False):
    losses = []
    for i, (x, y) in enumerate(batches(start + steps, BATCH, SEQ, VOCAB)):
        if i < start:
            continue
        torch.manual_seed(1000 + i)  # dropout masks independent of what ran before
        loss = m(x, y)
        loss.backward()
        if torch_clip:
            torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def reference(steps, clip=None):
    m = model()
    opt = torch.optim.AdamW(m.parameters(), foreach=False, **HYPER)
    return run(m, opt, steps, clip, torch_clip=clip is not None)


@pytest.fixture(scope="module")
def ref_curves():
    return {None: reference(STEPS), CLIP: reference(STEPS, CLIP)}


def assert_same_curve(got, want):
    assert len(got) == len(want)
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    assert worst <= 1e-5, "loss curves differ by %.3g relative (at most 1e-5)" % worst


@pytest.mark.parametrize("clip", [None, CLIP], ids=["noclip", "clip"])
@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_tiny_gpt_follows_adamw(make_runtime, ref_curves, tier, clip):
    # NVMe: 384 KiB of DRAM (128 KiB for staging) against 360 KiB of state, so that each step
    # streams most of it through NVMe. DRAM: room for all of it (a step pins DRAM-only state).
    rt = make_runtime(dram_bytes="4MiB" if tier == "dram" else "384KiB", nvme_bytes="64MiB",
                      prefetch_depth=2)
    m = model()
    start = [p.detach().clone() for p in m.parameters()]
    opt = CPUAdam(m.parameters(), runtime=rt, state_tier=tier, max_grad_norm=clip, threads=2,
                  **HYPER)
    got = run(m, opt, STEPS)
    assert_same_curve(got, ref_curves[clip])
    if tier == "nvme":
        moved = rt.stats()["bytes_moved"]
        assert moved["nvme"]["dram"] > STEPS * 12 * 30080 // 2, "the state was read from NVMe"
        assert moved["dram"]["nvme"] > STEPS * 12 * 30080 // 2, "and written back"
    # The parameters moved (the data is random tokens: the loss itself stays near log(128)).
    assert max((p.detach() - q).abs().max().item() for p, q in zip(m.parameters(), start)) > 0.05
    opt.close()


def test_clipping_changes_the_curve(ref_curves):
    assert ref_curves[None] != ref_curves[CLIP], "CLIP must be small enough to trigger"


def test_checkpoints_move_between_the_two(make_runtime):
    half = 20
    # AdamW -> CPUAdam
    m1 = model()
    a = torch.optim.AdamW(m1.parameters(), foreach=False, **HYPER)
    run(m1, a, half)
    sd = a.state_dict()
    m2 = model()
    m2.load_state_dict(m1.state_dict())
    c = CPUAdam(m2.parameters(), runtime=make_runtime(dram_bytes="4MiB"), **HYPER)
    c.load_state_dict(sd)
    cont_a = run(m1, a, half, start=half)
    cont_c = run(m2, c, half, start=half)
    assert_same_curve(cont_c, cont_a)
    # CPUAdam -> AdamW, and the layouts agree key for key.
    sd_c = c.state_dict()
    # A snapshot, the step counters too: torch's load_state_dict keeps a CPU `step` tensor as
    # given, so an AdamW loading a live counter would advance CPUAdam's step (and CPUAdam its):
    # the curves below then drifted apart from their second step (5.5e-5 under torch 2.11).
    for i, p in enumerate(m2.parameters()):
        assert sd_c["state"][i]["step"] is not c.state[p]["step"], "the checkpoint's own step"
    sd_a = a.state_dict()
    assert sd_c["state"].keys() == sd_a["state"].keys()
    for k in sd_a["state"]:
        assert sd_c["state"][k].keys() == sd_a["state"][k].keys()
        for name, t in sd_a["state"][k].items():
            assert sd_c["state"][k][name].shape == t.shape, name
    assert sd_c["param_groups"][0]["params"] == sd_a["param_groups"][0]["params"]
    # Every group key of AdamW's (differentiable, fused, ...), also in a CPUAdam that loaded
    # nothing: DCP loads a checkpoint into an optimizer only when it holds every key of that
    # optimizer's state_dict.
    fresh = CPUAdam(model().parameters(), runtime=make_runtime(dram_bytes="4MiB"), **HYPER)
    for sd in (sd_c, fresh.state_dict()):
        assert sd["param_groups"][0].keys() == sd_a["param_groups"][0].keys()
    fresh.close()
    m3 = model()
    m3.load_state_dict(m2.state_dict())
    a2 = torch.optim.AdamW(m3.parameters(), foreach=False, **HYPER)
    a2.load_state_dict(sd_c)
    assert_same_curve(run(m3, a2, half, start=2 * half), run(m2, c, half, start=2 * half))
    c.close()


def test_bf16_parameters_are_the_master_rounded():
    torch.manual_seed(3)
    p = torch.nn.Parameter(torch.randn(1000).to(torch.bfloat16))
    opt = CPUAdam([p], lr=1e-2)
    for _ in range(3):
        p.grad = torch.randn(1000).to(torch.bfloat16)
        opt.step()
    master = opt.state_dict()["state"][0]["master_param"]
    assert master.dtype == torch.float32
    assert torch.equal(master.to(torch.bfloat16), p.detach()), "bf16 = master rounded (RNE)"
    assert not torch.equal(master, p.detach().float()), "the master keeps more than bf16"
    opt.close()


@pytest.mark.parametrize("kernel", ["baseline", "avx2", "avx512"])
def test_every_kernel_follows_adamw(kernel, ref_curves):
    if ["baseline", "avx2", "avx512"].index(kernel) > ["baseline", "avx2", "avx512"].index(
            isa()[0]):
        pytest.skip("this CPU does not run %s" % kernel)
    assert set_isa_limit(kernel) == kernel
    try:
        m = model()
        opt = CPUAdam(m.parameters(), **HYPER)
        assert_same_curve(run(m, opt, 50), ref_curves[None][:50])
        opt.close()
    finally:
        set_isa_limit("avx512")


def test_struct_layouts_match_the_header():
    exe = os.environ.get("TIERMEM_ABI_LAYOUT")
    if not exe:
        pytest.skip("TIERMEM_ABI_LAYOUT is not set (ctest sets it to the python_abi_layout program)")
    c = json.loads(subprocess.check_output([exe]))
    mirror = {"tm_adam_config": _optim_capi.AdamConfig, "tm_adam_span": _optim_capi.AdamSpan,
              "tm_adam_bucket": _optim_capi.AdamBucket, "tm_adam_group": _optim_capi.AdamGroup}
    for cname, cls in mirror.items():
        fields = dict(c[cname])
        assert ctypes.sizeof(cls) == fields.pop("__size__"), cname
        assert [n for n, _ in cls._fields_] == list(fields), cname + ": field names or order"
        for name, offset in fields.items():
            assert getattr(cls, name).offset == offset, "%s.%s" % (cname, name)


def test_bad_arguments():
    p = torch.nn.Parameter(torch.zeros(4))
    with pytest.raises(ValueError, match="state_tier"):
        CPUAdam([p], state_tier="disk")
    with pytest.raises(ValueError, match="nvme"):
        CPUAdam([p], state_tier="nvme")
    assert CPUAdam([p], state_tier="DRAM").state_tier == "dram"  # any case, as tier= takes it
    # State in DRAM larger than the whole tier: refused when made (it failed at the first step).
    with tiermem.Runtime(device="emulated", hbm_bytes="16MiB", dram_bytes="1MiB",
                         log_level="error") as small:
        big = torch.nn.Parameter(torch.zeros(256, 1024))
        with pytest.raises(ValueError, match=r"CPUAdam: state_tier=\"dram\" holds the state "
                           r"\(2097152 bytes.*whole DRAM tier"):
            CPUAdam([big], runtime=small)
    # threads out of range: a ValueError as for the other arguments (it was tm_adam_create's
    # TiermemError naming a C field); not an int: a TypeError.
    for bad in (-1, 1025):
        with pytest.raises(ValueError, match=r"CPUAdam: threads=%d; want 0" % bad):
            CPUAdam([p], threads=bad)
    for bad in (1.5, "2", True):
        with pytest.raises(TypeError, match="CPUAdam: threads="):
            CPUAdam([p], threads=bad)
    p.grad = torch.ones(4)
    opt = CPUAdam([p])
    opt.param_groups[0]["betas"] = (0.9, 1.0)  # changed after construction: the step checks
    with pytest.raises(tiermem.TiermemError, match="beta2"):
        opt.step()
    assert torch.equal(p.detach(), torch.zeros(4)), "a refused step changed nothing"
    opt.close()
    with pytest.raises(ValueError, match="set_isa_limit"):
        set_isa_limit("sse9")


@pytest.mark.parametrize("hyper", [dict(lr=-1.0), dict(lr=float("nan")), dict(eps=-1e-8),
                                   dict(eps=float("nan")), dict(betas=(1.5, 0.9)),
                                   dict(betas=(0.9, 1.0)), dict(betas=(0.9, -0.1)),
                                   dict(weight_decay=-1.0)], ids=str)
def test_bad_hyperparameters_are_refused_as_adamw_refuses_them(hyper):
    """At construction, with torch.optim.AdamW's ValueError and message (not at the first step,
    a TiermemError); nothing is made."""
    p = torch.nn.Parameter(torch.zeros(4))
    with pytest.raises(ValueError) as want:
        torch.optim.AdamW([p], **hyper)
    with pytest.raises(ValueError) as got:
        CPUAdam([p], **hyper)
    assert str(got.value) == str(want.value)


def test_hyperparameters_of_the_wrong_kind_are_named():
    p = torch.nn.Parameter(torch.zeros(4))
    for bad in [(0.9,), (0.9, 0.99, 0.999), 0.9, None]:
        with pytest.raises(ValueError, match=r"Invalid betas: .*want a pair"):
            CPUAdam([p], betas=bad)
    for name in ("lr", "eps", "weight_decay"):
        with pytest.raises(TypeError, match="^CPUAdam: %s='x': want a number" % name):
            CPUAdam([p], **{name: "x"})
        with pytest.raises(TypeError, match="^CPUAdam: %s='1': want a number" % name):
            CPUAdam([p], **{name: "1"})  # a string, even of a number
    # Named (an outside client met "'>' not supported between 'str' and 'int'"), and a string
    # amsgrad refused rather than taken as true.
    with pytest.raises(TypeError, match="^CPUAdam: max_grad_norm='1': want a number"):
        CPUAdam([p], max_grad_norm="1")
    with pytest.raises(TypeError, match="^CPUAdam: amsgrad='yes': want True or False"):
        CPUAdam([p], amsgrad="yes")
    opt = CPUAdam([p], lr=torch.tensor(1e-2))  # a tensor lr, as AdamW takes it
    p.grad = torch.ones(4)
    opt.step()
    assert (p.detach() < 0).all()
    opt.close()


def test_a_closed_optimizer_says_so():
    p = torch.nn.Parameter(torch.zeros(4))
    p.grad = torch.ones(4)
    opt = CPUAdam([p])
    opt.step()
    sd = opt.state_dict()
    opt.close()
    opt.close()  # once
    for call in (opt.step, opt.state_dict, lambda: opt.load_state_dict(sd)):
        with pytest.raises(tiermem.TiermemError, match="the optimizer was closed") as e:
            call()
        assert e.value.status == tiermem.TM_ERR_INVALID_HANDLE
        assert "0x0000000000000000" not in str(e.value)


@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_a_checkpoint_of_other_shapes_is_refused_and_changes_nothing(make_runtime, tier):
    """A checkpoint of another model (other widths), or of the same one's parameters in another
    order: AdamW fails at its next step; CPUAdam loaded it, cut or padded to each parameter's
    size, and trained on state that was not that parameter's (an outside client). Refused,
    naming the entry and both shapes, before anything changes."""
    rt = make_runtime(dram_bytes="4MiB")
    m = _small(torch.float32)
    opt = CPUAdam(m.parameters(), runtime=rt, state_tier=tier, **HYPER)
    _train(m, opt, 2)
    before = opt.state_dict()
    wide = torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.Tanh(), torch.nn.Linear(48, 4))
    other = torch.optim.AdamW(wide.parameters(), **HYPER)
    _train(wide, other, 1)
    theirs = other.state_dict()
    theirs["param_groups"][0]["lr"] = 0.5
    with pytest.raises(ValueError, match=r"'exp_avg' of state 0 is a torch.float32 tensor of "
                                         r"shape \(48, 16\), its parameter's shape is \(32, 16\)"):
        opt.load_state_dict(theirs)
    mine = opt.state_dict()
    mine["state"] = {3 - k: v for k, v in mine["state"].items()}  # the parameters reversed
    with pytest.raises(ValueError,
                       match=r"of state 3 is .* shape \(32, 16\), its parameter's shape is \(4,\)"):
        opt.load_state_dict(mine)
    mine["state"] = {7: before["state"][0]}
    with pytest.raises(ValueError, match="state 7 names no parameter of this optimizer"):
        opt.load_state_dict(mine)
    # Malformed entries, the last one bad (the entries before it were loaded already, and a
    # two-element step raised torch's own error from .item()).
    for k, bad, words in ((3, dict(step=torch.tensor([1.0, 2.0])), "the step of state 3 is"),
                          (3, dict(step=-1.0), "the step of state 3 is -1.0"),
                          (3, dict(step=None), "state 3 has no step"),
                          (3, dict(exp_avg_sq=None), "state 3 has exp_avg but not exp_avg_sq"),
                          (1, dict(exp_avg=before["state"][1]["exp_avg"].long()),
                           "'exp_avg' of state 1 is a torch.int64 tensor; want a floating")):
        mine = opt.state_dict()
        for key, value in bad.items():
            if value is None:
                del mine["state"][k][key]
            else:
                mine["state"][k][key] = value
        with pytest.raises(ValueError, match=words):
            opt.load_state_dict(mine)
    after = opt.state_dict()
    assert after["param_groups"] == before["param_groups"]
    for k, entry in before["state"].items():
        for name, t in entry.items():
            assert torch.equal(after["state"][k][name], t), (k, name)
    opt.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_parameter_written_between_steps_is_what_the_master_steps(make_runtime, dtype):
    """With a master beside the parameter (state on NVMe, or a bf16 parameter), the master's
    value won over a write to the parameter: a resume that loaded the optimizer before the model
    went on from the fresh model's initial weights, and a clamp_ between steps was undone (an
    outside client). A write moves the parameter's _version; the step takes the written
    elements into the master and keeps the master's precision in the others."""
    def run(order=None, clamp=False):
        rt = make_runtime(dram_bytes="256KiB")
        m = _small(dtype)
        opt = CPUAdam(m.parameters(), runtime=rt, state_tier="nvme", **HYPER)
        _train(m, opt, 3)
        if order is not None:  # a resume: a fresh model and optimizer load the checkpoint
            sd_m, sd_o = m.state_dict(), opt.state_dict()
            opt.close()
            m = _small(dtype)
            for p in m.parameters():  # initial weights unlike the trained ones
                p.data.add_(1)
            opt = CPUAdam(m.parameters(), runtime=rt, state_tier="nvme", **HYPER)
            for what in order:
                (m.load_state_dict(sd_m) if what == "model" else opt.load_state_dict(sd_o))
        for i in range(3, 6):
            if clamp:
                with torch.no_grad():
                    for p in m.parameters():
                        p.clamp_(-0.05, 0.05)
            _train(m, opt, 1, start=i)
        out = [p.detach().clone() for p in m.parameters()]
        opt.close()
        return out

    straight = run()
    for order in (("model", "optimizer"), ("optimizer", "model")):
        assert all(torch.equal(a, b) for a, b in zip(run(order), straight)), order
    # The clamp is what each next step starts from (an Adam step moves a weight by about lr;
    # the first layer's initial weights reach 0.25): as AdamW, whose parameter is its master.
    clamped = run(clamp=True)
    assert all(p.float().abs().max() <= 0.05 + 2 * HYPER["lr"] for p in clamped)
    m = _small(dtype)
    ref = torch.optim.AdamW(m.parameters(), foreach=False, **HYPER)
    _train(m, ref, 3)
    for i in range(3, 6):
        with torch.no_grad():
            for p in m.parameters():
                p.clamp_(-0.05, 0.05)
        _train(m, ref, 1, start=i)
    if dtype == torch.float32:
        for a, b in zip(clamped, m.parameters()):
            torch.testing.assert_close(a, b.detach(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_a_checkpoint_without_a_parameters_entry_restarts_its_moments(make_runtime, tier):
    """AdamW replaces its whole state at a load, so a parameter the checkpoint has no entry for
    starts afresh; CPUAdam restarted its step but kept its old moments (an outside client)."""
    def run(opt_of):
        m = _small(torch.float32)
        opt = opt_of(m)
        _train(m, opt, 3)
        sd = opt.state_dict()
        del sd["state"][2]
        opt.load_state_dict(copy.deepcopy(sd))
        _train(m, opt, 2, start=3)
        out = [p.detach().clone() for p in m.parameters()]
        return out, opt

    rt = make_runtime(dram_bytes="4MiB" if tier == "dram" else "256KiB")
    got, opt = run(lambda m: CPUAdam(m.parameters(), runtime=rt, state_tier=tier, **HYPER))
    assert 2 in opt.state_dict()["state"]  # stepped again since, from zeros
    opt.close()
    want, _ = run(lambda m: torch.optim.AdamW(m.parameters(), foreach=False, **HYPER))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_offload_parameters_without_the_optimizer_keeps_its_updates(make_runtime, tier):
    """offload_parameters without optimizer=, its units copied in (views=False): CPUAdam writes
    the updated parameters through their addresses, which moved no _version, so a unit going
    out dropped the update as unchanged, and the run went on from stale parameters (an outside
    client). The step moves the versions of what it wrote."""
    def run(offload):
        rt = make_runtime(dram_bytes="4MiB")
        m = _small(torch.float32)
        opt = CPUAdam(m.parameters(), runtime=rt, state_tier=tier, **HYPER)
        params = tt.offload_parameters(m, rt, tier="dram", views=False) if offload else None
        for i in range(5):
            with rt.step():
                g = torch.Generator().manual_seed(i)
                m(torch.randn(8, 16, generator=g)).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
        if params is not None:
            assert params.copies > 0, "the units were copied in"
            params.remove()
        out = [p.detach().clone() for p in m.parameters()]
        opt.close()
        return out

    for a, b in zip(run(True), run(False)):
        assert torch.equal(a, b)


def test_group_keys_the_kernel_cannot_honour_are_refused_at_the_step(make_runtime):
    """maximize=True set in param_groups, or loaded from an AdamW(maximize=True) checkpoint, was
    kept and ignored: the optimizer minimized (an outside client). The step refuses it, nothing
    changed; a loaded torch.optim.Adam checkpoint's decoupled_weight_decay says what steps."""
    m = _small(torch.float32)
    opt = CPUAdam(m.parameters(), runtime=make_runtime(dram_bytes="4MiB"), **HYPER)
    _train(m, opt, 1)
    for steps, key in enumerate(("maximize", "differentiable"), 1):
        before = [p.detach().clone() for p in m.parameters()]
        opt.param_groups[0][key] = True
        m(torch.ones(2, 16)).sum().backward()
        with pytest.raises(tiermem.TiermemError, match="a parameter group has %s=True, which "
                           "this optimizer cannot honour: .*the step was not taken" % key):
            opt.step()
        assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))
        assert opt.state_dict()["state"][0]["step"].item() == steps
        opt.param_groups[0][key] = False
        opt.step()
        opt.zero_grad()
    for key, value, words in (("decoupled_weight_decay", False,
                               "decoupled_weight_decay=False, but this optimizer steps AdamW"),
                              ("betas", (0.9,), r"betas=\(0.9,\); want a pair")):
        if key not in opt.param_groups[0]:
            continue
        kept = opt.param_groups[0][key]
        opt.param_groups[0][key] = value
        m(torch.ones(2, 16)).sum().backward()
        with pytest.raises(tiermem.TiermemError, match=words):
            opt.step()
        opt.param_groups[0][key] = kept
        opt.zero_grad()
    adam = torch.optim.Adam(_small(torch.float32).parameters(), **HYPER)
    sd = adam.state_dict()
    if "decoupled_weight_decay" in sd["param_groups"][0]:
        opt.load_state_dict(sd)
        assert opt.param_groups[0]["decoupled_weight_decay"] is True
    opt.close()


def test_adamws_keyword_flags_are_taken_as_adamw_takes_them():
    """A configuration written for AdamW passed on as it is (transformers'
    optimizer_cls_and_kwargs): its flags were a TypeError. foreach / fused / capturable are
    carried and change nothing; maximize / differentiable only as False;
    decoupled_weight_decay only as adamw says."""
    m = _small(torch.float32)
    opt = CPUAdam(m.parameters(), foreach=False, fused=None, capturable=False, maximize=False,
                  differentiable=False, decoupled_weight_decay=True, **HYPER)
    assert opt.param_groups[0]["foreach"] is False and opt.param_groups[0]["fused"] is None
    _train(m, opt, 1)
    opt.close()
    for kw, error, words in ((dict(maximize=True), ValueError, "maximize=True cannot be"),
                             (dict(differentiable=True), ValueError, "differentiable=True"),
                             (dict(decoupled_weight_decay=False), ValueError, "give adamw=False"),
                             (dict(foreach="no"), TypeError, "foreach='no'"),
                             (dict(momentum=0.9), TypeError, "unexpected keyword argument")):
        with pytest.raises(error, match=words):
            CPUAdam(m.parameters(), **kw)


@pytest.mark.parametrize("overlap", [True, "yes", 1])
def test_overlap_asked_where_it_cannot_be_is_refused_by_name(overlap):
    """overlap=True with CPU parameters failed in torch.cuda.Stream() with a CUDA error; a
    value that is not a bool went the same way."""
    m = _small(torch.float32)
    error = ValueError if overlap is True else TypeError
    with pytest.raises(error, match="CPUAdam: overlap="):
        CPUAdam(m.parameters(), overlap=overlap, **HYPER)


def _train(m, opt, steps, start=0):
    for i in range(start, start + steps):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(8, 16, generator=g).to(next(m.parameters()).dtype)
        m(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def _small(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 4)).to(dtype)


@pytest.mark.parametrize("tier,dtype,amsgrad", [("dram", torch.float32, False),
                                                ("nvme", torch.float32, True),
                                                ("dram", torch.bfloat16, False),
                                                ("nvme", torch.float16, False)])
def test_runtime_close_brings_the_state_home(make_runtime, tier, dtype, amsgrad):
    """The runtime closed before the optimizer (a `with tiermem.Runtime()` block ending first, an
    exception in it): its close() brings the moments (and the fp32 masters of bf16 / fp16
    parameters) home into torch tensors, as it brings offload_optimizer_state's: state_dict()
    gives what it gave before, and the optimizer steps on, bit for bit the run whose runtime
    stayed open; a new parameter group and a load_state_dict() work there too."""
    runs = []
    for close_first in (False, True):
        m = _small(dtype)
        rt = make_runtime(dram_bytes="1MiB")
        opt = CPUAdam(m[0].parameters(), runtime=rt, state_tier=tier, amsgrad=amsgrad, lr=1e-2)
        _train(m, opt, 3)
        before = opt.state_dict()
        if close_first:
            rt.close()
            assert rt.closed
            after = opt.state_dict()
            assert sorted(after["state"][0]) == sorted(before["state"][0])
            for k, entry in before["state"].items():
                for name, t in entry.items():
                    assert torch.equal(after["state"][k][name], t), (k, name)
        opt.add_param_group(dict(params=list(m[2].parameters())))
        _train(m, opt, 3, start=3)
        opt.load_state_dict(opt.state_dict())
        _train(m, opt, 2, start=6)
        runs.append(([p.detach().clone() for p in m.parameters()], opt.state_dict()))
        opt.close()
        opt.close()
    (kept, kept_sd), (home, home_sd) = runs
    assert all(torch.equal(a, b) for a, b in zip(kept, home)), "the run after close differs"
    for k, entry in kept_sd["state"].items():
        for name, t in entry.items():
            assert torch.equal(home_sd["state"][k][name], t), (k, name)
    assert "master_param" in kept_sd["state"][0] or dtype == torch.float32


def test_runtime_close_refused_when_the_state_cannot_come_home(make_runtime):
    """A state that cannot be read refuses the close (TM_ERR_BUSY naming CPUAdam): the runtime
    stays open with the state, which a later close brings home."""
    p = torch.nn.Parameter(torch.zeros(64))
    p.grad = torch.ones(64)
    rt = make_runtime(dram_bytes="1MiB")
    opt = CPUAdam([p], runtime=rt, state_tier="nvme")
    opt.step()
    want = opt.state_dict()
    slot = opt._store[p]
    handle, slot.handles = slot.handles, [tiermem._capi.Tensor()]  # the zero handle: reads fail
    with pytest.raises(tiermem.TiermemError, match="CPUAdam could not bring") as e:
        rt.close()
    assert e.value.status == tiermem.TM_ERR_BUSY and not rt.closed
    slot.handles = handle
    rt.close()
    got = opt.state_dict()
    assert all(torch.equal(got["state"][0][k], want["state"][0][k]) for k in want["state"][0])
    opt.close()


def cuda_curve(make_opt, steps):
    """The tiny GPT trained on the GPU for `steps` steps by the optimizer make_opt(model) makes,
    with run()'s batches and dropout seeds: its loss curve."""
    m = model().cuda()
    opt = make_opt(m)
    losses = []
    for i, (x, y) in enumerate(batches(steps, BATCH, SEQ, VOCAB)):
        torch.manual_seed(1000 + i)
        loss = m(x.cuda(), y.cuda())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, opt


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the overlap path copies "
                    "gradients down on a side stream and steps during backward")
def test_overlap_on_gpu_follows_adamw(make_runtime):
    # The reference is torch.optim.AdamW stepping the same model on the same GPU, not the CPU
    # curve: a CUDA forward and backward is another computation (dropout's masks come from
    # CUDA's Philox generator, not the CPU's, for the same seed; cuBLAS and the CUDA reductions
    # round differently), so a GPU curve leaves the CPU one within a few steps (0.55% relative
    # on the H200 under torch 2.11), whichever optimizer steps it. On one GPU the same
    # parameters give the same gradients in both runs (the tiny GPT's backward kernels, cuBLAS
    # on one stream, embedding, layer norm, cross entropy, sum without atomics), so only the
    # optimizers' last bits differ, as on the CPU, where 1e-5 holds over 200 steps.
    want, _ = cuda_curve(lambda m: torch.optim.AdamW(m.parameters(), foreach=False, **HYPER), 50)
    got, opt = cuda_curve(lambda m: CPUAdam(m.parameters(),
                                            runtime=make_runtime(dram_bytes="4MiB"),
                                            overlap=True, **HYPER), 50)
    assert opt._overlap is not None, "the overlap path ran"
    assert_same_curve(got, want)
    opt.close()


def _flip_swap_files(nvme_dir):
    saved = flip_swap_files(nvme_dir)
    if not saved:
        pytest.skip("the swap files cannot be reached through /proc/self/fd")
    return saved


def test_failed_nvme_read_leaves_the_parameters_untouched(make_runtime, nvme_dir):
    """A step whose state cannot be read from NVMe raises, changes no parameter and no state, and
    taken again once the disk reads right equals the step of an optimizer that never failed."""
    torch.manual_seed(5)
    shapes = [(300, 7), (1023,), (64, 64)]
    ps = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    # Exclusive tiers: every bucket's state is read from NVMe (a clean DRAM copy would serve
    # the read that fails here).
    rt = make_runtime(dram_bytes="1MiB", checksum="xxh3", prefetch_depth=2, dram_inclusive="off")
    opt = CPUAdam(ps, runtime=rt, state_tier="nvme", threads=2, **HYPER)
    twin = CPUAdam(twins, threads=2, **HYPER)  # DRAM state: never fails
    grads = [[torch.randn(s) for s in shapes] for _ in range(2)]

    def step(o, params, g):
        for p, gi in zip(params, g):
            p.grad = gi.clone()
        o.step()

    step(opt, ps, grads[0])
    step(twin, twins, grads[0])
    for slot in opt._store.values():  # every state on NVMe only, where the fault strikes
        [t.offload("nvme") for t in slot.tensors]
        [t.sync() for t in slot.tensors]
        assert all(t.residency() == {"nvme"} for t in slot.tensors)
    # The first parameter's state reads from a DRAM copy: it steps before the second one fails.
    first = opt._store[ps[0]].tensors[0]
    first.prefetch("dram")
    first.sync()
    assert first.residency() == {"dram", "nvme"}
    before = [p.detach().clone() for p in ps]
    saved = _flip_swap_files(str(nvme_dir))
    with pytest.raises(tiermem.TiermemError, match="the step was not taken"):
        step(opt, ps, grads[1])
    for p, b in zip(ps, before):
        assert torch.equal(p.detach(), b), "a failed step changed a parameter"
    restore(saved)
    sd = opt.state_dict()
    assert [int(s["step"]) for s in sd["state"].values()] == [1, 1, 1]
    for a, b in zip(sd["state"].values(), twin.state_dict()["state"].values()):
        assert torch.equal(a["exp_avg"], b["exp_avg"]), "the state is the first step's"
        assert torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
    opt.step()  # the same step again (its gradients are still there): taken now
    step(twin, twins, grads[1])
    for p, q in zip(ps, twins):
        assert torch.equal(p.detach(), q.detach()), "the retried step equals a clean one"
    opt.close()
    twin.close()


def test_an_interrupt_as_the_step_is_prepared_leaves_the_next_step_free(make_runtime):
    """A KeyboardInterrupt taken just as the C step returns prepared (Ctrl-C during a step of
    state on NVMe) aborts that step: nothing changes, and the next step() is taken, equal to a
    clean one (an outside client's every later step was refused: "a prepared step waits for
    tm_adam_step_commit or tm_adam_step_abort")."""
    torch.manual_seed(6)
    shapes = [(300, 7), (64, 64)]
    ps = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    rt = make_runtime(dram_bytes="1MiB")
    opt = CPUAdam(ps, runtime=rt, state_tier="nvme", threads=1, **HYPER)
    twin = CPUAdam(twins, threads=1, **HYPER)
    for p, q in zip(ps, twins):
        p.grad = torch.randn(p.shape)
        q.grad = p.grad.clone()
    lib = tiermem._lib
    real = lib.tm_adam_step_groups_prepare
    calls = []

    def interrupted(*args):
        status = real(*args)
        calls.append(status)
        raise KeyboardInterrupt  # as the call returns: the step is prepared in C

    lib.tm_adam_step_groups_prepare = interrupted
    try:
        before = [p.detach().clone() for p in ps]
        with pytest.raises(KeyboardInterrupt):
            opt.step()
    finally:
        lib.tm_adam_step_groups_prepare = real
    assert calls == [tiermem._capi.OK], "the C step was prepared before the interrupt"
    for p, b in zip(ps, before):
        assert torch.equal(p.detach(), b), "an interrupted step changed a parameter"
    opt.step()
    twin.step()
    for p, q in zip(ps, twins):
        assert torch.equal(p.detach(), q.detach()), "the step after the interrupt is a clean one"
    opt.close()
    twin.close()


@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_checkpoints_and_close_while_offload_parameters_holds_the_parameters(make_runtime, tier):
    """CPUAdam's state_dict(), load_state_dict() and the runtime's close() read no parameter
    while offload_parameters holds them (an outside client's raised "this tensor's memory is
    offloaded by tiermem", and close() refused with TM_ERR_BUSY when it brought CPUAdam's state
    home before the parameters). A checkpoint of fp32 parameters has no master weights: loaded
    while the parameters are out, the masters are taken from them at the next step. The
    resumed run equals the one that never stopped, bit for bit."""
    import tiermem.torch as tt

    def build(rt):
        m = model()
        opt = CPUAdam(m.parameters(), runtime=rt, state_tier=tier, threads=1, **HYPER)
        return m, opt, tt.offload_parameters(m, rt, tier="dram", optimizer=opt)

    def steps(rt, m, params, opt, first, last):
        losses = []
        for i, (x, y) in enumerate(batches(last, BATCH, SEQ, VOCAB)):
            if i < first:
                continue
            torch.manual_seed(1000 + i)
            with rt.step():
                loss = m(x, y)
                loss.backward()
                params.step()
                opt.zero_grad()
            losses.append(loss.item())
        return losses

    budget = dict(dram_bytes="4MiB" if tier == "dram" else "1MiB")
    rt = make_runtime(**budget)
    m, opt, params = build(rt)
    whole = steps(rt, m, params, opt, 0, 2)
    checkpoint = {"model": {k: v.clone() for k, v in m.state_dict().items()},
                  "opt": opt.state_dict()}  # the parameters are out: nothing reads them
    assert all(not r.resident for r in params.records.values())
    assert len(checkpoint["opt"]["state"]) == len(list(m.parameters()))
    whole += steps(rt, m, params, opt, 2, 4)
    rt.close()  # CPUAdam's state and the parameters come home, in whichever order
    want = [p.detach().clone() for p in m.parameters()]
    params.remove()
    opt.close()

    rt2 = make_runtime(**budget)
    m2, opt2, params2 = build(rt2)
    m2.load_state_dict(checkpoint["model"])
    opt2.load_state_dict(checkpoint["opt"])  # the parameters are out
    resumed = steps(rt2, m2, params2, opt2, 2, 4)
    assert resumed == whole[2:]
    sd = opt2.state_dict()
    rt2.close()
    for p, q in zip(m2.parameters(), want):
        assert torch.equal(p.detach(), q), "the resumed run differs"
    assert sd["state"][0]["step"] == 4
    params2.remove()
    opt2.close()


def test_failure_in_one_group_leaves_every_group_untouched(make_runtime, nvme_dir):
    """Parameter groups with their own lr and weight decay step in one all-or-nothing call: when
    the second group's state cannot be read, the first group (whose state reads from DRAM) is
    not stepped either; the retried step equals an optimizer's that never failed."""
    torch.manual_seed(6)
    shapes = [(300, 7), (1023,), (64, 64)]
    ps = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in ps]

    def groups(params):
        return [{"params": params[:1]},
                {"params": params[1:], "lr": 5e-3, "weight_decay": 0.0}]

    # Exclusive tiers, as above: the state is read from NVMe, where the failure is.
    rt = make_runtime(dram_bytes="1MiB", checksum="xxh3", prefetch_depth=2, dram_inclusive="off")
    opt = CPUAdam(groups(ps), runtime=rt, state_tier="nvme", threads=2, **HYPER)
    twin = CPUAdam(groups(twins), threads=2, **HYPER)  # DRAM state: never fails
    grads = [[torch.randn(s) for s in shapes] for _ in range(2)]

    def step(o, params, g):
        for p, gi in zip(params, g):
            p.grad = gi.clone()
        o.step()

    step(opt, ps, grads[0])
    step(twin, twins, grads[0])
    for slot in opt._store.values():  # every state on NVMe only, where the fault strikes
        [t.offload("nvme") for t in slot.tensors]
        [t.sync() for t in slot.tensors]
    # The first group's state reads from a DRAM copy: alone, its step would succeed.
    first = opt._store[ps[0]].tensors[0]
    first.prefetch("dram")
    first.sync()
    assert first.residency() == {"dram", "nvme"}
    before = [p.detach().clone() for p in ps]
    saved = _flip_swap_files(str(nvme_dir))
    with pytest.raises(tiermem.TiermemError, match="the step was not taken") as failed:
        step(opt, ps, grads[1])
    for i, (p, b) in enumerate(zip(ps, before)):
        assert torch.equal(p.detach(), b), "a failed step changed parameter %d" % i
    assert "group 1, bucket 0" in str(failed.value), "the error names the failing bucket"
    restore(saved)
    sd = opt.state_dict()
    assert [int(s["step"]) for s in sd["state"].values()] == [1, 1, 1]
    for a, b in zip(sd["state"].values(), twin.state_dict()["state"].values()):
        assert torch.equal(a["exp_avg"], b["exp_avg"]), "the state is the first step's"
    opt.step()  # the same step again: taken now, with each group's hyperparameters
    step(twin, twins, grads[1])
    for p, q in zip(ps, twins):
        assert torch.equal(p.detach(), q.detach()), "the retried step equals a clean one"
    opt.close()
    twin.close()


def test_transposed_and_empty_parameters_follow_adamw(make_runtime):
    """A parameter that is a transposed view (non-contiguous) is stepped in its logical order, as
    torch.optim.AdamW steps it, and an empty one is counted but holds no state in tiermem: neither
    fails the step (both did, the first after counting the step). The checkpoint loads into AdamW."""
    def params():
        g = torch.Generator().manual_seed(11)
        ps = [torch.nn.Parameter(torch.randn(8, 5, generator=g).t()),  # strides (1, 5)
              torch.nn.Parameter(torch.randn(0, 4, generator=g)),
              torch.nn.Parameter(torch.randn(6, generator=g))]
        assert not ps[0].is_contiguous()
        return ps

    ours, ref = params(), params()
    c = CPUAdam(ours, runtime=make_runtime(dram_bytes="1MiB"), **HYPER)
    a = torch.optim.AdamW(ref, foreach=False, **HYPER)
    for step in range(4):
        g = torch.Generator().manual_seed(100 + step)
        grads = [torch.randn(p.shape, generator=g) for p in ours]
        for ps in (ours, ref):
            for p, grad in zip(ps, grads):
                p.grad = grad.clone()
        c.step()
        a.step()
        for p, q in zip(ours, ref):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-7)
    assert [int(c.state[p]["step"].item()) for p in ours] == [4, 4, 4]
    assert ours[0].stride() == (1, 5), "the parameter keeps its layout"
    sd = c.state_dict()
    assert {k: set(v) for k, v in sd["state"].items()} == \
        {k: set(v) for k, v in a.state_dict()["state"].items()}
    b = torch.optim.AdamW(params(), foreach=False, **HYPER)
    b.load_state_dict(sd)
    assert [tuple(b.state_dict()["state"][i]["exp_avg"].shape) for i in range(3)] == \
        [(5, 8), (0, 4), (6,)]
    c.close()


def test_fp32_cpu_parameters_are_their_own_master():
    """An fp32 CPU parameter with its state in DRAM is stepped in place, as AdamW steps it: its
    state holds only the moments (8 bytes a parameter), a change made to the parameter between
    steps is kept (there is no master to overwrite it), and a parameter that stops qualifying (a
    strided view now) gets a master from its value and goes on following AdamW."""
    g = torch.Generator().manual_seed(5)
    start = torch.randn(6, 10, generator=g)
    grads = [torch.randn(6, 10, generator=g) for _ in range(4)]
    p, q = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    opt = CPUAdam([p], threads=2, **HYPER)
    ref = torch.optim.AdamW([q], foreach=False, **HYPER)

    def both():
        for x, o, grad in ((p, opt, grads[i % 4]), (q, ref, grads[i % 4])):
            x.grad = grad.clone()
            o.step()

    for i in range(2):
        both()
    slot = opt._store[p]
    assert slot.in_place and slot.tensors[0].nbytes == 8 * p.numel(), "the moments only"
    torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)
    with torch.no_grad():  # an edit between steps (a weight tied, a re-initialization)
        p.mul_(0.5)
        q.mul_(0.5)
    i = 2
    both()
    torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)
    p.data = p.data.t().contiguous().t()  # the same values, strided now
    q.data = q.data.t().contiguous().t()
    assert not p.is_contiguous()
    i = 3
    both()
    assert not slot.in_place and slot.tensors[0].nbytes == 12 * p.numel(), "a master again"
    torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)
    sd, sd_ref = opt.state_dict()["state"][0], ref.state_dict()["state"][0]
    for name in ("step", "exp_avg", "exp_avg_sq"):  # fused multiply-adds: m may cancel
        torch.testing.assert_close(sd[name], sd_ref[name], rtol=1e-5, atol=1e-8)
    opt.close()


@pytest.mark.parametrize("one_group", [True, False])
def test_steady_steps_follow_adamw_through_changes(one_group):
    """Steady steps over in-place parameters follow AdamW, and every change between steps is
    seen: the learning rate of one group changed, a gradient missing for a step (its parameter a
    step behind, then stepped apart), a strided gradient, a parameter group added, a checkpoint
    loaded."""
    g = torch.Generator().manual_seed(7)
    shapes = [(8, 5), (13,), (4, 4), (9,)]
    start = [torch.randn(s, generator=g) for s in shapes]
    a = [torch.nn.Parameter(t.clone()) for t in start]
    b = [torch.nn.Parameter(t.clone()) for t in start]
    hyper = dict(HYPER, weight_decay=0.0)

    def groups(ps):
        if one_group:
            return [{"params": ps[:3]}]
        return [{"params": ps[:2]}, {"params": ps[2:3], "lr": 3e-3, "amsgrad": True}]

    opt = CPUAdam(groups(a), threads=2, **hyper)
    ref = torch.optim.AdamW(groups(b), foreach=False, **hyper)
    for i in range(9):
        if i == 5:  # a group added, the plan's parameters no longer all of them
            opt.add_param_group({"params": a[3:]})
            ref.add_param_group({"params": b[3:]})
        if i == 7:
            opt.load_state_dict(opt.state_dict())
        for o, ps in ((opt, a), (ref, b)):
            o.param_groups[0]["lr"] = 1e-3 * (1 + i % 3)
            for k, p in enumerate(ps):
                grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(10 * i + k))
                p.grad = None if (i == 3 and k == 1) else grad
            if i == 4:  # the same values, strided
                ps[0].grad = ps[0].grad.t().contiguous().t()
            o.step()
        for p, q in zip(a, b):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-7)
    opt.close()



def test_close_with_a_dead_nvme_tier_refuses_then_force_closes(make_runtime, nvme_dir):
    """Every swap file corrupt (TIERMEM_CHECKSUM=xxh3): close() cannot bring the state home and
    refuses (TM_ERR_BUSY, naming force=True), the runtime open; close(force=True) closes it,
    warning that the state went with it, and the optimizer then says the runtime was closed."""
    torch.manual_seed(7)
    ps = [torch.nn.Parameter(torch.randn(64, 64))]
    rt = make_runtime(dram_bytes="1MiB", checksum="xxh3", dram_inclusive="off")
    opt = CPUAdam(ps, runtime=rt, state_tier="nvme", threads=1, **HYPER)
    ps[0].grad = torch.randn(64, 64)
    opt.step()
    for slot in opt._store.values():  # on NVMe only, where the fault strikes
        [t.offload("nvme") for t in slot.tensors]
        [t.sync() for t in slot.tensors]
    _flip_swap_files(str(nvme_dir))
    with pytest.raises(tiermem.TiermemError, match=r"close\(force=True\)") as e:
        rt.close()
    assert e.value.status_name == "TM_ERR_BUSY" and not rt.closed
    with pytest.warns(tiermem.TiermemWarning, match=r"CPUAdam .*1 tensors lost.*went with the "
                      r"runtime"):
        rt.close(force=True)
    assert rt.closed
    with pytest.raises(tiermem.TiermemError, match=r"close\(force=True\) before the state of 1 "
                       r"parameters could come home.*load a checkpoint"):
        opt.step()
    ps[0].grad = None  # says so with no gradient too (it returned quietly)
    with pytest.raises(tiermem.TiermemError, match="went with the runtime"):
        opt.step()


def test_remove_after_a_forced_close_takes_the_hooks_off(make_runtime, nvme_dir):
    """offload_optimizer_state and offload_parameters on NVMe whose swap files are all corrupt:
    close(force=True) closes, and their remove() then takes the hooks off without raising (it
    raised that the runtime was closed: an outside client)."""
    torch.manual_seed(8)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    rt = make_runtime(hbm_bytes="1MiB", dram_bytes="256KiB", checksum="xxh3",
                      dram_inclusive="off")
    adamw = torch.optim.AdamW(model.parameters())
    params = tt.offload_parameters(model, rt, tier="nvme", optimizer=adamw)
    opt = tt.offload_optimizer_state(adamw, rt, tier="nvme")
    with rt.step():
        model(torch.randn(4, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(4, 64)
    for swapped in [*(r for s in opt.records.values() for r in s.values()),
                    *params.records.values()]:
        swapped.tm.offload("nvme")
        swapped.tm.sync()
    _flip_swap_files(str(nvme_dir))
    with pytest.raises(tiermem.TiermemError, match=r"close\(force=True\)"):
        rt.close()
    with pytest.warns(tiermem.TiermemWarning, match=r"ParameterOffload .*4 tensors lost"):
        rt.close(force=True)
    # The lost parameters say so (a forward read freed memory: a crash, for parameters in HBM
    # views), until a checkpoint is loaded into them.
    with pytest.raises(RuntimeError, match=r"went with its tiermem runtime.*load_state_dict"):
        model(x)
    # ... and so does a read through .data, detach() or state_dict(), and a copy into .data
    # (they said the bytes were in tiermem, for remove() to bring back).
    lost = model[0].weight
    for read in (lambda: lost.data.sum(), lambda: lost.detach() + 1,
                 lambda: torch.save(model.state_dict(), io.BytesIO()),
                 lambda: lost.data.copy_(saved["0.weight"])):
        with pytest.raises(RuntimeError, match=r"went with its tiermem runtime"):
            read()
    with pytest.raises(tiermem.TiermemError, match=r"4 parameters went with it"):
        params.step()
    opt.remove()
    params.remove()
    assert not any(m._forward_pre_hooks for m in model.modules())
    model.load_state_dict(saved)
    assert all(type(p) is torch.nn.Parameter for p in model.parameters())
    fresh = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    fresh.load_state_dict(saved)
    assert torch.equal(model(x), fresh(x))


def test_a_forced_close_brings_home_what_it_can(make_runtime):
    """close(force=True) after offload_parameters' remove() failed: the parameters whose bytes
    are readable come home (those in view the runtime's HBM: read after the destroy, they
    crashed the process); none is lost."""
    torch.manual_seed(9)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    rt = make_runtime(hbm_bytes="1MiB", dram_bytes="1MiB")
    params = tt.offload_parameters(model, rt)
    x = torch.randn(4, 64)
    model(x).sum().backward()  # the first unit stays in (held since its backward)
    expect = model(x).detach()

    def dead(*_):
        raise tiermem.TiermemError(tiermem.TM_ERR_IO, "a simulated dead tier")
    params.remove = dead
    with pytest.warns(tiermem.TiermemWarning, match=r"ParameterOffload .*came home"):
        rt.close(force=True)
    assert torch.equal(model(x), expect)
    assert all(type(p) is torch.nn.Parameter for p in model.parameters())
