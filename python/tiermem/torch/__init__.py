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
PyTorch's caching allocator. A subpackage per feature: activations (saved tensors), optim
(optimizer-state offload, CPUAdam), params (ZeRO-Infinity), fsdp (FSDPCPUAdam over FSDP2's
shards), fit (the per-block plan); allocator is a module. _shared holds what several features use
(transfers between torch and tiermem tensors, the tensor freed between uses, the bucketed step
driver...): a feature imports another's public names only, and any of _shared's
(tools/scripts/check_imports.py checks it). The modules saved_tensors, optimizer_state,
parameters, cpu_adam and cpu_adam_overlap are the old import paths, kept. docs/pytorch.md says
which optimizer offload to choose.
"""

from .activations import SavedTensorOffload, offload_saved_tensors
from .allocator import caching_allocator, runtime
from .fit import FitError, FittedPlan, fit
from .fsdp import FSDPCPUAdam
from .optim import CPUAdam, OptimizerStateOffload, offload_optimizer_state
from .params import ParameterOffload, offload_parameters
from . import cpu_adam, optimizer_state, parameters, saved_tensors  # noqa: F401  the old paths

FitError.__module__ = __name__  # tiermem.torch.FitError, where users catch it

from ._shared import interrupts as _interrupts  # noqa: E402
_interrupts.install()  # a Ctrl-C in one of tiermem's finalizers goes on to the main thread

__all__ = ["CPUAdam", "offload_saved_tensors", "offload_optimizer_state", "offload_parameters",
           "SavedTensorOffload", "OptimizerStateOffload", "ParameterOffload", "runtime",
           "caching_allocator", "fit", "FittedPlan", "FitError", "FSDPCPUAdam"]
