"""Errors and argument checks of the Python API: TiermemError, tiers, choices, addresses."""

import ctypes
import re

from . import _capi
from ._loaded import lib as _lib
from ._sizes import u64


class TiermemError(RuntimeError):
    """A tiermem call failed. .status is the tm_status code, .status_name its name ("TM_ERR_IO"),
    .message the library's detail (tm_last_error), .nothing_lost whether it was the report of
    asynchronous moves that each left their tensor valid where it was (TM_ERROR_NOTHING_LOST in
    tm_last_error_flags): the work around them stands."""

    def __init__(self, status, message=None, call=None, nothing_lost=False):
        if message is None and isinstance(status, str):
            # TiermemError(text): as code re-raising an exception by its type and text builds
            # it (a DataLoader worker's error in the main process); the status named in it.
            message, status = status, _status_in(status)
        self.status = int(status)
        self.status_name = _status_name(status)
        self.message = message if message is not None else ""
        self.call = call
        self.nothing_lost = bool(nothing_lost)
        where = "%s: " % call if call else ""
        super().__init__("%s%s: %s" % (where, self.status_name, self.message))

    def __reduce__(self):
        # Pickled whole (multiprocessing sends a worker's exception to its parent: without this
        # the parent's unpickling failed, and a Pool's result thread died, hanging map()).
        return (type(self), (self.status, self.message, self.call, self.nothing_lost))


class TiermemWarning(UserWarning):
    """Something failed that lost nothing: a move between tiers at the end of a step (the tensor
    stayed valid where it was). .error is the TiermemError the library reported."""

    def __init__(self, error):
        self.error = error
        super().__init__(str(error))


def _status_in(text):
    """The last tm_status name in text (TM_ERR_INTERNAL when none)."""
    names = [n for n in re.findall(r"TM_(?:OK|ERR_[A-Z_]+)", text) if n in _capi.STATUS_NAMES]
    return _capi.STATUS_NAMES.index(names[-1] if names else "TM_ERR_INTERNAL")


def _status_name(status):
    s = _lib.tm_status_string(int(status))
    return s.decode() if s else "TM_STATUS_UNKNOWN"


def _check(status, call):
    if status != _capi.OK:
        msg = _lib.tm_last_error()
        lost_nothing = _lib.tm_last_error_flags() & _capi.ERROR_NOTHING_LOST
        raise TiermemError(status, msg.decode(errors="replace") if msg else "", call,
                           lost_nothing)


def _tier(tier):
    if isinstance(tier, int) and 0 <= tier < _capi.TIER_COUNT:
        return tier
    try:
        return _capi.TIER_NAMES.index(str(tier).lower())
    except ValueError:
        raise ValueError("tier %r: expected \"hbm\", \"dram\" or \"nvme\"" % (tier,)) from None


_CLASSES = {"other": _capi.CLASS_OTHER, "param": _capi.CLASS_PARAM, "grad": _capi.CLASS_GRAD,
            "optimizer_state": _capi.CLASS_OPTIMIZER_STATE,
            "activation": _capi.CLASS_ACTIVATION}


_ACCESS = {"read": _capi.ACCESS_READ, "write": _capi.ACCESS_WRITE,
           "read_write": _capi.ACCESS_READ_WRITE}


def _choice(table, value, field):
    try:
        return table[str(value).lower()]
    except KeyError:
        raise ValueError("%s=%r: expected one of %s" %
                         (field, value, ", ".join(k for k in table if k != "default"))) from None


def _name(name, what="name"):
    """A tensor's name as the C string tm_tensor_desc.name takes: None or "" for none, a str
    (UTF-8) or bytes as they are (the trace writes bytes that are not UTF-8 as U+FFFD). A NUL
    byte would cut the name silently, and ctypes would raise an AttributeError for anything but
    a str: both are refused here, naming the argument."""
    if name is None:
        return None
    if isinstance(name, str):
        try:
            name = name.encode()
        except UnicodeEncodeError as e:
            raise ValueError("%s: %r is not encodable as UTF-8 (%s)" % (what, name, e.reason)) \
                from None
    elif isinstance(name, (bytes, bytearray)):
        name = bytes(name)
    else:
        raise TypeError("%s must be a str or bytes, not %s" % (what, type(name).__name__))
    if b"\0" in name:
        raise ValueError("%s: %r contains a NUL byte" % (what, name))
    return name or None


def _ptr(p, what="address"):
    return None if p is None else ctypes.c_void_p(u64(p, what))
