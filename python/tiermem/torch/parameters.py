"""Parameter offload (ZeRO-Infinity): parameters brought in around each use."""

import torch

from .optimizer_state import _StepDriver
from .swapped import _Swapped
from .transfers import _check_tier, _owns_storage

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
