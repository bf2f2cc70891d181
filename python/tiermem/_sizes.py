"""What the Python side checks before it reaches the C API: sizes as the TIERMEM_* variables
write them, and the device allocator callbacks over Python callables."""

import ctypes
import operator
import re

from . import _capi

# As lib/config/config.cc reads sizes: binary units only, no decimal point.
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40}


def _fits_uint64(n, what):
    """ctypes would wrap a larger value silently (2**64 to 0, "unset")."""
    if n >= 1 << 64:
        raise ValueError("%s: %d bytes does not fit in 64 bits" % (what, n))
    return n


def parse_size(value, what="size"):
    """An int, or a string such as "64MiB", "2G", "4096" (units are powers of 1024, as in the
    TIERMEM_* variables): bytes as an int."""
    if isinstance(value, bool):
        raise TypeError("%s: expected a size, got %r" % (what, value))
    if isinstance(value, int):
        if value < 0:
            raise ValueError("%s: %d is negative" % (what, value))
        return _fits_uint64(value, what)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]+)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS:
            return _fits_uint64(int(m.group(1)) * _UNITS[m.group(2).lower()], what)
        if value.strip().endswith("%"):
            raise ValueError("%s: %r: a percentage of the tier is only accepted in the TIERMEM_* "
                             "variable, not as a keyword" % (what, value))
        raise ValueError("%s: %r is not a size (examples: 4096, \"64MiB\", \"2G\")" %
                         (what, value))
    raise TypeError("%s: expected an int or a string, got %s" % (what, type(value).__name__))


def allocator_callbacks(alloc, free):
    """The C callbacks over Python callables alloc(nbytes, device, stream) -> address (an int;
    0 or None when it cannot) and free(address, nbytes, device, stream). An exception counts as
    a failed allocation (free's is ignored): it must not cross into the library's threads."""
    if not callable(alloc) or not callable(free):
        raise TypeError("device_alloc and device_free: expected two callables, got %s and %s" %
                        (type(alloc).__name__, type(free).__name__))

    def c_alloc(user, nbytes, device, stream):
        try:
            return int(alloc(int(nbytes), int(device), stream or None) or 0) or None
        except BaseException:  # noqa: B902 (nothing may unwind through the C caller)
            return None

    def c_free(user, ptr, nbytes, device, stream):
        try:
            free(int(ptr), int(nbytes), int(device), stream or None)
        except BaseException:  # noqa: B902
            pass

    return _capi.DEVICE_ALLOC(c_alloc), _capi.DEVICE_FREE(c_free)


def _as_int(value, what):
    """An int (numpy's too, through __index__), never a bool or a float."""
    if isinstance(value, bool):
        raise TypeError("%s: expected an int, got %r" % (what, value))
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError("%s: expected an int, got %s" % (what, type(value).__name__)) from None


def u64(value, what):
    """An int that ctypes passes as a uint64_t unchanged: ctypes would wrap 2**64 + 4 to 4, or
    -1 to 2**64 - 1, silently (an offset, a byte count, an address)."""
    n = _as_int(value, what)
    if n < 0:
        raise ValueError("%s: %d is negative" % (what, n))
    return _fits_uint64(n, what)


_INT_RANGES = {ctypes.c_uint32: (0, (1 << 32) - 1), ctypes.c_int32: (-(1 << 31), (1 << 31) - 1),
               ctypes.c_uint64: (0, (1 << 64) - 1)}


def config_field(structure, key, value):
    """value checked against the ctypes type of structure's field key, which would otherwise
    wrap an int (2**32 to 0, "unset") or cut a string at a NUL, silently."""
    ctype = dict(structure._fields_)[key]
    if ctype in _INT_RANGES:
        n = _as_int(value, key)
        lo, hi = _INT_RANGES[ctype]
        if not lo <= n <= hi:
            raise ValueError("%s: %d is out of range (%d to %d)" % (key, n, lo, hi))
        return n
    if ctype is ctypes.c_char_p and b"\0" in value:
        raise ValueError("%s: %r contains a NUL byte" % (key, value))
    return value

