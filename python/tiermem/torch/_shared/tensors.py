"""Which saved tensors are a model's parameters: the saved-tensor hooks of activation offload
and of fit leave those where they are."""

import torch


def _is_parameter(t):
    # Parameter's isinstance runs Python code (its metaclass): asked only of leaves and of
    # views' bases, since activations are mostly neither.
    if t.is_leaf:
        return isinstance(t, torch.nn.Parameter)
    base = t._base
    return base is not None and isinstance(base, torch.nn.Parameter)
