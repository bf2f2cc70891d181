"""The old path of activation offload, kept for users' imports: tiermem.torch.activations."""

from .activations.saved_tensors import SavedTensorOffload, offload_saved_tensors  # noqa: F401
