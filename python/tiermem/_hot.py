"""The per-tensor entry points of tiermem.torch's saved-tensor offload, as lean ctypes calls: a
layer saves 10 to 20 tensors and each pack and unpack crosses the C boundary, so what Python does
around each call counts (docs/benchmarks.md, bench/saved_tensors.py).

Each function here is its own ctypes object (the bindings' own, in _capi, keep their
prototypes), declared with handles as plain uint64: a struct of one uint64_t passed by value
travels in the same register on LP64 x86-64 and aarch64, as _capi.RECOMPUTE_FN already relies
on, and ctypes converts an int much faster than a Structure. Out-arguments are passed as
addresses of scratch words owned by the calling thread (packs run on the forward's thread,
unpacks and releases on whichever thread PyTorch runs them), so no ctypes object is made per
call. Callers check the returned status with check()."""

import ctypes
import threading

from . import _capi, _check, _lib

_u64, _i32, _vp = ctypes.c_uint64, ctypes.c_int32, ctypes.c_void_p


def _bind(name, argtypes):
    fn = _lib[name]  # indexing makes a new function object; attribute access would share one
    fn.restype = _i32
    fn.argtypes = argtypes
    return fn


# (runtime, desc*, src, stream, out*, done*)
create_copy_in_async = _bind("tm_tensor_create_copy_in_async", [_u64, _vp, _vp, _vp, _vp, _vp])
# (runtime, tensor, tier, access, stream, ptr*)
acquire = _bind("tm_tensor_acquire", [_u64, _u64, _i32, _i32, _vp, _vp])
# (runtime, tensor, tier, access, stream, layout*, managed*)
acquire_dlpack = _bind("tm_tensor_acquire_dlpack", [_u64, _u64, _i32, _i32, _vp, _vp, _vp])
# (runtime, tensor, tier, stream): tm_tensor_release when stream is NULL
release_on_stream = _bind("tm_tensor_release_on_stream", [_u64, _u64, _i32, _vp])
# (runtime, tensor, tier, stream): an acquire for reading released as written, in one call
release_written = _bind("tm_tensor_release_written", [_u64, _u64, _i32, _vp])
# (runtime, tensor, tier)
offload = _bind("tm_tensor_offload", [_u64, _u64, _i32])
destroy = _bind("tm_tensor_destroy", [_u64, _u64])
# (runtime, tensor, done*)
copy_done = _bind("tm_tensor_copy_done", [_u64, _u64, _vp])

OK = _capi.OK
check = _check


class Scratch:
    """One thread's arguments: a saved tensor's desc (class activation, home DRAM) whose size and
    name a pack writes through desc_bytes and desc_name (a memoryview over the name's own buffer,
    which the desc points to: no ctypes attribute is set per call), and the out-arguments (two
    words and an int32), with their addresses."""

    __slots__ = ("desc", "desc_addr", "desc_bytes", "desc_name", "_name_buffer", "words",
                 "out_addr", "ptr_addr", "flag", "flag_addr")

    def __init__(self):
        d = self.desc = _capi.TensorDesc()
        d.cls, d.home_tier = _capi.CLASS_ACTIVATION, _capi.TIER_DRAM
        # "saved.N\0" with N < 2**64 takes at most 27 bytes.
        self._name_buffer = ctypes.create_string_buffer(32)
        d.name = ctypes.cast(self._name_buffer, ctypes.c_char_p)
        self.desc_name = memoryview(self._name_buffer).cast("B")
        self.desc_addr = ctypes.addressof(d)
        self.desc_bytes = _u64.from_address(self.desc_addr + _capi.TensorDesc.bytes.offset)
        self.words = (_u64 * 2)()  # [0]: a tensor handle out, [1]: a pointer out
        self.out_addr = ctypes.addressof(self.words)
        self.ptr_addr = self.out_addr + ctypes.sizeof(_u64)
        self.flag = _i32()  # an int32_t out (done)
        self.flag_addr = ctypes.addressof(self.flag)


_local = threading.local()


def scratch():
    """The calling thread's Scratch."""
    try:
        return _local.scratch
    except AttributeError:
        s = _local.scratch = Scratch()
        return s
