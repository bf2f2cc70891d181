"""ctypes mirror of the CPU Adam part of include/tiermem/tiermem.h (tm_adam_*, tm_optim_*)."""

import ctypes

from . import _capi

DTYPE_F32, DTYPE_BF16, DTYPE_F16 = 0, 1, 2
ADAM_OUT_SCRATCH = 1 << 0  # tm_adam_step_groups_extend's flag
ISAS = {"baseline": 0, "avx2": 1, "avx512": 2}
ISA_NAMES = {v: k for k, v in ISAS.items()}

_enum = ctypes.c_int32
_f32p = ctypes.POINTER(ctypes.c_float)


class AdamConfig(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("lr", ctypes.c_double),
        ("beta1", ctypes.c_double),
        ("beta2", ctypes.c_double),
        ("eps", ctypes.c_double),
        ("weight_decay", ctypes.c_double),
        ("adamw", ctypes.c_int32),
        ("amsgrad", ctypes.c_int32),
        ("threads", ctypes.c_int32),
        ("numa_node", ctypes.c_int32),
    ]

    def __init__(self):
        super().__init__()
        self.struct_size = ctypes.sizeof(AdamConfig)
        self.lr, self.beta1, self.beta2, self.eps, self.weight_decay = 1e-3, 0.9, 0.999, 1e-8, 1e-2
        self.adamw, self.amsgrad, self.threads = 1, 0, 0
        self.numa_node = _capi.NUMA_DEFAULT


class Adam(ctypes.Structure):
    _fields_ = [("bits", ctypes.c_uint64)]


class AdamSpan(ctypes.Structure):
    _fields_ = [
        ("param", ctypes.c_void_p),
        ("exp_avg", ctypes.c_void_p),
        ("exp_avg_sq", ctypes.c_void_p),
        ("max_exp_avg_sq", ctypes.c_void_p),
        ("grad", ctypes.c_void_p),
        ("grad_dtype", _enum),
        ("param_out", ctypes.c_void_p),
        ("param_out_dtype", _enum),
        ("count", ctypes.c_uint64),
    ]


class AdamBucket(ctypes.Structure):
    _fields_ = [
        ("state", _capi.Tensor),
        ("count", ctypes.c_uint64),
        ("grad", ctypes.c_void_p),
        ("grad_dtype", _enum),
        ("param_out", ctypes.c_void_p),
        ("param_out_dtype", _enum),
    ]


class AdamGroup(ctypes.Structure):
    _fields_ = [
        ("config", ctypes.POINTER(AdamConfig)),
        ("step", ctypes.c_uint64),
        ("buckets", ctypes.POINTER(AdamBucket)),
        ("count", ctypes.c_size_t),
    ]


# On LP64, as the C compiler lays them out (checked at import).
LP64_SIZES = {AdamConfig: 64, AdamSpan: 72, AdamBucket: 48, AdamGroup: 32}


def bind(lib):
    if ctypes.sizeof(ctypes.c_void_p) == 8:
        for cls, size in LP64_SIZES.items():
            if ctypes.sizeof(cls) != size:
                raise ImportError("tiermem: ctypes struct %s is %d bytes, the header's is %d" %
                                  (cls.__name__, ctypes.sizeof(cls), size))
    p, st = ctypes.POINTER, _enum
    sig = {
        "tm_adam_create": (st, [_capi.Runtime, p(AdamConfig), p(Adam)]),
        "tm_adam_destroy": (st, [Adam]),
        "tm_adam_set_hyper": (st, [Adam, p(AdamConfig)]),
        "tm_adam_threads": (st, [Adam, p(ctypes.c_int32)]),
        "tm_adam_step": (st, [Adam, ctypes.c_uint64, ctypes.c_float, p(AdamSpan),
                              ctypes.c_size_t]),
        "tm_adam_step_buckets": (st, [Adam, ctypes.c_uint64, ctypes.c_float, p(AdamBucket),
                                      ctypes.c_size_t, p(ctypes.c_size_t)]),
        "tm_adam_step_groups": (st, [Adam, ctypes.c_float, p(AdamGroup), ctypes.c_size_t,
                                     p(ctypes.c_size_t)]),
        "tm_adam_step_groups_prepare": (st, [Adam, ctypes.c_float, p(AdamGroup),
                                             ctypes.c_size_t]),
        "tm_adam_step_groups_extend": (st, [Adam, ctypes.c_float, p(AdamGroup),
                                            ctypes.c_size_t, ctypes.c_uint32]),
        "tm_adam_step_commit": (st, [Adam, p(ctypes.c_size_t)]),
        "tm_adam_step_abort": (st, [Adam]),
        "tm_optim_isa_get": (st, [p(_enum), p(_enum)]),
        "tm_optim_set_isa_limit": (st, [_enum, p(_enum)]),
    }
    for name, (restype, argtypes) in sig.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
