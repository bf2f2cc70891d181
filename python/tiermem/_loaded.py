"""The library, checked against the ctypes layouts, loaded and bound once at import."""

from . import _capi

_capi.check_layout()
lib, where = _capi.load()
version = _capi.bind(lib, where)
