"""The old path of parameter offload, kept for users' imports: tiermem.torch.params."""

from .params.parameters import ParameterOffload, offload_parameters  # noqa: F401
