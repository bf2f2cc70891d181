"""What a tensor whose memory tiermem freed is to code that touches it between uses (an
offloaded parameter outside its unit, optimizer state outside optimizer.step()).

Its storage is empty while tiermem holds its bytes, and PyTorch's kernels do not check a
tensor's storage against its shape: reading it would crash the process or return garbage. So
while it is out, the tensor's class is swapped for a subclass (of its own class: a parameter
stays an nn.Parameter) whose __torch_function__ lets through what reads no data (shape, dtype,
device, requires_grad, the gradient, hooks) and raises a RuntimeError, naming the tensor and
saying how to read it, for anything else. detach() and .data give tensors of the same kind, so
that state_dict() (which detaches) still works: its hook puts copies read from tiermem in their
place. When the tensor is brought in, its own class comes back."""

import torch
from torch._C import DisableTorchFunction

_ALLOWED_PROPERTIES = (
    "shape", "dtype", "device", "layout", "requires_grad", "is_leaf", "grad", "grad_fn",
    "is_cuda", "is_sparse", "is_quantized", "is_meta", "is_nested", "is_mkldnn", "ndim", "names",
    "_version", "_base", "output_nr", "_backward_hooks", "_post_accumulate_grad_hooks")
_ALLOWED_METHODS = (
    "size", "dim", "numel", "nelement", "element_size", "stride", "is_contiguous",
    "storage_offset", "__hash__", "__len__", "register_hook", "retain_grad", "requires_grad_",
    "is_floating_point", "is_complex", "is_signed", "get_device", "_is_view",
    "register_post_accumulate_grad_hook", "storage", "untyped_storage", "_storage", "_typed_storage",
    "is_pinned", "is_shared", "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor",
    "new_empty_strided")
# Functions of torch that read no data of their tensor arguments (only shape, dtype, device).
_ALLOWED_TORCH = ("is_floating_point", "is_complex", "is_signed", "numel", "zeros_like",
                  "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
                  "randint_like", "is_tensor", "_has_compatible_shallow_copy_type")
_SHELLS = ("detach",)
# Conversions: a no-op one returns the tensor itself and reads nothing (Module.to / .cpu() /
# .float() of a model already there); any other one would read the freed storage.
_CONVERSIONS = {"to": None, "cpu": None, "cuda": None, "float": torch.float32,
                "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16}


def _functions(names, accessors):
    out = set()
    for name in names:
        attr = getattr(torch.Tensor, name, None)
        if attr is None:
            continue  # not in this version of torch
        for accessor in accessors:
            f = getattr(attr, accessor, None) if accessor else attr
            if f is not None:
                out.add(f)
    return out


_ALLOWED = (_functions(_ALLOWED_PROPERTIES, ("__get__", "__set__", "__delete__")) |
            _functions(_ALLOWED_METHODS, (None,)) |
            {getattr(torch, n) for n in _ALLOWED_TORCH if hasattr(torch, n)})
_CONVERTERS = {getattr(torch.Tensor, n): n for n in _CONVERSIONS if hasattr(torch.Tensor, n)}
_DATA_SET = torch.Tensor.data.__set__
_TYPE = torch.Tensor.type


def _is_no_op(func, args, kwargs):
    """Whether func(*args, **kwargs) is a conversion of args[0] to what it is already (torch
    then returns the tensor itself), or .data set to the tensor itself (Module._apply after
    such a conversion), or .type() asked for its name."""
    if not args:
        return False
    t = args[0]
    if func == _DATA_SET:
        return len(args) > 1 and args[1] is t
    if func == _TYPE:
        return len(args) == 1 and not kwargs
    name = _CONVERTERS.get(func)
    if name is None:
        return False
    with DisableTorchFunction():
        dtype, device = t.dtype, t.device
    if name == "to":
        if kwargs.get("copy"):
            return False
        try:
            to_device, to_dtype, _, memory_format = torch._C._nn._parse_to(*args[1:], **kwargs)
        except Exception:
            return False
        if memory_format not in (None, torch.preserve_format):
            return False
        return ((to_dtype is None or to_dtype == dtype) and
                (to_device is None or (to_device.type == device.type and
                                       to_device.index in (None, device.index))))
    if len(args) > 1 or any(k != "non_blocking" for k in kwargs):
        return False  # a device or memory format given: not worth telling apart
    if name == "cpu":
        return device.type == "cpu"
    if name == "cuda":
        return device.type == "cuda"
    return dtype == _CONVERSIONS[name]


_SHELL = _functions(_SHELLS, (None,)) | _functions(("data",), ("__get__",))


class _Offloaded:
    """Mixed in before the tensor's own class while its memory is freed."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_no_op(func, args, kwargs):
            return args[0] if func not in (_DATA_SET, _TYPE) else _call(func, args, kwargs)
        if func in _ALLOWED or func in _SHELL:
            with DisableTorchFunction():
                result = func(*args, **kwargs)
            if func in _SHELL and isinstance(result, torch.Tensor):
                result.__class__ = offloaded_class(type(result))
                if _lost(args) is not None:  # p.data / p.detach() of a lost p: lost too
                    result.__dict__["_tiermem_lost"] = "view"
            return result
        what = _name(func)
        lost = _lost(args)
        if lost is not None:
            if func in _REVIVE and args[0] is lost and lost.__dict__["_tiermem_lost"] is True:
                return _revive(func, args, kwargs)
            raise RuntimeError(
                "%s: this tensor's bytes went with its tiermem runtime, closed by "
                "close(force=True) when they could not come home: load a checkpoint into it "
                "(model.load_state_dict, or p.copy_(value) under torch.no_grad() on the "
                "parameter itself, not on its .data, gives it memory again)" %
                _describe(args, what))
        raise RuntimeError(
            "%s: this tensor's memory is offloaded by tiermem (its bytes are in tiermem and its "
            "own storage is freed), so it cannot be read or changed here. A parameter is in "
            "within its unit's forward and backward (a forward reading another unit's parameter "
            "needs units= that put both in one unit), or within ParameterOffload.gathered(); "
            "optimizer state within optimizer.step(); remove() brings either back for good"
            % (_describe(args, what)))

    def __format__(self, spec):
        return repr(self) if not spec else format(repr(self), spec)

    def __repr__(self):
        with DisableTorchFunction():
            shape, dtype = list(self.shape), self.dtype
        return "<%s offloaded by tiermem: shape %s, %s>" % (
            type(self).__mro__[2].__name__, shape, str(dtype).replace("torch.", ""))


def _call(func, args, kwargs):
    with DisableTorchFunction():
        return func(*args, **kwargs)


def _name(func):
    """The function's name; a property's own name for its __get__ / __set__ (p.T: "T")."""
    name = getattr(func, "__name__", str(func))
    if name in ("__get__", "__set__", "__delete__"):
        owner = getattr(getattr(func, "__self__", None), "__name__", None)
        if owner:
            return "%s (%s)" % (owner, "read" if name == "__get__" else "set")
    return name


def _describe(args, what):
    for a in args:
        if isinstance(a, _Offloaded):
            with DisableTorchFunction():
                return "%s on a %s tensor of shape %s" % (
                    what, str(a.dtype).replace("torch.", ""), list(a.shape))
    return what


_classes = {}


def offloaded_class(cls):
    """The offloaded kind of cls (cached)."""
    if issubclass(cls, _Offloaded):
        return cls
    made = _classes.get(cls)
    if made is None:
        made = type("Offloaded" + cls.__name__, (_Offloaded, cls), {})
        _classes[cls] = made
    return made


def mark_out(t):
    """t's memory is freed: operations on it raise from now on."""
    if not isinstance(t, _Offloaded):
        t.__class__ = offloaded_class(type(t))


def mark_lost(t):
    """t's bytes went with a runtime closed by close(force=True): operations on it raise saying
    so, but for a copy_ into the whole of it or a .data set (load_state_dict), which gives it
    memory again and its own class."""
    mark_out(t)
    t.__dict__["_tiermem_lost"] = True


def _lost(args):
    for a in args:
        if isinstance(a, _Offloaded) and a.__dict__.get("_tiermem_lost"):
            return a
    return None


_REVIVE = {torch.Tensor.copy_, _DATA_SET}


def _revive(func, args, kwargs):
    t = args[0]
    with DisableTorchFunction():
        if func is not _DATA_SET:
            t.untyped_storage().resize_((t.storage_offset() + t.numel()) * t.element_size())
        result = func(*args, **kwargs)
    del t.__dict__["_tiermem_lost"]
    mark_in(t)
    return t if result is t else result


def mark_in(t):
    """t's memory is back: its own class again."""
    if isinstance(t, _Offloaded):
        t.__class__ = type(t).__mro__[2]
