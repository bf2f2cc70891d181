"""CPUAdam's parameters stepped in place (their own master, state in DRAM) as tm_adam_span
arrays: the array the general path fills for each step (acquire_spans), and the plan of the
last such step (InPlacePlan), kept with its slots, state dicts, step counters and span array so
that a step that finds every parameter as the last one left it goes through one lean loop.

Why the plan: at 16M parameters (26 tensors) a step is ~8 ms, and the general path's Python
(grouping, slots, dictionaries keyed by tensors, a span array built anew), on caches the kernel
has just flushed, took ~0.23 ms of it; the plan's loop ~0.17 ms (its checks 0.07, the acquires
0.04, counting and releasing 0.06), measured on the 2-core VM (docs/benchmarks.md, "Against the
peers"). The plan makes every check the general path makes, on each step; anything it does not
fit (a gradient or parameter added, missing or changed in kind, step counts apart, amsgrad
switched, a step to resume) goes to the general path, which then makes a new plan.
"""

import array
import ctypes

import torch

from tiermem import _capi, _optim_capi

_F32 = torch.float32
DTYPES = {torch.float32: _optim_capi.DTYPE_F32, torch.bfloat16: _optim_capi.DTYPE_BF16,
          torch.float16: _optim_capi.DTYPE_F16}

# tm_adam_span as 8-byte words (LP64; the enums are the low half of theirs, zero above), filled
# without a ctypes attribute per field: the word of each field.
_WORDS = ctypes.sizeof(_optim_capi.AdamSpan) // 8
(_PARAM, _M, _V, _VMAX, _GRAD, _GRAD_DTYPE, _OUT, _OUT_DTYPE, _COUNT) = (
    getattr(_optim_capi.AdamSpan, name).offset // 8 for name, _ in _optim_capi.AdamSpan._fields_)
assert ctypes.sizeof(_optim_capi.AdamSpan) == 8 * _WORDS == 72, "tm_adam_span is LP64's"


def _fill(words, w, p, slot, g, base):
    n = slot.count
    words[w + _PARAM] = p.data_ptr()
    words[w + _M] = base
    words[w + _V] = base + 4 * n
    if slot.amsgrad:
        words[w + _VMAX] = base + 8 * n
    words[w + _GRAD] = g.data_ptr()
    words[w + _GRAD_DTYPE] = DTYPES[g.dtype]
    words[w + _COUNT] = n


def acquire_spans(lib, check, rt, here, acquired):
    """The tm_adam_span array of `here` ((param, slot, grad, counter)), their state acquired in
    DRAM for writing (appended to `acquired` as it goes, for the caller to release)."""
    words = array.array("Q", bytes(8 * _WORDS * len(here)))
    ptr = ctypes.c_void_p()
    out = ctypes.byref(ptr)
    acquire = lib.tm_tensor_acquire
    for i, (p, slot, g, _) in enumerate(here):
        status = acquire(rt, slot.handle, _capi.TIER_DRAM, _capi.ACCESS_READ_WRITE, None, out)
        if status != _capi.OK:
            check(status, "tm_tensor_acquire")
        acquired.append(slot)
        _fill(words, i * _WORDS, p, slot, g, ptr.value)
    return (_optim_capi.AdamSpan * len(here)).from_buffer(words)


def _hyper(group):
    """What CPUAdam._config reads of a group, as it reads it (a tensor lr read anew each time)."""
    b1, b2 = group["betas"]
    return (float(group["lr"]), float(b1), float(b2), float(group["eps"]),
            float(group["weight_decay"]))


class InPlacePlan:
    """Made from runs [(group, step, [(param, slot, grad, counter)])] the general path has just
    stepped, all in place, every counter a ctypes view (CPUAdam._counter)."""

    __slots__ = ("state", "entries", "starts", "runs", "words", "keys", "cfgs")

    def __init__(self, opt, runs):
        self.state = opt.state
        self.entries = []  # (param, group, its state dict, step tensor, counter, slot)
        # (group, amsgrad, first entry, count, span array view, param ids, counters)
        self.runs = []
        self.words = array.array("Q", bytes(8 * _WORDS * sum(len(h) for _, _, h in runs)))
        for group, _, here in runs:
            first = len(self.entries)
            for p, slot, g, c in here:
                st = opt.state[p]
                _fill(self.words, _WORDS * len(self.entries), p, slot, g, 0)  # the count stays
                self.entries.append((p, group, st, st["step"], c, slot))
            view = (_optim_capi.AdamSpan * len(here)).from_buffer(self.words, 8 * _WORDS * first)
            self.runs.append((group, bool(group["amsgrad"]), first, len(here), view,
                              [id(p) for p, _, _, _ in here], [c for _, _, _, c in here]))
        self.starts = {run[2] for run in self.runs}
        self.keys = None  # the hyperparameters the runs last gave tm_adam_set_hyper
        self.cfgs = None

    def step(self, opt, items, grad_scale, lib, check):
        """Steps `items` ((param, group, grad), as CPUAdam.step lists them) as the general path
        would, and returns True; or False, nothing done, if they are not the plan's."""
        entries, words, starts = self.entries, self.words, self.starts
        if opt.state is not self.state or len(items) != len(entries):
            return False
        if any(bool(run[0]["amsgrad"]) != run[1] for run in self.runs):
            return False
        state_get, steps, w = opt.state.get, [], 0
        for i, ((p, group, g), (pp, gg, st, t, c, slot)) in enumerate(zip(items, entries)):
            if p is not pp or group is not gg or state_get(p) is not st or st.get("step") is not t:
                return False
            step = int(c.value) + 1
            if i in starts:
                steps.append(step)
            elif step != steps[-1]:
                return False
            # As CPUAdam._in_place_ok and _grad find them; else the general path's conversions.
            if (p.dtype is not _F32 or not p.is_cpu or not p.is_contiguous() or
                    p.numel() != slot.count or g.is_sparse or g.is_cuda):
                return False
            code = DTYPES.get(g.dtype)
            if code is None or not g.is_contiguous():
                return False
            words[w + _PARAM] = p.data_ptr()
            words[w + _GRAD] = g.data_ptr()
            words[w + _GRAD_DTYPE] = code
            w += _WORDS
        keys = [_hyper(run[0]) for run in self.runs]
        rt = opt.runtime._handle()
        acquire, release = lib.tm_tensor_acquire, lib.tm_tensor_release
        ptr = ctypes.c_void_p()
        out = ctypes.byref(ptr)
        acquired = []
        try:
            w = 0
            for _, _, _, _, _, slot in entries:
                status = acquire(rt, slot.handle, _capi.TIER_DRAM, _capi.ACCESS_READ_WRITE, None,
                                 out)
                if status != _capi.OK:
                    check(status, "tm_tensor_acquire")
                acquired.append(slot.handle)
                base, n = ptr.value, slot.count
                words[w + _M] = base
                words[w + _V] = base + 4 * n
                if slot.amsgrad:
                    words[w + _VMAX] = base + 8 * n
                w += _WORDS
            if keys != self.keys:  # all checked before anything steps, as the general path does
                self.keys, cfgs = None, [opt._config(run[0]) for run in self.runs]
                for cfg in cfgs:
                    check(lib.tm_adam_set_hyper(opt._adam, ctypes.byref(cfg)),
                          "tm_adam_set_hyper")
                self.cfgs = cfgs
                # With one run the optimizer keeps its hyperparameters until they change.
                self.keys = keys if len(self.runs) == 1 else None
            several = len(self.runs) > 1
            for (_, _, _, count, view, ids, counters), step, cfg in zip(self.runs, steps,
                                                                        self.cfgs):
                if several:
                    check(lib.tm_adam_set_hyper(opt._adam, ctypes.byref(cfg)),
                          "tm_adam_set_hyper")
                check(lib.tm_adam_step(opt._adam, step, grad_scale, view, count), "tm_adam_step")
                for c in counters:
                    c.value += 1.0  # as AdamW's step += 1 in fp32
                opt._stepped.update(ids)
        finally:
            for handle in acquired:
                release(rt, handle, _capi.TIER_DRAM)
        return True
