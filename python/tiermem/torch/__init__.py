"""tiermem for PyTorch: saved-tensor (activation), optimizer-state and parameter offload.

    import tiermem, tiermem.torch
    rt = tiermem.Runtime(dram_bytes="4GiB", nvme_paths="/mnt/nvme")
    params = tiermem.torch.offload_parameters(model, rt, tier="nvme", optimizer=opt)
    opt = tiermem.torch.offload_optimizer_state(opt, rt, tier="dram")  # wraps, never patches
    for batch in data:
        with rt.step():  # the step's uses, the optimizer's included, are the schedule
            with tiermem.torch.offload_saved_tensors(rt, tier="dram"):
                loss = model(batch).sum()
            loss.backward()
            opt.step()  # bucket by bucket, each bucket's parameters and state brought in
            opt.zero_grad()

On CUDA, tiermem.torch.runtime(...) creates the runtime with its HBM tier drawing from
PyTorch's caching allocator. The public modules, one feature each: allocator, saved_tensors
(activations), optimizer_state (ZeRO-Offload and the bucketed step driver), parameters
(ZeRO-Infinity), cpu_adam (with cpu_adam_overlap), fsdp, fit. What serves them is
underscored: _transfers (bytes between torch tensors and tiermem tensors), _stash and _views (for
saved_tensors), _swapped (a tensor freed between uses), _offloaded (what touching one does),
_param_views and _param_state_dict (for parameters), _fsdp_shards, _fsdp_prefetch and _fsdp_guard
(for fsdp), _fit_cost, _fit_hooks and _fit_profile (for fit). docs/pytorch.md says which optimizer
offload to choose.
"""

from .allocator import caching_allocator, runtime
from .cpu_adam import CPUAdam
from .fit import FitError, FittedPlan, fit
from .fsdp import FSDPCPUAdam
from .optimizer_state import OptimizerStateOffload, offload_optimizer_state
from .parameters import ParameterOffload, offload_parameters
from .saved_tensors import SavedTensorOffload, offload_saved_tensors

FitError.__module__ = __name__  # tiermem.torch.FitError, where users catch it

__all__ = ["CPUAdam", "offload_saved_tensors", "offload_optimizer_state", "offload_parameters",
           "SavedTensorOffload", "OptimizerStateOffload", "ParameterOffload", "runtime",
           "caching_allocator", "fit", "FittedPlan", "FitError", "FSDPCPUAdam"]
