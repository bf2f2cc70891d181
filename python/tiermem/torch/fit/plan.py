"""tiermem.torch.fit: fit a model's saved activations to an HBM budget, choosing per block to keep
them, offload them to DRAM or NVMe, or recompute the block (torch.utils.checkpoint), from times
and bandwidths measured on the machine at hand (the cost model: fit_cost; docs/planner.md)."""

import math
import statistics
import warnings
import weakref

import torch
from torch.utils import _pytree

from ... import TiermemWarning, parse_size
from .._shared.transfers import _check_runtime, _size_arg
from .._shared.units import _unit_modules
from . import _cost as _fit_cost
from ._cost import CHOICES, DRAM, KEEP, NVME, RECOMPUTE, BlockCost, Machine, RestCost
from ._hooks import (FitError, _State, Router, SavedBytesMeter, SavedCounter, track_blocks,
                     wrap_recompute)
from ._profile import BlockTimer, Clock, bandwidths

_MIB = 1 << 20
_DRIFT = 0.15  # a measured step this far from the prediction re-plans
# model -> its FittedPlan in place: a model has one plan at a time (fit again replaces it).
_plans = weakref.WeakKeyDictionary()


def _gbps_arg(value, what):
    """link_gbps= / nvme_gbps=: None (measured) or a positive finite number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("%s: expected a number of GB/s or None (measured), got %s" %
                        (what, type(value).__name__))
    if not math.isfinite(value) or value <= 0:
        raise ValueError("%s=%r: must be a positive number of GB/s (None: measured)" %
                         (what, value))
    return float(value)


class FittedPlan:
    """The handle fit returns. Use it as a context around each step's forward and backward
    (inside rt.step()): `with rt.step(), plan: loss = model(x, y); loss.backward()`.
    .choices (per block), .prediction (fwd, bwd, step seconds; peak bytes), .costs, .machine,
    .peak (the meter's peak over the steps since .meter.reset()), .table() (the plan as text),
    .check(step_seconds), .replan(), .remove()."""

    def __init__(self, model, runtime, blocks, budget, inputs, loss_fn, min_bytes, link_gbps,
                 nvme_gbps, steps, log):
        self.model, self.runtime, self.blocks = model, runtime, blocks
        self.budget, self.inputs, self.loss_fn = budget, inputs, loss_fn
        self.min_bytes, self.steps, self.log = min_bytes, steps, log
        self._gbps = (link_gbps, nvme_gbps)
        self.cuda = any(p.is_cuda for p in model.parameters())
        self.state = _State()
        self.meter = SavedBytesMeter(runtime)
        self.track_peak = True
        self.choices = None
        self.prediction = None
        self.measured = []
        self._undo = []
        self._hooks = track_blocks(blocks, self.state)
        self._router = None
        self._profiling = False

    # --- the step ------------------------------------------------------------------------
    def __enter__(self):
        self._check_applied("__enter__")
        self._router = Router(self.runtime, self.state, self.choices, self.min_bytes,
                              self._stash_bytes(), self.meter if self.track_peak else None)
        self._router.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb):
        router, self._router = self._router, None
        return router.__exit__(exc_type, exc, tb)

    @property
    def peak(self):
        return self.meter.peak

    def _stash_bytes(self):
        """Sources in flight may take what the budget leaves beside the rest of the plan."""
        p = self.prediction
        if p is None or self._profiling:
            return 256 << 20  # the profile's steps: unbounded, as the model assumes
        slack = self.budget - (p.peak - p.inflight)
        return max(int(slack), 1 << 20)

    def _loss(self):
        out = self.model(*self.inputs)
        loss = self.loss_fn(out) if self.loss_fn is not None else out
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError("fit: %s gave %s, not a scalar loss tensor: the profile's steps "
                            "call backward() on it (give loss_fn= to reduce the output)" % (
                                "loss_fn(model(*inputs))" if self.loss_fn is not None else
                                "model(*inputs)", "a tensor of shape %s" % tuple(loss.shape)
                                if isinstance(loss, torch.Tensor) else type(loss).__name__))
        return loss

    def _run_step(self, choices=None, timer=None):
        """One forward and backward under choices (default: the plan's), inside rt.step();
        (fwd, bwd) seconds. The gradients it leaves are the caller's to clear."""
        old = self.choices
        if choices is not None:
            self._clear()
            self._set(choices)
        clock = timer.clock if timer is not None else Clock(self.cuda)
        try:
            with self.runtime.step():
                self._sync()
                clock.mark("start")
                with self:
                    loss = self._loss()
                    clock.mark("fwd_end")
                    loss.backward()
                clock.mark("end")
            self.runtime.sync()
            self._sync()
        finally:
            if choices is not None:
                self._clear()
                if old is not None:
                    self._set(old)
                else:
                    self.choices = None
        return clock.between("start", "fwd_end"), clock.between("fwd_end", "end")

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def _set(self, choices):
        self._undo = [wrap_recompute(b, i, self.state)
                      for i, (b, c) in enumerate(zip(self.blocks, choices)) if c == RECOMPUTE]
        self.choices = list(choices)

    def _clear(self):
        for undo in self._undo:
            undo()
        self._undo = []

    # --- planning ------------------------------------------------------------------------
    def _profile(self):
        """Per block costs (one keep-all step with the counter, then steps of keep-all,
        dram-all and recompute-all rotated, medians), the bandwidths and the corrections."""
        n = len(self.blocks)
        counter = SavedCounter(self.state, self.min_bytes)
        inputs, grads = {}, {}

        def record_input(module, args, kwargs, i):
            inputs[i] = sum(a.numel() * a.element_size() for a in args
                            if isinstance(a, torch.Tensor))
            # What wrap_recompute asks: an input (any tensor in the arguments) requiring grad.
            grads[i] = any(isinstance(a, torch.Tensor) and a.requires_grad
                           for a in _pytree.tree_leaves((args, kwargs)))

        hs = [b.register_forward_pre_hook(
            lambda m, a, k, i=i: record_input(m, a, k, i), with_kwargs=True)
            for i, b in enumerate(self.blocks)]
        try:
            with counter:
                self._loss().backward()
        finally:
            for h in hs:
                h.remove()
        self._zero_grads()
        d2h, h2d, nw, nr, sources = bandwidths(self.runtime, self.cuda, *self._gbps)
        m = Machine(d2h, h2d, nw, nr, self.runtime.info()["prefetch_depth"])
        m.sources = sources
        tiers = self.runtime.stats()["tiers"]
        self._dram_free = tiers["dram"]["capacity"] - tiers["dram"]["used"]
        self._nvme_free = tiers["nvme"]["capacity"] - tiers["nvme"]["used"]
        moved_all = sum(counter.moved.get(i, 0) for i in range(n))
        modes = [[KEEP] * n, [RECOMPUTE] * n]
        if 0 < moved_all <= self._dram_free:
            modes.append([DRAM] * n)
        runs = {tuple(c): [] for c in modes}
        spans = []
        self._run_step(modes[0])  # warm-up
        self._zero_grads()
        for r in range(self.steps):
            for c in modes[r % len(modes):] + modes[:r % len(modes)]:
                timer = BlockTimer(self.blocks, Clock(self.cuda)) if c == modes[0] else None
                try:
                    runs[tuple(c)].append(self._run_step(c, timer))
                    if timer is not None:
                        spans.append(timer.spans())
                finally:
                    if timer is not None:
                        timer.remove()
                self._zero_grads()
        med = lambda xs: statistics.median(xs)  # noqa: E731
        blocks = []
        for i, b in enumerate(self.blocks):
            blocks.append(BlockCost(
                "%s[%d]" % (type(b).__name__, i), med(s[1][i] for s in spans),
                med(s[4][i] for s in spans), counter.kept.get(i, 0), counter.moved.get(i, 0),
                counter.small.get(i, 0), inputs.get(i, 0), counter.sizes.get(i, ()),
                grads.get(i, True)))
        rest = RestCost(med(s[0] for s in spans), med(s[2] for s in spans),
                        med(s[3] for s in spans), med(s[5] for s in spans),
                        counter.kept.get(None, 0))
        # Scale the blocks' spans so that the keep-all step is what it measured (the timer's
        # marks cost a little).
        keep_f, keep_b = (med(x[k] for x in runs[tuple(modes[0])]) for k in (0, 1))
        self._scale(blocks, rest, keep_f, keep_b)
        m.recompute_factor, m.sources["recompute"] = _fit_cost.recompute_factor(
            [x[1] for x in runs[tuple(modes[0])]], [x[1] for x in runs[tuple(modes[1])]],
            sum(b.fwd for b in blocks if b.recomputable))
        if len(modes) == 3 and moved_all > 0:
            # The host's cost per byte offloaded: each round's all-DRAM step against its own
            # all-keep step (a load during one round weighs on both), less the difference the
            # model predicts between them without it (the link's time that is not hidden).
            bare = _fit_cost.predict(blocks, rest, modes[2], m)
            kept = _fit_cost.predict(blocks, rest, modes[0], m)
            pairs = list(zip(runs[tuple(modes[0])], runs[tuple(modes[2])]))
            m.pack_fwd, m.pack_bwd = (
                max(0.0, med(o[k] - c[k] for c, o in pairs) - (b - a)) / moved_all
                for k, a, b in ((0, kept.fwd, bare.fwd), (1, kept.bwd, bare.bwd)))
        self.costs, self.rest, self.machine = blocks, rest, m
        self.baseline = {name: tuple(med(x[k] for x in runs[tuple(c)]) for k in (0, 1))
                         for name, c in zip(("keep", "recompute", "dram"), modes)}

    @staticmethod
    def _scale(blocks, rest, fwd, bwd):
        f = rest.pre_f + rest.post_f + sum(b.fwd for b in blocks)
        g = rest.pre_b + rest.post_b + sum(b.bwd for b in blocks)
        sf, sb = (fwd / f if f > 0 else 1.0), (bwd / g if g > 0 else 1.0)
        for b in blocks:
            b.fwd *= sf
            b.bwd *= sb
        rest.pre_f *= sf
        rest.post_f *= sf
        rest.pre_b *= sb
        rest.post_b *= sb

    def _zero_grads(self):
        for p in self.model.parameters():
            p.grad = None

    def _plan(self):
        """Profiles, chooses and applies; FitError when nothing fits the budget."""
        self._clear()
        self._profiling = True
        try:
            self._profile()
        finally:
            self._profiling = False
            # .peak is the plan's: the profile's keep-all steps are not (they exceed budgets).
            self.meter.reset()
        return self._choose()

    def refit(self, hbm_budget):
        """Chooses and applies the plan for another budget from the costs already measured (no
        profile); FitError when nothing fits it (the plan is then unchanged)."""
        self._check_applied("refit")
        budget = parse_size(hbm_budget, "hbm_budget")
        if budget <= 0:
            raise FitError("hbm_budget=%r: must be positive" % (hbm_budget,))
        old = self.budget
        self.budget = budget
        try:
            chosen = self._choose()
        except FitError:
            self.budget = old
            raise
        self.meter.reset()  # .peak is the new plan's
        return chosen

    def _choose(self):
        n = len(self.costs)
        # The least peak: every block checkpointed or offloaded, the last one (the backward's
        # first, whose activations are whole then anyway) kept or not.
        # A block that cannot be recomputed is offloaded instead.
        def way(b, c):
            return DRAM if c == RECOMPUTE and not b.recomputable else c

        least = min(_fit_cost.predict(
            self.costs, self.rest, [way(b, c) for b in self.costs[:-1]] +
            [way(self.costs[-1], last)], self.machine).peak
            for c in (RECOMPUTE, DRAM) for last in (c, KEEP))
        got = _fit_cost.choose(self.costs, self.rest, self.machine, self.budget,
                              self._dram_free, self._nvme_free)
        if got is None:
            least = int(math.ceil(least))
            raise FitError("hbm_budget=%d bytes (%.2f MiB): no plan fits; the least this model "
                           "needs is about %d bytes (%.2f MiB: the rest of the model's saved "
                           "tensors, every block but the last checkpointed or offloaded, and one "
                           "block's activations during its backward)" % (
                               self.budget, self.budget / _MIB, least, least / _MIB), least=least)
        self._clear()
        self._set(got[0])
        self.prediction = got[1]
        return self

    def apply(self, choices):
        """Applies choices of your own (one of "keep", "dram", "nvme", "recompute" per block)
        instead of the chosen ones, priced by the same model (its prediction may exceed the
        budget: that is then the caller's choice); .peak starts afresh."""
        self._check_applied("apply")
        if isinstance(choices, str):  # one word, not a list of its letters
            raise TypeError("choices: a list of %d choices (one per block), each one of %s, "
                            "not the string %r" % (len(self.blocks), "/".join(CHOICES), choices))
        # Any case, as tier= arguments elsewhere ("NVMe").
        choices = [c.lower() if isinstance(c, str) else c for c in choices]
        if len(choices) != len(self.blocks) or any(c not in CHOICES for c in choices):
            raise ValueError("choices: expected %d of %s, got %r" %
                             (len(self.blocks), "/".join(CHOICES), choices))
        if NVME in choices and self.machine.nvme_write is None:
            raise ValueError("choices: \"nvme\" needs a runtime with an NVMe tier")
        for b, c in zip(self.costs, choices):
            if c == RECOMPUTE and not b.recomputable:
                raise ValueError("choices: %s cannot be recomputed: no input of it requires grad "
                                 "(the model's first block fed the batch itself?), so a "
                                 "checkpoint has no backward to replay and it keeps its "
                                 "activations" % b.name)
        self._clear()
        self._set(choices)
        self.prediction = _fit_cost.predict(self.costs, self.rest, choices, self.machine,
                                           self.budget)
        self.meter.reset()  # .peak is these choices'
        return self

    def table(self):
        """The plan as tiermem-plan prints a rung: per block the choice, its bytes and time."""
        self._check_applied("table")
        m, p = self.machine, self.prediction
        gbps = lambda x: "n/a" if x is None else "%.2f" % (x / 1e9)  # noqa: E731
        lines = ["fitted plan: HBM budget %.2f MiB of saved activations; link D2H %s / H2D %s "
                 "GB/s (%s), NVMe write %s / read %s GB/s (%s); host cost %.3f / %.3f ms per "
                 "MiB offloaded (fwd / bwd), recompute %.2fx a forward (%s)" %
                 (self.budget / _MIB, gbps(m.d2h), gbps(m.h2d), m.sources.get("link"),
                  gbps(m.nvme_write), gbps(m.nvme_read), m.sources.get("nvme"),
                  m.pack_fwd * _MIB * 1e3, m.pack_bwd * _MIB * 1e3, m.recompute_factor,
                  m.sources.get("recompute", "set")),
                 "%-14s %-10s %10s %10s %9s %9s" % ("block", "choice", "saved MiB", "HBM MiB",
                                                    "fwd ms", "bwd ms")]
        for b, c in zip(self.costs, self.choices):
            bwd = b.bwd + (m.recompute_factor * b.fwd if c == RECOMPUTE else 0)
            lines.append("%-14s %-10s %10.2f %10.2f %9.3f %9.3f" %
                         (b.name, c, b.kept / _MIB, _fit_cost.resident(b, c) / _MIB, b.fwd * 1e3,
                          bwd * 1e3))
        r = self.rest
        lines.append("%-14s %-10s %10.2f %10.2f %9.3f %9.3f" %
                     ("(rest)", KEEP, r.kept / _MIB, r.kept / _MIB, (r.pre_f + r.post_f) * 1e3,
                      (r.pre_b + r.post_b) * 1e3))
        lines.append("predicted: step %.2f ms (fwd %.2f, bwd %.2f), peak %.2f MiB of %.2f MiB" %
                     (p.step * 1e3, p.fwd * 1e3, p.bwd * 1e3, p.peak / _MIB, self.budget / _MIB))
        return "\n".join(lines)

    def check(self, step_seconds, replan=True):
        """Compares a measured step (seconds) with the prediction and prints the error; beyond
        15% it re-plans (profiles again and applies the new choice; not with replan=False) and
        returns True."""
        self._check_applied("check")
        self.measured.append(step_seconds)
        err = step_seconds / self.prediction.step - 1
        self.log("fit: measured step %.2f ms, predicted %.2f ms: %+.1f%%" %
                 (step_seconds * 1e3, self.prediction.step * 1e3, 100 * err))
        if abs(err) <= _DRIFT or not replan:
            return abs(err) > _DRIFT
        self.log("fit: off by more than %d%%: re-planning" % (100 * _DRIFT))
        self.replan()
        return True

    def replan(self):
        """Profiles again and applies the new choice (what check() does beyond 15%)."""
        self._check_applied("replan")
        self._plan()
        self.log(self.table())

    def measure(self, steps=3):
        """The median of steps forward-and-backward steps under the plan, in seconds (what
        check() takes; the gradients cleared after each)."""
        self._check_applied("measure")
        times = []
        for _ in range(steps):
            f, b = self._run_step()
            times.append(f + b)
            self._zero_grads()
        return statistics.median(times)

    def _check_applied(self, what):
        if self.choices is None:
            raise RuntimeError("FittedPlan.%s: the plan was removed (fit the model again)" % what)

    def remove(self):
        """Undoes the plan: blocks run as they were, no hooks."""
        if _plans.get(self.model) is self:
            del _plans[self.model]
        self._clear()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.choices = None


def fit(model, runtime, hbm_budget, inputs, loss_fn=None, min_bytes=16384, link_gbps=None,
        nvme_gbps=None, profile_steps=3, check_steps=3, max_replans=1, units=None, log=print):
    """Chooses per block (each entry of the model's largest ModuleList, or the units policy of
    offload_parameters) keep / offload to DRAM / offload to NVMe / recompute so that the bytes of
    saved activations in HBM stay within hbm_budget (int or "64MiB") at the least predicted step
    time, prints the plan, applies it, measures check_steps steps and prints the prediction
    error (re-planning up to max_replans times when it is off by more than 15%). inputs: the
    arguments of one training step's model(*inputs); loss_fn(output) -> scalar loss (default:
    the output is the loss). The profile and check steps run forward and backward (no optimizer
    step), leave no gradients, and restore the RNG and the module's buffers. Returns a
    FittedPlan (use it around each step; .remove() undoes it)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError("model: expected a torch.nn.Module, got %s" % type(model).__name__)
    _check_runtime(runtime)
    budget = parse_size(hbm_budget, "hbm_budget")
    if budget <= 0:
        raise FitError("hbm_budget=%r: must be positive" % (hbm_budget,))
    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)
    blocks = _unit_modules(model, units)
    if not blocks:
        raise FitError("the model has no blocks to plan: no nn.ModuleList holding parameters (by "
                       "default the blocks are the entries of the largest, by parameters); give "
                       "units=")
    where = {}
    for i, b in enumerate(blocks):
        # Hooks and choices are per module: the calls of a block used twice (weights shared
        # across layers) would be measured as one, and the plan's figures would be wrong.
        if id(b) in where:
            raise FitError("blocks %d and %d are the same %s, called twice (shared weights): fit "
                           "plans each block's activations apart and cannot tell its calls "
                           "apart; give units= naming modules that are each called once, or use "
                           "offload_saved_tensors" % (where[id(b)], i, type(b).__name__))
        where[id(b)] = i
    if int(profile_steps) < 1:
        raise ValueError("profile_steps=%r: at least 1" % (profile_steps,))
    min_bytes = _size_arg(min_bytes, "min_bytes")
    link_gbps = _gbps_arg(link_gbps, "link_gbps")
    nvme_gbps = _gbps_arg(nvme_gbps, "nvme_gbps")
    old = _plans.get(model)
    if old is not None:
        log("fit: the model's plan in place is replaced (its remove() called)")
        old.remove()
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    devices = [p.device.index for p in model.parameters() if p.is_cuda][:1]
    with torch.random.fork_rng(devices=devices):
        plan = FittedPlan(model, runtime, blocks, budget, tuple(inputs), loss_fn, min_bytes,
                          link_gbps, nvme_gbps, int(profile_steps), log)
        try:
            plan._plan()
            log(plan.table())
            replans = max(0, int(max_replans))
            for k in range(replans + 1):
                if check_steps <= 0 or not plan.check(plan.measure(check_steps), k < replans):
                    break
            else:  # the last check was off too, with no re-plan left
                warnings.warn(
                    "fit: the plan's measured step is still %+.0f%% off its prediction after %d "
                    "re-plan(s) (another process's load, or a cost the model does not know): "
                    "its choices may not be the fastest; fit again on a quiet machine, or "
                    "raise max_replans" % (100 * (plan.measured[-1] / plan.prediction.step - 1),
                                           replans), TiermemWarning, stacklevel=2)
        except BaseException:
            plan.remove()
            raise
        finally:
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)
    _plans[model] = plan
    return plan


__all__ = ["fit", "FittedPlan", "FitError", "CHOICES", "KEEP", "DRAM", "NVME", "RECOMPUTE"]
