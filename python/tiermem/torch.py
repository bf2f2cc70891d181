"""tiermem for PyTorch: saved-tensor (activation), optimizer-state and parameter offload.

    import tiermem, tiermem.torch
    rt = tiermem.Runtime(dram_bytes="4GiB", nvme_paths="/mnt/nvme")
    params = tiermem.torch.offload_parameters(model, rt, tier="nvme", optimizer=opt)
    tiermem.torch.offload_optimizer_state(opt, rt, tier="dram")
    for batch in data:
        with rt.step(), tiermem.torch.offload_saved_tensors(rt, tier="dram"):
            loss = model(batch).sum()
            loss.backward()
        opt.step()

Bytes move with tm_tensor_copy_in / copy_out: CUDA tensors on the current stream (no host
synchronization), CPU tensors without a stream followed by tm_tensor_sync.
"""

import ctypes
import weakref

import torch

from . import Runtime, TiermemError, _capi, _tier

__all__ = ["offload_saved_tensors", "offload_optimizer_state", "offload_parameters",
           "SavedTensorOffload", "OptimizerStateOffload", "ParameterOffload"]

_TIER_HOME = {"dram": "dram", "nvme": "dram"}  # NVMe tensors are written to DRAM, then offloaded


def _check_tier(tier):
    name = _capi.TIER_NAMES[_tier(tier)]
    if name not in _TIER_HOME:
        raise ValueError("tier=%r: offload goes to \"dram\" or \"nvme\"" % (tier,))
    return name


# cudaStreamLegacy: PyTorch's default stream reports cuda_stream == 0, which the C API takes as
# "no stream" (unordered); the legacy default stream is what 0 means to CUDA.
_CUDA_STREAM_LEGACY = 0x1


def _stream(t, rt=None):
    """The cudaStream_t (an int) the copy is ordered on: the current stream of a CUDA tensor's
    device; None for CPU tensors (copy without a stream, then tm_tensor_sync). A CUDA tensor
    needs a runtime on the CUDA device: the emulated device cannot tell its memory from the
    host's."""
    if t.device.type == "cuda":
        if rt is not None and not _is_cuda_runtime(rt):
            raise ValueError("a CUDA tensor needs a tiermem runtime on the CUDA device "
                             "(device=\"cuda\"); this one uses %s" % rt.info()["device"])
        return torch.cuda.current_stream(t.device).cuda_stream or _CUDA_STREAM_LEGACY
    return None


def _is_cuda_runtime(rt):
    cached = getattr(rt, "_tiermem_cuda", None)
    if cached is None:
        cached = bool(rt.info()["hbm_device_pointers"])
        try:
            rt._tiermem_cuda = cached
        except AttributeError:
            pass
    return cached


def _resize_storage(t, nbytes):
    """Frees (0) or reallocates the memory under t, keeping the tensor object, its views and its
    autograd identity (as FSDP does with parameters)."""
    if hasattr(t, "untyped_storage"):
        t.untyped_storage().resize_(nbytes)
    else:
        t.storage().resize_(nbytes // t.element_size())


def _storage_nbytes(t):
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage().nbytes()
    return t.storage().size() * t.element_size()


def _owns_storage(t):
    """t alone spans its whole storage, contiguous: its memory can be freed and refilled."""
    return (t.layout == torch.strided and t.is_contiguous() and t.storage_offset() == 0 and
            _storage_nbytes(t) == t.numel() * t.element_size() and t.numel() > 0)


def _send(tm, t, nbytes, tier):
    """Copies the first nbytes at t's address into tm, then starts it down to NVMe for tier nvme.
    Without a stream the source must stay unchanged until the copy is done: sync first."""
    stream = _stream(t, tm._rt)
    tm.copy_in(t.data_ptr(), nbytes, 0, stream)
    if stream is None:
        tm.sync()
    if tier == "nvme":
        tm.offload("nvme")


def _fetch(tm, t, nbytes):
    """Copies tm into the memory at t's address; on return t may be used on the current stream
    (CUDA) or at once (CPU)."""
    stream = _stream(t, tm._rt)
    tm.copy_out(t.data_ptr(), nbytes, 0, stream)
    if stream is None:
        tm.sync()


def _destroy_quietly(tm):
    try:
        if not tm._rt.closed:
            tm.destroy()
    except TiermemError:
        pass  # the runtime went first: its tensors went with it


# ---------------------------------------------------------------------------------------------
# Saved tensors (activations)


class _Packed:
    """A saved tensor held by tiermem. Its tiermem tensor lives as long as autograd keeps this
    object (until the backward that used it, or until the graph is freed without one)."""

    __slots__ = ("tm", "dtype", "device", "size", "stride", "span", "dense", "compact_size",
                 "__weakref__")

    def __del__(self):
        _destroy_quietly(self.tm)


def _is_parameter(t):
    if isinstance(t, torch.nn.Parameter):
        return True
    base = getattr(t, "_base", None)
    return base is not None and isinstance(base, torch.nn.Parameter)


class SavedTensorOffload(torch.autograd.graph.saved_tensors_hooks):
    """Context manager (see offload_saved_tensors). Counters: .packed, .packed_bytes, .skipped;
    .error: the TiermemError that stopped offloading, if any.

    PyTorch turns an exception raised inside a hook into a plain RuntimeError. So a failed pack
    keeps that tensor (and the rest of the context's) in memory, the forward runs on, and the
    TiermemError is raised when the context exits. A failed unpack (in backward) raises at once:
    a RuntimeError naming the TiermemError, turned back into the TiermemError itself when the
    backward ran inside the context."""

    def __init__(self, runtime, tier="dram", min_bytes=16384):
        if not isinstance(runtime, Runtime):
            raise TypeError("runtime: expected a tiermem.Runtime, got %s" %
                            type(runtime).__name__)
        self.runtime = runtime
        self.tier = _check_tier(tier)
        self.min_bytes = int(min_bytes)
        self.packed = 0
        self.packed_bytes = 0
        self.skipped = 0
        self.error = None
        super().__init__(self._pack, self._unpack)

    def __enter__(self):
        self.error = None
        super().__enter__()
        return self  # `with offload_saved_tensors(...) as hooks:` reads .packed, .skipped

    def __exit__(self, exc_type, exc, tb):
        super().__exit__(exc_type, exc, tb)
        if self.error is not None and not isinstance(exc, TiermemError) and (
                exc is None or isinstance(exc, RuntimeError)):
            raise self.error from exc
        return False

    def _keep(self, t):
        """True when t stays with autograd as it is."""
        if (t.layout != torch.strided or t.is_quantized or t.device.type not in ("cpu", "cuda")
                or t.numel() == 0):
            return True
        if _is_parameter(t):
            return True  # parameters (and views of them) are the model's, not activations
        return t.numel() * t.element_size() < self.min_bytes

    def _pack(self, t):
        if self.error is not None or self._keep(t):
            self.skipped += 1
            return t
        p = _Packed()
        p.dtype, p.device = t.dtype, t.device
        p.size, p.stride = tuple(t.size()), tuple(t.stride())
        numel = t.numel()
        # Elements from the first to the last one the view reaches (strides are never negative).
        span = 1 + sum((n - 1) * s for n, s in zip(p.size, p.stride))
        # Copy the span as it lies (dense, overlapping or expanded, or with small gaps) and
        # rebuild the same strides over it; a view with large gaps is copied compactly.
        p.dense = span <= 2 * numel
        if p.dense:
            src, p.span = t, span
        else:
            # Expanded dimensions (stride 0) are kept once and expanded again in unpack.
            src = t
            for dim, (n, s) in enumerate(zip(p.size, p.stride)):
                if s == 0 and n > 1:
                    src = src.narrow(dim, 0, 1)
            p.compact_size = tuple(src.size())
            src = src.contiguous()
            p.span = src.numel()
        nbytes = p.span * t.element_size()
        try:
            p.tm = self.runtime.tensor(nbytes, "activation", _TIER_HOME[self.tier],
                                       self.runtime.next_name("saved"))
        except TiermemError as e:
            self.error = e
            return t
        try:
            _send(p.tm, src, nbytes, self.tier)
        except TiermemError as e:
            _destroy_quietly(p.tm)
            self.error = e
            return t
        self.packed += 1
        self.packed_bytes += nbytes
        return p

    def _unpack(self, p):
        if isinstance(p, torch.Tensor):
            return p
        if p.tm._h is None:
            raise TiermemError(_capi.STATUS_NAMES.index("TM_ERR_INVALID_HANDLE"),
                               "saved tensor %r was already released" % p.tm.name)
        try:
            if p.dense:
                buf = torch.empty(p.span, dtype=p.dtype, device=p.device)
                _fetch(p.tm, buf, p.tm.nbytes)
                return buf.as_strided(p.size, p.stride)
            compact = torch.empty(p.compact_size, dtype=p.dtype, device=p.device)
            _fetch(p.tm, compact, p.tm.nbytes)
        except TiermemError as e:
            self.error = e
            raise
        out = torch.empty_strided(p.compact_size, p.stride, dtype=p.dtype, device=p.device)
        return out.copy_(compact).expand(p.size)


def offload_saved_tensors(runtime, tier="dram", min_bytes=16384):
    """Like torch.autograd.graph.save_on_cpu: inside the context, every tensor autograd saves
    for backward (min_bytes and larger; parameters excepted) is copied into tiermem and read
    back when the backward needs it. tier "dram" keeps it in pinned DRAM (spilling to NVMe when
    the DRAM budget is full); "nvme" writes it on to NVMe at once. Names ("saved.N", counted
    from each rt.step()) repeat step after step, so the schedule prefetches the backward's
    tensors ahead."""
    return SavedTensorOffload(runtime, tier, min_bytes)


# ---------------------------------------------------------------------------------------------
# Optimizer state and parameters: a tensor whose memory is freed between uses (storage resized
# to 0) while tiermem holds its bytes.


class _Swapped:
    """One torch tensor whose bytes live in tiermem between uses."""

    __slots__ = ("tensor", "tm", "nbytes", "tier", "resident", "version", "refs")

    def __init__(self, runtime, tensor, cls, name, tier):
        self.tensor = tensor
        self.nbytes = tensor.numel() * tensor.element_size()
        self.tier = tier
        self.tm = runtime.tensor(self.nbytes, cls, _TIER_HOME[tier], name)
        self.refs = 0
        try:
            self.send()
        except BaseException:
            _destroy_quietly(self.tm)
            raise

    def send(self):
        """Copies the tensor's bytes to tiermem and frees its memory."""
        _send(self.tm, self.tensor, self.nbytes, self.tier)
        _resize_storage(self.tensor, 0)
        self.resident = False

    def prefetch(self):
        if not self.resident and self.tier == "nvme":
            self.tm.prefetch("dram")

    def bring_in(self):
        if self.resident:
            return
        _resize_storage(self.tensor, self.nbytes)
        try:
            _fetch(self.tm, self.tensor, self.nbytes)
        except BaseException:
            _resize_storage(self.tensor, 0)
            raise
        self.resident = True
        self.version = self.tensor._version

    def let_go(self, dirty=None):
        """Frees the memory; writes the bytes back first when they changed since bring_in."""
        if not self.resident:
            return
        if dirty is None:
            dirty = self.tensor._version != self.version
        if dirty:
            self.send()
        else:
            _resize_storage(self.tensor, 0)
            self.resident = False

    def restore(self):
        """Back to an ordinary tensor: resident, and tiermem's copy destroyed."""
        self.bring_in()
        _destroy_quietly(self.tm)


def _chunks(optimizer, bucket_bytes):
    """(group, params) pieces of at most bucket_bytes of parameters (one parameter at least)."""
    for group in optimizer.param_groups:
        piece, size = [], 0
        for p in group["params"]:
            n = p.numel() * p.element_size()
            if piece and size + n > bucket_bytes:
                yield group, piece
                piece, size = [], 0
            piece.append(p)
            size += n
        if piece:
            yield group, piece


class _StepDriver:
    """Wraps optimizer.step: each bucket of parameters is stepped alone, with its state (and its
    parameters, when offloaded) brought in first while the next bucket is prefetched, and sent
    back after. One per optimizer, shared by the state and parameter offloads."""

    def __init__(self, optimizer, bucket_bytes):
        self.optimizer = optimizer
        self.bucket_bytes = bucket_bytes
        self.state = None  # OptimizerStateOffload
        self.params = None  # ParameterOffload
        self._step = optimizer.step
        self._state_dict = optimizer.state_dict
        self._load_state_dict = optimizer.load_state_dict
        optimizer.step = self.step
        optimizer.state_dict = self.state_dict
        optimizer.load_state_dict = self.load_state_dict

    @staticmethod
    def of(optimizer, bucket_bytes):
        driver = getattr(optimizer, "_tiermem_driver", None)
        if driver is None:
            driver = _StepDriver(optimizer, bucket_bytes)
            optimizer._tiermem_driver = driver
        return driver

    def detach_if_unused(self):
        if self.state is None and self.params is None:
            opt = self.optimizer
            opt.step, opt.state_dict = self._step, self._state_dict
            opt.load_state_dict = self._load_state_dict
            del opt._tiermem_driver

    def _swapped(self, ps):
        out = []
        for p in ps:
            if self.params is not None and id(p) in self.params.records:
                out.append(("param", self.params.records[id(p)]))
            if self.state is not None:
                out.extend(("state", s) for s in self.state.records.get(id(p), {}).values())
        return out

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        opt = self.optimizer
        pieces = list(_chunks(opt, self.bucket_bytes))
        groups = opt.param_groups
        swapped = [self._swapped(ps) for _, ps in pieces]
        for _, s in swapped[0] if swapped else ():
            s.prefetch()
        for i, (group, ps) in enumerate(pieces):
            if i + 1 < len(pieces):
                for _, s in swapped[i + 1]:
                    s.prefetch()  # NVMe -> DRAM while this bucket updates
            for kind, s in swapped[i]:
                if kind == "param":
                    self.params.hold(s)
                else:
                    s.bring_in()
            all_params = group["params"]
            try:
                group["params"] = ps
                opt.param_groups = [group]
                self._step()
            finally:
                group["params"] = all_params
                opt.param_groups = groups
            if self.state is not None:
                self.state.adopt(ps)
            for kind, s in swapped[i]:
                if kind == "param":
                    self.params.unhold(s, dirty=True)
                else:
                    s.let_go(dirty=True)
        return loss

    def state_dict(self):
        """The optimizer's state_dict with every offloaded state tensor brought in and copied."""
        held = []
        if self.state is not None:
            for per_param in self.state.records.values():
                for s in per_param.values():
                    s.bring_in()
                    held.append(s)
        try:
            sd = self._state_dict()
            sd["state"] = {k: {n: (v.clone() if torch.is_tensor(v) else v) for n, v in st.items()}
                           for k, st in sd["state"].items()}
        finally:
            for s in held:
                s.let_go()
        return sd

    def load_state_dict(self, state_dict):
        """Loads, then offloads the loaded state again."""
        if self.state is not None:
            self.state.release_all()
        self._load_state_dict(state_dict)
        if self.state is not None:
            for group in self.optimizer.param_groups:
                self.state.adopt(group["params"])


class OptimizerStateOffload:
    """Handle of offload_optimizer_state: .remove() brings the state back and unhooks."""

    def __init__(self, optimizer, runtime, tier, min_bytes, bucket_bytes):
        self.optimizer = optimizer
        self.runtime = runtime
        self.tier = tier
        self.min_bytes = min_bytes
        self.records = {}  # id(param) -> {state key: _Swapped}
        self._index = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                self._index[id(p)] = len(self._index)
        self.driver = _StepDriver.of(optimizer, bucket_bytes)
        if self.driver.state is not None:
            raise ValueError("offload_optimizer_state: this optimizer's state is offloaded already")
        self.driver.state = self
        for group in optimizer.param_groups:
            self.adopt(group["params"])

    def adopt(self, params):
        """Offloads the state tensors of params not yet held (new after a first step)."""
        for p in params:
            state = self.optimizer.state.get(p)
            if not state:
                continue
            per_param = self.records.setdefault(id(p), {})
            for key, v in state.items():
                if key in per_param and per_param[key].tensor is v:
                    continue
                if (not torch.is_tensor(v) or not _owns_storage(v) or
                        v.numel() * v.element_size() < self.min_bytes):
                    continue
                if key in per_param:
                    _destroy_quietly(per_param.pop(key).tm)  # replaced by the optimizer
                name = "optim.%d.%s" % (self._index.get(id(p), -1), key)
                per_param[key] = _Swapped(self.runtime, v, "optimizer_state", name, self.tier)

    def release_all(self):
        for per_param in self.records.values():
            for s in per_param.values():
                s.restore()
        self.records.clear()

    def remove(self):
        """The state back in ordinary tensors; optimizer.step unwrapped."""
        self.release_all()
        self.driver.state = None
        self.driver.detach_if_unused()


def offload_optimizer_state(optimizer, runtime, tier="dram", min_bytes=4096,
                            bucket_bytes=64 << 20):
    """ZeRO-Offload: the optimizer's state tensors (Adam's moments, any optimizer's tensors of
    min_bytes or more) live in tiermem between steps. optimizer.step() updates the parameters in
    buckets of bucket_bytes: each bucket's state is brought in while the next one is prefetched
    from NVMe, and sent back after. state_dict() and load_state_dict() keep working. Returns a
    handle whose remove() undoes it."""
    return OptimizerStateOffload(optimizer, runtime, _check_tier(tier), int(min_bytes),
                                 int(bucket_bytes))


class _PreBackward(torch.autograd.Function):
    """Identity on a module's outputs; in backward it brings the module's parameters in before
    the module's own backward runs."""

    @staticmethod
    def forward(ctx, offload, module, *outputs):
        ctx.offload, ctx.module = offload, module
        return tuple(o.detach() for o in outputs)

    @staticmethod
    def backward(ctx, *grads):
        ctx.offload._before_backward(ctx.module)
        return (None, None) + grads


class ParameterOffload:
    """Handle of offload_parameters: .gathered() (every parameter in, written back after),
    .remove() (parameters back in ordinary tensors, hooks gone), .records."""

    def __init__(self, module, runtime, tier, optimizer, bucket_bytes):
        self.module = module
        self.runtime = runtime
        self.tier = tier
        self.records = {}  # id(param) -> _Swapped
        self._owners = {}  # module -> [records of its direct parameters]
        self._pending = {}  # module -> ids of parameters whose gradient is still to come
        self._kept = set()  # modules held since their backward (or always: unwrappable output)
        self._backward_hooked = False
        self._hooks = []
        self.optimizer_aware = optimizer is not None
        for name, p in module.named_parameters():
            if id(p) in self.records or not _owns_storage(p.data):
                continue  # tied (held once) or a view into a shared buffer (left alone)
            # The Parameter itself: its version counter tells whether a step changed it.
            self.records[id(p)] = _Swapped(runtime, p, "param", "param." + name, tier)
        for m in module.modules():
            mine = [self.records[id(p)] for p in m.parameters(recurse=False)
                    if id(p) in self.records]
            if not mine:
                continue
            self._owners[m] = mine
            self._hooks.append(m.register_forward_pre_hook(self._pre_forward))
            self._hooks.append(m.register_forward_hook(self._post_forward))
        self._grad_hooks = []
        if self.optimizer_aware:
            # Released after the module's backward only when the step knows to bring them in.
            for m, mine in self._owners.items():
                for p in m.parameters(recurse=False):
                    if id(p) in self.records and p.requires_grad:
                        self._grad_hooks.append(p.register_hook(self._grad_hook(m, id(p))))
            self.driver = _StepDriver.of(optimizer, bucket_bytes)
            self.driver.params = self
        else:
            self.driver = None

    # Reference counts: a tied parameter is held by each module using it.
    def hold(self, s):
        s.refs += 1
        s.bring_in()

    def unhold(self, s, dirty=None):
        s.refs = max(0, s.refs - 1)
        if s.refs == 0:
            s.let_go(dirty)

    def _pre_forward(self, module, inputs):
        self._backward_hooked = False  # a backward that raised never ran its callback
        if module in self._kept:
            self._kept.discard(module)  # held since its backward: that hold is this forward's
            return
        mine = self._owners[module]
        for s in mine:
            s.prefetch()
        for s in mine:
            self.hold(s)

    def _post_forward(self, module, inputs, output):
        mine = self._owners[module]
        if not torch.is_grad_enabled():
            for s in mine:
                self.unhold(s)
            return output
        tensors = [output] if torch.is_tensor(output) else (
            list(output) if isinstance(output, (tuple, list)) else None)
        if tensors is None or not all(torch.is_tensor(o) for o in tensors):
            # Not wrappable, so its backward cannot say when it starts: the parameters stay in.
            self._kept.add(module)
            return output
        for s in mine:
            self.unhold(s)
        if not any(o.requires_grad for o in tensors):
            return output
        wrapped = _PreBackward.apply(self, module, *tensors)
        if torch.is_tensor(output):
            return wrapped[0]
        return type(output)(wrapped) if isinstance(output, tuple) else list(wrapped)

    def _before_backward(self, module):
        if not self._backward_hooked:
            self._backward_hooked = True
            torch.autograd.Variable._execution_engine.queue_callback(self._after_backward)
        if module in self._pending or module in self._kept:
            return  # a module whose outputs get gradients twice is brought in once
        for s in self._owners[module]:
            self.hold(s)
        if self.optimizer_aware:
            self._pending[module] = {id(p) for p in module.parameters(recurse=False)
                                     if id(p) in self.records and p.requires_grad}
        else:
            self._kept.add(module)  # let go by its next forward, which writes back a change

    def _grad_hook(self, module, pid):
        def hook(grad):
            pending = self._pending.get(module)
            if pending is not None and pid in pending:
                pending.discard(pid)
                if not pending:
                    del self._pending[module]
                    for s in self._owners[module]:
                        self.unhold(s)
            return grad
        return hook

    def _after_backward(self):
        self._backward_hooked = False
        if self.optimizer_aware:
            # Whatever a gradient hook did not let go (no gradient this time): let go now.
            for module in list(self._pending):
                del self._pending[module]
                for s in self._owners[module]:
                    self.unhold(s)

    def gathered(self):
        """Context manager: every parameter in (to read or change them); written back and
        freed after."""
        offload = self

        class _Gathered:
            def __enter__(self):
                for s in offload.records.values():
                    offload.hold(s)
                return offload.module

            def __exit__(self, *exc):
                for s in offload.records.values():
                    offload.unhold(s)

        return _Gathered()

    def remove(self):
        """Parameters back in ordinary tensors; hooks removed; tiermem's copies destroyed."""
        for h in self._hooks + self._grad_hooks:
            h.remove()
        self._hooks, self._grad_hooks = [], []
        for s in self.records.values():
            s.restore()
        self.records.clear()
        if self.driver is not None:
            self.driver.params = None
            self.driver.detach_if_unused()


def offload_parameters(module, runtime, tier="dram", optimizer=None, bucket_bytes=64 << 20):
    """ZeRO-Infinity: the module's parameter data lives in tiermem. A submodule's parameters are
    brought in before its forward and let go after; brought in again for its backward. With
    optimizer (the one stepping these parameters), they are let go after the module's backward
    too, and optimizer.step() brings them in bucket by bucket (with their state, when
    offload_optimizer_state is used as well); without one, the backward leaves them in until the
    next forward lets each go. Tied parameters are held once; parameters that are views into a
    shared buffer are left alone. Returns a handle (gathered(), remove())."""
    return ParameterOffload(module, runtime, _check_tier(tier), optimizer, int(bucket_bytes))
