"""Parameters that view their HBM copy while they are in (offload_parameters): no copy into a
torch tensor, only an acquire of tiermem's HBM copy (prefetched ahead by the units' schedule) and
a release when the view is dropped.

A parameter in is `p.data = <view of the acquired HBM copy>`; out, `p.data` is its placeholder
again (the original tensor, its storage freed). Autograd saves some parameters as views made in
forward (F.linear saves weight.t()), which would hold the forward's HBM copy to the backward.
While a forward runs, the saved-tensor hooks here record such an alias by its place in the
parameter instead, and rebuild it from the parameter's data of the moment in backward (a view
or a copy: a parameter copied in for its forward may view in its backward, and the reverse)."""

import ctypes
import threading
import weakref

import torch
from torch._C import DisableTorchFunction

from ... import TM_ERR_BUSY, TM_ERR_OUT_OF_MEMORY, TiermemError, _capi, _hot
from .._shared import views as _views
from .._shared.offloaded import mark_in, mark_out
from .._shared.swapped import _Swapped
from .._shared.tensors import _eager
from .._shared.transfers import (_CUDA_STREAM_LEGACY, _destroy_quietly, _is_cuda_runtime,
                                 _resize_storage)




def _compute_stream(t):
    """The stream a view is used on: PyTorch's current stream on CUDA, None on the host."""
    if t.device.type == "cuda":
        return torch.cuda.current_stream(t.device).cuda_stream or _CUDA_STREAM_LEGACY
    return None


def _dtype_viewable(dtype):
    """Whether bytes can be seen as dtype with Tensor.view(dtype) (quantized and the like not)."""
    try:
        torch.empty(8, dtype=torch.uint8).view(dtype)
        return True
    except (RuntimeError, TypeError):
        return False


class _Views:
    """A parameter's views still alive (held beyond their unit by something else, such as a
    state_dict() taken inside gathered()), and whether its tiermem tensor is to be destroyed
    when the last goes."""

    __slots__ = ("live", "destroy")

    def __init__(self):
        self.live, self.destroy = 0, False


# The views' releases begun and not finished (see _ViewState), and the lock their steps take.
_pending = set()
_lock = threading.RLock()
# A Ctrl-C a release on the main thread caught (a finalizer cannot raise it: Python would print
# it and drop it), raised again by the next parameter let go or brought in.
_held_interrupt = False


def raise_held_interrupt():
    global _held_interrupt
    if _held_interrupt:
        _held_interrupt = False
        raise KeyboardInterrupt("held while tiermem released a parameter's view")


def settle():
    """Finishes the releases of views whose memory PyTorch freed but whose finalizer a
    KeyboardInterrupt stopped before its first step (remove() and the runtime's close() call
    this first, so that no pin is left behind)."""
    with _lock:
        for state in list(_pending):
            holder = state.holder
            if holder is not None and holder() is None:
                state.finish()


class _ViewState:
    """One view's acquire: released when PyTorch frees the view's memory, as written (the HBM
    copy then the only one, written down when evicted) when the parameter was written while it
    viewed it.

    A KeyboardInterrupt can land between any two of the release's steps (Python raises it
    after a call returns, never inside one), and an exception in a finalizer is lost. So each
    step is one C call, counted before it is made: released() finishes what an interrupt left
    (each call made once, never twice: the next view's pin is not this one's) and then hands
    the interrupt on (raised by the next parameter let go or brought in); one stopped before its
    first step is finished by settle()."""

    __slots__ = ("tm", "stream", "tier", "dirty", "views", "holder", "calls", "made")

    def __init__(self, tm, stream, tier, views_):
        self.tm, self.stream, self.tier, self.dirty = tm, stream, tier, False
        self.views = views_  # counted live by _view_of once the view exists
        self.holder = None  # a weak reference to what holds the view's memory, once it exists
        self.calls = None  # the release's C calls, once planned
        self.made = 0  # how many of them were made (each counted before it is made)

    def released(self):
        """PyTorch freed the view's memory (the holder's finalizer)."""
        global _held_interrupt
        while True:
            try:
                self.finish()
                return
            except KeyboardInterrupt:  # between two steps: the rest made, then handed on
                if threading.current_thread() is threading.main_thread():
                    _held_interrupt = True

    def finish(self):
        with _lock:
            if self.calls is None:
                calls = self._plan()
                self.calls = calls  # (no instruction that can raise it between these two)
                self.views.live -= 1
            calls = self.calls
            while self.made < len(calls):
                fn, args = calls[self.made]
                self.made += 1
                fn(*args)  # its status: nothing to do about a failure in a finalizer
            _pending.discard(self)
            if calls and calls[-1][0] is _hot.destroy:
                self.tm._h = None

    def _plan(self):
        """The release's C calls (none when the tensor or the runtime went first)."""
        tm = self.tm
        h, rt = tm._h, tm._rt._rt
        if h is None or rt is None:
            return ()  # destroyed, or the runtime went first: its tensors went with it
        args = (rt.bits, h.bits, _capi.TIER_HBM, self.stream)
        if self.views.destroy and self.views.live == 1:
            # remove() came while this view was held elsewhere: the last one destroys it
            return ((_hot.release_on_stream, args), (_hot.destroy, args[:2]))
        if not self.dirty:
            return ((_hot.release_on_stream, args),)  # unchanged: the copy stays clean
        calls = [(_hot.release_written, args)]
        if self.tier == "nvme":
            calls.append((_hot.offload, (rt.bits, h.bits, _capi.TIER_NVME)))
        return calls


def _view_of(state, ptr, nbytes, dtype, device):
    """A 1-D tensor of dtype over the nbytes at ptr; state.released() runs when PyTorch frees
    its memory (whatever still holds the view keeps the copy pinned till then)."""
    if device.type == "cuda":
        holder = _views._DeviceBytes(ptr, nbytes)
        raw = torch.as_tensor(holder, device=device)
    else:
        holder = (ctypes.c_char * nbytes).from_address(ptr)
        raw = torch.frombuffer(holder, dtype=torch.uint8)
    typed = raw if dtype == torch.uint8 else raw.view(dtype)
    # Only now: a failure above leaves the release to the caller.
    state.views.live += 1
    state.holder = weakref.ref(holder)
    _pending.add(state)
    weakref.finalize(holder, state.released)
    return typed


class _ViewedParam(_Swapped):
    """A parameter whose bytes live in tiermem: in, it views the acquired HBM copy (a copy into
    its own memory only when it cannot: no room in HBM, a CPU parameter with a CUDA runtime, an
    odd dtype, or copies forced)."""

    __slots__ = ("placeholder", "view_ptr", "viewable", "view_state", "address", "views")

    def __init__(self, runtime, tensor, cls, name, tier):
        super().__init__(runtime, tensor, cls, name, tier)
        with DisableTorchFunction():  # out already (tiermem.torch._shared.offloaded)
            self.placeholder = tensor.data  # shares the (now freed) storage; refilled by copies
        self.view_ptr = None  # the HBM copy's address while p.data views it
        self.address = None  # where p.data's bytes are while in (a view's or its own)
        self.view_state = None  # the acquire of the view p.data is now
        self.views = _Views()
        self.viewable = (tensor.layout == torch.strided and tensor.is_contiguous() and
                         (tensor.device.type == "cuda") == _is_cuda_runtime(runtime) and
                         _dtype_viewable(tensor.dtype))

    def bring_in(self, view=True):
        """In: a view of the HBM copy (view, when it can be), else a copy. Returns True when
        it views."""
        raise_held_interrupt()
        if self.resident or self.home:
            return self.view_ptr is not None
        if view and self.viewable:
            mark_in(self.tensor)
            try:
                viewed = self._view_in()
            except BaseException:
                mark_out(self.tensor)
                raise
            if viewed:
                self.address = self.view_ptr
                return True
        super().bring_in()  # out, p.data is the placeholder: its storage refilled
        self.address = self.tensor.data_ptr()
        return False

    def _view_in(self):
        stream = _compute_stream(self.tensor)
        try:
            ptr = self.tm.acquire("hbm", "read", stream)
        except TiermemError as e:
            if e.status == TM_ERR_OUT_OF_MEMORY:
                return False  # the copy path, explicitly: HBM cannot hold it now
            raise
        state = _ViewState(self.tm, stream, self.tier, self.views)
        try:
            flat = _view_of(state, ptr, self.nbytes, self.tensor.dtype, self.tensor.device)
        except BaseException:
            self.tm.release("hbm", stream)
            raise
        self.tensor.data = flat.view(self.tensor.shape)
        self.view_ptr, self.view_state = ptr, state
        self.resident = True
        self.version = self.tensor._version
        return True

    def let_go(self, dirty=None):
        """Out. A view is dropped; its copy is released once PyTorch frees the view (at once,
        unless something else still holds it), marked changed first when it was written (dirty,
        or by default a change of the parameter's version)."""
        if not self.resident or self.home:
            return
        self.check_unconverted()
        self.address = None
        if self.view_ptr is None:
            super().let_go(dirty)
            return
        if dirty is None:
            dirty = self.tensor._version != self.version
        self.view_state.dirty = bool(dirty)
        self.view_state = None
        self.view_ptr = None
        self.resident = False
        self.tensor.data = self.placeholder  # frees the view: released here, as a rule
        mark_out(self.tensor)
        raise_held_interrupt()

    def _restore(self):
        """Back to an ordinary tensor (its own memory, the current bytes); tiermem's copy
        destroyed."""
        if self.resident and self.converted():
            # Converted while in (model.double()): the converted tensor is the one to keep.
            self.view_ptr = self.address = self.view_state = None
            self._destroy()
            return
        if self.view_ptr is None:
            try:
                _Swapped.bring_in(self)  # a copy into its own memory, not a view
                self._destroy()
                return
            except TiermemError as e:
                # Written through a view that something else still holds: its HBM copy stays
                # pinned for writing until that is dropped. Read it there.
                if e.status != TM_ERR_BUSY or not self.views.live:
                    raise
                mark_in(self.tensor)
                if not self._view_in():
                    mark_out(self.tensor)
                    raise
        current = self.tensor.data
        _resize_storage(self.placeholder, self.nbytes)
        with torch.no_grad():
            self.placeholder.copy_(current)
        self.tensor.data = self.placeholder
        self.view_ptr = self.address = self.view_state = None
        del current  # the view's memory freed: its copy released, so it can be destroyed
        self._destroy()

    def _replaced(self):
        with DisableTorchFunction():
            self.placeholder = self.tensor.data  # the new storage, refilled by copies

    def lose(self, fill=None):
        if self.view_ptr is not None:  # its memory goes with the runtime
            self.tensor.data = self.placeholder
            self.view_ptr = self.address = self.view_state = None
        super().lose(fill)

    def _destroy(self):
        if self.views.live:
            self.views.destroy = True  # by the release of the last view held elsewhere
        else:
            _destroy_quietly(self.tm)


def _storage_ptr(t):
    return t.data_ptr() - t.storage_offset() * t.element_size()


class _Alias:
    """A saved tensor that is a view of a viewed parameter: its place in the parameter."""

    __slots__ = ("record", "size", "stride", "offset")

    def __init__(self, record, t):
        self.record = record
        self.size, self.stride, self.offset = t.size(), t.stride(), t.storage_offset()


class _Outer:
    """A saved tensor packed by the hooks this forward ran under (delegated to them)."""

    __slots__ = ("unpack", "packed")

    def __init__(self, unpack, packed):
        self.unpack, self.packed = unpack, packed


# torch 2.8+: the saved-tensor hooks on top of the stack, or None.
_top_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)


def _outer_hooks():
    """(hooks, known): the saved-tensor hooks a forward starts under, (pack, unpack) or None.
    known is False when torch cannot say which (before 2.8) and some are set."""
    top = _top_hooks
    if top is not None:
        try:
            return top(False), True
        except TypeError:
            return top(), True
    # Older torch cannot read the stack. A tensor saved now tells whether it is empty: hooks
    # can be set on its saved copy only when no default hooks packed it.
    with torch.enable_grad():
        y = torch.zeros(1, requires_grad=True).exp()
        try:
            y.grad_fn._raw_saved_result.register_hooks(lambda t: t, lambda t: t)
            return None, True
        except RuntimeError:
            return None, False


class SavedAliases(torch.autograd.graph.saved_tensors_hooks):
    """Saved-tensor hooks around a forward of offloaded units: a saved view of a parameter in
    is kept as its place in the parameter; everything else goes to the hooks the forward runs
    under (outer), if any."""

    def __init__(self, resident, outer):
        self.resident = resident  # storage address -> _ViewedParam, the parameters in now
        self.outer = outer
        super().__init__(_eager(self._pack), _eager(self._unpack))

    def _pack(self, t):
        resident = self.resident
        if resident:
            record = resident.get(_storage_ptr(t))
            # (Not a conjugate or negated view: its place alone would lose the flag.)
            if record is not None and t.dtype == record.tensor.dtype and not (
                    t.is_conj() or t.is_neg()):
                return _Alias(record, t)
        if self.outer is not None:
            return _Outer(self.outer[1], self.outer[0](t))
        return t

    @staticmethod
    def _unpack(packed):
        kind = type(packed)
        if kind is _Alias:
            data = packed.record.tensor.detach()
            return data.as_strided(packed.size, packed.stride, packed.offset)
        if kind is _Outer:
            return packed.unpack(packed.packed)
        return packed
