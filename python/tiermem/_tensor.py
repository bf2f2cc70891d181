"""tiermem.Tensor: one tensor of a Runtime, and the calls on it (the C API's tm_tensor_*)."""

import ctypes

from . import _capi, _dlpack
from ._errors import _ACCESS, TiermemError, _check, _choice, _ptr, _tier
from ._loaded import lib as _lib
from ._sizes import u64 as _u64


class Tensor:
    """A tensor of a Runtime: a buffer of .nbytes bytes that tiermem places and moves."""

    __slots__ = ("_rt", "_h", "nbytes", "name", "_recompute", "_recompute_error", "__weakref__")

    def __init__(self, runtime, handle, nbytes, name):
        self._rt, self._h, self.nbytes, self.name = runtime, handle, nbytes, name
        self._recompute = None  # the ctypes callback, alive while the library may call it
        self._recompute_error = None  # what the callback raised, for the call that ran it

    def _call(self, fn, *args):
        status = getattr(_lib, fn)(self._rt._handle(), self._handle(), *args)
        cause, self._recompute_error = self._recompute_error, None
        if status != _capi.OK and cause is not None:
            try:
                _check(status, fn)
            except TiermemError as e:
                raise e from cause
        _check(status, fn)

    def set_recompute(self, fn, cost_seconds=0.0):
        """Gives the tensor a callback that rebuilds its bytes (tm_tensor_set_recompute): under
        pressure tiermem may then drop the tensor instead of writing it down, when cost_seconds
        (what a rebuild takes) is less than the round trip down and back up; its next use
        calls fn(tier, address, nbytes, stream) on the calling thread, which must write all
        nbytes to address (in "hbm" or "dram"; a device pointer for HBM on CUDA) before it
        returns. An exception in fn fails that use with a TiermemError raised from it; the
        tensor stays dropped. fn None clears it (a dropped tensor is rebuilt first); cost_seconds
        must then be 0. The callback is kept alive as long as the tensor."""
        if fn is None:
            self._call("tm_tensor_set_recompute", _capi.RECOMPUTE_FN(), None,
                       float(cost_seconds))
            self._recompute = None
            return
        if not callable(fn):
            raise TypeError("set_recompute: fn must be callable or None, not %s" %
                            type(fn).__name__)

        def c_fn(user, tensor, tier, dst, nbytes, stream):
            try:
                fn(_capi.TIER_NAMES[tier], int(dst), int(nbytes), stream or None)
                return _capi.OK
            except BaseException as e:  # noqa: B902 (nothing may unwind through the C caller)
                self._recompute_error = e
                return e.status if isinstance(e, TiermemError) and e.status > 0 else \
                    _capi.STATUS_NAMES.index("TM_ERR_INVALID_ARGUMENT")

        callback = _capi.RECOMPUTE_FN(c_fn)
        self._call("tm_tensor_set_recompute", callback, None, float(cost_seconds))
        self._recompute = callback

    def _handle(self):
        if self._h is None:
            raise TiermemError(_capi.STATUS_NAMES.index("TM_ERR_INVALID_HANDLE"),
                               "tensor %r was destroyed" % self.name)
        return self._h

    def _span(self, offset, nbytes, call):
        """(offset, nbytes) checked as uint64_t; nbytes None: to the tensor's end."""
        offset = _u64(offset, call + ": offset")
        if nbytes is None:
            if offset > self.nbytes:
                raise ValueError("%s: offset %d is past the end of tensor %r (%d bytes)" %
                                 (call, offset, self.name, self.nbytes))
            return offset, self.nbytes - offset
        return offset, _u64(nbytes, call + ": nbytes")

    def copy_in(self, src_ptr, nbytes=None, offset=0, stream=None):
        """Copies nbytes from address src_ptr (host or device) into the tensor at offset.
        stream: a cudaStream_t as an int, or None. Returns once enqueued (see sync())."""
        offset, n = self._span(offset, nbytes, "copy_in")
        self._call("tm_tensor_copy_in", offset, _ptr(src_ptr, "copy_in: src_ptr"), n,
                   _ptr(stream, "copy_in: stream"))

    def copy_in_async(self, src_ptr, nbytes=None, offset=0, stream=None):
        """As copy_in, but the stream does not wait for the copy: src must stay unchanged until
        copy_done() is True (or sync() returns)."""
        offset, n = self._span(offset, nbytes, "copy_in_async")
        self._call("tm_tensor_copy_in_async", offset, _ptr(src_ptr, "copy_in_async: src_ptr"), n,
                   _ptr(stream, "copy_in_async: stream"))

    def copy_done(self):
        """True when none of the tensor's copies to or from callers' memory is in flight
        (never blocks)."""
        done = ctypes.c_int32()
        self._call("tm_tensor_copy_done", ctypes.byref(done))
        return bool(done.value)

    def acquire(self, tier, access="read", stream=None):
        """Pins the tensor's copy in tier ("hbm" or "dram") and returns its address (an int; a
        device pointer for HBM on CUDA). access: "read", "write" or "read_write". Each acquire
        needs one release."""
        out = ctypes.c_void_p()
        self._call("tm_tensor_acquire", _tier(tier), _choice(_ACCESS, access, "access"),
                   _ptr(stream), ctypes.byref(out))
        return out.value

    def acquire_dlpack(self, tier, dtype, shape, strides=None, access="read", stream=None,
                       byte_offset=0):
        """Acquires the copy in tier ("hbm" or "dram") as acquire() does and returns it as a
        DLPack capsule ("dltensor") viewing it with dtype (a name such as "float32", a torch or
        numpy dtype, or DLPack's (code, bits, lanes)), shape and strides (in elements; None:
        row-major), from byte_offset: torch.from_dlpack(capsule) makes a tensor of it
        (tm_tensor_acquire_dlpack). The acquire is released when the consumer frees what it
        made (on stream, when one is given), or when the capsule is dropped untaken; the tensor
        outlives destroy() until then."""
        code, bits, lanes = _dlpack.dtype_code(dtype)
        shape = [int(n) for n in shape]
        layout = _capi.DlpackLayout()
        layout.dtype_code, layout.dtype_bits, layout.dtype_lanes = code, bits, lanes
        layout.ndim = len(shape)
        dims = (ctypes.c_int64 * max(1, len(shape)))(*shape)
        layout.shape = ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64))
        if strides is not None:
            strides = [int(s) for s in strides]
            if len(strides) != len(shape):
                raise ValueError("acquire_dlpack: %d strides for %d dimensions" %
                                 (len(strides), len(shape)))
            steps = (ctypes.c_int64 * max(1, len(strides)))(*strides)
            layout.strides = ctypes.cast(steps, ctypes.POINTER(ctypes.c_int64))
        layout.byte_offset = _u64(byte_offset, "acquire_dlpack: byte_offset")
        out = ctypes.c_void_p()
        self._call("tm_tensor_acquire_dlpack", _tier(tier), _choice(_ACCESS, access, "access"),
                   _ptr(stream), ctypes.byref(layout), ctypes.byref(out))
        return _dlpack.capsule(out.value)

    def release(self, tier, stream=None, written=False):
        """Unpins one acquire in tier; with a stream, once the stream's work so far has passed
        (tm_tensor_release_on_stream). written: an acquire for reading whose memory was written
        through its address after all; the copy becomes the tensor's only one in the same call
        (tm_tensor_release_written), as an acquire for writing makes it."""
        if written:
            self._call("tm_tensor_release_written", _tier(tier), _ptr(stream))
        elif stream is None:
            self._call("tm_tensor_release", _tier(tier))
        else:
            self._call("tm_tensor_release_on_stream", _tier(tier), _ptr(stream))

    def copy_out(self, dst_ptr, nbytes=None, offset=0, stream=None):
        """Copies nbytes of the tensor at offset to address dst_ptr. Without a stream the bytes
        are there once sync() returns."""
        offset, n = self._span(offset, nbytes, "copy_out")
        self._call("tm_tensor_copy_out", offset, _ptr(dst_ptr, "copy_out: dst_ptr"), n,
                   _ptr(stream, "copy_out: stream"))

    def write(self, data, offset=0):
        """Writes a bytes-like object (synchronously)."""
        offset = _u64(offset, "write: offset")
        buf = (ctypes.c_char * len(data)).from_buffer_copy(data)
        self._call("tm_tensor_write", offset, ctypes.cast(buf, ctypes.c_void_p), len(data))

    def read(self, nbytes=None, offset=0):
        """Reads nbytes (default: to the end) into a new bytes object."""
        offset, n = self._span(offset, nbytes, "read")
        if n > self.nbytes:  # past the end whatever the offset: said before allocating n bytes
            raise ValueError("read: nbytes %d is more than tensor %r holds (%d bytes)" %
                             (n, self.name, self.nbytes))
        buf = ctypes.create_string_buffer(n)
        self._call("tm_tensor_read", offset, ctypes.cast(buf, ctypes.c_void_p), n)
        return buf.raw

    def offload(self, tier):
        self._call("tm_tensor_offload", _tier(tier))

    def prefetch(self, tier):
        self._call("tm_tensor_prefetch", _tier(tier))

    def sync(self):
        self._call("tm_tensor_sync")

    def residency(self):
        """The set of tier names holding a valid copy."""
        mask = ctypes.c_uint32()
        self._call("tm_tensor_residency", ctypes.byref(mask))
        return {n for i, n in enumerate(_capi.TIER_NAMES) if mask.value & (1 << i)}

    def destroy(self):
        if self._h is not None:
            h, self._h = self._h, None
            _check(_lib.tm_tensor_destroy(self._rt._handle(), h), "tm_tensor_destroy")
            self._recompute = None  # the library no longer calls it

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()
