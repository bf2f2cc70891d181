"""The old path of optimizer-state offload, kept for users' imports: tiermem.torch.optim."""

from .optim.optimizer_state import OptimizerStateOffload, offload_optimizer_state  # noqa: F401
