"""Parameter offload (ZeRO-Infinity): parameters in tiermem between their unit's uses
(parameters), the views that stand for them in forward and backward (_views), their state_dict
(_state_dict)."""

from .parameters import ParameterOffload, offload_parameters

__all__ = ["ParameterOffload", "offload_parameters"]
