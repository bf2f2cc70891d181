"""Optimizer-state offload (ZeRO-Offload), stepped by the driver it shares with parameter offload.

Nothing of the user's optimizer is replaced: its step, state_dict and load_state_dict stay its
own, and an LR scheduler's wrapper of its step (made before or after) stays in place through
remove(). tiermem hooks it through torch's removable optimizer hooks, which keep what is called
on the optimizer itself correct: optimizer.step() brings all of its offloaded state (and
parameters) in first and sends them back after; state_dict() returns copies; load_state_dict()
offloads what it loaded. The bucketed step, each bucket's state and parameters brought in while
the next bucket's are prefetched, is the step of the handle offload_optimizer_state returns
(and of ParameterOffload): a wrapper, as torchao's CPUOffloadOptimizer wraps its optimizer."""

import torch

from .._shared.step_driver import _all_params, _StepDriver
from .._shared.swapped import _Swapped
from .._shared.transfers import (_check_runtime, _check_tier, _destroy_quietly, _owns_storage,
                                 _resizable, _size_arg)


class OptimizerStateOffload(torch.optim.Optimizer):
    """What offload_optimizer_state returns: the optimizer wrapped, as torchao's
    CPUOffloadOptimizer wraps its own. .step() is the bucketed step; .zero_grad(),
    .state_dict(), .load_state_dict(), .add_param_group(), .param_groups, .state and .defaults
    are the optimizer's. An Optimizer in type only (Optimizer.__init__ is not called), so that
    torch's LR schedulers take it; hooks go on the optimizer itself. .remove() brings the
    state back into ordinary tensors and takes tiermem's hooks off the optimizer."""

    def __init__(self, optimizer, runtime, tier, min_bytes, bucket_bytes):
        if isinstance(optimizer, OptimizerStateOffload):
            raise ValueError("offload_optimizer_state: this optimizer's state is offloaded already")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError("optimizer: expected a torch.optim.Optimizer, got %s" %
                            type(optimizer).__name__)
        _check_runtime(runtime)
        # A closed runtime raises here: accepted, the first step would update the parameters
        # and then fail to offload the state it made.
        runtime._handle()
        self.optimizer = optimizer
        self.runtime = runtime
        self.tier = tier
        self.min_bytes = min_bytes
        self.records = {}  # id(param) -> {state key: _Swapped}
        self._index = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                self._index[id(p)] = len(self._index)
        driver = _StepDriver._of(optimizer, bucket_bytes)
        if driver.state is not None:
            raise ValueError("offload_optimizer_state: this optimizer's state is offloaded already")
        driver.state = self
        self._driver = driver
        try:
            self._adopt(_all_params(optimizer))
        except BaseException:
            self.remove()
            raise
        runtime._bring_home_at_close(self)  # close() brings them home first

    # --- the optimizer's interface ----------------------------------------------------------
    def step(self, closure=None):
        """optimizer.step() in buckets of bucket_bytes: each bucket's state (and parameters,
        with offload_parameters(optimizer=...)) brought in while the next bucket's is
        prefetched, the optimizer's own step run on that bucket alone, and sent back. After
        remove(), the optimizer's step."""
        if self._driver is None:
            return self.optimizer.step(closure)
        return self._driver.step(closure)

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        """The optimizer's state_dict, AdamW's layout for AdamW: the offloaded tensors copied
        in."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        """Loads into the optimizer; what it loaded is offloaded again. A load that fails keeps
        the state it had, offloaded again."""
        try:
            self.optimizer.load_state_dict(state_dict)
        except BaseException:
            if self._driver is not None:
                try:
                    # The pre-hook brought the state home for the load: back it goes.
                    self._adopt(_all_params(self.optimizer))
                except Exception:
                    pass  # left in ordinary tensors, which the next step offloads: the load's
                    # error is the one raised
            raise

    def add_param_group(self, param_group):
        self.optimizer.add_param_group(param_group)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def defaults(self):
        return self.optimizer.defaults

    def __repr__(self):
        return "OptimizerStateOffload(%r, tier=%r)" % (self.optimizer, self.tier)

    # --- the offload ------------------------------------------------------------------------
    def _adopt(self, params):
        """Offloads the state tensors of params not yet held (new after a first step)."""
        fresh = {}  # id of a tensor on a storage that cannot be resized -> its copy
        for p in params:
            state = self.optimizer.state.get(p)
            if not state:
                continue
            per_param = self.records.setdefault(id(p), {})
            for key, v in list(state.items()):
                if key in per_param and per_param[key].tensor is v:
                    continue
                if (not torch.is_tensor(v) or v.layout != torch.strided or
                        v.numel() * v.element_size() < self.min_bytes):
                    continue
                if not _resizable(v):
                    # torch.load's (a checkpoint loaded): the optimizer gets a copy, whose
                    # memory can be freed and refilled; the loaded dict keeps its tensor.
                    if id(v) not in fresh:
                        with torch.no_grad():
                            fresh[id(v)] = v.clone(memory_format=torch.contiguous_format)
                    v = state[key] = fresh[id(v)]
                if not _owns_storage(v):
                    continue
                if key in per_param:
                    _destroy_quietly(per_param.pop(key).tm)  # replaced by the optimizer
                name = "optim.%d.%s" % (self._index.get(id(p), -1), key)
                per_param[key] = _Swapped(self.runtime, v, "optimizer_state", name, self.tier)

    def _release_all(self):
        for per_param in self.records.values():
            for s in per_param.values():
                s.restore()
        self.records.clear()

    def _abandon(self):
        """close(force=True), remove() having failed: the state that can still come home does,
        the rest is lost with the runtime (reading it raises saying so; load a checkpoint).
        Returns how many tensors were lost."""
        lost = sum(not s.home_or_lose() for per_param in self.records.values()
                   for s in per_param.values())
        self.records.clear()
        self._detach()
        return lost

    def remove(self):
        """The state back in ordinary tensors; tiermem's hooks off the optimizer (nothing else
        of it was changed). Once: a second call (or the runtime's close() after it) does
        nothing."""
        if self.runtime.closed:  # close(force=True): the state went with the runtime
            self.records.clear()
        else:
            self._release_all()
        self._detach()

    def _detach(self):
        if self._driver is not None:
            self._driver.state = None
            self._driver._detach_if_unused()
            self._driver = None


def offload_optimizer_state(optimizer, runtime, tier="dram", min_bytes=4096,
                            bucket_bytes=64 << 20):
    """ZeRO-Offload: the optimizer's state tensors (Adam's moments, any optimizer's tensors of
    min_bytes or more) live in tiermem between steps. Returns the optimizer wrapped
    (OptimizerStateOffload): its step() updates the parameters in buckets of bucket_bytes, each
    bucket's state brought in while the next one is prefetched from NVMe and sent back after;
    its remove() undoes the offload. The optimizer itself is left unpatched and keeps working:
    its own step() brings all of the state in and sends it back (correct, not bucketed), its
    state_dict() and load_state_dict() keep AdamW's layout."""
    return OptimizerStateOffload(optimizer, runtime, _check_tier(tier),
                                 _size_arg(min_bytes, "min_bytes"),
                                 _size_arg(bucket_bytes, "bucket_bytes"))
