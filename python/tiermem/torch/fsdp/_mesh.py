"""What FSDPCPUAdam steps: a module sharded by FSDP2's fully_shard, its parameters DTensors
sharded over a 1-D mesh or, under HSDP, over a 2-D mesh (replicated across its first dimension,
sharded within its second). Everything else is refused, by name: FSDP1, CPUOffloadPolicy,
tensor parallelism, ignored parameters."""

import torch

from tiermem.torch.fsdp._guard import local


def _fsdp2():
    """FSDP2's public names, imported when first used: tiermem.torch imports on a torch without
    them (Debian's 1.13), where only FSDPCPUAdam is unavailable."""
    try:
        from torch.distributed.fsdp import (CPUOffloadPolicy, FSDPModule,
                                            FullyShardedDataParallel)
        from torch.distributed.tensor import DTensor, Replicate, Shard
    except ImportError as e:
        raise ImportError("FSDPCPUAdam needs torch 2.6 or later (torch.distributed.fsdp."
                          "fully_shard and DTensor); this is torch %s" % torch.__version__) from e
    return CPUOffloadPolicy, FSDPModule, FullyShardedDataParallel, DTensor, Shard, Replicate


def _check_module(module):
    """Refuses what FSDPCPUAdam does not step, naming it; returns {parameter: its name}."""
    CPUOffloadPolicy, FSDPModule, FSDP1 = _fsdp2()[:3]
    if not isinstance(module, torch.nn.Module):
        raise TypeError("FSDPCPUAdam: module is %s, want the nn.Module fully_shard sharded" %
                        type(module).__name__)
    sharded = False
    for name, m in module.named_modules():
        where = "the module" if not name else "module %r" % name
        if isinstance(m, FSDP1):
            raise ValueError("FSDPCPUAdam: %s is wrapped by FullyShardedDataParallel (FSDP1), "
                             "which is not supported: shard it with torch.distributed.fsdp."
                             "fully_shard (FSDP2)" % where)
        if isinstance(m, FSDPModule):
            sharded = True
            # FSDP2 keeps the policy on the module's parameter group only (no public getter);
            # where that moved, _check_param still finds shards off their mesh's device.
            state = getattr(m, "_get_fsdp_state", lambda: None)()
            group = getattr(state, "_fsdp_param_group", None)
            if isinstance(getattr(group, "offload_policy", None), CPUOffloadPolicy):
                raise ValueError("FSDPCPUAdam: %s was sharded with fully_shard(..., "
                                 "offload_policy=CPUOffloadPolicy()), which is not supported: "
                                 "FSDPCPUAdam keeps the optimizer state in tiermem itself; "
                                 "shard without it" % where)
    if not sharded:
        raise ValueError("FSDPCPUAdam: the module is not sharded by torch.distributed.fsdp."
                         "fully_shard (no FSDPModule in it)")
    return {p: n for n, p in module.named_parameters()}


def _shard_dim(p):
    """The mesh dimension p's shard is split over: 0 on fully_shard's 1-D mesh, 1 under HSDP
    (a 2-D mesh, (Replicate(), Shard(0)): replicated across its first dimension, sharded within
    its second). None for any other placement."""
    _, _, _, _, Shard, Replicate = _fsdp2()
    pl = tuple(p.placements)
    if p.device_mesh.ndim == 1 and isinstance(pl[0], Shard):
        return 0
    if p.device_mesh.ndim == 2 and isinstance(pl[0], Replicate) and isinstance(pl[1], Shard):
        return 1
    return None


def _check_param(p, name):
    DTensor, Shard = _fsdp2()[3:5]
    what = "parameter %r" % name if name else "a parameter not in the module"
    if not isinstance(p, DTensor):
        raise ValueError("FSDPCPUAdam: %s is not sharded by fully_shard (ignored_params, or a "
                         "module outside the sharded one), which is not supported" % what)
    if _shard_dim(p) is None:
        tp = p.device_mesh.ndim > 1 and any(isinstance(x, Shard) for x in p.placements[1:])
        raise ValueError("FSDPCPUAdam: %s is placed %s on a %d-D mesh%s; supported: fully_shard's "
                         "1-D sharding, and HSDP (a 2-D mesh placed (Replicate(), Shard(0)))" %
                         (what, tuple(p.placements), p.device_mesh.ndim,
                          " (tensor parallelism, which is not supported)" if tp else ""))
    shard = local(p)
    if shard.device.type != p.device_mesh.device_type:
        raise ValueError("FSDPCPUAdam: %s has its shard on %s, its mesh on %s (CPUOffloadPolicy?),"
                         " which is not supported" % (what, shard.device,
                                                      p.device_mesh.device_type))
