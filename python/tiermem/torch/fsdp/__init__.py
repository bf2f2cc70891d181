"""FSDPCPUAdam: CPUAdam over the shards of a model FSDP2 sharded (optimizer), the shards held in
tiermem between uses (_shards), reads of them between uses refused (_guard), the NVMe state's I/O
behind backward (_prefetch). Also the old module path tiermem.torch.fsdp."""

from .optimizer import FSDPCPUAdam

__all__ = ["FSDPCPUAdam"]
