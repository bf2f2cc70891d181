"""How a fitted plan acts on a step: one saved_tensors_hooks context that sends each saved tensor
where its block's choice says (kept, or packed by a SavedTensorOffload to DRAM or NVMe), the
recomputed blocks' forward wrapped in torch.utils.checkpoint, and the meter of the bytes of
saved activations held in HBM (docs/pytorch.md, "Fitting a model to an HBM budget")."""

import weakref

import torch
from torch.utils import _pytree
from torch.utils import checkpoint as _checkpoint

from .._shared.tensors import _eager, _is_parameter
from .._shared.tensors import plans_active as _plans_active
from .._shared.transfers import _storage_nbytes
from ..activations import SavedTensorOffload
from ._cost import DRAM, NVME


class _State:
    """Which block runs now (None: the rest of the model) and whether it is being recomputed."""

    __slots__ = ("current", "recomputing")

    def __init__(self):
        self.current, self.recomputing = None, False


def _base_key(t):
    # The storage's first byte: the same for every view of one storage, cheap to compute.
    return t.data_ptr() - t.storage_offset() * t.element_size()


class _Kept:
    """A saved tensor that stays, counted by the meter while autograd holds it."""

    __slots__ = ("t", "meter", "key")

    def __del__(self):
        self.meter._drop(self.key)


class SavedBytesMeter:
    """The bytes of saved activations held in HBM, and their peak: every saved tensor kept as it
    is (counted once per storage), the sources in the runtime's stash whose copies to DRAM are
    still in flight, tensors copied out in backward while autograd holds them, and the bytes the
    runtime's HBM tier holds (prefetched and acquired copies; read with tm_runtime_stats at each
    unpack). Parameters are not saved activations and are not counted."""

    def __init__(self, runtime=None):
        self.runtime = runtime
        self._live = {}  # storage key -> [references, bytes]
        self.kept = 0
        self.copies = 0
        self.hbm = 0
        self.peak = 0

    def reset(self):
        """Starts a new peak from what is held now (the HBM tier read afresh)."""
        if self.runtime is not None:
            self.hbm = self.runtime.stats()["tiers"]["hbm"]["used"]
        self.peak = self._now()

    def keep(self, t):
        k = _Kept()
        k.t, k.meter, k.key = t, self, _base_key(t)
        entry = self._live.get(k.key)
        if entry is None:
            n = _storage_nbytes(t)
            self._live[k.key] = [1, n]
            self.kept += n
        else:
            entry[0] += 1
        self.sample()
        return k

    def _drop(self, key):
        entry = self._live.get(key)
        if entry is not None:
            entry[0] -= 1
            if entry[0] == 0:
                del self._live[key]
                self.kept -= entry[1]

    def copied(self, t):
        n = t.numel() * t.element_size()
        self.copies += n
        weakref.finalize(t, self._uncopied, n)

    def _uncopied(self, n):
        self.copies -= n

    def _now(self):
        stash = getattr(self.runtime, "_tiermem_stash", None) if self.runtime else None
        return self.kept + self.copies + self.hbm + (stash.bytes if stash is not None else 0)

    def sample(self, hbm=False):
        if hbm and self.runtime is not None:
            self.hbm = self.runtime.stats()["tiers"]["hbm"]["used"]
        now = self._now()
        if now > self.peak:
            self.peak = now


class Router(torch.autograd.graph.saved_tensors_hooks):
    """The saved-tensor hooks of one step under a plan (choices, one per block; the rest is
    kept). With a meter, kept tensors are counted; without one they pass through untouched."""

    def __init__(self, runtime, state, choices, min_bytes, stash_bytes, meter=None):
        self.state, self.choices, self.meter = state, choices, meter
        self.min_bytes = int(min_bytes)
        self.offload = {}
        for tier in (DRAM, NVME):
            if tier in choices:
                self.offload[tier] = SavedTensorOffload(runtime, tier, min_bytes,
                                                        stash_bytes=stash_bytes)
        super().__init__(_eager(self._pack), _eager(self._unpack))

    def __enter__(self):
        super().__enter__()
        _plans_active.depth = getattr(_plans_active, "depth", 0) + 1
        return self

    def __exit__(self, exc_type, exc, tb):
        _plans_active.depth -= 1
        super().__exit__(exc_type, exc, tb)
        if exc is None:
            for off in self.offload.values():
                off._prefetch_last()
        for off in self.offload.values():
            if off.error is not None and exc is None:
                raise off.error
        return False

    def _pack(self, t):
        s = self.state
        off = None
        if s.current is not None and not s.recomputing:
            off = self.offload.get(self.choices[s.current])
        if off is not None:
            p = off._pack(t)
            if p is not t:
                if self.meter is not None:
                    self.meter.sample()
                return (off, p)
        if self.meter is None or t.layout != torch.strided or _is_parameter(t):
            return t  # parameters are the model's, not saved activations
        return self.meter.keep(t)

    def _unpack(self, x):
        if isinstance(x, torch.Tensor):
            return x
        if isinstance(x, _Kept):
            return x.t
        off, p = x
        copies = off.unpacked_copies
        out = off._unpack(p)
        meter = self.meter
        if meter is not None:
            if off.unpacked_copies != copies:
                meter.copied(out)
            meter.sample(hbm=True)
        return out


class SavedCounter(torch.autograd.graph.saved_tensors_hooks):
    """The profile's count of what each block saves: per block (and None: the rest) the distinct
    storages' bytes, the bytes offloading would move (tensors of min_bytes and more, each as
    saved_tensors packs it: its span, once for a tensor saved twice) and the small ones' bytes,
    and the moved tensors' sizes."""

    def __init__(self, state, min_bytes):
        self.state, self.min_bytes = state, int(min_bytes)
        self.kept, self.moved, self.small, self.sizes = {}, {}, {}, {}
        self._seen, self._saves = {}, {}
        super().__init__(self._pack, lambda t: t)

    def _pack(self, t):
        if t.layout != torch.strided or t.numel() == 0 or _is_parameter(t):
            return t
        i = self.state.current
        seen = self._seen.setdefault(i, set())
        key = _base_key(t)
        if key not in seen:
            seen.add(key)
            self.kept[i] = self.kept.get(i, 0) + _storage_nbytes(t)
        n = t.numel() * t.element_size()
        if n < self.min_bytes:
            self.small[i] = self.small.get(i, 0) + n
        elif self._first_save(i, t):  # a tensor saved twice is copied once
            span = 1 + sum((d - 1) * st for d, st in zip(t.size(), t.stride()))
            moved = (span if span <= 2 * t.numel() else t.numel()) * t.element_size()
            self.moved[i] = self.moved.get(i, 0) + moved
            self.sizes.setdefault(i, []).append(moved)
        return t

    def _first_save(self, i, t):
        """False for a save of elements this block saved before, unchanged since (the same
        tensor, or a view of the same tensor over the same elements, contiguous in another shape):
        packing shares its copy. (The profile keeps every saved tensor alive, so an id is not
        reused.)"""
        root = t if t._base is None else t._base
        shape = t.numel() if t.is_contiguous() else (tuple(t.size()), t.stride())
        key = (id(root), t._version, t.data_ptr(), t.dtype, shape)
        saves = self._saves.setdefault(i, set())
        if key in saves:
            return False
        saves.add(key)
        return True


class FitError(ValueError):
    """No plan fits the budget, or fit was given something it cannot fit. .least: when no plan
    fits, the least budget that would (bytes, an int to pass as hbm_budget); else None."""

    def __init__(self, message, least=None):
        super().__init__(message)
        self.least = least


def _is_kv_cache(x):
    # transformers' Cache (DynamicCache, StaticCache, ...), recognised by name so that tiermem
    # needs no transformers: a decoder layer updates it in place in its forward.
    return any(c.__name__ == "Cache" and c.__module__.startswith("transformers")
               for c in type(x).__mro__)


def wrap_recompute(block, index, state):
    """Replaces block.forward (on the instance) with one that runs it under
    torch.utils.checkpoint, the recompute attributed to the block; returns the undo. The call's
    positional and keyword arguments are flattened (torch.utils._pytree) into the checkpoint's
    positional inputs, so that every tensor in them, nested in tuples, lists or dicts too, is an
    input of the checkpoint and gets its gradient. A call without an input that requires grad
    (no backward to replay it) runs as it is."""
    orig = block.forward

    def run(*args, **kwargs):
        prev = state.current, state.recomputing
        state.current, state.recomputing = index, torch.is_grad_enabled()
        try:
            return orig(*args, **kwargs)
        finally:
            state.current, state.recomputing = prev

    def forward(*args, **kwargs):
        # The reentrant checkpoint takes positional inputs only, and treats anything but a
        # top-level tensor as a constant, losing its gradient. Blocks called with keyword
        # arguments (every transformers decoder layer: hidden_states, attention_mask=...,
        # position_embeddings=(cos, sin)) used to run here as they were, never recomputed,
        # while the plan counted them as recomputed (their activations kept in HBM beyond the
        # predicted peak). Flattened, every tensor leaf is a checkpoint input.
        leaves, spec = _pytree.tree_flatten((args, kwargs))
        if not torch.is_grad_enabled() or not any(
                isinstance(a, torch.Tensor) and a.requires_grad for a in leaves):
            return orig(*args, **kwargs)
        cache = next((a for a in leaves if _is_kv_cache(a)), None)
        if cache is not None:
            # Recomputed in backward, the block would append its keys and values to the cache a
            # second time and attend over both: wrong gradients, silently (or a shape error).
            raise FitError(
                "block %d (%s) was called with a KV cache (%s: transformers' use_cache=True), "
                "which its forward updates in place: recomputed in backward it would add its keys "
                "and values a second time and attend over both, giving wrong gradients; train "
                "with use_cache=False (model.config.use_cache = False, or model(..., "
                "use_cache=False)), as transformers' own gradient checkpointing does, or give "
                "this block another choice" % (index, type(block).__name__, type(cache).__name__))

        def run_flat(*flat):
            a, k = _pytree.tree_unflatten(list(flat), spec)
            return run(*a, **k)

        return _checkpoint.checkpoint(run_flat, *leaves, use_reentrant=True)

    # Eager under torch.compile: the recompute's bookkeeping (which block, replaying or not) is
    # Python state that a traced forward would not set when it runs.
    block.forward = forward = _eager(forward)

    def undo():
        if block.__dict__.get("forward") is forward:
            del block.forward

    return undo


def track_blocks(blocks, state):
    """Forward hooks that tell state which block runs; returns their handles."""
    handles = []
    for i, b in enumerate(blocks):
        def pre(module, args, i=i):
            state.current = i

        def post(module, args, out):
            state.current = None

        # Eager under torch.compile: traced, they set nothing when the block ran, and no saved
        # tensor was routed (an outside client's compiled model kept every activation in HBM).
        handles.append(b.register_forward_pre_hook(_eager(pre)))
        handles.append(b.register_forward_hook(_eager(post)))
    return handles

