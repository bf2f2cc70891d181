"""Saved-tensor (activation) offload: autograd's saved_tensors_hooks into tiermem."""

import torch

from .. import Runtime, TiermemError, _capi
from .transfers import _TIER_HOME, _check_tier, _destroy_quietly, _fetch, _send

class _Packed:
    """A saved tensor held by tiermem. Its tiermem tensor lives as long as autograd keeps this
    object (until the backward that used it, or until the graph is freed without one)."""

    __slots__ = ("tm", "dtype", "device", "size", "stride", "span", "dense", "compact_size",
                 "__weakref__")

    def __del__(self):
        _destroy_quietly(self.tm)


def _is_parameter(t):
    if isinstance(t, torch.nn.Parameter):
        return True
    base = getattr(t, "_base", None)
    return base is not None and isinstance(base, torch.nn.Parameter)


class SavedTensorOffload(torch.autograd.graph.saved_tensors_hooks):
    """Context manager (see offload_saved_tensors). Counters: .packed, .packed_bytes, .skipped;
    .error: the TiermemError that stopped offloading, if any.

    PyTorch turns an exception raised inside a hook into a plain RuntimeError. So a failed pack
    keeps that tensor (and the rest of the context's) in memory, the forward runs on, and the
    TiermemError is raised when the context exits. A failed unpack (in backward) raises at once:
    a RuntimeError naming the TiermemError, turned back into the TiermemError itself when the
    backward ran inside the context."""

    def __init__(self, runtime, tier="dram", min_bytes=16384):
        if not isinstance(runtime, Runtime):
            raise TypeError("runtime: expected a tiermem.Runtime, got %s" %
                            type(runtime).__name__)
        self.runtime = runtime
        self.tier = _check_tier(tier)
        self.min_bytes = int(min_bytes)
        self.packed = 0
        self.packed_bytes = 0
        self.skipped = 0
        self.error = None
        super().__init__(self._pack, self._unpack)

    def __enter__(self):
        self.error = None
        super().__enter__()
        return self  # `with offload_saved_tensors(...) as hooks:` reads .packed, .skipped

    def __exit__(self, exc_type, exc, tb):
        super().__exit__(exc_type, exc, tb)
        if self.error is not None and not isinstance(exc, TiermemError) and (
                exc is None or isinstance(exc, RuntimeError)):
            raise self.error from exc
        return False

    def _keep(self, t):
        """True when t stays with autograd as it is."""
        if (t.layout != torch.strided or t.is_quantized or t.device.type not in ("cpu", "cuda")
                or t.numel() == 0):
            return True
        if _is_parameter(t):
            return True  # parameters (and views of them) are the model's, not activations
        return t.numel() * t.element_size() < self.min_bytes

    def _pack(self, t):
        if self.error is not None or self._keep(t):
            self.skipped += 1
            return t
        p = _Packed()
        p.dtype, p.device = t.dtype, t.device
        p.size, p.stride = tuple(t.size()), tuple(t.stride())
        numel = t.numel()
        # Elements from the first to the last one the view reaches (strides are never negative).
        span = 1 + sum((n - 1) * s for n, s in zip(p.size, p.stride))
        # Copy the span as it lies (dense, overlapping or expanded, or with small gaps) and
        # rebuild the same strides over it; a view with large gaps is copied compactly.
        p.dense = span <= 2 * numel
        if p.dense:
            src, p.span = t, span
        else:
            # Expanded dimensions (stride 0) are kept once and expanded again in unpack.
            src = t
            for dim, (n, s) in enumerate(zip(p.size, p.stride)):
                if s == 0 and n > 1:
                    src = src.narrow(dim, 0, 1)
            p.compact_size = tuple(src.size())
            src = src.contiguous()
            p.span = src.numel()
        nbytes = p.span * t.element_size()
        try:
            p.tm = self.runtime.tensor(nbytes, "activation", _TIER_HOME[self.tier],
                                       self.runtime.next_name("saved"))
        except TiermemError as e:
            self.error = e
            return t
        try:
            _send(p.tm, src, nbytes, self.tier)
        except TiermemError as e:
            _destroy_quietly(p.tm)
            self.error = e
            return t
        self.packed += 1
        self.packed_bytes += nbytes
        return p

    def _unpack(self, p):
        if isinstance(p, torch.Tensor):
            return p
        if p.tm._h is None:
            raise TiermemError(_capi.STATUS_NAMES.index("TM_ERR_INVALID_HANDLE"),
                               "saved tensor %r was already released" % p.tm.name)
        try:
            if p.dense:
                buf = torch.empty(p.span, dtype=p.dtype, device=p.device)
                _fetch(p.tm, buf, p.tm.nbytes)
                return buf.as_strided(p.size, p.stride)
            compact = torch.empty(p.compact_size, dtype=p.dtype, device=p.device)
            _fetch(p.tm, compact, p.tm.nbytes)
        except TiermemError as e:
            self.error = e
            raise
        out = torch.empty_strided(p.compact_size, p.stride, dtype=p.dtype, device=p.device)
        return out.copy_(compact).expand(p.size)


def offload_saved_tensors(runtime, tier="dram", min_bytes=16384):
    """Like torch.autograd.graph.save_on_cpu: inside the context, every tensor autograd saves
    for backward (min_bytes and larger; parameters excepted) is copied into tiermem and read
    back when the backward needs it. tier "dram" keeps it in pinned DRAM (spilling to NVMe when
    the DRAM budget is full); "nvme" writes it on to NVMe at once. Names ("saved.N", counted
    from each rt.step()) repeat step after step, so the schedule prefetches the backward's
    tensors ahead."""
    return SavedTensorOffload(runtime, tier, min_bytes)
