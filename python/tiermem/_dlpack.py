"""DLPack capsules over tm_tensor_acquire_dlpack's exports: the "dltensor" PyCapsule every
consumer takes (torch.from_dlpack, torch.utils.dlpack.from_dlpack), made with the C API's own
PyCapsule functions (function objects of our own: argtypes set here touch no one else's)."""

import ctypes

NAME = b"dltensor"  # lives as long as the module: a capsule keeps a pointer to its name
_api = ctypes.pythonapi
_new = _api["PyCapsule_New"]
_new.restype = ctypes.py_object
_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_is_valid = _api["PyCapsule_IsValid"]
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_pointer = _api["PyCapsule_GetPointer"]
_pointer.restype = ctypes.c_void_p
_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
# The same two on a capsule being destroyed (its reference count is 0: never a py_object).
_raw_is_valid = _api["PyCapsule_IsValid"]
_raw_is_valid.restype = ctypes.c_int
_raw_is_valid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_raw_pointer = _api["PyCapsule_GetPointer"]
_raw_pointer.restype = ctypes.c_void_p
_raw_pointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_DELETER_OFFSET = 56  # DLManagedTensor: DLTensor (48 bytes), manager_ctx, then deleter


def delete(managed):
    """Runs the deleter of the DLManagedTensor at address managed (releasing its acquire)."""
    _DELETER(ctypes.c_void_p.from_address(managed + _DELETER_OFFSET).value)(managed)


def _destroy(capsule):
    # A consumer renames what it takes ("used_dltensor") and calls the deleter itself later.
    if _raw_is_valid(capsule, NAME):
        delete(_raw_pointer(capsule, NAME))


_DESTRUCTOR = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)(_destroy)
_DESTRUCTOR_ADDRESS = ctypes.cast(_DESTRUCTOR, ctypes.c_void_p).value


def capsule(managed, owned=True):
    """A "dltensor" capsule of the DLManagedTensor at address managed. owned: one that no
    consumer takes runs its deleter when it is dropped; False: the caller hands it to a
    consumer at once and calls delete() when the consumer refuses it (see untaken)."""
    return _new(managed, NAME, _DESTRUCTOR_ADDRESS if owned else None)


def untaken(cap):
    """True when no consumer has taken the capsule (its name is still "dltensor")."""
    return bool(_is_valid(cap, NAME))


def pointer(cap):
    """The address a "dltensor" capsule holds."""
    return _pointer(cap, NAME)


# DLPack's DLDataTypeCode and bits by dtype name (PyTorch's and NumPy's names; "torch." taken off).
DTYPES = {"float16": (2, 16), "float32": (2, 32), "float64": (2, 64), "bfloat16": (4, 16),
          "int8": (0, 8), "int16": (0, 16), "int32": (0, 32), "int64": (0, 64),
          "uint8": (1, 8), "uint16": (1, 16), "uint32": (1, 32), "uint64": (1, 64),
          "bool": (6, 8), "complex64": (5, 64), "complex128": (5, 128)}
_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "long": "int64",
            "int": "int32", "short": "int16", "cfloat": "complex64", "cdouble": "complex128"}


def dtype_code(dtype):
    """(code, bits, lanes) of dtype: a name ("float32"), a torch or numpy dtype, or a
    (code, bits, lanes) tuple as DLPack writes it."""
    if isinstance(dtype, tuple):
        if len(dtype) != 3 or not all(isinstance(v, int) for v in dtype):
            raise ValueError("dtype: a DLPack (code, bits, lanes) tuple of ints, not %r" %
                             (dtype,))
        return dtype
    name = str(dtype).rsplit(".", 1)[-1]
    name = _ALIASES.get(name, name)
    if name not in DTYPES:
        raise ValueError("dtype %r has no DLPack code here: one of %s, or a (code, bits, "
                         "lanes) tuple" % (dtype, ", ".join(sorted(DTYPES))))
    code, bits = DTYPES[name]
    return code, bits, 1
