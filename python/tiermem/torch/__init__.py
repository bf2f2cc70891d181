"""tiermem for PyTorch: saved-tensor (activation), optimizer-state and parameter offload.

    import tiermem, tiermem.torch
    rt = tiermem.Runtime(dram_bytes="4GiB", nvme_paths="/mnt/nvme")
    params = tiermem.torch.offload_parameters(model, rt, tier="nvme", optimizer=opt)
    opt = tiermem.torch.offload_optimizer_state(opt, rt, tier="dram")  # wraps, never patches
    for batch in data:
        with rt.step(), tiermem.torch.offload_saved_tensors(rt, tier="dram"):
            loss = model(batch).sum()
            loss.backward()
        opt.step()  # bucket by bucket, each bucket's parameters and state brought in
        opt.zero_grad()

On CUDA, tiermem.torch.runtime(...) creates the runtime with its HBM tier drawing from
PyTorch's caching allocator. The modules, one feature each: allocator, transfers (bytes between
torch tensors and tiermem tensors), saved_tensors (activations; stash and views serve it),
swapped (a tensor freed between uses), optimizer_state (ZeRO-Offload and the bucketed step
driver), parameters (ZeRO-Infinity).
"""

from .allocator import caching_allocator, runtime
from .cpu_adam import CPUAdam
from .fit import FitError, FittedPlan, fit
from .fsdp import FSDPCPUAdam
from .optimizer_state import OptimizerStateOffload, offload_optimizer_state
from .parameters import ParameterOffload, offload_parameters
from .saved_tensors import SavedTensorOffload, offload_saved_tensors

__all__ = ["CPUAdam", "offload_saved_tensors", "offload_optimizer_state", "offload_parameters",
           "SavedTensorOffload", "OptimizerStateOffload", "ParameterOffload", "runtime",
           "caching_allocator", "fit", "FittedPlan", "FitError", "FSDPCPUAdam"]
