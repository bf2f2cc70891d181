"""Saved-tensor (activation) offload: autograd's saved_tensors_hooks into tiermem.

Pack copies a saved tensor into tiermem with tm_tensor_copy_in_async: the copy runs on tiermem's
copy stream after an event on the compute stream, which does not wait for it; the source stays
alive in the runtime's stash until the copy has passed. Unpack acquires the tensor's HBM copy
(prefetched ahead by the schedule, which learns the backward's order of unpacks in the first
step) and returns a tensor viewing it, released when PyTorch frees it; when the HBM tier cannot
hold it (or the layout is not dense) it is copied out instead."""

import collections
import itertools
import warnings
import weakref

import torch

from ... import TM_ERR_OUT_OF_MEMORY, Tensor, TiermemError, TiermemWarning, _capi, _hot
from .._shared.tensors import plans_active as _plans_active
from .._shared import views as _views
from .._shared.transfers import (_CUDA_STREAM_LEGACY, _check_runtime, _check_tier, _fetch,
                                 _is_cuda_runtime, _size_arg, _stream)
from ._stash import CopyStash

_HBM, _READ = _capi.TIER_HBM, _capi.ACCESS_READ
_INVALID_HANDLE = _capi.STATUS_NAMES.index("TM_ERR_INVALID_HANDLE")
_STRIDED = torch.strided
_CPU = torch.device("cpu")
_Parameter = torch.nn.Parameter
# How many of the last copies a later save of the same bytes may share (the repeats come within
# a few saves: one layer's output saved by the next layer and its own backward, or by 3
# projections), and how many copies of one tensor's parts are kept for it.
_SEEN = 16
_SHARED = 4


class _Packed:
    """A saved tensor held by tiermem: the handle of its tiermem tensor (h, made and filled by
    one tm_tensor_create_copy_in_async) in the runtime of handle bits `bits`, and how to rebuild
    its layout. The tiermem tensor lives as long as autograd keeps this object (until the backward
    that used it, or until the graph is freed without one), and as long as any view of its HBM
    copy (a DLPack export, which the library frees with it; a view made otherwise keeps this
    object)."""

    __slots__ = ("rt", "bits", "h", "index", "nbytes", "dtype", "device", "size", "stride",
                 "span", "dense", "flat", "compact_size", "viewable", "layout", "conj", "ptr",
                 "contiguous", "owner", "__weakref__")

    def __del__(self):
        h = getattr(self, "h", None)  # None: never filled, or destroyed
        # A reshaped save of the same bytes (owner: the pack that made the copy) destroys nothing.
        if h is not None and self.owner is None and self.rt._rt is not None:
            self.h = None
            _hot.destroy(self.bits, h)  # its status: nothing to tell anyone this late

    @property
    def name(self):
        return "saved.%d" % self.index

    @property
    def tm(self):
        """A tiermem.Tensor over the same handle, for the calls off the hot path (prefetch,
        offload, copy_done); destroyed only through this object."""
        if self.h is None:
            raise TiermemError(_INVALID_HANDLE, "saved tensor %r was already released" %
                               self.name)
        return Tensor(self.rt, _capi.Tensor(self.h), self.nbytes, self.name)

    def copy_done(self):
        """True when the pack's copy has landed (or the runtime, which waited for it, is gone)."""
        rt = self.rt._rt
        if self.h is None or rt is None:
            return True
        s = _hot.scratch()
        _hot.check(_hot.copy_done(rt.bits, self.h, s.flag_addr), "tm_tensor_copy_done")
        return s.flag.value != 0

    def _view_freed(self, _ref):
        """A view of the HBM copy (emulated device: no stream) was freed by PyTorch."""
        rt = self.rt._rt
        if self.h is not None and rt is not None:
            _hot.release_on_stream(rt.bits, self.h, _HBM, None)


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
    """Context manager (see offload_saved_tensors). Counters: .packed, .packed_bytes, .shared
    (saves that shared an earlier copy of the same elements), .skipped,
    .unpacked_views (served by a view of the HBM copy), .unpacked_copies (copied out); .error:
    the TiermemError that stopped offloading, if any.

    PyTorch turns an exception raised inside a hook into a plain RuntimeError. So a failed pack
    keeps that tensor (and the rest of the context's) in memory, the forward runs on, and the
    TiermemError is raised when the context exits. A failed unpack (in backward) raises at once:
    a RuntimeError naming the TiermemError, turned back into the TiermemError itself when the
    backward ran inside the context."""

    def __init__(self, runtime, tier="dram", min_bytes=16384, views=True,
                 stash_bytes=256 << 20, share=True):
        _check_runtime(runtime)
        self.runtime = runtime
        self.tier = _check_tier(tier)
        self.min_bytes = _size_arg(min_bytes, "min_bytes")
        self.views = bool(views)
        self.share = bool(share)
        self.stash = _stash_of(runtime, _size_arg(stash_bytes, "stash_bytes"))
        self._cuda_runtime = _is_cuda_runtime(runtime)
        self._rt_bits = runtime._handle().bits  # packs made after close fail as a bad handle
        self.packed = 0
        self.packed_bytes = 0
        self.shared = 0
        self.skipped = 0
        self.unpacked_views = 0
        self.unpacked_copies = 0
        self.error = None
        # The last packs (weak references), which the backward unpacks first. Tier "nvme": they
        # stay in DRAM (their write to NVMe and the read back could not be done before they are
        # needed); each older one is written down.
        self._recent = collections.deque()
        # id(the tensor owning a copied save's bytes: the save, or the view's base) -> (its weak
        # reference, the saves' _version, [(copy number, the pack's weak reference)]), the
        # newest last
        self._seen = {}
        self._copies = 0
        depth = getattr(runtime, "_tiermem_prefetch_depth", None)
        if depth is None:
            depth = runtime._tiermem_prefetch_depth = int(runtime.info()["prefetch_depth"])
        self._depth = depth
        self._recent_limit = 2 * max(1, depth)
        super().__init__(self._pack, self._unpack)

    def __enter__(self):
        if getattr(_plans_active, "depth", 0):
            warnings.warn(
                "offload_saved_tensors entered inside a fitted plan's context: the innermost "
                "saved-tensor hooks take every save, so the plan's choices and its meter (.peak) "
                "no longer apply to this forward; enter it outside the plan (the plan offloads "
                "the blocks it chose), or remove the plan", TiermemWarning, stacklevel=2)
        self.error = None
        self._seen.clear()
        super().__enter__()
        return self  # `with offload_saved_tensors(...) as hooks:` reads .packed, .skipped

    def __exit__(self, exc_type, exc, tb):
        super().__exit__(exc_type, exc, tb)
        self._seen.clear()  # saves of one forward share copies, never those of the next
        if exc is None:
            self._prefetch_last()
        if self.error is not None and not isinstance(exc, TiermemError) and (
                exc is None or isinstance(exc, RuntimeError)):
            raise self.error from exc
        return False

    def _keep(self, t, numel, itemsize):
        """True when t stays with autograd as it is (the cheapest questions first: most tensors
        kept are small, or parameters)."""
        if numel == 0 or numel * itemsize < self.min_bytes:
            return True
        if t.layout != _STRIDED or t.is_quantized or not (t.is_cuda or t.is_cpu):
            return True
        # Parameters (and views of them) are the model's, not activations. Parameter's
        # isinstance runs Python code (its metaclass): asked only of leaves and views' bases.
        if t.is_leaf:
            return isinstance(t, _Parameter)
        base = t._base
        return base is not None and isinstance(base, _Parameter)

    # The hot path: pack and unpack run once per saved tensor between the model's operations, so
    # their code and data are cold each time (bench/saved_tensors.py); what they do is inlined
    # and each tensor attribute is asked once.
    def _pack(self, t):
        # The same bytes saved again, unchanged since: the same tensor (a ReLU's output is saved
        # by it and by the next Linear), or a view of the same tensor over the same elements (a
        # Linear saves its 3-D input reshaped to 2-D; one hidden state feeds q, k and v). Keyed
        # by the tensor that owns the bytes (a view's base), alive as long as the view is.
        base = t._base
        root = t if base is None else base
        seen = self._seen.get(id(root)) if self.share else None
        if seen is not None and seen[0]() is root and seen[1] == t._version:
            p = self._share(t, seen[2])
            if p is not None:
                self.shared += 1
                return p
        numel = t.numel()
        dtype = t.dtype
        itemsize = dtype.itemsize
        if self.error is not None or self._keep(t, numel, itemsize):
            self.skipped += 1
            return t
        version = t._version
        # A conjugate or negated view holds its values as a flag over other bytes: the bytes go,
        # the conjugation (complex dtypes only) comes back at unpack, a negation is resolved
        # here (a copy; rare, and never shared).
        if t.is_neg():
            t = t.resolve_neg()
            root = None
        p = _Packed()
        p.h = p.owner = None
        p.conj = dtype.is_complex and t.is_conj()
        p.bits = self._rt_bits
        p.rt = self.runtime
        p.dtype = dtype
        cuda = t.is_cuda
        p.device = t.device if cuda else _CPU
        p.size = size = t.size()
        p.stride = stride = t.stride()
        p.ptr = ptr = t.data_ptr()
        if t.is_contiguous():
            p.dense = p.contiguous = True
            src, p.span = t, numel
            p.flat = len(size) == 1
        else:
            p.flat = p.contiguous = False
            self._layout(p, t, numel)
            src = t if p.dense else self._compact(p, t)
        nbytes = p.nbytes = p.span * itemsize
        # A dense CPU tensor views HBM on the emulated device (host memory), a dense CUDA tensor
        # on the CUDA device, as DLPack (layout None: a dtype this PyTorch takes no DLPack of);
        # anything else is copied out.
        p.viewable = viewable = self.views and p.dense and cuda == self._cuda_runtime
        if viewable:
            layout = _views.layouts.get((dtype, size, stride))
            p.layout = layout if layout is not None else _views.dlpack_layout(dtype, size, stride)
        else:
            p.layout = None
        if cuda:
            if not self._cuda_runtime:
                _stream(src, self.runtime)  # raises: the emulated device cannot read it
            stream = torch.cuda.current_stream(p.device).cuda_stream or _CUDA_STREAM_LEGACY
        else:
            stream = None
        # Made, filled (the copy starts after the stream's work so far; the stream does not
        # wait for it) and asked whether the copy has landed, in one call. Its name, "saved.N"
        # counted from each rt.step(), is rt.next_name's (inlined).
        names = self.runtime._names
        counter = names.get("saved")
        if counter is None:
            counter = names.setdefault("saved", itertools.count())
        p.index = next(counter)
        sc = _hot.scratch()
        sc.desc_bytes.value = nbytes
        name = b"saved.%d\0" % p.index
        sc.desc_name[:len(name)] = name
        status = _hot.create_copy_in_async(p.bits, sc.desc_addr,
                                           ptr if src is t else src.data_ptr(), stream,
                                           sc.out_addr, sc.flag_addr)
        if status != _hot.OK:
            try:
                _hot.check(status, "tm_tensor_create_copy_in_async")
            except TiermemError as e:
                self.error = e  # no tensor was left; this one stays with autograd
            self.skipped += 1
            return t
        p.h = sc.words[0]
        self._copies += 1
        # The last packs (weak references), which the backward unpacks first.
        recent = self._recent
        ref = weakref.ref(p)
        recent.append(ref)
        if len(recent) > self._recent_limit:
            older = recent.popleft()
            if self.tier == "nvme":
                self._note_older(older())
        if root is not None and self.share:
            self._note_copy(root, version, ref)
        if not sc.flag.value:
            # The source stays alive until the copy has read it (the compute stream goes on).
            try:
                self.stash.add(p, src, nbytes)
            except TiermemError as e:
                self.error = e
                self.skipped += 1
                return t
        self.packed += 1
        self.packed_bytes += nbytes
        return p

    def _note_copy(self, root, version, ref):
        """Notes the copy (its pack's weak reference) of a save whose bytes root owns at version:
        weak references (autograd decides how long either lives), keyed by id and checked by
        identity (an id is reused once its object is gone), the last _SHARED copies of each
        owner, the owners newest last."""
        seen, key = self._seen, id(root)
        entry = seen.pop(key, None)
        if entry is not None and entry[0]() is root and entry[1] == version:
            copies = entry[2]
            copies.append((self._copies, ref))
            if len(copies) > _SHARED:
                del copies[0]
        else:
            if len(seen) >= _SEEN:
                del seen[next(iter(seen))]
            entry = (weakref.ref(root), version, [(self._copies, ref)])
        seen[key] = entry

    def _share(self, t, copies):
        """The pack that serves saving t, from the copies of the same owner at the same version
        (newest first) among the last _SEEN: one for the same elements in the same layout as
        it is, a pack of t's shape over a copy of the same elements contiguous in another shape;
        None when no copy holds exactly t's elements (another part of the owner, another dtype),
        or those that did are gone."""
        if t.is_neg():
            return None
        dtype, ptr = t.dtype, t.data_ptr()
        conj = dtype.is_complex and t.is_conj()
        size, stride = t.size(), t.stride()
        for seq, ref in reversed(copies):
            if self._copies - seq >= _SEEN:
                return None
            p = ref()
            if p is None or p.h is None or p.dtype != dtype or p.ptr != ptr or p.conj != conj:
                continue
            if size == p.size and stride == p.stride:
                return p
            if p.contiguous and t.is_contiguous() and t.numel() == p.span:
                return self._reshaped(p, size, stride)
        return None

    @staticmethod
    def _reshaped(p, size, stride):
        """A pack of another (contiguous) shape over p's copy; p destroys the copy once both
        are gone."""
        q = _Packed()
        for name in ("rt", "bits", "h", "index", "nbytes", "dtype", "device", "span", "dense",
                     "viewable", "conj", "ptr", "contiguous"):
            setattr(q, name, getattr(p, name))
        q.owner = p.owner or p  # keeps the copy: p destroys it once q is gone too
        q.size, q.stride, q.flat = size, stride, len(size) == 1
        q.layout = _views.dlpack_layout(q.dtype, size, stride) if q.viewable else None
        return q

    @staticmethod
    def _layout(p, t, numel):
        """Elements from the first to the last one the view reaches (strides are never
        negative). Copy the span as it lies (dense, overlapping or expanded, or with small gaps)
        and rebuild the same strides over it; a view with large gaps is copied compactly."""
        span = 1 + sum((n - 1) * s for n, s in zip(p.size, p.stride))
        p.dense = span <= 2 * numel
        p.span = span

    @staticmethod
    def _compact(p, t):
        """The source of a view with large gaps: expanded dimensions (stride 0) kept once (and
        expanded again in unpack), the rest made contiguous."""
        src = t
        for dim, (n, s) in enumerate(zip(p.size, p.stride)):
            if s == 0 and n > 1:
                src = src.narrow(dim, 0, 1)
        p.compact_size = tuple(src.size())
        src = src.contiguous()
        p.span = src.numel()
        return src

    def _prefetch_last(self):
        """The forward is over: its last packs are the backward's first unpacks (often the
        largest, the logits). The schedule cannot prefetch them (a tensor is busy during its
        own pack, and no other use comes before the backward), so they start into HBM now, as
        many as the prefetch depth."""
        if not self.views or self._depth <= 0:
            return
        for ref in list(self._recent)[:-self._depth - 1:-1]:  # the last ones, newest first
            p = ref()
            if p is not None and p.viewable and p.h is not None:
                try:
                    p.tm.prefetch("hbm")  # a hint: dropped when there is no room
                except TiermemError:
                    pass  # acquired already (unpacked): nothing to prefetch

    def _note_older(self, older):
        """A pack left the last ones (twice the prefetch depth), tier "nvme": it is written down
        (the last ones stay in DRAM: their write to NVMe and the read back could not be done
        before the backward needs them)."""
        if older is not None and older.h is not None:
            try:
                older.tm.offload("nvme")  # queued: written once its copy has landed
            except TiermemError:
                pass  # busy: already unpacked (acquired), so it is needed in DRAM anyway

    def _unpack(self, p):
        if type(p) is not _Packed:
            return p  # kept as it was
        h = p.h
        if h is None:
            raise TiermemError(_INVALID_HANDLE, "saved tensor %r was already released" % p.name)
        if self.stash._entries:
            self.stash.drain()
        layout = p.layout
        if layout is not None:
            # A view of the HBM copy (a hit when the schedule prefetched it), handed over as
            # DLPack: the library releases it when PyTorch frees the tensor.
            stream = (torch.cuda.current_stream(p.device).cuda_stream or _CUDA_STREAM_LEGACY
                      if self._cuda_runtime else None)
            sc = _hot.scratch()
            status = _hot.acquire_dlpack(self._rt_bits, h, _HBM, _READ, stream, layout[1],
                                         sc.ptr_addr)
            if status == _hot.OK:
                self.unpacked_views += 1
                out = _views.from_dlpack(sc.words[1])
                return out.conj() if p.conj else out
            self._refused(p, status)  # raises, unless the HBM tier has no room: copied out
        elif p.viewable:
            out = self._view(p)
            if out is not None:
                self.unpacked_views += 1
                return out.conj() if p.conj else out
        out = self._copy_out(p)
        return out.conj() if p.conj else out

    def _refused(self, p, status):
        """An acquire of p's HBM copy failed with status: a TiermemError (kept as .error), unless
        the tier has no room for it (the caller copies out instead)."""
        if status == TM_ERR_OUT_OF_MEMORY:
            return
        try:
            if self.runtime.closed:  # (its handle is gone: say so, not that it is invalid)
                raise TiermemError(_INVALID_HANDLE, "saved tensor %r: the runtime was closed "
                                   "before the backward that needs it" % p.name)
            _hot.check(status, "tm_tensor_acquire")
        except TiermemError as e:
            self.error = e
            raise

    def _copy_out(self, p):
        self.unpacked_copies += 1
        try:
            tm = p.tm
            if p.dense:
                buf = torch.empty(p.span, dtype=p.dtype, device=p.device)
                _fetch(tm, buf, p.nbytes)
                return buf.as_strided(p.size, p.stride)
            compact = torch.empty(p.compact_size, dtype=p.dtype, device=p.device)
            _fetch(tm, compact, p.nbytes)
        except TiermemError as e:
            self.error = e
            raise
        out = torch.empty_strided(p.compact_size, p.stride, dtype=p.dtype, device=p.device)
        return out.copy_(compact).expand(p.size)

    def _view(self, p):
        """A tensor viewing p's HBM copy, made without DLPack (a dtype this PyTorch exports no
        DLPack of), or None when the HBM tier has no room for it."""
        device = p.device  # viewable: on the runtime's device (CUDA, or the emulated host)
        stream = (torch.cuda.current_stream(device).cuda_stream or _CUDA_STREAM_LEGACY
                  if self._cuda_runtime else None)
        sc = _hot.scratch()
        status = _hot.acquire(self._rt_bits, p.h, _HBM, _READ, stream, sc.ptr_addr)
        if status != _hot.OK:
            self._refused(p, status)
            return None
        ptr = sc.words[1]
        try:
            flat = _views.view_acquired(p, ptr, p.nbytes, p.dtype, device, stream)
        except BaseException:
            _hot.release_on_stream(self._rt_bits, p.h, _HBM, stream)
            raise
        if p.flat:
            return flat  # 1-D and contiguous: the view is already the tensor
        return flat.as_strided(p.size, p.stride)


def offload_saved_tensors(runtime, tier="dram", min_bytes=16384, views=True,
                          stash_bytes=256 << 20, share=True):
    """Like torch.autograd.graph.save_on_cpu: inside the context, every tensor autograd saves
    for backward (min_bytes and larger; parameters excepted) is copied into tiermem and read
    back when the backward needs it. tier "dram" keeps it in pinned DRAM (spilling to NVMe when
    the DRAM budget is full); "nvme" writes it on to NVMe, all but the last few packs (twice
    the prefetch depth), which the backward needs first. The compute stream never
    waits for a pack's copy; its source is kept (at most stash_bytes of them, beyond which the
    host waits for the oldest) until the copy has passed. Names ("saved.N", counted from each
    rt.step()) repeat step after step, so the schedule prefetches the backward's tensors into
    HBM ahead of their unpacks; with views (the default) unpack returns a tensor viewing that
    HBM copy, released when PyTorch frees it, and views=False copies out instead. A save of
    exactly the elements one of the last 16 copies holds, unchanged since (the tensor's
    _version), shares that copy; share=False copies every save (for code that writes into a
    saved tensor's memory without its version knowing: through .data, numpy, DLPack)."""
    return SavedTensorOffload(runtime, tier, min_bytes, views, stash_bytes, share)
