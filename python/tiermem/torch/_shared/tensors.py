"""Which saved tensors are a model's parameters: the saved-tensor hooks of activation offload
and of fit leave those where they are. And _eager, for hooks that must run as Python under
torch.compile."""

import threading

import torch

# The fitted plans whose saved-tensor hooks are active on this thread (fit's Router): an
# offload_saved_tensors entered inside one takes every save from it, which it warns about.
plans_active = threading.local()

# Hooks that move tensors' data in and out (a unit's parameters, an optimizer's state) run
# eagerly under torch.compile: dynamo cannot trace them (it fails on them, or recompiles them at
# every call); disabled, it graph-breaks around them and compiles the code between. About 0.3 us
# a call in eager mode.
_eager = getattr(getattr(torch, "compiler", None), "disable", None) or (lambda f: f)


def _is_parameter(t):
    # Parameter's isinstance runs Python code (its metaclass): asked only of leaves and of
    # views' bases, since activations are mostly neither.
    if t.is_leaf:
        return isinstance(t, torch.nn.Parameter)
    base = t._base
    return base is not None and isinstance(base, torch.nn.Parameter)
