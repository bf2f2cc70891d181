"""tiermem.torch.fit: the chooser's decisions on made-up costs (recompute when the link is slow,
offload when compute is slow, keep when everything fits, never over the budget), and on the tiny
GPT with the emulated device: the measured peak within the budget, training bit-identical to
plain under every choice, and clear errors for bad arguments."""

import itertools
import random
import re
import warnings

import pytest
import torch

import tiermem
import tiermem.torch as tt
from tiermem.torch.fit import plan as fit_plan
from tiermem.torch.fit import _cost as fit_cost
from tiermem.torch.fit._cost import DRAM, KEEP, NVME, RECOMPUTE, BlockCost, Machine, RestCost
from tinygpt import TinyGPT, batches

MIB = 1 << 20


def blocks_of(n, fwd=1e-3, moved=8 * MIB):
    return [BlockCost("b%d" % i, fwd, 2 * fwd, moved + MIB, moved, MIB, MIB,
                      [moved // 8] * 8) for i in range(n)]


REST = RestCost(1e-4, 1e-4, 1e-4, 1e-4, 2 * MIB)


def machine(gbps, nvme_gbps=None):
    nv = None if nvme_gbps is None else nvme_gbps * 1e9
    return Machine(gbps * 1e9, gbps * 1e9, nv, nv, prefetch_depth=4)


def choose(blocks, m, budget, dram=1 << 40, nvme=1 << 40):
    got = fit_cost.choose(blocks, REST, m, budget, dram, nvme)
    assert got is not None
    return got


def test_keeps_everything_when_it_fits():
    blocks = blocks_of(4)
    everything = REST.kept + sum(b.kept for b in blocks)
    choices, p = choose(blocks, machine(1000, 10), everything)
    assert choices == [KEEP] * 4
    assert p.peak == everything


def test_recomputes_when_the_link_is_slow():
    blocks = blocks_of(4)
    budget = REST.kept + 2 * blocks[0].kept + 2 * MIB  # two blocks must give up their bytes
    choices, p = choose(blocks, machine(0.01), budget)
    assert choices.count(RECOMPUTE) == 2 and choices.count(KEEP) == 2, choices
    assert p.peak <= budget


def test_offloads_when_compute_is_slow():
    # 100 ms a block forward: 9 MiB cross a 10 GB/s link in under 1 ms, hidden; a recompute
    # would add 100 ms.
    blocks = blocks_of(4, fwd=0.1)
    budget = REST.kept + 2 * blocks[0].kept + 2 * MIB
    choices, p = choose(blocks, machine(10), budget)
    assert RECOMPUTE not in choices and choices.count(DRAM) >= 2, choices
    assert p.peak <= budget


def test_nvme_only_when_dram_is_full():
    blocks = blocks_of(4, fwd=0.1)
    budget = REST.kept + blocks[0].kept + 8 * MIB  # three blocks must leave HBM
    m = machine(10, nvme_gbps=5)
    choices, _ = choose(blocks, m, budget)
    assert NVME not in choices
    choices, p = choose(blocks, m, budget, dram=blocks[0].moved)
    assert choices.count(DRAM) <= 1 and NVME in choices, choices
    assert p.peak <= budget


def test_copies_share_the_link():
    # Two blocks' copies queue on one link: offloading both costs more than one, at the same
    # compute, once the link is the bottleneck.
    blocks = blocks_of(2, fwd=1e-3)
    m = machine(4)
    one = fit_cost.predict(blocks, REST, [DRAM, KEEP], m)
    two = fit_cost.predict(blocks, REST, [DRAM, DRAM], m)
    assert two.step > one.step + blocks[0].moved / m.d2h * 0.9


def test_recompute_factor_pairs_rounds_and_has_a_floor():
    # Load during the keep steps of rounds 2 and 3 only: the medians of either side alone say the
    # recompute costs nothing (keep 40 ms against recompute 15); each round's own difference
    # says 4 ms over a forward of 4 ms.
    keep, rec = [10e-3, 40e-3, 41e-3], [14e-3, 15e-3, 45e-3]
    assert sorted(rec)[1] - sorted(keep)[1] < 0
    r, how = fit_cost.recompute_factor(keep, rec, 4e-3)
    assert (round(r, 6), how) == (1.0, "measured")
    # Below half a forward is noise: the floor, and said so.
    r, how = fit_cost.recompute_factor([10e-3] * 3, [10.5e-3] * 3, 4e-3)
    assert (r, how) == (fit_cost.RECOMPUTE_FLOOR, "floor") and r == 0.5
    r, how = fit_cost.recompute_factor([10e-3] * 3, [8e-3] * 3, 4e-3)
    assert (r, how) == (0.5, "floor")
    assert fit_cost.recompute_factor([], [], 4e-3) == (1.0, "measured")


def test_never_over_budget_and_greedy_is_valid():
    rng = random.Random(7)
    for _ in range(30):
        n = rng.randint(1, 5)
        blocks = [BlockCost("b", rng.uniform(1e-4, 1e-2), rng.uniform(1e-4, 2e-2),
                            rng.randint(2, 20) * MIB, rng.randint(1, 18) * MIB, 64 << 10,
                            rng.randint(1, 2) * MIB, [MIB] * 4) for _ in range(n)]
        m = machine(rng.uniform(0.5, 50), rng.uniform(0.5, 5))
        budget = rng.randint(4, 80) * MIB
        best = fit_cost.choose(blocks, REST, m, budget, 1 << 40, 1 << 40)
        greedy = fit_cost._greedy(blocks, REST, m, budget, 1 << 40, 1 << 40)
        fits = [c for c in itertools.product(fit_cost.CHOICES, repeat=n)
                if fit_cost.predict(blocks, REST, c, m, budget).peak <= budget]
        assert (best is None) == (not fits)
        if best is not None:
            assert best[1].peak <= budget
            assert greedy is not None and greedy[1].peak <= budget
            assert best[1].step <= greedy[1].step + 1e-12


def _model():
    torch.manual_seed(0)
    return TinyGPT(vocab=128, seq=32, hidden=64, heads=4, blocks=3)


def _data(steps=3):
    return list(batches(steps, 4, 32, 128))


@pytest.fixture
def rt(make_runtime):
    return make_runtime(hbm_bytes="32MiB", dram_bytes="64MiB", emu_link_gbps=2)


def _fit(rt, budget, **kw):
    model = _model()
    x, y = _data(1)[0]
    lines = []
    plan = tt.fit(model, rt, budget, (x, y), min_bytes=1024, profile_steps=1, check_steps=1,
                  max_replans=0, log=lines.append, **kw)
    return model, plan, lines


def test_measured_peak_within_budget(rt):
    model, plan, lines = _fit(rt, 1 << 40)
    full = plan.prediction.peak
    costs = plan.costs
    assert plan.choices == [KEEP] * 3
    budget = plan.rest.kept + costs[0].kept + costs[1].kept // 2 + sum(c.ckpt for c in costs)
    plan.remove()
    model, plan, lines = _fit(rt, budget)
    assert "fitted plan" in lines[0] and "predicted: step" in lines[0]
    assert plan.choices.count(KEEP) < 3 and plan.prediction.peak <= budget < full
    # Right after fit, .peak is the check step's under the plan, not the profile's keep-all.
    assert 0 < plan.peak <= budget, (plan.peak, budget, plan.choices)
    for x, y in _data(2):
        plan.meter.reset()
        with rt.step(), plan:
            model(x, y).backward()
        assert 0 < plan.peak <= budget, (plan.peak, budget, plan.choices)
    plan.remove()


def _train(model, steps, rt=None, plan=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for x, y in steps:
        torch.manual_seed(1)  # dropout: the same masks in both runs
        if plan is not None:
            with rt.step(), plan:
                loss = model(x, y)
                loss.backward()
        else:
            loss = model(x, y)
            loss.backward()
        out.append((loss.detach().clone(), [p.grad.clone() for p in model.parameters()]))
        opt.step()
        opt.zero_grad()
    return out


@pytest.mark.parametrize("choices", [[KEEP, DRAM, RECOMPUTE], [RECOMPUTE, NVME, DRAM],
                                     [DRAM, DRAM, DRAM], [RECOMPUTE] * 3])
def test_training_bit_identical_to_plain(make_runtime, choices):
    rt = make_runtime(hbm_bytes="32MiB", dram_bytes="64MiB")
    steps = _data(3)
    plain = _train(_model(), steps)
    model, plan, _ = _fit(rt, 1 << 40)
    kept_all = plan.peak  # (the budget fits everything: fit's check steps kept every block)
    plan.apply(choices)
    assert plan.peak < kept_all  # the meter starts afresh with the choices applied
    fitted = _train(model, steps, rt, plan)
    for (l0, g0), (l1, g1) in zip(plain, fitted):
        assert torch.equal(l0, l1)
        assert all(torch.equal(a, b) for a, b in zip(g0, g1))
    plan.remove()
    assert all("forward" not in b.__dict__ for b in model.blocks)


def test_bad_arguments(rt):
    x, y = _data(1)[0]
    with pytest.raises(TypeError, match="torch.nn.Module"):
        tt.fit(lambda a, b: a, rt, "1GiB", (x, y))
    with pytest.raises(TypeError, match="tiermem.Runtime"):
        tt.fit(_model(), object(), "1GiB", (x, y))
    with pytest.raises(ValueError, match="hbm_budget"):
        tt.fit(_model(), rt, "lots", (x, y))
    model = _model()
    with pytest.raises(TypeError, match=r"not a scalar loss tensor.*loss_fn="):
        tt.fit(_model(), rt, "1GiB", (x, y), loss_fn=lambda out: out.expand(2))
    with pytest.raises(tt.FitError, match="no plan fits; the least this model needs"):
        tt.fit(model, rt, 4096, (x, y), profile_steps=1, log=lambda s: None)
    assert all("forward" not in b.__dict__ for b in model.blocks)  # nothing left applied
    _, plan, _ = _fit(rt, 1 << 40)
    with pytest.raises(ValueError, match="choices"):
        plan.apply([KEEP, "gpu", KEEP])
    with pytest.raises(TypeError, match="not the string 'keep'"):  # not ['k', 'e', 'e', 'p']
        plan.apply("keep")
    plan.apply([c.upper() for c in plan.choices])  # any case, as tier= arguments
    plan.remove()
    with pytest.raises(RuntimeError, match="removed"):
        with plan:
            pass
    # A removed plan neither checks (it re-profiled, and raised a FitError) nor measures, nor
    # applies choices again (it put the blocks' wrappers back without the hooks that feed them).
    for call in (lambda: plan.check(1.0), plan.measure, plan.replan, plan.table,
                 lambda: plan.apply(["keep"] * len(plan.blocks)), lambda: plan.refit("1GiB")):
        with pytest.raises(RuntimeError, match="the plan was removed"):
            call()
    for what in ("link_gbps", "nvme_gbps"):
        for bad in (0, -3, float("nan"), float("inf")):
            with pytest.raises(ValueError, match="%s=.*positive number of GB/s" % what):
                tt.fit(model, rt, "1GiB", (x, y), **{what: bad})
        with pytest.raises(TypeError, match=what):
            tt.fit(model, rt, "1GiB", (x, y), **{what: "fast"})
    with pytest.raises(ValueError, match="min_bytes"):
        tt.fit(model, rt, "1GiB", (x, y), min_bytes="lots")


def test_the_least_it_names_fits_and_size_strings(rt):
    model = _model()
    x, y = _data(1)[0]
    with pytest.raises(tt.FitError, match="the least this model needs is about") as e:
        tt.fit(model, rt, 4096, (x, y), min_bytes="1KiB", profile_steps=1, log=lambda s: None)
    # The budget it names, in bytes (the message's, pasted back, and .least), fits, and less
    # does not: it is the least (it had counted the last block's checkpoint too, which a kept
    # block needs not).
    least = int(re.search(r"needs is about ([0-9]+) bytes", str(e.value)).group(1))
    assert e.value.least == least
    with pytest.raises(tt.FitError) as less:
        tt.fit(model, rt, least - int(0.02 * MIB), (x, y), min_bytes="1KiB", profile_steps=1,
               log=lambda s: None)
    assert less.value.least is not None
    budget = least + int(0.01 * MIB)  # the profile is measured again: room for its noise
    plan = tt.fit(model, rt, budget, (x, y), min_bytes="1KiB", profile_steps=1, check_steps=0,
                  log=lambda s: None)
    assert plan.min_bytes == 1024 and plan.prediction.peak <= budget
    plan.remove()


def test_fit_again_replaces_the_plan_in_place(rt):
    model = _model()
    x, y = _data(1)[0]
    hooks = lambda: sum(len(b._forward_hooks) + len(b._forward_pre_hooks)  # noqa: E731
                        for b in model.blocks)
    first = tt.fit(model, rt, 1 << 40, (x, y), profile_steps=1, check_steps=0,
                   log=lambda s: None)
    one = hooks()
    assert one > 0
    lines = []
    second = tt.fit(model, rt, 1 << 40, (x, y), profile_steps=1, check_steps=0,
                    log=lines.append)
    assert "replaced" in lines[0] and first.choices is None and hooks() == one
    second.remove()
    assert hooks() == 0


def test_a_plan_still_off_after_its_replans_warns(rt, monkeypatch):
    model = _model()
    x, y = _data(1)[0]
    monkeypatch.setattr(fit_plan.FittedPlan, "measure",
                        lambda self, steps=3: 2 * self.prediction.step)
    with pytest.warns(tiermem.TiermemWarning, match=r"still \+100% off its prediction after 0"):
        plan = tt.fit(model, rt, 1 << 40, (x, y), profile_steps=1, max_replans=0,
                      log=lambda s: None)
    plan.remove()


def test_check_replans_when_the_step_drifts(rt):
    _, plan, lines = _fit(rt, 1 << 40)
    assert "fit: measured step" in lines[-1] and "predicted" in lines[-1]
    first = plan.prediction
    assert plan.check(first.step * 1.1) is False  # within 15%: no new profile
    assert plan.prediction is first
    assert plan.check(first.step * 1.5, replan=False) is True  # off, but told not to re-plan
    assert plan.prediction is first
    assert plan.check(first.step * 1.5) is True  # off: profiled and chosen again
    assert plan.prediction is not first and plan.choices == [KEEP] * 3
    assert any("re-planning" in line for line in lines)
    plan.remove()


def test_a_block_called_twice_is_refused(rt):
    """A ModuleList holding one block twice (weights shared across layers): fit measures per
    module and would fold the two calls into one, so it says so rather than plan wrongly."""
    model = _model()
    model.blocks[2] = model.blocks[0]
    x, y = _data(1)[0]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(tt.FitError, match="blocks 0 and 2 are the same .*called twice"):
        tt.fit(model, rt, "1MiB", (x, y), min_bytes=1024, profile_steps=1, check_steps=1,
               log=lambda s: None)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("inclusive", ["on", "off"])
def test_the_nvme_figure_is_the_drives(make_runtime, inclusive):
    """fit measures NVMe through the runtime with a probe DRAM can hold beside the run: with a
    DRAM tier smaller than the 32 MiB probe, the probe shrinks and its moves cross the drive
    (an outside client once got 310 GB/s: the probe landed straight on NVMe, nothing moved);
    with no room for a probe at all, no figure and a source that says why."""
    from tiermem.torch.fit import _profile
    rt = make_runtime(dram_bytes="6MiB", dram_inclusive=inclusive)
    before = rt.stats()["bytes_moved"]
    *_, nw, nr, src = _profile.bandwidths(rt, cuda=False)
    after = rt.stats()["bytes_moved"]
    assert src["nvme"] == "measured through the runtime", src
    wrote = after["dram"]["nvme"] - before["dram"]["nvme"]
    assert wrote >= 2 * MIB, after  # two round trips of at least 1 MiB, each written down
    assert rt.stats()["tiers"]["dram"]["peak"] >= MIB  # from DRAM, not filled onto NVMe
    if inclusive == "off":  # the read crossed too (inclusive: a clean DRAM copy answers it)
        assert after["nvme"]["dram"] - before["nvme"]["dram"] >= 2 * MIB, after
    assert 0 < nw < 1e12 and 0 < nr < 1e12, (nw, nr)
    assert rt.stats()["tensors"] == 0
    small = make_runtime(dram_bytes="256KiB")
    *_, nw, nr, src = _profile.bandwidths(small, cuda=False)
    assert nw is None and nr is None and src["nvme"].startswith("not measured"), src


def test_offload_saved_tensors_inside_the_plan_warns(rt):
    model = _model()
    x, y = _data(1)[0]
    plan = tt.fit(model, rt, 1 << 40, (x, y), profile_steps=1, check_steps=0, log=lambda s: None)
    with rt.step(), plan:
        with pytest.warns(tiermem.TiermemWarning, match="inside a fitted plan's context"):
            with tt.offload_saved_tensors(rt):
                model(x, y).backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # outside the plan: no warning
        with rt.step(), tt.offload_saved_tensors(rt), plan:
            model(x, y).backward()
    plan.remove()


class _DataFirst(torch.nn.Module):
    """Blocks fed the batch itself: the first one's input requires no grad."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Sequential(
            torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 128))
            for _ in range(4)])

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return x.pow(2).mean()


def test_a_block_fed_only_data_is_never_recomputed(rt):
    """A checkpoint of a block none of whose inputs requires grad has no backward to replay: it
    runs as it is and keeps its activations. Priced as recomputed, it put the measured peak
    256 KiB over the prediction and the budget (an outside client); now recompute is not its
    choice, and the plans' measured peaks are their predictions."""
    torch.manual_seed(0)
    model, x = _DataFirst(), torch.randn(64, 128)
    quiet = lambda s: None  # noqa: E731
    with pytest.raises(tt.FitError, match="needs is about") as e:
        tt.fit(model, rt, 1, (x,), profile_steps=1, log=quiet)
    for budget in (e.value.least + int(0.01 * MIB), 700000, 1000000):
        plan = tt.fit(model, rt, budget, (x,), profile_steps=1, check_steps=0, log=quiet)
        assert not plan.costs[0].recomputable and all(c.recomputable for c in plan.costs[1:])
        assert plan.choices[0] != RECOMPUTE, plan.choices
        plan.meter.reset()
        with rt.step(), plan:
            model(x).backward()
        assert plan.peak <= plan.prediction.peak <= budget, (plan.choices, plan.peak)
        plan.remove()
    plan = tt.fit(model, rt, 1 << 40, (x,), profile_steps=1, check_steps=0, log=quiet)
    with pytest.raises(ValueError, match=r"Sequential\[0\] cannot be recomputed"):
        plan.apply([RECOMPUTE] * 4)
    plan.remove()
