"""The optimizer step through any DRAM budget, and resumes at the budget a run trained in.

A small transformers Llama (106,816 parameters; its embedding and head have the largest state,
16,384 parameters each) trains with its optimizer state on NVMe: CPUAdam(state_tier="nvme") and
torch's AdamW under offload_optimizer_state(tier="nvme"). The DRAM budget is swept from above
the state down to a DRAM tier smaller than the largest tensor's state: every run has the bits of
the state held in DRAM. A run saved mid-way and loaded in a new process at the same budget (a
plain loop with torch.save, and transformers' Trainer with resume_from_checkpoint) goes on with
the bits of the run that was not interrupted. FSDPCPUAdam's sweep and DCP resume are in
test_fsdp.py (tight, resume_save, resume_load)."""

import contextlib
import json
import os
import subprocess
import sys

import pytest
import torch

import tiermem
import tiermem.torch as tt

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "optim_resume_worker.py")
sys.path.insert(0, HERE)

from optim_resume_worker import LR, batch, model  # noqa: E402

pytest.importorskip("transformers")

STEPS = 3
# The runtime's DRAM budgets: the DRAM tier is the budget less its staging pool (128 KiB here).
# The state is 1.22 MiB (CPUAdam: master and moments) or 834 KiB (AdamW's moments); the largest
# tensor's state 192 KiB (CPUAdam) or 128 KiB (AdamW): the last budgets leave a DRAM tier of
# 64, 32, 16 and 8 KiB (the least: a 4 KiB slice and its new version).
BUDGETS = ["2MiB", "1MiB", "640KiB", "384KiB", "256KiB", "192KiB", "160KiB", "144KiB", "136KiB"]


def _train(opt, m, steps=STEPS):
    for i in range(steps):
        x = batch(i)
        m(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in m.parameters()]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def in_dram():
    """The parameters after STEPS steps with the state in DRAM: CPUAdam's, and AdamW's."""
    m = model()
    opt = tt.CPUAdam(m.parameters(), lr=LR, threads=1)
    cpu_adam = _train(opt, m)
    opt.close()
    m = model()
    adamw = _train(torch.optim.AdamW(m.parameters(), lr=LR, foreach=False), m)
    return dict(cpu_adam=cpu_adam, offload=adamw)


@pytest.mark.parametrize("budget", BUDGETS)
def test_cpu_adam_trains_at_any_dram_budget(make_runtime, in_dram, budget):
    rt = make_runtime(dram_bytes=budget)
    m = model()
    opt = tt.CPUAdam(m.parameters(), lr=LR, runtime=rt, state_tier="nvme", threads=1)
    got = _train(opt, m)
    tier = rt.stats()["tiers"]["dram"]["capacity"]
    largest = max(12 * p.numel() for p in m.parameters())
    state = 12 * sum(p.numel() for p in m.parameters())
    # One more step, counted: the state read from NVMe once (its new version written once).
    before = rt.stats()["bytes_moved"]
    _train(opt, m, 1)
    after = rt.stats()["bytes_moved"]
    opt.close()
    assert _same(got, in_dram["cpu_adam"]), "state on NVMe at %s differs from DRAM" % budget
    if budget == BUDGETS[-1]:
        assert tier < largest, "the sweep ends below the largest tensor's state"
    if tier < state:  # streamed: read once (at the least budget a slice or so again, 0.2%)
        read = after["nvme"]["dram"] - before["nvme"]["dram"]
        assert state <= read <= 1.01 * state, "read %.4fx the state a step" % (read / state)


def test_cpu_adam_inside_runtime_steps_reads_the_state_once(make_runtime):
    """The loop the docs show, each step inside rt.step() (as offload_parameters and
    offload_saved_tensors need): the schedule learned the pipeline's reads of the state and
    prefetched them again when it replayed, evicted before use, so each step read 7.6% of the
    state twice and the DRAM peak went over the half of the tier the pipeline keeps to (an
    outside client). The pipeline's reads are its own: the same bytes as without steps."""
    moved = {}
    for stepped in (False, True):
        rt = make_runtime(dram_bytes="640KiB")
        m = model()
        opt = tt.CPUAdam(m.parameters(), lr=LR, runtime=rt, state_tier="nvme", threads=1)
        state = 12 * sum(p.numel() for p in m.parameters())
        reads = []
        for i in range(4):
            x = batch(i)
            before = rt.stats()["bytes_moved"]["nvme"]["dram"]
            with (rt.step() if stepped else contextlib.nullcontext()):
                m(input_ids=x, labels=x).loss.backward()
                opt.step()
                opt.zero_grad()
            reads.append(rt.stats()["bytes_moved"]["nvme"]["dram"] - before)
        tier = rt.stats()["tiers"]["dram"]
        opt.close()
        assert tier["capacity"] < state, "the state must stream through DRAM"
        assert all(state <= r <= 1.01 * state for r in reads[1:]), (stepped, reads, state)
        moved[stepped] = (reads, tier["peak"], [p.detach().clone() for p in m.parameters()])
    assert moved[True][0] == moved[False][0]
    # The peak moves by a page or two with when the disk finishes each write (CI saw 4 KiB
    # between two runs of one loop); the replayed prefetches put it 24 KiB over.
    assert abs(moved[True][1] - moved[False][1]) <= 8192, (moved[True][1], moved[False][1])
    assert _same(moved[True][2], moved[False][2])


def test_cpu_adam_below_the_least_dram_says_so_and_changes_nothing(make_runtime):
    """A DRAM tier of 4 KiB (below the least, a slice and its new version): the step raises
    TM_ERR_OUT_OF_MEMORY naming what it needed, and the parameters are as they were."""
    rt = make_runtime(dram_bytes="132KiB")
    m = model()
    opt = tt.CPUAdam(m.parameters(), lr=LR, runtime=rt, state_tier="nvme", threads=1)
    x = batch(0)
    m(input_ids=x, labels=x).loss.backward()
    before = [p.detach().clone() for p in m.parameters()]
    with pytest.raises(tiermem.TiermemError, match="needs") as e:
        opt.step()
    assert e.value.status_name == "TM_ERR_OUT_OF_MEMORY"
    assert _same(before, [p.detach() for p in m.parameters()])
    opt.close()


@pytest.mark.parametrize("budget", BUDGETS)
def test_offloaded_adamw_trains_at_any_dram_budget(make_runtime, in_dram, budget):
    rt = make_runtime(dram_bytes=budget)
    m = model()
    opt = tt.offload_optimizer_state(torch.optim.AdamW(m.parameters(), lr=LR, foreach=False),
                                     rt, tier="nvme")
    got = _train(opt, m)
    opt.remove()
    assert _same(got, in_dram["offload"]), "state on NVMe at %s differs from AdamW's" % budget


def test_cpu_adam_slices_big_tensors(make_runtime):
    """A tensor whose state is more than a slice is stepped in slices, one tiermem tensor and
    one bucket each, the bounds multiples of the kernel's vector width; a bad slice_bytes is
    refused by name."""
    rt = make_runtime(dram_bytes="1MiB")
    p = torch.nn.Parameter(torch.randn(10000))
    opt = tt.CPUAdam([p], runtime=rt, state_tier="nvme", slice_bytes="16KiB")
    p.grad = torch.randn(10000)
    opt.step()
    slot = opt._store[p]
    assert len(slot.tensors) == 8 and slot.bounds[-1] == 10000
    assert all(b % 64 == 0 for b in slot.bounds[:-1])
    assert all(t.nbytes <= 16 << 10 for t in slot.tensors)
    opt.close()
    for bad in (0, -1, 1000, "lots", 2.5):
        with pytest.raises((ValueError, TypeError), match="slice_bytes"):
            tt.CPUAdam([p], runtime=rt, state_tier="nvme", slice_bytes=bad)


def test_cpu_adam_load_leaves_the_state_as_a_step_does(make_runtime):
    """torch.distributed.checkpoint's get_optimizer_state_dict first steps a fresh optimizer
    with zero gradients (its _init_optim_state), then the load writes the state: written where
    the step left clean DRAM copies, it used to stay only in DRAM, and the next step pinned it
    there whole. After the load every state tensor is on NVMe."""
    rt = make_runtime(dram_bytes="4MiB")
    m = model()
    opt = tt.CPUAdam(m.parameters(), lr=LR, runtime=rt, state_tier="nvme", threads=1)
    _train(opt, m, 2)
    saved = opt.state_dict()
    fresh = tt.CPUAdam(m.parameters(), lr=LR, runtime=rt, state_tier="nvme", threads=1)
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    fresh.param_groups[0]["lr"] = 0.0
    fresh.step()
    fresh.zero_grad()
    fresh.load_state_dict(saved)
    where = [t.residency() for slot in fresh._store.values() for t in slot.tensors]
    assert where and all("nvme" in r for r in where), where
    opt.close()
    fresh.close()


def _worker(*args):
    proc = subprocess.run([sys.executable, WORKER] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    out = args[4]
    with open(os.path.join(out, "losses.json")) as f:
        return json.load(f), torch.load(os.path.join(out, "params.pt"))


# Below the state's size: the runs stream it through DRAM.
RESUME_DRAM = "384KiB"


@pytest.mark.parametrize("kind", ["cpu_adam", "offload"])
def test_resume_in_a_new_process_at_the_training_budget(tmp_path, nvme_dir, kind):
    whole, first, second = (tmp_path / d for d in ("whole", "first", "second"))
    for d in (whole, first, second):
        d.mkdir()
    went_on, want = _worker("loop", kind, RESUME_DRAM, nvme_dir, whole, 6)
    assert went_on["dram_tier"] < went_on["state_bytes"] * 2 // 3
    _worker("loop", kind, RESUME_DRAM, nvme_dir, first, 3, 3)
    resumed, got = _worker("loop", kind, RESUME_DRAM, nvme_dir, second, 3, "-",
                           first / "ckpt.pt")
    assert resumed["losses"] == went_on["losses"][3:]
    assert all(torch.equal(got[n], want[n]) for n in want), "the resumed run differs"
    assert os.listdir(nvme_dir) == []


@pytest.mark.parametrize("kind", ["cpu_adam", "offload"])
def test_trainer_resume_from_checkpoint_at_the_training_budget(tmp_path, nvme_dir, kind):
    """transformers' Trainer: 6 steps, a checkpoint every 3; a new process resumes from the
    first checkpoint (resume_from_checkpoint) at the same DRAM budget: the same parameters."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir()
    cut.mkdir()
    went_on, want = _worker("trainer", kind, RESUME_DRAM, nvme_dir, whole, 6)
    _worker("trainer", kind, RESUME_DRAM, nvme_dir, cut, 3)
    ckpt = cut / "run" / "checkpoint-3"
    assert (ckpt / "optimizer.pt").exists(), sorted(os.listdir(cut / "run"))
    resumed, got = _worker("trainer", kind, RESUME_DRAM, nvme_dir, cut, 6, ckpt)
    assert resumed["losses"][-3:] == went_on["losses"][-3:]
    assert all(torch.equal(got[n], want[n]) for n in want), "the resumed run differs"


@pytest.mark.parametrize("budget", ["1MiB", "160KiB"])
def test_a_full_nvme_tier_at_the_first_step_changes_nothing(make_runtime, budget):
    """The NVMe tier full while the first step makes the state: the step raises saying it was
    not taken, no half-made state is kept (stepped later from zeros, it would leave the
    parameters at +-lr), and once there is room step() goes on with the bits of a run that
    never failed (an outside client found both: parameters zeroed, and at the least budget a
    state left only in DRAM that every later step could not pin)."""
    def run(fault):
        torch.manual_seed(0)
        m = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(6)])
        rt = make_runtime(dram_bytes=budget, nvme_bytes="8MiB")
        opt = tt.CPUAdam(m.parameters(), runtime=rt, state_tier="nvme", threads=1)
        filler = None
        if fault:
            filler = rt.tensor(7 << 20, cls="other", home="nvme", name="filler")
            filler.write(bytearray(7 << 20))  # written: a tensor never written takes no room
            filler.offload("nvme")
            filler.sync()
        g = torch.Generator().manual_seed(1)
        m(torch.randn(4, 128, generator=g)).sum().backward()
        if fault:
            before = [p.detach().clone() for p in m.parameters()]
            with pytest.raises(tiermem.TiermemError, match="the step was not taken") as e:
                opt.step()
            assert e.value.status_name == "TM_ERR_NO_SPACE"
            assert _same(before, [p.detach() for p in m.parameters()])
            # Its checkpoint loads into torch.optim.AdamW, which then steps: the parameters
            # whose state was made (zeros) have it whole, the others none, as AdamW before its
            # first step; a step counter alone made AdamW's step fail with KeyError 'exp_avg'
            # (an outside client found it).
            sd = opt.state_dict()
            assert all("exp_avg" in entry for entry in sd["state"].values()), sd["state"]
            m2 = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(6)])
            adamw = torch.optim.AdamW(m2.parameters())
            adamw.load_state_dict(sd)
            m2(torch.randn(4, 128, generator=torch.Generator().manual_seed(2))).sum().backward()
            adamw.step()
            filler.destroy()
        opt.step()
        opt.zero_grad()
        for _ in range(2):
            m(torch.randn(4, 128, generator=g)).sum().backward()
            opt.step()
            opt.zero_grad()
        out = [p.detach().clone() for p in m.parameters()]
        opt.close()
        return out

    assert _same(run(True), run(False))
