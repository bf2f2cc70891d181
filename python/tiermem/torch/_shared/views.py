"""Torch tensors that view a tiermem tensor's acquired HBM copy, with no copy: on CUDA through
__cuda_array_interface__ (a device pointer), on the emulated device (HBM is host memory) through
torch.frombuffer. The copy stays acquired while PyTorch holds the view and is released (on the
stream it was used on) when PyTorch frees its memory."""

import ctypes
import weakref

import torch

from ... import TiermemError, _capi, _dlpack, _hot

class _DeviceBytes:
    """nbytes of device memory at ptr, as __cuda_array_interface__ describes it (uint8, 1-D; no
    stream: the caller's stream is already ordered after the copy)."""

    __slots__ = ("__cuda_array_interface__", "__weakref__")

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 2}


def _release_quietly(owner, tier, stream):
    tm = owner.tm
    try:
        if tm._h is not None and not tm._rt.closed:
            tm.release(tier, stream)
    except TiermemError:
        pass  # the runtime went first: its tensors went with it


def view(owner, ptr, nbytes, dtype, device, stream, tier="hbm"):
    """A 1-D tensor of dtype over nbytes at ptr (owner.tm's acquired copy in tier). When PyTorch
    frees the memory, owner.tm is released in tier (on stream, when one is given); owner stays
    alive until then."""
    if device.type == "cuda":
        holder = _DeviceBytes(ptr, nbytes)
        raw = torch.as_tensor(holder, device=device)
    else:
        holder = (ctypes.c_char * nbytes).from_address(ptr)  # ctypes caches the array type
        raw = torch.frombuffer(holder, dtype=torch.uint8)
    # PyTorch holds `holder` until the storage is freed, then drops it: the release follows.
    weakref.finalize(holder, _release_quietly, owner, tier, stream)
    return raw if dtype == torch.uint8 else raw.view(dtype)


class _AcquiredDeviceBytes(_DeviceBytes):
    """_DeviceBytes whose end (PyTorch dropping it with the storage) releases the acquire on
    the stream it was made for."""

    __slots__ = ("_owner", "_stream")

    def __del__(self):
        owner = self._owner
        rt = owner.rt._rt
        if owner.h is not None and rt is not None:
            _hot.release_on_stream(rt.bits, owner.h, _capi.TIER_HBM, self._stream)


def view_acquired(owner, ptr, nbytes, dtype, device, stream):
    """view() for the saved-tensor offload's hot path: a 1-D tensor of dtype over the HBM copy
    (on device; a CUDA one exactly when stream is not None) of owner (which has .rt, the Runtime, and .h, the tiermem tensor's handle) acquired at ptr,
    released (owner.h in HBM, on stream) when PyTorch frees the memory. owner stays alive
    until then, so that its tensor is never destroyed while acquired. No finalizer object: on
    CUDA the holder's own __del__ releases; on the emulated device the holder (a ctypes array,
    which cannot have one) keeps a weak reference to itself whose callback releases (a weak
    reference alive when its referent goes has its callback called)."""
    if stream is not None:  # CUDA (its default stream is passed as cudaStreamLegacy)
        holder = _AcquiredDeviceBytes(ptr, nbytes)
        holder._owner, holder._stream = owner, stream
        raw = torch.as_tensor(holder, device=device)
        return raw if dtype == torch.uint8 else raw.view(dtype)
    holder = (ctypes.c_char * nbytes).from_address(ptr)  # ctypes caches the array type
    raw = torch.frombuffer(holder, dtype=dtype)
    # Emulated device: no stream (the host's order is the order).
    holder._tm_release = weakref.ref(holder, owner._view_freed)
    return raw


# DLPack: tm_tensor_acquire_dlpack hands the acquired copy over as a DLManagedTensor whose deleter
# (in the library) releases it when PyTorch frees the tensor: no Python runs at the release, and
# the tensor comes with its shape and strides (tiermem/_dlpack.py makes the capsule).
_from_dlpack = getattr(torch._C, "_from_dlpack", None) or torch.utils.dlpack.from_dlpack
_dl_dtypes = {}
layouts = {}  # (dtype, size, stride) -> dlpack_layout's pair; read by the hot path
_LAYOUTS_KEPT = 4096


def _dl_dtype(dtype):
    """(code, bits, lanes) of dtype as this PyTorch writes it in DLPack (read off a tensor it
    exports), or None when it exports no such dtype."""
    try:
        return _dl_dtypes[dtype]
    except KeyError:
        pass
    try:
        capsule = torch.utils.dlpack.to_dlpack(torch.empty(1, dtype=dtype))
        raw = (ctypes.c_uint8 * 4).from_address(_dlpack.pointer(capsule) + 20)
        got = (raw[0], raw[1], raw[2] | raw[3] << 8)
    except Exception:  # noqa: BLE001 - a dtype DLPack (or this PyTorch) cannot carry
        got = None
    _dl_dtypes[dtype] = got
    return got


def dlpack_layout(dtype, size, stride):
    """(tm_dlpack_layout, its address) for a view of that dtype, size and stride, made once per
    layout (the same layouts come back step after step); None when PyTorch takes no such dtype
    as DLPack. The caller keeps the pair as long as it passes the address."""
    key = (dtype, size, stride)
    got = layouts.get(key)
    if got is not None:
        return got
    dl = _dl_dtype(dtype)
    if dl is None:
        return None
    lay = _capi.DlpackLayout()
    lay.dtype_code, lay.dtype_bits, lay.dtype_lanes = dl
    n = len(size)
    dims = (ctypes.c_int64 * (2 * n + 1))(*size, *stride)
    lay.ndim = n
    lay.shape = ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64))
    lay.strides = ctypes.cast(ctypes.addressof(dims) + 8 * n, ctypes.POINTER(ctypes.c_int64))
    lay._dims = dims  # kept with the struct
    got = (lay, ctypes.addressof(lay))
    if len(layouts) >= _LAYOUTS_KEPT:
        layouts.clear()  # a model whose shapes never repeat: holders keep theirs
    layouts[key] = got
    return got


def from_dlpack(managed):
    """The tensor of a DLManagedTensor at address managed (tm_tensor_acquire_dlpack's); when
    PyTorch does not take it, its deleter runs (releasing the acquire) before the error goes on."""
    capsule = _dlpack.capsule(managed, owned=False)  # no destructor: taken at once, or deleted
    try:
        return _from_dlpack(capsule)
    except BaseException:
        if _dlpack.untaken(capsule):
            _dlpack.delete(managed)
        raise
