"""Bytes between torch tensors and tiermem tensors: which stream a copy is ordered on, and a
tensor's storage freed and refilled in place."""

import torch

from .. import TiermemError, _capi, _tier

_TIER_HOME = {"dram": "dram", "nvme": "dram"}  # NVMe tensors are written to DRAM, then offloaded


def _check_tier(tier):
    name = _capi.TIER_NAMES[_tier(tier)]
    if name not in _TIER_HOME:
        raise ValueError("tier=%r: offload goes to \"dram\" or \"nvme\"" % (tier,))
    return name


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
        tm.sync()
    if tier == "nvme":
        tm.offload("nvme")


def _fetch(tm, t, nbytes):
    """Copies tm into the memory at t's address; on return t may be used on the current stream
    (CUDA) or at once (CPU)."""
    stream = _stream(t, tm._rt)
    tm.copy_out(t.data_ptr(), nbytes, 0, stream)
    if stream is None:
        tm.sync()


def _destroy_quietly(tm):
    try:
        if not tm._rt.closed:
            tm.destroy()
    except TiermemError:
        pass  # the runtime went first: its tensors went with it
