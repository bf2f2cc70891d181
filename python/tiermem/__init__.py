"""tiermem: three-tier (HBM, pinned DRAM, NVMe) tensor memory, from Python (ctypes over the C API).

    import tiermem
    with tiermem.Runtime(dram_bytes="1GiB", nvme_paths="/mnt/nvme") as rt:
        with rt.step():
            ...
        print(rt.stats()["bytes_moved"]["dram"]["nvme"])

tiermem.torch holds the PyTorch offloads (saved tensors, optimizer state, parameters).
"""

import contextlib
import ctypes
import gc
import itertools
import os
import threading
import warnings
import weakref

from . import _capi
from ._errors import _CLASSES, TiermemError, TiermemWarning, _check, _choice, _ptr, _tier
from ._errors import _name as _tensor_name
from ._loaded import lib as _lib
from ._loaded import version as _version
from ._loaded import where as _where
from ._sizes import allocator_callbacks as _allocator_callbacks
from ._sizes import config_field as _config_field
from ._sizes import parse_size
from ._tensor import Tensor

__all__ = ["Runtime", "Tensor", "TiermemError", "TiermemWarning", "parse_size", "version",
           "library_path"]
TiermemError.__module__ = __name__  # tiermem.TiermemError, where users catch it
TiermemWarning.__module__ = __name__
Tensor.__module__ = __name__


def version():
    """(major, minor, patch) of the loaded library."""
    return _version


def library_path():
    """Where the loaded library came from (a path or the soname)."""
    return _where


# Status codes by name, e.g. tiermem.TM_ERR_OUT_OF_MEMORY.
for _code, _name in enumerate(_capi.STATUS_NAMES):
    globals()[_name] = _code


_SETTINGS = ("device", "cuda_device", "hbm_bytes", "dram_bytes", "nvme_paths", "nvme_bytes",
             "io_engine", "io_block_size", "io_queue_depth", "io_threads", "numa_node",
             "log_level", "emu_link_gbps", "prefetch_depth", "prefetch_bytes", "placement",
             "trace", "checksum", "local_rank", "local_world_size", "device_alloc", "device_free")
# Settings that tm_config has no field for (docs/environment.md): only the environment (or
# TIERMEM_ENV_FILE) sets them. A keyword for one needs a field appended to tm_config and to its
# mirror, _capi.Config, first; until then the keyword is refused, naming the variable.
_ENVIRONMENT_ONLY = {"hbm_layout": "TIERMEM_HBM_LAYOUT", "dram_inclusive": "TIERMEM_DRAM_INCLUSIVE",
                     "hbm_hand_on": "TIERMEM_HBM_HAND_ON", "link_gbps": "TIERMEM_LINK_GBPS",
                     "nvme_gbps": "TIERMEM_NVME_GBPS"}


class Runtime:
    """A tiermem runtime. Keyword settings are named like tm_config's fields, one for each;
    anything left unset comes from the TIERMEM_* environment variables, then the defaults
    (docs/environment.md). Sizes are ints or strings such as "64MiB". The settings tm_config
    has no field for (TIERMEM_HBM_LAYOUT, TIERMEM_DRAM_INCLUSIVE, TIERMEM_HBM_HAND_ON,
    TIERMEM_LINK_GBPS, TIERMEM_NVME_GBPS) are environment only: their keywords are a TypeError
    naming the variable."""

    def __init__(self, **settings):
        for key in sorted(set(settings) & set(_ENVIRONMENT_ONLY)):
            raise TypeError("tiermem.Runtime: %s has no tm_config field in this version of the "
                            "library; set %s in the environment (docs/environment.md)" %
                            (key, _ENVIRONMENT_ONLY[key]))
        unknown = sorted(set(settings) - set(_SETTINGS))
        if unknown:
            raise TypeError("tiermem.Runtime: unknown setting(s) %s; known: %s" %
                            (", ".join(unknown), ", ".join(_SETTINGS)))
        cfg = _capi.Config()
        self._keep = []  # C strings the config points at, alive until create returns
        alloc, free = settings.pop("device_alloc", None), settings.pop("device_free", None)
        # The callbacks live as long as the runtime (tiermem calls them until it is destroyed).
        self._allocator = None
        if alloc is not None or free is not None:
            self._allocator = _allocator_callbacks(alloc, free)
            cfg.device_alloc, cfg.device_free = self._allocator
        for key, value in settings.items():
            if value is None:
                continue
            if key in ("hbm_bytes", "dram_bytes", "nvme_bytes", "prefetch_bytes"):
                value = parse_size(value, key)
            elif key in ("io_block_size",):
                value = parse_size(value, key)
            elif key == "device":
                value = _choice(_capi.DEVICES, value, key)
            elif key == "io_engine":
                value = _choice(_capi.IO_ENGINES, value, key)
            elif key == "log_level":
                value = _choice(_capi.LOG_LEVELS, value, key)
            elif key == "placement":
                value = _choice(_capi.PLACEMENTS, value, key)
            elif key == "checksum":
                value = _choice(_capi.CHECKSUMS, value, key)
            elif key == "numa_node":
                if isinstance(value, str) and value.strip().isdigit():
                    value = int(value)  # "0", as TIERMEM_NUMA takes it
                if isinstance(value, str):
                    if value.strip().lower() not in ("auto", "off"):
                        raise ValueError("numa_node=%r: want \"auto\", \"off\" or a node "
                                         "number (0 and up)" % (value,))
                    value = {"auto": _capi.NUMA_AUTO, "off": _capi.NUMA_OFF}[value.strip().lower()]
                elif isinstance(value, int) and not isinstance(value, bool) and value < 0 and \
                        value not in (_capi.NUMA_DEFAULT, _capi.NUMA_AUTO, _capi.NUMA_OFF):
                    raise ValueError("numa_node=%d: want \"auto\", \"off\" or a node number "
                                     "(0 and up)" % value)
            elif key == "nvme_paths":
                if isinstance(value, (str, bytes, os.PathLike)):
                    value = os.fsencode(value)
                else:
                    try:
                        value = b":".join(os.fsencode(p) for p in value)
                    except TypeError:
                        raise TypeError("nvme_paths=%r: want a path or a list of paths" %
                                        (value,)) from None
                self._keep.append(value)
            elif key == "trace":
                value = os.fsencode(value)
                self._keep.append(value)
            setattr(cfg, key, _config_field(cfg, key, value))
        rt = _capi.Runtime()
        _check(_lib.tm_runtime_create(ctypes.byref(cfg), ctypes.byref(rt)), "tm_runtime_create")
        self._rt = rt
        self._pid = os.getpid()  # a fork()ed child cannot use it (its threads stayed here)
        self._lock = threading.Condition()  # signalled when a step ends
        self._step_index = 0
        self._in_step = False
        self._step_thread = None  # the thread that began the step in progress
        self._closing = False
        self._closer = None  # the thread of the close() in progress
        self._names = {}
        # Offloads whose tensors hold a framework's only copy (tiermem.torch's parameters and
        # optimizer state): close() brings them home first.
        self._homecoming = weakref.WeakSet()

    def _bring_home_at_close(self, offload):
        """close() calls offload._runtime_closing() (else offload.remove()) before the runtime
        goes (tiermem.torch: the offloads, and CPUAdam, whose state comes home into torch
        tensors); a failure there refuses the close."""
        self._homecoming.add(offload)

    def _handle(self):
        if self._rt is None:
            raise TiermemError(_capi.STATUS_NAMES.index("TM_ERR_INVALID_HANDLE"),
                               "the runtime was closed")
        return self._rt

    @property
    def closed(self):
        return self._rt is None

    def close(self, force=False):
        """Destroys the runtime and every tensor it still holds; its swap files vanish. Offloads
        of tiermem.torch still in place (parameters, optimizer state) are brought home first,
        as their remove() does, so that the model keeps its weights, and so is the state of a
        CPUAdam or FSDPCPUAdam on this runtime (with FSDPCPUAdam's shards and gradients), which
        goes on in torch memory: when one cannot be, close raises (TM_ERR_BUSY, naming it) and
        the runtime stays open. force=True (a dead NVMe tier, say) closes anyway: each tensor
        that can still come home does, the rest go with the runtime (a TiermemWarning names the
        offloads and how many tensors were lost; reading a lost one raises saying so, a lost
        FSDP2 shard holds NaN, and those offloads and optimizers raise that the runtime was
        closed), so load a checkpoint to go on."""
        if self._rt is None:
            return
        self._wait_for_the_step()
        try:
            self._close(force)
        finally:
            with self._lock:  # steps waiting for this close (step_begin) go on, or raise
                self._closer = None
                if self._rt is not None:
                    self._closing = False  # open still: steps may go on
                self._lock.notify_all()

    def _close(self, force):
        if os.getpid() != self._pid:
            # A fork()ed child's copy: the library refuses it here and its destroy frees
            # nothing (the parent's threads, files and tensors are the parent's); nothing to
            # bring home either, the child's memory being a copy.
            rt, self._rt = self._rt, None
            _lib.tm_runtime_destroy(rt)
            return
        abandoned = []
        for offload in list(getattr(self, "_homecoming", ())):
            try:
                home = getattr(offload, "_runtime_closing", None) or offload.remove
                home()
            except Exception as e:
                if not force:
                    raise TiermemError(
                        _capi.STATUS_NAMES.index("TM_ERR_BUSY"),
                        "close: %s could not bring its tensors home (%s): the runtime stays "
                        "open, with their bytes (close(force=True) closes it without them)" %
                        (type(offload).__name__, e)) from e
                # What can still come home does; the rest is marked lost (a view of the
                # runtime's memory read after the destroy would crash the process).
                abandon = getattr(offload, "_abandon", None)
                lost = abandon() if abandon is not None else None
                abandoned.append("%s (%s%s)" % (
                    getattr(offload, "_display", type(offload).__name__), e, "" if lost is None else
                    "; %d tensors lost" % lost if lost else "; every tensor came home after all"))
            self._homecoming.discard(offload)
        if abandoned:
            warnings.warn("close(force=True): %s failed to bring its tensors home; those that "
                          "could not come home went with the runtime (reading one raises, an FSDP2 "
                          "shard holds NaN; load a checkpoint to go on)" % "; ".join(abandoned),
                          TiermemWarning, stacklevel=2)
        # A DLPack view still out keeps the runtime's memory past the destroy: views only garbage
        # (a reference cycle) are collected first, so that the runtime goes now; those alive keep
        # it until they are freed (tm_runtime_destroy says how many).
        if self.stats()["dlpack_exports"]:
            gc.collect()
        rt, self._rt = self._rt, None
        _check(_lib.tm_runtime_destroy(rt), "tm_runtime_destroy")

    def _wait_for_the_step(self):
        """close() waits for a step in progress on another thread to end (a watchdog closing
        the runtime of a training thread: the tensors that step uses stay until it ends), and
        no step begins after; inside a step on this thread (a signal handler's close()) it
        raises instead, the step unchanged: raise from the handler, and the with blocks end
        the step, then close."""
        me = threading.get_ident()
        with self._lock:
            if self._in_step and self._step_thread == me:
                raise TiermemError(
                    _capi.STATUS_NAMES.index("TM_ERR_BUSY"),
                    "close: a step is in progress on this thread (close() from a signal "
                    "handler?): end the step first; from a handler, set a flag that the "
                    "training loop checks between steps, and close after the loop")
            # Before waiting: the step in progress is the last (a loop stepping on would
            # otherwise begin the next one before this wait saw the end of this one).
            self._closing = True
            self._closer = me
            while self._in_step and self._step_thread not in (None, me):
                if not any(t.ident == self._step_thread for t in threading.enumerate()):
                    break  # its thread ended without ending it (step_begin alone)
                self._lock.wait(0.1)

    def __enter__(self):
        self._handle()  # a closed runtime is refused here, not by the first call in the block
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # Collected with a step open (interpreter exit): nothing else can use it any more.
        self._in_step = False
        try:
            self.close()
        except Exception:
            pass

    def tensor(self, nbytes, cls="other", home=None, name=None):
        """Creates a Tensor of nbytes. cls: "param", "grad", "optimizer_state", "activation" or
        "other"; home: "hbm", "dram", "nvme" or None (the placement preset decides)."""
        d = _capi.TensorDesc()
        d.bytes = parse_size(nbytes, "nbytes")
        d.cls = _choice(_CLASSES, cls, "cls")
        d.home_tier = _capi.TIER_BY_PLACEMENT if home is None else _tier(home)
        encoded = _tensor_name(name)  # kept alive until the call returns
        d.name = encoded
        h = _capi.Tensor()
        _check(_lib.tm_tensor_create(self._handle(), ctypes.byref(d), ctypes.byref(h)),
               "tm_tensor_create")
        return Tensor(self, h, d.bytes, name)

    def tensor_copied_in(self, src_ptr, nbytes, cls="other", home=None, name=None, stream=None):
        """tensor() and copy_in_async() of all nbytes from address src_ptr, in one C call
        (tm_tensor_create_copy_in_async). Returns (Tensor, done): done is True when the copy
        has landed already; else src must stay unchanged until copy_done() says so. On failure
        no tensor is left."""
        d = _capi.TensorDesc()
        d.bytes = parse_size(nbytes, "nbytes")
        d.cls = _choice(_CLASSES, cls, "cls")
        d.home_tier = _capi.TIER_BY_PLACEMENT if home is None else _tier(home)
        encoded = _tensor_name(name)
        d.name = encoded
        h, done = _capi.Tensor(), ctypes.c_int32()
        _check(_lib.tm_tensor_create_copy_in_async(self._handle(), ctypes.byref(d), _ptr(src_ptr),
                                                   _ptr(stream), ctypes.byref(h),
                                                   ctypes.byref(done)),
               "tm_tensor_create_copy_in_async")
        return Tensor(self, h, d.bytes, name), bool(done.value)

    def next_name(self, prefix):
        """prefix.N, N counting from 0 in each step: names that repeat step after step, so the
        schedule matches a tensor created anew each step with last step's."""
        # No lock (a pack asks for one name per saved tensor): the dict's get and setdefault and
        # the counter's next are each atomic in CPython, and step_begin swaps in a fresh dict.
        counter = self._names.get(prefix)
        if counter is None:
            counter = self._names.setdefault(prefix, itertools.count())
        return "%s.%d" % (prefix, next(counter))

    @property
    def step_index(self):
        """Steps begun so far."""
        return self._step_index

    def sync(self):
        """Waits for every move; raises the first failure among them."""
        _check(_lib.tm_runtime_sync(self._handle()), "tm_runtime_sync")

    def step_begin(self):
        with self._lock:
            # A close() in progress on another thread (a watchdog's): its offloads are coming
            # home, so the training thread waits for it to end, then raises that the runtime is
            # closed (or, when the close failed, steps on: the runtime is open still). Raising
            # at once let the loop go on without tiermem while the close still moved its tensors.
            me = threading.get_ident()
            while self._closing and self._closer not in (None, me):
                self._lock.wait(0.1)
            if self._closing or self._rt is None:
                raise TiermemError(_capi.STATUS_NAMES.index("TM_ERR_INVALID_HANDLE"),
                                   "step: the runtime was closed (or is closing)")
            _check(_lib.tm_step_begin(self._handle()), "tm_step_begin")
            self._step_index += 1
            self._in_step = True
            self._step_thread = threading.get_ident()
            self._names = {}  # prefix -> itertools.count, for next_name

    def step_end(self):
        with self._lock:
            try:
                status = _lib.tm_step_end(self._handle())  # before a waiting close() goes on
            finally:
                self._in_step = False
                self._step_thread = None
                self._lock.notify_all()  # a close() from another thread waits for this
        _check(status, "tm_step_end")  # the message is this thread's (tm_last_error)

    @contextlib.contextmanager
    def step(self):
        """One training step: the first step's order of uses becomes the schedule that later
        steps prefetch by. Steps do not nest, and a runtime has one at a time, shared by all
        its threads: a step() inside another raises (TM_ERR_INVALID_ARGUMENT), the outer one
        going on.

        Its end reports the asynchronous failures of the step (tm_step_end). Moves between tiers
        that failed (an offload to a full NVMe tier) left their tensors valid where they were:
        the step's work stands, so they come as a TiermemWarning (repeating the step would apply
        it twice). A callers' copy that failed in the step (copy_in_async: its bytes did not
        land) raises the TiermemError."""
        with self._lock:
            nested = self._in_step
        if nested:
            raise TiermemError(
                _capi.STATUS_NAMES.index("TM_ERR_INVALID_ARGUMENT"),
                "step: a step is running already on this runtime: steps do not nest, and a "
                "runtime has one step at a time, shared by all its threads (the schedule is one "
                "order of uses)")
        self.step_begin()
        try:
            yield self
        except BaseException:
            try:
                self.step_end()
            except Exception:  # noqa: BLE001: the exception already propagating says more
                # Not `except TiermemError`: a step left open at interpreter exit ends here, in
                # the generator's GeneratorExit, once this module's globals may be None already
                # (an except clause naming None is a TypeError, printed as "Exception ignored").
                pass
            raise
        try:
            self.step_end()
        except TiermemError as e:
            if not e.nothing_lost:
                raise
            warnings.warn(TiermemWarning(e), stacklevel=3)

    def stats(self):
        """The runtime's counters as a dict (tm_stats): tiers[name] = {capacity, used, peak},
        bytes_moved[from][to], and every counter by its C name."""
        s = _capi.Stats()
        _check(_lib.tm_runtime_stats(self._handle(), ctypes.byref(s)), "tm_runtime_stats")
        out = {}
        for name, _ in _capi.Stats._fields_:
            if name == "struct_size":
                continue
            if name == "tiers":
                out[name] = {_capi.TIER_NAMES[i]: {"capacity": t.capacity, "used": t.used,
                                                    "peak": t.peak}
                             for i, t in enumerate(s.tiers)}
            elif name == "bytes_moved":
                out[name] = {_capi.TIER_NAMES[i]: {_capi.TIER_NAMES[j]: s.bytes_moved[i][j]
                                                   for j in range(_capi.TIER_COUNT)}
                             for i in range(_capi.TIER_COUNT)}
            else:
                out[name] = getattr(s, name)
        return out

    def info(self):
        """What the runtime resolved (tm_info) as a dict; enums as their names."""
        i = _capi.Info()
        _check(_lib.tm_runtime_info(self._handle(), ctypes.byref(i)), "tm_runtime_info")
        out = {}
        rev = lambda table, v: next((k for k, x in table.items() if x == v), v)
        for name, _ in _capi.Info._fields_:
            v = getattr(i, name)
            if name == "struct_size":
                continue
            if name == "device":
                v = rev(_capi.DEVICES, v)
            elif name == "io_engine":
                v = rev(_capi.IO_ENGINES, v)
            elif name == "placement":
                v = rev(_capi.PLACEMENTS, v)
            elif name == "tier_bytes":
                v = {_capi.TIER_NAMES[k]: v[k] for k in range(_capi.TIER_COUNT)}
            elif name == "device_name":
                v = v.decode(errors="replace")
            elif name in ("hbm_device_pointers", "device_allocator"):
                v = bool(v)
            out[name] = v
        return out

    def config_value(self, variable):
        """Effective value of a setting by its variable name, e.g. "TIERMEM_DRAM_BYTES"."""
        needed = ctypes.c_size_t(256)
        name = variable.encode()
        while True:
            size = needed.value
            buf = ctypes.create_string_buffer(size)
            status = _lib.tm_runtime_config_value(self._handle(), name, buf, size,
                                                  ctypes.byref(needed))
            if status == _capi.OK or needed.value <= size:
                _check(status, "tm_runtime_config_value")
                return buf.value.decode()
