"""The C side of CPUAdam's step: one tm_adam optimizer (its worker threads and the step it has
prepared), and the layout of what its calls read: the hyperparameters (tm_adam_config), the
spans of parameters stepped in place (tm_adam_span), the buckets of state stepped through
tiermem (tm_adam_bucket, tm_adam_group). The kernel owns the prepared step: it keeps what the C
step reads (gradients, arrays, configs) until the step is committed or aborted, and knows
whether one is prepared. CPUAdam decides what is stepped, in which order and when; the kernel
carries it out."""

import array
import ctypes

import torch

import tiermem
from tiermem import _capi, _optim_capi

__all__ = ["AdamKernel", "DTYPES", "isa", "set_isa_limit"]

_lib = tiermem._lib
_optim_capi.bind(_lib)
_check = tiermem._check

DTYPES = {torch.float32: _optim_capi.DTYPE_F32, torch.bfloat16: _optim_capi.DTYPE_BF16,
          torch.float16: _optim_capi.DTYPE_F16}

# tm_adam_span as 8-byte words (LP64; the enums are the low half of theirs, zero above), filled
# without a ctypes attribute per field: the word of each field.
_SPAN_WORDS = ctypes.sizeof(_optim_capi.AdamSpan) // 8
(_SPAN_PARAM, _SPAN_M, _SPAN_V, _SPAN_VMAX, _SPAN_GRAD, _SPAN_GRAD_DTYPE, _SPAN_OUT,
 _SPAN_OUT_DTYPE, _SPAN_COUNT) = (getattr(_optim_capi.AdamSpan, name).offset // 8
                                  for name, _ in _optim_capi.AdamSpan._fields_)
assert ctypes.sizeof(_optim_capi.AdamSpan) == 8 * _SPAN_WORDS == 72, "tm_adam_span is LP64's"


def isa():
    """(best instruction set this CPU runs, the one the kernel uses now): "avx512", "avx2" or
    "baseline"."""
    detected, active = ctypes.c_int32(), ctypes.c_int32()
    _check(_lib.tm_optim_isa_get(ctypes.byref(detected), ctypes.byref(active)),
           "tm_optim_isa_get")
    return _optim_capi.ISA_NAMES[detected.value], _optim_capi.ISA_NAMES[active.value]


def set_isa_limit(name):
    """Caps the kernel's instruction set process-wide ("baseline", "avx2", "avx512"); returns
    the one now in use (a cap above the CPU's is lowered to it)."""
    if name not in _optim_capi.ISAS:
        raise ValueError("set_isa_limit: %r is not one of %s" % (name, sorted(_optim_capi.ISAS)))
    active = ctypes.c_int32()
    _check(_lib.tm_optim_set_isa_limit(_optim_capi.ISAS[name], ctypes.byref(active)),
           "tm_optim_set_isa_limit")
    return _optim_capi.ISA_NAMES[active.value]


def _out_host(p, slot):
    """Where the updated value of a parameter that cannot receive it in place (on a GPU, or
    strided) is written: the slot's host buffer, made at its first use."""
    if slot.out_host is None:
        slot.out_host = torch.empty(slot.count, dtype=p.dtype, pin_memory=p.is_cuda)
    return slot.out_host


class AdamKernel:
    """One tm_adam optimizer of a runtime, with `threads` CPU threads (0: the cores of the
    DRAM tier's node). Not thread-safe: CPUAdam calls it under its lock."""

    def __init__(self, runtime, threads, adamw, who="CPUAdam"):
        self._who = who  # in messages
        cfg = _optim_capi.AdamConfig()
        cfg.threads = int(threads)
        self._adamw = int(bool(adamw))
        self._adam = _optim_capi.Adam()
        _check(_lib.tm_adam_create(runtime._handle(), ctypes.byref(cfg), ctypes.byref(self._adam)),
               "tm_adam_create")
        self._keep = []  # what the prepared step reads until it is committed or aborted
        self._prepared = False

    @property
    def prepared(self):
        """A step prepared (begun), not yet committed or aborted."""
        return self._prepared

    def config(self, group):
        """The tm_adam_config of a parameter group; a TiermemError (TM_ERR_INVALID_ARGUMENT) for
        a group asking what the kernel does not do, set in param_groups or loaded from an AdamW
        checkpoint (it stepped as if not asked)."""
        why = None
        for key, reason in (("maximize", "it steps to minimize the loss only (negate the loss)"),
                            ("differentiable", "its step is not differentiable")):
            if group.get(key):
                why = "%s=%r, which this optimizer cannot honour: %s" % (key, group[key], reason)
        decoupled = group.get("decoupled_weight_decay")
        if decoupled is not None and bool(decoupled) != bool(self._adamw):
            why = ("decoupled_weight_decay=%r, but this optimizer steps %s (adamw=%r, set when "
                   "it was made)" % (decoupled, "AdamW" if self._adamw else "Adam",
                                     bool(self._adamw)))
        try:
            beta1, beta2 = group["betas"]
        except (TypeError, ValueError):
            why = "betas=%r; want a pair (beta1, beta2)" % (group["betas"],)
        if why is not None:
            raise tiermem.TiermemError(
                _capi.STATUS_NAMES.index("TM_ERR_INVALID_ARGUMENT"),
                "%s: a parameter group has %s; the step was not taken" % (self._who, why))
        cfg = _optim_capi.AdamConfig()
        cfg.lr, cfg.beta1, cfg.beta2 = float(group["lr"]), beta1, beta2
        cfg.eps, cfg.weight_decay = float(group["eps"]), float(group["weight_decay"])
        cfg.adamw, cfg.amsgrad = self._adamw, int(bool(group["amsgrad"]))
        return cfg

    def set_config(self, cfg):
        """Sets cfg (raises naming what is wrong with it): tm_adam_step steps with the last
        set."""
        _check(_lib.tm_adam_set_hyper(self._adam, ctypes.byref(cfg)), "tm_adam_set_hyper")

    # ---- parameters stepped in place (their state in DRAM or at home), one call a run ----

    @staticmethod
    def spans(rt, here, acquired):
        """The tm_adam_span array of parameters stepped in place, here: (param, slot, grad, _);
        their state acquired in DRAM for writing (appended to `acquired` as it goes, for the
        caller to release), or at home in torch memory (a master there too, but for a parameter
        that is its own)."""
        words = array.array("Q", bytes(8 * _SPAN_WORDS * len(here)))
        ptr = ctypes.c_void_p()
        out = ctypes.byref(ptr)
        acquire = _lib.tm_tensor_acquire
        for i, (p, slot, g, _) in enumerate(here):
            if slot.home is not None:
                base = slot.home.data_ptr()
            else:  # state in DRAM: one slice
                status = acquire(rt, slot.handles[0], _capi.TIER_DRAM, _capi.ACCESS_READ_WRITE,
                                 None, out)
                if status != _capi.OK:
                    _check(status, "tm_tensor_acquire")
                acquired.append(slot)
                base = ptr.value
            n, w = slot.count, i * _SPAN_WORDS
            if slot.in_place:
                words[w + _SPAN_PARAM] = p.data_ptr()
            else:  # the master first; the updated parameter written as its dtype
                words[w + _SPAN_PARAM] = base
                base += 4 * n
                if p.is_cuda or not p.is_contiguous():
                    words[w + _SPAN_OUT] = _out_host(p, slot).data_ptr()
                else:
                    words[w + _SPAN_OUT] = p.data_ptr()
                words[w + _SPAN_OUT_DTYPE] = DTYPES[p.dtype]
            words[w + _SPAN_M] = base
            words[w + _SPAN_V] = base + 4 * n
            if slot.amsgrad:
                words[w + _SPAN_VMAX] = base + 8 * n
            words[w + _SPAN_GRAD] = g.data_ptr()
            words[w + _SPAN_GRAD_DTYPE] = DTYPES[g.dtype]
            words[w + _SPAN_COUNT] = n
        return (_optim_capi.AdamSpan * len(here)).from_buffer(words)

    def step_in_place(self, step, grad_scale, spans, count):
        """One run's step (tm_adam_step) over spans, with the config set last."""
        _check(_lib.tm_adam_step(self._adam, step, grad_scale, spans, count), "tm_adam_step")

    # ---- state stepped through tiermem, in buckets: prepared, then committed or aborted ----

    def begin(self, grad_scale, runs=()):
        """Prepares a step (tm_adam_step_groups_prepare) of runs, [(group, step, pairs)] with
        pairs [(param, slot, grad, _)], or none (extend() adds them): raises, nothing
        prepared, or leaves it prepared."""
        groups = self._groups(runs)
        # Set before the call: a KeyboardInterrupt taken as it returns still aborts the step it
        # prepared (left prepared, every later step was refused).
        self._prepared = True
        try:
            _check(_lib.tm_adam_step_groups_prepare(self._adam, grad_scale, groups, len(runs)),
                   "tm_adam_step_groups" if runs else "tm_adam_step_groups_prepare")
        except tiermem.TiermemError:
            self._prepared = False  # it prepared nothing
            self._keep = []
            raise

    def extend(self, grad_scale, runs, scratch=False):
        """Adds runs (as begin's) to the step prepared (tm_adam_step_groups_extend; scratch:
        TM_ADAM_OUT_SCRATCH): raises (the caller aborts), or leaves them prepared."""
        flags = _optim_capi.ADAM_OUT_SCRATCH if scratch else 0
        _check(_lib.tm_adam_step_groups_extend(self._adam, grad_scale, self._groups(runs),
                                               len(runs), flags), "tm_adam_step_groups_extend")

    def commit(self):
        """Takes the step prepared (tm_adam_step_commit): all or nothing across its groups.
        Returns (whether every bucket was stepped, the status; raising is the caller's, once
        it has counted what stepped)."""
        done = ctypes.c_size_t(0)
        self._prepared = False
        status = _lib.tm_adam_step_commit(self._adam, ctypes.byref(done))
        self._keep = []
        return bool(done.value), status

    def abort(self):
        """Every state as before the step prepared, if one is (else nothing)."""
        if self._prepared:
            self._prepared = False
            _lib.tm_adam_step_abort(self._adam)
        self._keep = []

    def close(self):
        """Frees the optimizer and its workers. Once: a second call does nothing."""
        if self._adam.bits:
            _lib.tm_adam_destroy(self._adam)  # (a step prepared goes with it)
            self._adam = _optim_capi.Adam()
        self._prepared = False
        self._keep = []

    def _groups(self, runs):
        """The tm_adam_group array of runs, kept with what it points to (the configs, the
        bucket arrays, the gradients) until the step is committed or aborted."""
        if not runs:
            return None
        keep = self._keep
        groups = (_optim_capi.AdamGroup * len(runs))()
        for i, (group, step, pairs) in enumerate(runs):
            buckets = []
            for p, slot, g, _ in pairs:
                keep.append(g)
                buckets += self._buckets(p, slot, g)
            arr = (_optim_capi.AdamBucket * len(buckets))(*buckets)
            cfg = self.config(group)
            keep += [arr, cfg]
            groups[i].config = ctypes.pointer(cfg)
            groups[i].step, groups[i].count = step, len(buckets)
            groups[i].buckets = ctypes.cast(arr, ctypes.POINTER(_optim_capi.AdamBucket))
        keep.append(groups)
        return groups

    @staticmethod
    def _buckets(p, slot, g):
        """One bucket a slice: its elements of the gradient and of the updated parameter."""
        if p.is_cuda or not p.is_contiguous():
            out = _out_host(p, slot)
        else:  # the parameter itself receives the updated value in the same pass
            out = p
        grad, grad_size, grad_dtype = g.data_ptr(), g.element_size(), DTYPES[g.dtype]
        out_ptr, out_size, out_dtype = out.data_ptr(), out.element_size(), DTYPES[p.dtype]
        buckets = []
        for _, h, first, n in slot.slices():
            b = _optim_capi.AdamBucket()
            b.state, b.count = h, n
            b.grad, b.grad_dtype = grad + first * grad_size, grad_dtype
            b.param_out, b.param_out_dtype = out_ptr + first * out_size, out_dtype
            buckets.append(b)
        return buckets
