"""The old path of CPUAdam's step behind backward, kept for users' imports:
tiermem.torch.optim.cpu_adam_overlap."""

from .optim.cpu_adam_overlap import Overlap  # noqa: F401
