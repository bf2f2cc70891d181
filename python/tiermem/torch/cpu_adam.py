"""The old path of CPUAdam, kept for users' imports: tiermem.torch.optim.cpu_adam."""

from .optim.cpu_adam import CPUAdam, isa, set_isa_limit

__all__ = ["CPUAdam", "isa", "set_isa_limit"]
