"""Optimizer offload: the state of the user's optimizer offloaded and stepped bucket by bucket
(optimizer_state, ZeRO-Offload), and CPUAdam, the step on the CPU over state in tiermem (cpu_adam,
with cpu_adam_overlap for the step behind backward on CUDA)."""

from .cpu_adam import CPUAdam
from .optimizer_state import OptimizerStateOffload, offload_optimizer_state

__all__ = ["CPUAdam", "OptimizerStateOffload", "offload_optimizer_state"]
