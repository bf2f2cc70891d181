"""Parameter offload (ZeRO-Infinity), by unit as FSDP wraps: a unit is a module subtree (by
default each block of the model's largest ModuleList, and the root for the rest), and every
parameter of a unit is in before the unit's forward and backward, so that a module reading a
child's parameter directly (nn.MultiheadAttention reads out_proj.weight) finds it in. The next
units' parameters are prefetched into HBM while a unit runs, in forward and in backward order."""

import weakref

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ... import TiermemError, _capi
from .._shared.step_driver import _StepDriver
from .._shared.transfers import (_check_runtime, _check_tier, _owns_storage, _rehome, _resizable,
                                 _size_arg, _storage_key)
from .._shared.units import _unit_modules
from . import _state_dict as _param_state_dict
from ._views import SavedAliases, _eager, _outer_hooks, _ViewedParam, settle

# Modules and parameters held by a ParameterOffload (until its remove()): a second
# offload_parameters of them is refused. The values are weak references: the offload holds its
# module, so a strong one kept every key alive, and a runtime whose offload was never removed
# was never freed (its DRAM tier, threads and swap files: an outside client's sweep). The
# module keeps its offload alive through the hooks it holds.
_held = WeakIdKeyDictionary()


def _holder(key):
    """The ParameterOffload holding a module or parameter, or None."""
    ref = _held.get(key)
    return None if ref is None else ref()
_INVALID_HANDLE = _capi.STATUS_NAMES.index("TM_ERR_INVALID_HANDLE")


class _PreBackward(torch.autograd.Function):
    """Identity on a unit's outputs; in backward it brings the unit's parameters in before the
    unit's own backward runs."""

    @staticmethod
    def forward(ctx, offload, unit, *outputs):
        ctx.offload, ctx.unit = offload, unit
        return tuple(o.detach() for o in outputs)

    @staticmethod
    def backward(ctx, *grads):
        ctx.offload._before_backward(ctx.unit)
        return (None, None) + grads


# In a unit's pending set: the gradients of its inputs are still to come (_watch_inputs).
_INPUTS = "inputs"


class _Unit:
    """A module subtree whose parameters come and go together."""

    __slots__ = ("module", "records", "index", "hook_ids")

    def __init__(self, module, records):
        self.module, self.records, self.index, self.hook_ids = module, records, None, None


def _order_hooks(unit):
    """The unit's forward pre-hook of ours runs first, its forward hook last, so that hooks of
    the caller's own on the unit module (registered before offload_parameters or after) find
    its parameters in. Torch runs a module's hooks in the order of their dicts."""
    pre, post = unit.hook_ids
    for hooks, key, last in ((getattr(unit.module, "_forward_pre_hooks", None), pre, False),
                             (getattr(unit.module, "_forward_hooks", None), post, True)):
        if hooks is not None and key in hooks and hasattr(hooks, "move_to_end"):
            hooks.move_to_end(key, last=last)


def _refuse_held(module, optimizer):
    """Raises when module, one of its parameters or the optimizer's parameters are offloaded
    already: a second offload would free what the first one holds, and steps would fail."""
    if _holder(module) is not None:
        raise ValueError("offload_parameters: this %s's parameters are offloaded already (by an "
                         "earlier offload_parameters; its handle's remove() undoes it)" %
                         type(module).__name__)
    for name, p in module.named_parameters():
        if _holder(p) is not None:
            raise ValueError("offload_parameters: parameter %s is offloaded already (by an "
                             "earlier offload_parameters of a module holding it; its handle's "
                             "remove() undoes it)" % name)
    if optimizer is not None:
        driver = _StepDriver._existing(optimizer)
        if driver is not None and driver.params is not None:
            raise ValueError("offload_parameters: this optimizer steps parameters offloaded "
                             "already (one offload_parameters per optimizer: give it the module "
                             "holding all of them, or remove() the first)")
        owned = {id(p) for p in module.parameters()}
        theirs = [p for g in optimizer.param_groups for p in g["params"]]
        if theirs and not any(id(p) in owned for p in theirs):
            raise ValueError("offload_parameters: optimizer= steps none of this %s's parameters "
                             "(an optimizer of another model?): its step() through this handle "
                             "would never train the module" % type(module).__name__)


def _storages(module):
    """Storage key -> the distinct parameters and buffers of module on it. Storages that cannot
    be resized (torch.load's: load_state_dict(assign=True), from_pretrained) are replaced first
    by fresh ones with the same bytes (_rehome), so that they can be freed and refilled."""
    on = {}
    seen = set()
    for t in list(module.parameters()) + list(module.buffers()):
        if (id(t) in seen or t.layout != torch.strided or t.numel() == 0 or
                t.device.type == "meta"):
            continue
        seen.add(id(t))
        on.setdefault(_storage_key(t), []).append(t)
    params = {id(p) for p in module.parameters()}
    for key, tensors in list(on.items()):
        if not _resizable(tensors[0]) and any(id(t) in params for t in tensors):
            del on[key]
            _rehome(tensors)
            for t in tensors:
                on.setdefault(_storage_key(t), []).append(t)
    return on


class ParameterOffload:
    """Handle of offload_parameters: .gathered() (every parameter in, written back after),
    .step() (with optimizer=: its step, bucketed), .remove() (parameters back in ordinary
    tensors, hooks gone), .records, .units; .views (parameters brought in as views of their HBM
    copy) and .copies (copied in instead)."""

    def __init__(self, module, runtime, tier, optimizer, bucket_bytes, units=None, views=True):
        if not isinstance(module, torch.nn.Module):
            raise TypeError("module: expected a torch.nn.Module, got %s" % type(module).__name__)
        _check_runtime(runtime)
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError("optimizer: expected a torch.optim.Optimizer or None, got %s" %
                            type(optimizer).__name__)
        runtime._handle()  # a closed runtime raises here, before anything is changed
        _refuse_held(module, optimizer)
        self.module = module
        self.runtime = runtime
        self.tier = tier
        self._lost = 0  # parameters that went with a runtime closed by force (_abandon)
        self.use_views = bool(views)
        self.views = 0
        self.copies = 0
        self._resident = {}  # address of p.data's bytes -> record, the parameters in now
        # While a forward (and its backward) runs without saved-tensor hooks of ours (torch
        # before 2.8 under hooks it cannot read): every parameter is copied in, in place.
        self._copies_only = not self.use_views
        self._saving = None  # the SavedAliases entered for the forward running
        self._saving_unit = None  # the unit whose forward entered it
        self._viewed_bytes = 0  # bytes of the parameters in as views (their copies pinned)
        self._hbm_bytes = runtime.info()["tier_bytes"]["hbm"]
        blocks = _unit_modules(module, units)  # first: a bad policy leaves nothing behind
        self.records = {}  # id(param) -> _ViewedParam
        self._hooks, self._grad_hooks, self._driver = [], [], None
        try:
            self._offload(module, runtime, tier, optimizer, bucket_bytes, blocks)
        except BaseException:
            self.remove()  # what was offloaded comes back: the module as it was
            raise
        runtime._bring_home_at_close(self)  # close() brings them home first

    def _offload(self, module, runtime, tier, optimizer, bucket_bytes, blocks):
        _held[module] = weakref.ref(self)
        on = _storages(module)  # storage -> the parameters and buffers on it
        for name, p in module.named_parameters():
            if id(p) in self.records or not _owns_storage(p.data):
                continue  # tied (held once) or a view into a shared buffer (left alone)
            if len(on.get(_storage_key(p), ())) > 1:
                # Another tensor on its storage (a second Parameter object over the same
                # memory, a buffer): freeing the storage would free that one's too. Left alone.
                continue
            # The Parameter itself: its version counter tells whether a step changed it.
            self.records[id(p)] = _ViewedParam(runtime, p, "param", "param." + name, tier)
            _held[p] = weakref.ref(self)
        self.units = []
        in_block = set()
        for b in blocks:
            mine = [self.records[id(p)] for p in b.parameters() if id(p) in self.records]
            in_block.update(id(s) for s in mine)
            self.units.append(_Unit(b, mine))
        rest = [s for s in self.records.values() if id(s) not in in_block]
        self.units.insert(0, _Unit(module, rest))  # the root: what no block holds
        self._order = []  # units in the order their forwards ran (learned in the first)
        self._pending = {}  # unit -> ids of parameters whose gradient is still to come
        self._kept = set()  # units held since their backward (or always: unwrappable output)
        self._backward_hooked = False
        for u in self.units:
            pre = u.module.register_forward_pre_hook(_eager(self._pre_forward_of(u)))
            post = u.module.register_forward_hook(_eager(self._post_forward_of(u)))
            u.hook_ids = (pre.id, post.id)
            _order_hooks(u)
            self._hooks += [pre, post]
        self._loading = 0  # load_state_dict() calls running
        self._hooks += _param_state_dict.install(self)
        self.optimizer_aware = optimizer is not None
        if self.optimizer_aware:
            # Released after the unit's backward only when the step knows to bring them in.
            self._units_of = {}
            for u in self.units:
                for s in u.records:
                    self._units_of.setdefault(id(s.tensor), []).append(u)
            for s in self.records.values():
                if s.tensor.requires_grad:
                    self._grad_hooks.append(s.tensor.register_hook(self._grad_hook(id(s.tensor))))
            self._driver = _StepDriver._of(optimizer, bucket_bytes)
            self._driver.params = self

    # Reference counts: a tied parameter is held by each unit using it.
    def _hold(self, s, view=True):
        s.refs += 1
        if s.resident:
            return
        if s.bring_in(view=view and not self._copies_only):
            self.views += 1
            self._viewed_bytes += s.nbytes
        else:
            self.copies += 1
        self._resident[s.address] = s

    def _unhold(self, s, dirty=None):
        s.refs = max(0, s.refs - 1)
        if s.refs == 0:
            self._resident.pop(s.address, None)
            if s.view_ptr is not None:
                self._viewed_bytes -= s.nbytes
            s.let_go(dirty)

    def _start_saving(self, unit):
        """The outermost unit's forward starts: saved views of parameters are kept as their
        place in the parameter (SavedAliases), under the hooks already set, when torch lets
        them be read; else this forward and its backward copy parameters in."""
        self._saving_unit = unit
        if not self.use_views:
            return
        outer, known = _outer_hooks()
        self._copies_only = not known
        if known:
            saving = SavedAliases(self._resident, outer)
            try:
                saving.__enter__()
            except RuntimeError:
                self._copies_only = True  # saved-tensor hooks disabled here (torch says why)
                return
            self._saving = saving

    def _stop_saving(self):
        self._saving_unit = None
        saving, self._saving = self._saving, None
        if saving is not None:
            saving.__exit__(None, None, None)

    def _prefetch(self, unit, step):
        """Starts the parameters of the unit `step` places from `unit` in forward order on
        their way into HBM."""
        if unit.index is None:
            return
        i = unit.index + step
        if 0 <= i < len(self._order):
            for s in self._order[i].records:
                s.prefetch("hbm")

    def _hold_unit(self, unit, step):
        """Brings unit in; the unit `step` places from it (forward order) comes next. Its
        parameters view their HBM copies when HBM holds them beside the views already in and
        the next unit, whose prefetch then finds room; else they are copied in (into PyTorch's
        memory, beyond HBM's budget), as FSDP double-buffers, so that the next unit's copy
        still overlaps this one's compute."""
        need = self._viewed_bytes + sum(s.nbytes for s in unit.records if not s.resident)
        if unit.index is not None and 0 <= unit.index + step < len(self._order):
            need += sum(s.nbytes for s in self._order[unit.index + step].records)
        view = need <= self._hbm_bytes
        for s in unit.records:
            s.prefetch()  # NVMe -> DRAM for all of them first, then one by one in
        for s in unit.records:
            self._hold(s, view)

    def _pre_forward_of(self, unit):
        def hook(module, inputs):
            if module is not unit.module:
                return  # a copy of the module (copy.deepcopy) carries the hook: not ours
            _order_hooks(unit)  # hooks of the caller's own, registered since, inside ours
            self._backward_hooked = False  # a backward that raised never ran its callback
            if self._saving_unit is unit:
                self._stop_saving()  # its forward raised: the post-forward hook never ran
            if self._saving_unit is None and torch.is_grad_enabled():
                self._start_saving(unit)
            if unit.index is None:
                unit.index = len(self._order)
                self._order.append(unit)
            self._prefetch(unit, +1)
            if self.optimizer_aware and torch.is_grad_enabled():
                self._watch_inputs(unit, inputs)
            if unit in self._kept:
                self._kept.discard(unit)  # held since its backward: that hold is this forward's
                return
            self._hold_unit(unit, +1)
        return hook

    def _watch_inputs(self, unit, inputs):
        """A unit with frozen parameters (a LoRA's base weights, a frozen norm) gets no gradient
        for them, yet its backward may read them after its last gradient came (a norm at its
        start): it is let go once the gradients of its inputs are computed too (autograd runs
        every op between the unit's outputs and its inputs before), or after the backward when
        no positional input wants a gradient."""
        if all(s.tensor.requires_grad for s in unit.records):
            return
        tensors = [t for t in inputs if torch.is_tensor(t) and t.requires_grad]
        if tensors:
            torch.autograd.graph.register_multi_grad_hook(
                tensors, lambda grads: self._inputs_done(unit))

    def _inputs_done(self, unit):
        pending = self._pending.get(unit)
        if pending is not None and _INPUTS in pending:
            pending.discard(_INPUTS)
            if not pending:
                self._release_unit(unit)

    def _post_forward_of(self, unit):
        def hook(module, inputs, output):
            if module is not unit.module:
                return output
            if self._saving_unit is unit:
                self._stop_saving()
            if not torch.is_grad_enabled():
                for s in unit.records:
                    self._unhold(s)
                return output
            tensors = [output] if torch.is_tensor(output) else (
                list(output) if isinstance(output, (tuple, list)) else None)
            if tensors is None or not all(torch.is_tensor(o) for o in tensors):
                # Not wrappable, so its backward cannot say when it starts: the parameters stay.
                self._kept.add(unit)
                return output
            for s in unit.records:
                self._unhold(s)
            if not any(o.requires_grad for o in tensors):
                return output
            wrapped = _PreBackward.apply(self, unit, *tensors)
            if torch.is_tensor(output):
                return wrapped[0]
            return type(output)(wrapped) if isinstance(output, tuple) else list(wrapped)
        return hook

    def _before_backward(self, unit):
        if not self._backward_hooked:
            self._backward_hooked = True
            torch.autograd.Variable._execution_engine.queue_callback(self._after_backward)
        self._prefetch(unit, -1)  # the backward runs the units in reverse
        if unit in self._pending or unit in self._kept:
            return  # a unit whose outputs get gradients twice is brought in once
        self._hold_unit(unit, -1)
        if self.optimizer_aware:
            # Let go when its last gradient came; a unit with frozen parameters, once its
            # inputs' gradients came too (_watch_inputs), or after the backward (the mark
            # _INPUTS stays: no input wanted a gradient).
            pending = {id(s.tensor) for s in unit.records if s.tensor.requires_grad}
            if len(pending) < len(unit.records):
                pending.add(_INPUTS)
            self._pending[unit] = pending
        else:
            self._kept.add(unit)  # let go by its next forward, which writes back a change

    def _release_unit(self, unit):
        self._pending.pop(unit, None)
        for s in unit.records:
            self._unhold(s)

    def _grad_hook(self, pid):
        def hook(grad):
            for unit in self._units_of.get(pid, ()):
                pending = self._pending.get(unit)
                if pending is not None and pid in pending:
                    pending.discard(pid)
                    if not pending:
                        self._release_unit(unit)
            return grad
        return hook

    def _after_backward(self):
        self._backward_hooked = False
        if self.optimizer_aware:
            # Whatever a gradient hook did not let go (no gradient this time): let go now.
            for unit in list(self._pending):
                self._release_unit(unit)

    def step(self, closure=None):
        """The optimizer's step (given as optimizer=) in buckets of bucket_bytes: each bucket's
        parameters (and state, with offload_optimizer_state) brought in while the next bucket's
        are prefetched, and let go after. The optimizer's own step() also works, bringing all
        of them in at once. The same step as OptimizerStateOffload.step()."""
        if self._driver is None:
            if self.runtime.closed and self._lost:
                raise TiermemError(_INVALID_HANDLE, "ParameterOffload.step: the runtime was "
                                   "closed by close(force=True) and %d parameters went with it: "
                                   "load a checkpoint into the model (load_state_dict), then "
                                   "step the optimizer itself" % self._lost)
            if self.runtime.closed:  # close() brought the parameters home, as remove() does
                raise TiermemError(_INVALID_HANDLE, "ParameterOffload.step: the runtime was "
                                   "closed, which brought the parameters home into ordinary "
                                   "tensors: step the optimizer itself")
            raise ValueError("ParameterOffload.step: offload_parameters was not given the "
                             "optimizer (optimizer=...), or remove() was called")
        state = self._driver.state
        if state is not None:
            # Through the state's handle as the user's code would call it: whatever wraps its
            # step (an LR scheduler's counter, built on that handle) sees this step.
            return state.step(closure)
        return self._driver.step(closure)

    def _optimizer(self, what):
        opt = self._driver._optimizer() if self._driver is not None else None
        if opt is None:
            raise ValueError("ParameterOffload.%s: offload_parameters was not given the "
                             "optimizer (optimizer=...), or remove() was called" % what)
        return opt

    @property
    def param_groups(self):
        """The optimizer's (given as optimizer=): torch.amp.GradScaler.step(params) unscales
        their gradients, then steps through params.step()."""
        return self._optimizer("param_groups").param_groups

    def zero_grad(self, set_to_none=True):
        """The optimizer's zero_grad (given as optimizer=)."""
        self._optimizer("zero_grad").zero_grad(set_to_none=set_to_none)

    def gathered(self):
        """Context manager: every parameter in (to read or change them); written back and
        freed after."""
        offload = self

        class _Gathered:
            def __enter__(self):
                for s in offload.records.values():
                    offload._hold(s)
                return offload.module

            def __exit__(self, *exc):
                for s in offload.records.values():
                    offload._unhold(s)

        return _Gathered()

    def remove(self):
        """Parameters back in ordinary tensors; hooks removed; tiermem's copies destroyed."""
        settle()  # a view's release a Ctrl-C stopped before it began
        if self._saving_unit is not None:
            self._stop_saving()  # a forward that raised left its hooks set
        for h in self._hooks + self._grad_hooks:
            h.remove()
        self._hooks, self._grad_hooks = [], []
        # After close(force=True) the bytes went with the runtime: nothing to bring back (the
        # parameters stay without data; load a checkpoint into them).
        if not self.runtime.closed:
            for s in self.records.values():
                s.restore()
        self._forget()

    def _abandon(self):
        """close(force=True), remove() having failed: the hooks go, the parameters that can
        still come home do (those in: a view's bytes copied into the parameter's own memory),
        the others are lost with the runtime: reading one raises saying so, and loading a
        checkpoint into it (load_state_dict) gives it memory again. Returns how many were
        lost."""
        for h in self._hooks + self._grad_hooks:
            h.remove()
        self._hooks, self._grad_hooks = [], []
        lost = self._lost = sum(not s.home_or_lose() for s in self.records.values())
        self._forget()
        return lost

    def _forget(self):
        for p in [p for p, ref in _held.items() if ref() is self]:
            del _held[p]
        if _holder(self.module) is self:
            del _held[self.module]
        self.records.clear()
        if self._driver is not None:
            self._driver.params = None
            self._driver._detach_if_unused()
            self._driver = None  # a second remove() (or the runtime's close()) does nothing


def offload_parameters(module, runtime, tier="dram", optimizer=None, bucket_bytes=64 << 20,
                       units=None, views=True):
    """ZeRO-Infinity: the module's parameter data lives in tiermem, brought in by unit (units:
    None for each block of the model's largest ModuleList, a collection of module classes, a
    callable(module) -> bool, or a collection of submodules; the root holds the rest). A
    unit's parameters are brought in before its forward and let go after, brought in again for
    its backward, while the next unit's are prefetched into HBM. With optimizer (the one
    stepping these parameters), they are let go after the unit's backward too, and the handle's
    step() steps the optimizer bucket by bucket, bringing them in (with their state, when
    offload_optimizer_state is used as well); optimizer.step() itself brings all of them in at
    once (torch's step hooks; the optimizer is not patched). Without one, the backward leaves
    them in until the next forward lets each go. Tied parameters are held once; parameters that
    are views into a shared buffer are left alone. While in, a parameter's data is a view of its
    tiermem copy in HBM (views=True, the default; no copy), released when it goes out, and
    marked changed first when it was written (the optimizer's step, or any in-place change: its
    version); it is copied into its own memory instead when it cannot view (no room in HBM, a
    CPU parameter with a CUDA runtime, a dtype that cannot view bytes, views=False, or torch
    before 2.8 under saved-tensor hooks it cannot read). Returns a handle (gathered(), step(),
    remove())."""
    return ParameterOffload(module, runtime, _check_tier(tier), optimizer,
                            _size_arg(bucket_bytes, "bucket_bytes"), units, views)
