"""What a read of an FSDP2 parameter shard or gradient shard meets while FSDPCPUAdam holds it in
tiermem (shard_tier / grad_tier): a RuntimeError naming the parameter and saying where to read
it, not the empty storage (in torch 2.11 a view of a storage resized to 0 is a SIGSEGV on sum()).

The objects a user reaches are covered: the registered parameter DTensor (what
model.parameters() and the optimizer's param_groups hold) and its _local_tensor, and the
gradient DTensor p.grad and its _local_tensor. Covering swaps the object's class for a subclass
of its own class (a DTensor stays a DTensor; _shared.offloaded's scheme and allow-list:
shape, dtype, device, grad, hooks, no-op conversions pass) whose __torch_function__ raises for
anything else. The DTensor itself must be covered: DTensor runs ops on its local tensor from
__torch_dispatch__, where no __torch_function__ of the local tensor is called. FSDP2's own
all-gather input (_sharded_param_data) is not covered: FSDP2 reads it only after the hooks of
_shards brought it in, and its reset_sharded_param checks its exact type."""

import weakref

import torch
from torch._C import DisableTorchFunction
from torch.utils._pytree import tree_flatten

from .._shared.offloaded import _ALLOWED, _SHELL, _TYPE, _call, _functions, _is_no_op, _name

# Views read nothing and give tensors on the same empty storage, covered alike: p.to_local() (a
# view_as of the local tensor) still answers numel(), shape, and raises on a read.
_SHELLS = _SHELL | _functions(("view_as", "view"), (None,))


class _Cover:
    """The covered objects of one unit's shards or gradients, and what to say of them."""

    __slots__ = ("kind", "tier", "tensors", "dropped", "__weakref__")

    def __init__(self, kind, tier):
        self.kind, self.tier = kind, tier  # kind: "shard" or "grad"
        # id -> weak reference: a WeakSet would compare tensors with ==, which reads them.
        self.tensors = {}
        self.dropped = False

    def add(self, t, name):
        """Covers t (and, for a DTensor, its local tensor) until uncover()."""
        for x in (t, getattr(t, "_local_tensor", None)):
            if x is None:
                continue
            x._tiermem_name = name
            x._tiermem_cover = self
            self.tensors[id(x)] = weakref.ref(x)
            if not isinstance(x, _Held):
                x.__class__ = _held_class(type(x))

    def _alive(self):
        for key, ref in list(self.tensors.items()):
            t = ref()
            if t is None:
                del self.tensors[key]
            else:
                yield t

    def uncover(self):
        for t in self._alive():
            if isinstance(t, _Held):
                t.__class__ = type(t).__mro__[2]

    def message(self, name, what):
        if self.dropped:
            return ("tiermem: %s on the gradient of parameter %r: FSDPCPUAdam.zero_grad() dropped "
                    "it (its storage is empty); read p.grad after the next backward, before "
                    "zero_grad()" % (what, name))
        if self.kind == "grad":
            return ("tiermem: %s on the gradient of parameter %r: FSDPCPUAdam(grad_tier=%r) holds "
                    "it in tiermem from backward to zero_grad() (its torch storage is empty). To "
                    "clip, pass max_grad_norm= to FSDPCPUAdam instead of calling "
                    "torch.nn.utils.clip_grad_norm_; to read it, do so inside `with "
                    "opt.shards_in():`" % (what, name, self.tier))
        return ("tiermem: %s on parameter %r: FSDPCPUAdam(shard_tier=%r) holds its shard in "
                "tiermem between uses (its torch storage is empty); read or change it inside "
                "`with opt.shards_in():`, or after opt.close()" % (what, name, self.tier))


class _Held:
    """Mixed in before a covered tensor's own class."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # Not a no-op conversion either (_offloaded passes those): Module._apply swaps a DTensor
        # with what to() returns, which would put an uncovered alias of the empty storage in the
        # parameter, and FSDP2's reset_sharded_param after it copies from that alias.
        if func is _TYPE and _is_no_op(func, args, kwargs):
            return _call(func, args, kwargs)
        if func in _ALLOWED or func in _SHELLS:
            with DisableTorchFunction():
                result = func(*args, **kwargs)
            if func in _SHELLS and isinstance(result, torch.Tensor):
                held = args[0]  # p.detach(), p.data, a view: the same empty storage
                held._tiermem_cover.add(result, held._tiermem_name)
            return result
        for a in tree_flatten((args, kwargs))[0]:
            if isinstance(a, _Held):
                raise RuntimeError(a._tiermem_cover.message(a._tiermem_name, _name(func)))
        raise RuntimeError("tiermem: %s on a tensor FSDPCPUAdam holds in tiermem" % _name(func))

    def __format__(self, spec):
        return repr(self) if not spec else format(repr(self), spec)

    def __repr__(self):
        with DisableTorchFunction():
            shape, dtype = list(self.shape), self.dtype
        return "<%s of %r held in tiermem by FSDPCPUAdam: shape %s, %s>" % (
            type(self).__mro__[2].__name__, self._tiermem_name, shape,
            str(dtype).replace("torch.", ""))


_classes = {}


def _held_class(cls):
    made = _classes.get(cls)
    if made is None:
        made = _classes[cls] = type("Held" + cls.__name__, (_Held, cls), {})
    return made


def local(t):
    """t.to_local() whether t is covered or not (for FSDPCPUAdam's own aliases)."""
    with DisableTorchFunction():
        return t.to_local()
