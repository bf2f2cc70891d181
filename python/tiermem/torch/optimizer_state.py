"""Optimizer-state offload (ZeRO-Offload), and the step driver shared with parameter offload:
optimizer.step() in buckets, each bucket's state and parameters brought in around its update."""

import torch

from .swapped import _Swapped
from .transfers import _check_tier, _destroy_quietly, _owns_storage

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
        runtime._bring_home_at_close(self)  # close() brings them home first

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
        """The state back in ordinary tensors; optimizer.step unwrapped. Once: a second call
        (or the runtime's close() after it) does nothing."""
        self.release_all()
        if self.driver is not None:
            self.driver.state = None
            self.driver.detach_if_unused()
            self.driver = None


def offload_optimizer_state(optimizer, runtime, tier="dram", min_bytes=4096,
                            bucket_bytes=64 << 20):
    """ZeRO-Offload: the optimizer's state tensors (Adam's moments, any optimizer's tensors of
    min_bytes or more) live in tiermem between steps. optimizer.step() updates the parameters in
    buckets of bucket_bytes: each bucket's state is brought in while the next one is prefetched
    from NVMe, and sent back after. state_dict() and load_state_dict() keep working. Returns a
    handle whose remove() undoes it."""
    return OptimizerStateOffload(optimizer, runtime, _check_tier(tier), int(min_bytes),
                                 int(bucket_bytes))
