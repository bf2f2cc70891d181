"""ctypes mirror of include/tiermem/tiermem.h: the structs, the enums and the function prototypes."""

import ctypes
import os

# The header these bindings mirror (TM_VERSION_MAJOR / _MINOR). Before 1.0 a minor version may
# change the ABI (the soname carries it), so both must match the loaded library.
API_MAJOR = 0
API_MINOR = 1
SONAME = "libtiermem.so.%d.%d" % (API_MAJOR, API_MINOR)

OK = 0
ERROR_NOTHING_LOST = 0x1  # tm_last_error_flags: TM_ERROR_NOTHING_LOST
STATUS_NAMES = (
    "TM_OK", "TM_ERR_INVALID_ARGUMENT", "TM_ERR_INVALID_HANDLE", "TM_ERR_OUT_OF_MEMORY",
    "TM_ERR_NO_SPACE", "TM_ERR_IO", "TM_ERR_DEVICE", "TM_ERR_CONFIG", "TM_ERR_BUSY",
    "TM_ERR_UNSUPPORTED", "TM_ERR_INTERNAL", "TM_ERR_CORRUPT")

TIER_HBM, TIER_DRAM, TIER_NVME = 0, 1, 2
TIER_COUNT = 3
TIER_BY_PLACEMENT = -1
TIER_NAMES = ("hbm", "dram", "nvme")

CLASS_OTHER, CLASS_PARAM, CLASS_GRAD, CLASS_OPTIMIZER_STATE, CLASS_ACTIVATION = range(5)
ACCESS_READ, ACCESS_WRITE, ACCESS_READ_WRITE = range(3)

DEVICES = {"default": 0, "auto": 1, "cuda": 2, "emulated": 3}
IO_ENGINES = {"default": 0, "auto": 1, "uring": 2, "posix": 3}
LOG_LEVELS = {"default": 0, "error": 1, "warn": 2, "info": 3, "debug": 4}
PLACEMENTS = {"default": 0, "none": 1, "zero-offload": 2, "zero-infinity": 3, "activations": 4}
CHECKSUMS = {"default": 0, "off": 1, "xxh3": 2}

PREFETCH_DEPTH_DEFAULT = -1
CUDA_DEVICE_DEFAULT = -1
NUMA_DEFAULT, NUMA_AUTO, NUMA_OFF = -1, -2, -3
LOCAL_RANK_DEFAULT = -1

_enum = ctypes.c_int32
_size_t = ctypes.c_size_t

DEVICE_ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, _size_t, ctypes.c_int32,
                                ctypes.c_void_p)
DEVICE_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, _size_t, ctypes.c_int32,
                               ctypes.c_void_p)


class Config(ctypes.Structure):
    _fields_ = [
        ("struct_size", _size_t),
        ("api_version", ctypes.c_uint32),
        ("device", _enum),
        ("cuda_device", ctypes.c_int32),
        ("hbm_bytes", ctypes.c_uint64),
        ("dram_bytes", ctypes.c_uint64),
        ("nvme_paths", ctypes.c_char_p),
        ("nvme_bytes", ctypes.c_uint64),
        ("io_engine", _enum),
        ("io_block_size", ctypes.c_uint32),
        ("io_queue_depth", ctypes.c_uint32),
        ("numa_node", ctypes.c_int32),
        ("log_level", _enum),
        ("emu_link_gbps", ctypes.c_double),
        ("io_threads", ctypes.c_uint32),
        ("prefetch_depth", ctypes.c_int32),
        ("prefetch_bytes", ctypes.c_uint64),
        ("placement", _enum),
        ("trace", ctypes.c_char_p),
        ("checksum", _enum),
        ("device_alloc", DEVICE_ALLOC),
        ("device_free", DEVICE_FREE),
        ("device_allocator_user", ctypes.c_void_p),
        ("local_rank", ctypes.c_int32),
        ("local_world_size", ctypes.c_int32),
    ]

    def __init__(self):
        # TM_CONFIG_INIT
        super().__init__()
        self.struct_size = ctypes.sizeof(Config)
        self.api_version = API_MAJOR * 10000 + API_MINOR * 100
        self.cuda_device = CUDA_DEVICE_DEFAULT
        self.numa_node = NUMA_DEFAULT
        self.prefetch_depth = PREFETCH_DEPTH_DEFAULT
        self.local_rank = LOCAL_RANK_DEFAULT
        self.local_world_size = LOCAL_RANK_DEFAULT


class TensorDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", _size_t),
        ("bytes", ctypes.c_uint64),
        ("cls", _enum),
        ("home_tier", ctypes.c_int32),
        ("name", ctypes.c_char_p),
    ]

    def __init__(self):
        super().__init__()
        self.struct_size = ctypes.sizeof(TensorDesc)
        self.home_tier = TIER_BY_PLACEMENT


class DlpackLayout(ctypes.Structure):
    _fields_ = [
        ("struct_size", _size_t),
        ("dtype_code", ctypes.c_uint8),
        ("dtype_bits", ctypes.c_uint8),
        ("dtype_lanes", ctypes.c_uint16),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]

    def __init__(self):
        super().__init__()
        self.struct_size = ctypes.sizeof(DlpackLayout)
        self.dtype_code, self.dtype_bits, self.dtype_lanes = 2, 32, 1


class TierStats(ctypes.Structure):
    _fields_ = [("capacity", ctypes.c_uint64), ("used", ctypes.c_uint64),
                ("peak", ctypes.c_uint64)]


class Stats(ctypes.Structure):
    _fields_ = [
        ("struct_size", _size_t),
        ("tiers", TierStats * TIER_COUNT),
        ("bytes_moved", (ctypes.c_uint64 * TIER_COUNT) * TIER_COUNT),
        ("tensors", ctypes.c_uint64),
        ("acquires", ctypes.c_uint64),
        ("acquire_hits", ctypes.c_uint64),
        ("acquire_misses", ctypes.c_uint64),
        ("acquire_stall_ns", ctypes.c_uint64),
        ("prefetches", ctypes.c_uint64),
        ("evictions", ctypes.c_uint64),
        ("eviction_bytes", ctypes.c_uint64),
        ("schedule_length", ctypes.c_uint64),
        ("schedule_relearned", ctypes.c_uint64),
        ("prefetches_dropped", ctypes.c_uint64),
        ("prefetches_dropped_no_room", ctypes.c_uint64),
        ("prefetches_dropped_demand", ctypes.c_uint64),
        ("prefetches_dropped_superseded", ctypes.c_uint64),
        ("prefetches_cancelled", ctypes.c_uint64),
        ("moves_failed", ctypes.c_uint64),
        ("demand_waits", ctypes.c_uint64),
        ("demand_wait_ns", ctypes.c_uint64),
        ("fragmentation_evictions", ctypes.c_uint64),
        ("write_throughs", ctypes.c_uint64),
        ("write_through_bytes", ctypes.c_uint64),
        ("clean_reads", ctypes.c_uint64),
        ("clean_read_bytes", ctypes.c_uint64),
        ("clean_drops", ctypes.c_uint64),
        ("clean_drop_bytes", ctypes.c_uint64),
        # Appended in 0.5: recompute callbacks.
        ("recompute_drops", ctypes.c_uint64),
        ("recompute_drop_bytes", ctypes.c_uint64),
        ("recomputes", ctypes.c_uint64),
        ("recompute_failures", ctypes.c_uint64),
        ("recompute_ns", ctypes.c_uint64),
        ("relocations", ctypes.c_uint64),
        ("relocation_bytes", ctypes.c_uint64),
        ("copied_in_bytes", ctypes.c_uint64),
        ("copied_out_bytes", ctypes.c_uint64),
        ("offloads_parked", ctypes.c_uint64),
        # Appended in 0.8: HBM handed on behind copies down (TIERMEM_HBM_HAND_ON).
        ("hbm_handed_on", ctypes.c_uint64),
        ("hbm_handed_on_bytes", ctypes.c_uint64),
        ("moves_behind", ctypes.c_uint64),
        ("moves_behind_bytes", ctypes.c_uint64),
        ("moves_failed_lost", ctypes.c_uint64),
        ("dlpack_exports", ctypes.c_uint64),
    ]

    def __init__(self):
        super().__init__()
        self.struct_size = ctypes.sizeof(Stats)


class Info(ctypes.Structure):
    _fields_ = [
        ("struct_size", _size_t),
        ("device", _enum),
        ("cuda_device", ctypes.c_int32),
        ("hbm_device_pointers", ctypes.c_int32),
        ("io_engine", _enum),
        ("numa_node", ctypes.c_int32),
        ("tier_bytes", ctypes.c_uint64 * TIER_COUNT),
        ("io_block_size", ctypes.c_uint32),
        ("io_queue_depth", ctypes.c_uint32),
        ("io_threads", ctypes.c_uint32),
        ("nvme_paths", ctypes.c_uint32),
        ("nvme_alignment", ctypes.c_uint32),
        ("prefetch_depth", ctypes.c_int32),
        ("prefetch_bytes", ctypes.c_uint64),
        ("placement", _enum),
        ("device_name", ctypes.c_char * 128),
        ("local_rank", ctypes.c_int32),
        ("local_world_size", ctypes.c_int32),
        ("device_allocator", ctypes.c_int32),
    ]

    def __init__(self):
        # TM_INFO_INIT
        super().__init__()
        self.struct_size = ctypes.sizeof(Info)
        self.cuda_device = -1
        self.numa_node = -1
        self.local_world_size = 1


class Runtime(ctypes.Structure):
    _fields_ = [("bits", ctypes.c_uint64)]


class Tensor(ctypes.Structure):
    _fields_ = [("bits", ctypes.c_uint64)]


# tm_recompute_fn(user, tensor, tier, dst, bytes, stream). The tm_tensor argument, a struct of one
# uint64_t passed by value, is declared as that uint64_t: the same register on LP64 x86-64 and
# aarch64, and it spares ctypes a struct-by-value callback argument.
RECOMPUTE_FN = ctypes.CFUNCTYPE(_enum, ctypes.c_void_p, ctypes.c_uint64, _enum, ctypes.c_void_p,
                                ctypes.c_uint64, ctypes.c_void_p)


# sizeof on x86-64 and aarch64 Linux (LP64) of the header at API_MAJOR.API_MINOR. A mismatch
# means this file no longer mirrors the header: checked at import, and field by field against
# the C compiler's offsets by tests/python/test_abi.py.
LP64_SIZES = {"Config": 160, "TensorDesc": 32, "Stats": 480, "Info": 232}


def _prototypes(lib):
    p, u64, i32 = ctypes.POINTER, ctypes.c_uint64, ctypes.c_int32
    vp, st = ctypes.c_void_p, _enum
    sig = {
        "tm_status_string": (ctypes.c_char_p, [st]),
        "tm_last_error": (ctypes.c_char_p, []),
        "tm_last_error_flags": (ctypes.c_uint32, []),
        "tm_get_version": (st, [p(ctypes.c_int), p(ctypes.c_int), p(ctypes.c_int)]),
        "tm_version_string": (ctypes.c_char_p, []),
        "tm_runtime_create": (st, [p(Config), p(Runtime)]),
        "tm_runtime_destroy": (st, [Runtime]),
        "tm_runtime_stats": (st, [Runtime, p(Stats)]),
        "tm_runtime_info": (st, [Runtime, p(Info)]),
        "tm_runtime_config_value": (st, [Runtime, ctypes.c_char_p, ctypes.c_char_p, _size_t,
                                         p(_size_t)]),
        "tm_tensor_create": (st, [Runtime, p(TensorDesc), p(Tensor)]),
        "tm_tensor_destroy": (st, [Runtime, Tensor]),
        "tm_tensor_bytes": (st, [Runtime, Tensor, p(u64)]),
        "tm_tensor_write": (st, [Runtime, Tensor, u64, vp, u64]),
        "tm_tensor_read": (st, [Runtime, Tensor, u64, vp, u64]),
        "tm_tensor_acquire": (st, [Runtime, Tensor, i32, i32, vp, p(vp)]),
        "tm_tensor_release": (st, [Runtime, Tensor, i32]),
        "tm_tensor_release_on_stream": (st, [Runtime, Tensor, i32, vp]),
        "tm_tensor_release_written": (st, [Runtime, Tensor, i32, vp]),
        "tm_tensor_acquire_dlpack": (st, [Runtime, Tensor, i32, i32, vp, p(DlpackLayout),
                                          p(vp)]),
        "tm_tensor_copy_in": (st, [Runtime, Tensor, u64, vp, u64, vp]),
        "tm_tensor_copy_out": (st, [Runtime, Tensor, u64, vp, u64, vp]),
        "tm_tensor_copy_in_async": (st, [Runtime, Tensor, u64, vp, u64, vp]),
        "tm_tensor_copy_done": (st, [Runtime, Tensor, p(i32)]),
        "tm_tensor_create_copy_in_async": (st, [Runtime, p(TensorDesc), vp, vp, p(Tensor),
                                                p(i32)]),
        "tm_tensor_offload": (st, [Runtime, Tensor, i32]),
        "tm_tensor_prefetch": (st, [Runtime, Tensor, i32]),
        "tm_tensor_sync": (st, [Runtime, Tensor]),
        "tm_runtime_sync": (st, [Runtime]),
        "tm_step_begin": (st, [Runtime]),
        "tm_step_end": (st, [Runtime]),
        "tm_schedule_set": (st, [Runtime, p(Tensor), p(i32), _size_t]),
        "tm_tensor_residency": (st, [Runtime, Tensor, p(ctypes.c_uint32)]),
        "tm_tensor_set_recompute": (st, [Runtime, Tensor, RECOMPUTE_FN, vp, ctypes.c_double]),
    }
    for name, (restype, argtypes) in sig.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def _bundled_path():
    """The wheel's own library: tiermem/lib/libtiermem.so.X.Y beside this file (pip install)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", SONAME)
    return path if os.path.exists(path) else None


def _installed_path():
    try:
        from . import _paths  # written by cmake --install; absent in a source tree or wheel
    except ImportError:
        return None
    return getattr(_paths, "LIBRARY", None)


def _source_tree_path():
    """A source checkout's own build: <root>/build/lib/libtiermem.so (tools/build.sh's default
    build folder, $BUILD_DIR when set), when this package is <root>/python/tiermem."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    if os.path.basename(os.path.dirname(here)) != "python" or \
            not os.path.exists(os.path.join(root, "lib", "api", "tiermem.map")):
        return None
    build = os.environ.get("BUILD_DIR") or os.path.join(root, "build")
    path = os.path.join(build, "lib", "libtiermem.so")
    return path if os.path.exists(path) else None


def load():
    """The library: $TIERMEM_LIBRARY, else the wheel's own (tiermem/lib/), else the one cmake
    --install recorded, else a source checkout's own build tree (build/lib/libtiermem.so), else
    the soname.

    Returns (library, where it came from). Raises OSError naming every place tried.
    """
    tried = []
    env = os.environ.get("TIERMEM_LIBRARY")
    if env:
        # Named explicitly: a failure here is an error, not a reason to fall back silently.
        try:
            lib = ctypes.CDLL(env)
        except OSError as e:
            raise OSError("tiermem: TIERMEM_LIBRARY=%s cannot be loaded (%s); unset it to load "
                          "the wheel's or the build's own library" % (env, e)) from e
        if not hasattr(lib, "tm_status_string"):
            raise OSError("tiermem: TIERMEM_LIBRARY=%s is not libtiermem (it has no "
                          "tm_status_string); unset it to load the wheel's or the build's own "
                          "library" % env)
        return lib, env
    candidates = [p for p in (_bundled_path(), _installed_path(), _source_tree_path()) if p]
    candidates.append(SONAME)
    for path in candidates:
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise OSError("tiermem: cannot load the library; tried " + "; ".join(tried) +
                  ". Set TIERMEM_LIBRARY to the path of libtiermem.so, build it in this checkout "
                  "(bash tools/build.sh demo), or install tiermem with pip or cmake --install")


def check_layout():
    """The ctypes structs must be the header's sizes on LP64; say which one drifted if not."""
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        return  # the table is for LP64; the ABI test compares field offsets on any platform
    for name, size in LP64_SIZES.items():
        got = ctypes.sizeof(globals()[name])
        if got != size:
            raise ImportError("tiermem: ctypes struct %s is %d bytes, the header's is %d: "
                              "python/tiermem/_capi.py no longer mirrors tiermem.h" %
                              (name, got, size))


def bind(lib, where):
    _prototypes(lib)
    major, minor, patch = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    lib.tm_get_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch))
    if (major.value, minor.value) != (API_MAJOR, API_MINOR):
        raise ImportError("tiermem: %s is version %d.%d.%d; these bindings need %d.%d.x" %
                          (where, major.value, minor.value, patch.value, API_MAJOR, API_MINOR))
    return (major.value, minor.value, patch.value)
