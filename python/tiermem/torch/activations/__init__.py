"""Activation offload: the tensors autograd saves for backward held in tiermem from forward to
backward (saved_tensors), the sources of copies in flight kept alive meanwhile (_stash)."""

from .saved_tensors import SavedTensorOffload, offload_saved_tensors

__all__ = ["SavedTensorOffload", "offload_saved_tensors"]
