"""One pool for PyTorch and tiermem's HBM tier: tiermem's device_alloc / device_free callbacks
drawing from PyTorch's CUDA caching allocator, so that an HBM copy tiermem prefetches and the
tensors PyTorch allocates share one pool and one budget (memory tiermem frees goes back to the
cache, where PyTorch's next allocation finds it)."""

import torch

from .. import Runtime


def _alloc(nbytes, device, stream):
    return torch.cuda.caching_allocator_alloc(nbytes, device, stream)


def _free(ptr, nbytes, device, stream):
    torch.cuda.caching_allocator_delete(ptr)


def caching_allocator():
    """Runtime settings (device_alloc, device_free) for PyTorch's CUDA caching allocator."""
    return {"device_alloc": _alloc, "device_free": _free}


def runtime(**settings):
    """A tiermem.Runtime whose HBM tier, on a CUDA machine, draws from PyTorch's caching
    allocator (settings as tiermem.Runtime's; an explicit device_alloc / device_free, or
    device="emulated", leaves the allocator as given)."""
    on_cuda = torch.cuda.is_available() and str(settings.get("device") or "auto") != "emulated"
    if on_cuda and "device_alloc" not in settings and "device_free" not in settings:
        settings.update(caching_allocator())
    return Runtime(**settings)
