"""tiermem.torch.fit: per block of a model, keep, offload or recompute its saved activations to
fit an HBM budget (plan), from a cost model (_cost), measurements (_profile) and the hooks that
take them and carry the plan out (_hooks). Also the old module path tiermem.torch.fit."""

from ._cost import CHOICES, DRAM, KEEP, NVME, RECOMPUTE
from .plan import FitError, FittedPlan, fit

__all__ = ["fit", "FittedPlan", "FitError", "CHOICES", "KEEP", "DRAM", "NVME", "RECOMPUTE"]
