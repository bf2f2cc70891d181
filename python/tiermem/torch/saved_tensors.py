"""Saved-tensor (activation) offload: autograd's saved_tensors_hooks into tiermem.

Pack copies a saved tensor into tiermem with tm_tensor_copy_in_async: the copy runs on tiermem's
copy stream after an event on the compute stream, which does not wait for it; the source stays
alive in the runtime's stash until the copy has passed. Unpack acquires the tensor's HBM copy
(prefetched ahead by the schedule, which learns the backward's order of unpacks in the first
step) and returns a tensor viewing it, released when PyTorch frees it; when the HBM tier cannot
hold it (or the layout is not dense) it is copied out instead."""

import collections
import weakref

import torch

from .. import TM_ERR_OUT_OF_MEMORY, Runtime, TiermemError, _capi
from . import views
from .stash import CopyStash
from .transfers import _TIER_HOME, _check_tier, _destroy_quietly, _fetch, _is_cuda_runtime, _stream


class _Packed:
    """A saved tensor held by tiermem. Its tiermem tensor lives as long as autograd keeps this
    object (until the backward that used it, or until the graph is freed without one)."""

    __slots__ = ("tm", "dtype", "device", "size", "stride", "span", "dense", "compact_size",
                 "viewable", "__weakref__")

    def __del__(self):
        _destroy_quietly(self.tm)


def _is_parameter(t):
    # Parameter's isinstance runs Python code (its metaclass): asked only of leaves and of
    # views' bases, since activations are mostly neither.
    if t.is_leaf:
        return isinstance(t, torch.nn.Parameter)
    base = t._base
    return base is not None and isinstance(base, torch.nn.Parameter)


def _stash_of(runtime, max_bytes):
    """The runtime's stash of sources in flight: one per runtime, so that it outlives every
    context whose packs it holds."""
    stash = getattr(runtime, "_tiermem_stash", None)
    if stash is None:
        stash = CopyStash(max_bytes)
        runtime._tiermem_stash = stash
    stash.max_bytes = int(max_bytes)
    return stash


class SavedTensorOffload(torch.autograd.graph.saved_tensors_hooks):
    """Context manager (see offload_saved_tensors). Counters: .packed, .packed_bytes, .skipped,
    .unpacked_views (served by a view of the HBM copy), .unpacked_copies (copied out); .error:
    the TiermemError that stopped offloading, if any.

    PyTorch turns an exception raised inside a hook into a plain RuntimeError. So a failed pack
    keeps that tensor (and the rest of the context's) in memory, the forward runs on, and the
    TiermemError is raised when the context exits. A failed unpack (in backward) raises at once:
    a RuntimeError naming the TiermemError, turned back into the TiermemError itself when the
    backward ran inside the context."""

    def __init__(self, runtime, tier="dram", min_bytes=16384, views=True,
                 stash_bytes=256 << 20):
        if not isinstance(runtime, Runtime):
            raise TypeError("runtime: expected a tiermem.Runtime, got %s" %
                            type(runtime).__name__)
        self.runtime = runtime
        self.tier = _check_tier(tier)
        self.min_bytes = int(min_bytes)
        self.views = bool(views)
        self.stash = _stash_of(runtime, stash_bytes)
        self._cuda_runtime = _is_cuda_runtime(runtime)
        self.packed = 0
        self.packed_bytes = 0
        self.skipped = 0
        self.unpacked_views = 0
        self.unpacked_copies = 0
        self.error = None
        # The last packs (weak references), which the backward unpacks first. Tier "nvme": they
        # stay in DRAM (their write to NVMe and the read back could not be done before they are
        # needed); each older one is written down.
        self._recent = collections.deque()
        depth = getattr(runtime, "_tiermem_prefetch_depth", None)
        if depth is None:
            depth = runtime._tiermem_prefetch_depth = int(runtime.info()["prefetch_depth"])
        self._depth = depth
        self._recent_limit = 2 * max(1, depth)
        super().__init__(self._pack, self._unpack)

    def __enter__(self):
        self.error = None
        super().__enter__()
        return self  # `with offload_saved_tensors(...) as hooks:` reads .packed, .skipped

    def __exit__(self, exc_type, exc, tb):
        super().__exit__(exc_type, exc, tb)
        if exc is None:
            self._prefetch_last()
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
        # A dense CPU tensor views HBM on the emulated device (host memory), a dense CUDA tensor
        # on the CUDA device; anything else is copied out.
        p.viewable = self.views and p.dense and (p.device.type == "cuda") == self._cuda_runtime
        try:
            p.tm.copy_in_async(src.data_ptr(), nbytes, 0, _stream(src, self.runtime))
            self._note_recent(p)
            # The source stays alive until the copy has read it (the compute stream goes on).
            if not p.tm.copy_done():
                self.stash.add(p, src, nbytes)
        except TiermemError as e:
            _destroy_quietly(p.tm)
            self.error = e
            return t
        self.packed += 1
        self.packed_bytes += nbytes
        return p

    def _prefetch_last(self):
        """The forward is over: its last packs are the backward's first unpacks (often the
        largest, the logits). The schedule cannot prefetch them (a tensor is busy during its
        own pack, and no other use comes before the backward), so they start into HBM now, as
        many as the prefetch depth."""
        if not self.views or self._depth <= 0:
            return
        for ref in list(self._recent)[:-self._depth - 1:-1]:  # the last ones, newest first
            p = ref()
            if p is not None and p.viewable and p.tm._h is not None:
                try:
                    p.tm.prefetch("hbm")  # a hint: dropped when there is no room
                except TiermemError:
                    pass  # acquired already (unpacked): nothing to prefetch

    def _note_recent(self, p):
        recent = self._recent
        recent.append(weakref.ref(p))
        while len(recent) > self._recent_limit:
            older = recent.popleft()()
            if self.tier == "nvme" and older is not None and older.tm._h is not None:
                try:
                    older.tm.offload("nvme")  # queued: written once its copy has landed
                except TiermemError:
                    pass  # busy: already unpacked (acquired), so it is needed in DRAM anyway

    def _unpack(self, p):
        if isinstance(p, torch.Tensor):
            return p
        if p.tm._h is None:
            raise TiermemError(_capi.STATUS_NAMES.index("TM_ERR_INVALID_HANDLE"),
                               "saved tensor %r was already released" % p.tm.name)
        self.stash.drain()
        try:
            if p.viewable:
                out = self._view(p)
                if out is not None:
                    self.unpacked_views += 1
                    return out
            self.unpacked_copies += 1
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

    def _view(self, p):
        """A tensor viewing p's HBM copy (a hit when the schedule prefetched it), or None when
        the HBM tier has no room for it."""
        stream = (torch.cuda.current_stream(p.device).cuda_stream or 0x1
                  if p.device.type == "cuda" else None)  # 0x1: cudaStreamLegacy (see _stream)
        try:
            ptr = p.tm.acquire("hbm", "read", stream)
        except TiermemError as e:
            if e.status == TM_ERR_OUT_OF_MEMORY:
                return None
            raise
        try:
            flat = views.view(p, ptr, p.tm.nbytes, p.dtype, p.device, stream)
        except BaseException:
            p.tm.release("hbm", stream)
            raise
        return flat.as_strided(p.size, p.stride)


def offload_saved_tensors(runtime, tier="dram", min_bytes=16384, views=True,
                          stash_bytes=256 << 20):
    """Like torch.autograd.graph.save_on_cpu: inside the context, every tensor autograd saves
    for backward (min_bytes and larger; parameters excepted) is copied into tiermem and read
    back when the backward needs it. tier "dram" keeps it in pinned DRAM (spilling to NVMe when
    the DRAM budget is full); "nvme" writes it on to NVMe, all but the last few packs (twice
    the prefetch depth), which the backward needs first. The compute stream never
    waits for a pack's copy; its source is kept (at most stash_bytes of them, beyond which the
    host waits for the oldest) until the copy has passed. Names ("saved.N", counted from each
    rt.step()) repeat step after step, so the schedule prefetches the backward's tensors into
    HBM ahead of their unpacks; with views (the default) unpack returns a tensor viewing that
    HBM copy, released when PyTorch frees it, and views=False copies out instead."""
    return SavedTensorOffload(runtime, tier, min_bytes, views, stash_bytes)
