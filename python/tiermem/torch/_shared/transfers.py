"""Bytes between torch tensors and tiermem tensors: which stream a copy is ordered on, and a
tensor's storage freed and refilled in place."""

import warnings

import torch

from ... import Runtime, TiermemError, TiermemWarning, _capi, _tier, parse_size

_TIER_HOME = {"dram": "dram", "nvme": "dram"}  # NVMe tensors are written to DRAM, then offloaded


def _check_runtime(runtime):
    """The one check of a runtime= argument, for every feature's entry point."""
    if not isinstance(runtime, Runtime):
        raise TypeError("runtime: expected a tiermem.Runtime, got %s" % type(runtime).__name__)
    return runtime


def _check_tier(tier):
    """The tier an offload goes to: "dram" or "nvme" (any case, or the C enum's value)."""
    try:
        name = _capi.TIER_NAMES[_tier(tier)]
    except ValueError:
        name = None  # (not a tier at all: the message below names the two an offload takes)
    if name not in _TIER_HOME:
        raise ValueError("tier=%r: offload goes to \"dram\" or \"nvme\"" % (tier,))
    return name


def _size_arg(value, what):
    """A size argument (bucket_bytes=, min_bytes=): bytes as an int, or a string such as
    "64MiB"; a TypeError or ValueError naming the argument for anything else."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return parse_size(value, what)


# cudaStreamLegacy: PyTorch's default stream reports cuda_stream == 0, which the C API takes as
# "no stream" (unordered); the legacy default stream is what 0 means to CUDA.
_CUDA_STREAM_LEGACY = 0x1


def _stream(t, rt=None):
    """The cudaStream_t (an int) the copy is ordered on: the current stream of a CUDA tensor's
    device; None for CPU tensors (copy without a stream, then tm_tensor_sync). A CUDA tensor
    needs a runtime on the CUDA device: the emulated device cannot tell its memory from the
    host's."""
    if t.device.type == "cuda":
        if rt is not None and not _is_cuda_runtime(rt):
            raise ValueError("a CUDA tensor needs a tiermem runtime on the CUDA device "
                             "(device=\"cuda\"); this one uses %s" % rt.info()["device"])
        return torch.cuda.current_stream(t.device).cuda_stream or _CUDA_STREAM_LEGACY
    return None


def _is_cuda_runtime(rt):
    cached = getattr(rt, "_tiermem_cuda", None)
    if cached is None:
        cached = bool(rt.info()["hbm_device_pointers"])
        try:
            rt._tiermem_cuda = cached
        except AttributeError:
            pass
    return cached


def _resize_storage(t, nbytes):
    """Frees (0) or reallocates the memory under t, keeping the tensor object, its views and its
    autograd identity (as FSDP does with parameters)."""
    if hasattr(t, "untyped_storage"):
        t.untyped_storage().resize_(nbytes)
    else:
        t.storage().resize_(nbytes // t.element_size())


def _storage_nbytes(t):
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage().nbytes()
    return t.storage().size() * t.element_size()


def _storage_key(t):
    """The identity of t's storage (its StorageImpl): the tensors that share memory through one
    storage give the same key."""
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage()._cdata
    return t.storage()._cdata


def _resizable(t):
    """Whether t's storage can be freed and refilled in place. torch.load's storages (mmap'd or
    not) cannot: load_state_dict(assign=True) and transformers' from_pretrained leave
    parameters on them."""
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage().resizable()
    return t.storage().resizable()


def _byte_span(t):
    """(first, end): the bytes of t's storage that t covers (numel() > 0, strides >= 0)."""
    size = t.element_size()
    first = t.storage_offset() * size
    return first, first + size * (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride())))


def _rehome(tensors):
    """Moves tensors that share one storage (none of them empty) onto fresh, resizable storages
    holding the same bytes: those whose bytes overlap share one new storage, at the same places
    relative to one another; the others get one each. Each tensor keeps its object (its .data
    is set), so that whatever holds it (an optimizer, a module tying it twice) has the new one;
    anything else on the old storage (the state dict loaded) keeps the old bytes."""
    spans = sorted(((_byte_span(t), t) for t in tensors), key=lambda x: x[0][0])
    groups = []  # [first, end, members]: runs of overlapping spans
    for (first, end), t in spans:
        if groups and first < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], end)
            groups[-1][2].append(t)
        else:
            groups.append([first, end, [t]])
    old = tensors[0].untyped_storage()
    device = tensors[0].device
    with torch.no_grad():
        for first, end, members in groups:
            # Every member's offset stays a whole number of its elements: element sizes are
            # powers of two, so starting at a multiple of the largest is enough.
            align = max(t.element_size() for t in members)
            first -= first % align
            src = torch.empty(0, dtype=torch.uint8, device=device).set_(old, first, (end - first,))
            fresh = src.clone().untyped_storage()
            for t in members:
                offset = (t.storage_offset() * t.element_size() - first) // t.element_size()
                t.data = torch.empty(0, dtype=t.dtype, device=device).set_(
                    fresh, offset, t.size(), t.stride())


def _owns_storage(t):
    """t alone spans its whole storage, contiguous: its memory can be freed and refilled."""
    return (t.layout == torch.strided and t.is_contiguous() and t.storage_offset() == 0 and
            _storage_nbytes(t) == t.numel() * t.element_size() and t.numel() > 0)


def _send(tm, t, nbytes, tier):
    """Copies the first nbytes at t's address into tm, then starts it down to NVMe for tier nvme.
    Without a stream the source must stay unchanged until the copy is done: sync first."""
    stream = _stream(t, tm._rt)
    tm.copy_in(t.data_ptr(), nbytes, 0, stream)
    if stream is None:
        _sync_copy(tm)
    if tier == "nvme":
        tm.offload("nvme")


def _fetch(tm, t, nbytes):
    """Copies tm into the memory at t's address; on return t may be used on the current stream
    (CUDA) or at once (CPU)."""
    stream = _stream(t, tm._rt)
    tm.copy_out(t.data_ptr(), nbytes, 0, stream)
    if stream is None:
        _sync_copy(tm)


def _sync_copy(tm):
    """Waits for a copy between tm and a caller's memory. A failure it reports that lost
    nothing is an earlier move of the tensor that left it valid where it was (an offload to a
    full NVMe tier): the copy is whole, so it is a TiermemWarning, not an error (an outside
    client could not take a state_dict while NVMe was full)."""
    try:
        tm.sync()
    except TiermemError as e:
        if not e.nothing_lost:
            raise
        warnings.warn(TiermemWarning(e), stacklevel=3)


def _destroy_quietly(tm):
    try:
        if not tm._rt.closed:
            tm.destroy()
    except TiermemError:
        pass  # the runtime went first: its tensors went with it
