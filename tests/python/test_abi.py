"""The ctypes mirror of tiermem.h against the C compiler's layout, field by field."""

import ctypes
import json
import os
import subprocess

import pytest

import tiermem
from tiermem import _capi


def test_struct_layouts_match_the_header():
    exe = os.environ.get("TIERMEM_ABI_LAYOUT")
    if not exe:
        pytest.skip("TIERMEM_ABI_LAYOUT is not set (ctest sets it to the python_abi_layout program)")
    c = json.loads(subprocess.check_output([exe]))
    mirror = {"tm_config": _capi.Config, "tm_tensor_desc": _capi.TensorDesc,
              "tm_stats": _capi.Stats, "tm_info": _capi.Info,
              "tm_dlpack_layout": _capi.DlpackLayout}
    for cname, cls in mirror.items():
        fields = dict(c[cname])
        assert ctypes.sizeof(cls) == fields.pop("__size__"), cname
        assert [n for n, _ in cls._fields_] == list(fields), cname + ": field names or order"
        for name, offset in fields.items():
            assert getattr(cls, name).offset == offset, "%s.%s" % (cname, name)


def test_version_is_the_one_the_bindings_mirror():
    major, minor, _ = tiermem.version()
    assert (major, minor) == (_capi.API_MAJOR, _capi.API_MINOR)
