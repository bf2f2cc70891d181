"""CPUAdam: ZeRO-Offload's optimizer. The fp32 master weights and the Adam moments live in tiermem
(pinned DRAM, or NVMe with state_tier="nvme", swapped through DRAM bucket by bucket), and the
step runs on the CPU in tiermem's vectorized kernel (lib/optim). Only the gradients go down and
the updated parameters come up.

    opt = CPUAdam(model.parameters(), lr=1e-3, weight_decay=0.01, max_grad_norm=1.0)
    loss.backward(); opt.step(); opt.zero_grad()

state_dict() / load_state_dict() have torch.optim.AdamW's layout: checkpoints move between the
two. See docs/pytorch.md ("CPUAdam") for clipping, mixed precision and the overlap with backward.
"""

import ctypes
import threading
from collections import defaultdict
from itertools import chain

import torch

import tiermem
from tiermem import _capi, _optim_capi

__all__ = ["CPUAdam", "isa", "set_isa_limit"]

_lib = tiermem._lib
_optim_capi.bind(_lib)
_check = tiermem._check

_DTYPES = {torch.float32: _optim_capi.DTYPE_F32, torch.bfloat16: _optim_capi.DTYPE_BF16,
           torch.float16: _optim_capi.DTYPE_F16}


def isa():
    """(best instruction set this CPU runs, the one the kernel uses now): "avx512", "avx2" or
    "baseline"."""
    detected, active = ctypes.c_int32(), ctypes.c_int32()
    _check(_lib.tm_optim_isa_get(ctypes.byref(detected), ctypes.byref(active)),
           "tm_optim_isa_get")
    return _optim_capi.ISA_NAMES[detected.value], _optim_capi.ISA_NAMES[active.value]


def set_isa_limit(name):
    """Caps the kernel's instruction set process-wide ("baseline", "avx2", "avx512"); returns
    the one now in use (a cap above the CPU's is lowered to it)."""
    if name not in _optim_capi.ISAS:
        raise ValueError("set_isa_limit: %r is not one of %s" % (name, sorted(_optim_capi.ISAS)))
    active = ctypes.c_int32()
    _check(_lib.tm_optim_set_isa_limit(_optim_capi.ISAS[name], ctypes.byref(active)),
           "tm_optim_set_isa_limit")
    return _optim_capi.ISA_NAMES[active.value]


class _Slot:
    """One parameter's bucket: its state tensor in tiermem ([master | exp_avg | exp_avg_sq |
    max_exp_avg_sq] in fp32) and, for a parameter on a GPU, pinned buffers for its gradient and
    its updated value."""

    __slots__ = ("tensor", "count", "amsgrad", "grad_host", "out_host", "ready")

    def __init__(self, tensor, count, amsgrad):
        self.tensor, self.count, self.amsgrad = tensor, count, amsgrad
        self.grad_host = self.out_host = self.ready = None


class CPUAdam(torch.optim.Optimizer):
    """Adam / AdamW stepped on the CPU over state held in tiermem.

    params, lr, betas, eps, weight_decay, amsgrad: as torch.optim.AdamW (adamw=False: Adam, the
    decay added to the gradient). max_grad_norm: clip the gradients by their global L2 norm,
    exactly as torch.nn.utils.clip_grad_norm_ (the coefficient is folded into the step's read of
    the gradient, no extra pass). runtime: a tiermem.Runtime for the state (None: a private one
    sized for it, DRAM only). state_tier: "dram" or "nvme". threads: CPU workers (0: the cores of
    the DRAM tier's NUMA node). overlap: on a GPU, copy each gradient down on a side stream as
    backward produces it and step each parameter on the CPU while backward goes on (None: when
    the parameters are on a GPU and torch has register_post_accumulate_grad_hook).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, adamw=True, max_grad_norm=None, runtime=None,
                 state_tier="dram", threads=0, overlap=None):
        if state_tier not in ("dram", "nvme"):
            raise ValueError("CPUAdam: state_tier=%r, want 'dram' or 'nvme'" % (state_tier,))
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError("CPUAdam: max_grad_norm=%r, want a positive number or None" %
                             (max_grad_norm,))
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        foreach=None, maximize=False, capturable=False)
        super().__init__(params, defaults)
        for p in self._params():
            if p.dtype not in _DTYPES:
                raise TypeError("CPUAdam: a parameter is %s; fp32, bf16 and fp16 are supported" %
                                p.dtype)
        self.adamw, self.max_grad_norm, self.state_tier = bool(adamw), max_grad_norm, state_tier
        if runtime is None:
            if state_tier == "nvme":
                raise ValueError("CPUAdam: state_tier='nvme' needs a runtime with nvme_paths")
            need = sum(16 * p.numel() for p in self._params())
            runtime = tiermem.Runtime(device="emulated", hbm_bytes="16MiB",
                                      dram_bytes=need + (64 << 20), log_level="error")
            self._own_runtime = runtime
        else:
            self._own_runtime = None
        self.runtime = runtime
        cfg = _optim_capi.AdamConfig()
        cfg.threads = int(threads)
        self._adam = _optim_capi.Adam()
        _check(_lib.tm_adam_create(runtime._handle(), ctypes.byref(cfg), ctypes.byref(self._adam)),
               "tm_adam_create")
        self._slots = {}
        self._stepped, self._unfinished = set(), None
        self._lock = threading.Lock()  # one C step at a time (the worker and step())
        self._overlap = None
        cuda = any(p.is_cuda for p in self._params())
        if overlap is None:
            overlap = cuda and hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
        if overlap:
            from tiermem.torch.cpu_adam_overlap import Overlap  # CUDA only
            self._overlap = Overlap(self)

    # ---- state in tiermem ----

    def _params(self):
        return chain.from_iterable(g["params"] for g in self.param_groups)

    def _slot(self, p, group, init=True):
        slot = self._slots.get(p)
        amsgrad = bool(group["amsgrad"])
        if slot is not None and slot.amsgrad != amsgrad and amsgrad:
            raise ValueError("CPUAdam: amsgrad was turned on after the state was made")
        if slot is None:
            n = p.numel()
            t = self.runtime.tensor((16 if amsgrad else 12) * n, cls="optimizer_state",
                                    home=self.state_tier,
                                    name=self.runtime.next_name("cpu_adam"))
            slot = _Slot(t, n, amsgrad)
            self._slots[p] = slot
            if init:
                zeros = torch.zeros(n, dtype=torch.float32)
                self._write(slot, p.detach().reshape(-1), zeros, zeros,
                            zeros if amsgrad else None)
        return slot

    def _write(self, slot, master, m, v, vmax):
        parts = [master, m, v] + ([vmax if vmax is not None else torch.zeros_like(v)]
                                  if slot.amsgrad else [])
        flat = torch.cat([t.detach().to("cpu", torch.float32).reshape(-1) for t in parts])
        _check(_lib.tm_tensor_write(self.runtime._handle(), slot.tensor._handle(), 0,
                                    flat.data_ptr(), flat.numel() * 4), "tm_tensor_write")

    def _read(self, slot):
        flat = torch.empty((4 if slot.amsgrad else 3) * slot.count, dtype=torch.float32)
        _check(_lib.tm_tensor_read(self.runtime._handle(), slot.tensor._handle(), 0,
                                   flat.data_ptr(), flat.numel() * 4), "tm_tensor_read")
        return flat.split(slot.count)

    # ---- the step ----

    def _config(self, group):
        cfg = _optim_capi.AdamConfig()
        cfg.lr, (cfg.beta1, cfg.beta2) = float(group["lr"]), group["betas"]
        cfg.eps, cfg.weight_decay = float(group["eps"]), float(group["weight_decay"])
        cfg.adamw, cfg.amsgrad = int(self.adamw), int(bool(group["amsgrad"]))
        return cfg

    def _grad_scale(self, grads):
        """The clipping coefficient, computed as torch.nn.utils.clip_grad_norm_ computes it."""
        if self.max_grad_norm is None or not grads:
            return 1.0
        norms = [torch.norm(g.detach(), 2.0) for g in grads]
        total = torch.norm(torch.stack([n.to(norms[0].device) for n in norms]), 2.0)
        coef = torch.clamp(self.max_grad_norm / (total + 1e-6), max=1.0)
        return float(coef.to(torch.float32).item())

    def _bucket(self, p, group, grad):
        slot = self._slot(p, group)
        g = grad.detach()
        if g.is_sparse:
            raise RuntimeError("CPUAdam does not support sparse gradients")
        if g.is_cuda:
            g = self._download(slot, g)
        g = g.contiguous()
        if g.dtype not in _DTYPES:
            g = g.float()
        b = _optim_capi.AdamBucket()
        b.state = slot.tensor._handle()
        b.count, b.grad, b.grad_dtype = slot.count, g.data_ptr(), _DTYPES[g.dtype]
        if p.is_cuda or not p.is_contiguous():
            if slot.out_host is None:
                slot.out_host = torch.empty(slot.count, dtype=p.dtype,
                                            pin_memory=p.is_cuda)
            b.param_out, b.param_out_dtype = slot.out_host.data_ptr(), _DTYPES[p.dtype]
        else:  # the parameter itself receives the updated value in the same pass
            b.param_out, b.param_out_dtype = p.data_ptr(), _DTYPES[p.dtype]
        return b, g

    def _download(self, slot, g):
        if slot.grad_host is None or slot.grad_host.dtype != g.dtype:
            slot.grad_host = torch.empty(slot.count, dtype=g.dtype, pin_memory=True)
        slot.grad_host.copy_(g.reshape(-1))
        return slot.grad_host

    def _step_params(self, items, grad_scale):
        """items: (param, group, grad) in order; steps them all in one call through tiermem,
        all or nothing: one C group per parameter group and step count (a parameter added to
        a group later has taken fewer steps), each with the group's hyperparameters."""
        runs = {}  # (id(group), step number) -> (group, step, [(param, grad)])
        empty = []  # no elements, nothing to update (torch.optim.AdamW steps them too): counted
        for p, group, grad in items:
            st = self.state[p]
            if "step" not in st:
                st["step"] = torch.tensor(0.0)
            if p.numel() == 0:
                empty.append(p)
                continue
            step = int(st["step"].item()) + 1
            runs.setdefault((id(group), step), (group, step, []))[2].append((p, grad))
        with self._lock:
            if runs:
                self._step_groups(list(runs.values()), grad_scale)
            for p in empty:  # once the others have stepped: all or nothing
                self._stepped.add(p)
                self.state[p]["step"] += 1

    def _step_groups(self, runs, grad_scale):
        keep = []  # the gradients, bucket arrays and configs the C call reads
        groups = (_optim_capi.AdamGroup * len(runs))()
        for i, (group, step, pairs) in enumerate(runs):
            arr = (_optim_capi.AdamBucket * len(pairs))()
            for j, (p, grad) in enumerate(pairs):
                arr[j], g = self._bucket(p, group, grad)
                keep.append(g)
            cfg = self._config(group)
            keep += [arr, cfg]
            groups[i].config = ctypes.pointer(cfg)
            groups[i].step, groups[i].count = step, len(pairs)
            groups[i].buckets = ctypes.cast(arr, ctypes.POINTER(_optim_capi.AdamBucket))
        done = ctypes.c_size_t(0)
        status = _lib.tm_adam_step_groups(self._adam, grad_scale, groups, len(runs),
                                          ctypes.byref(done))
        # All or nothing across every group: done is 0 (nothing changed, not even the CPU
        # parameters that receive the update in place) or every bucket, counted and uploaded.
        if done.value:
            for _, _, pairs in runs:
                for p, _ in pairs:
                    self._stepped.add(p)
                    self.state[p]["step"] += 1
                    slot = self._slots[p]
                    if slot.out_host is not None:
                        # In the parameter's logical order (as its master was written and its
                        # gradient read): any strides, a transposed weight's too.
                        p.data.copy_(slot.out_host.view(p.shape), non_blocking=True)
        _check(status, "tm_adam_step_groups")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._overlap is not None:
            self._overlap.finish()
            return loss
        items = [(p, g, p.grad) for g in self.param_groups for p in g["params"]
                 if p.grad is not None]
        if self._unfinished is not None:
            # The step a failure interrupted: only its parameters left untouched, with the
            # clipping coefficient of the whole step.
            left, scale = self._unfinished
            items = [it for it in items if it[0] in left]
        else:
            scale = self._grad_scale([grad for _, _, grad in items])
        self._stepped = set()
        try:
            self._step_params(items, scale)
        except tiermem.TiermemError:
            self._unfinished = ({p for p, _, _ in items if p not in self._stepped}, scale)
            raise
        self._unfinished = None
        return loss

    # ---- checkpoints, in torch.optim.AdamW's layout ----

    def state_dict(self):
        if self._overlap is not None:
            self._overlap.drain()
        sd = super().state_dict()
        index = {id(p): i for i, p in enumerate(self._params())}
        state = {}
        for p, st in self.state.items():
            i = index[id(p)]
            # A snapshot, as the moments read from tiermem below are: the step counters are
            # copied too. torch >= 2.x's load_state_dict keeps a CPU `step` tensor as it is
            # given (no deep copy), so an AdamW loading a live counter would share it with this
            # optimizer, and each would advance the other's step (its bias correction).
            entry = {k: v.clone() if torch.is_tensor(v) else v for k, v in st.items()}
            slot = self._slots.get(p)
            if slot is None and p.numel() == 0 and "step" in st:
                # As torch.optim.AdamW keeps it, so that the checkpoint loads there too.
                entry["exp_avg"] = torch.zeros(p.shape, dtype=torch.float32)
                entry["exp_avg_sq"] = torch.zeros(p.shape, dtype=torch.float32)
                if any(p is q and g["amsgrad"] for g in self.param_groups for q in g["params"]):
                    entry["max_exp_avg_sq"] = torch.zeros(p.shape, dtype=torch.float32)
            if slot is not None:
                parts = self._read(slot)
                entry["exp_avg"] = parts[1].clone().view_as(p)
                entry["exp_avg_sq"] = parts[2].clone().view_as(p)
                if slot.amsgrad:
                    entry["max_exp_avg_sq"] = parts[3].clone().view_as(p)
                if p.dtype != torch.float32:  # the master weights are more than the parameter
                    entry["master_param"] = parts[0].clone().view_as(p)
            state[i] = entry
        sd["state"] = state
        return sd

    def load_state_dict(self, state_dict):
        groups, saved = self.param_groups, state_dict["param_groups"]
        if len(groups) != len(saved) or any(len(a["params"]) != len(b["params"])
                                            for a, b in zip(groups, saved)):
            raise ValueError("CPUAdam.load_state_dict: the checkpoint's parameter groups do not "
                             "match this optimizer's")
        ids = {old: p for old, p in zip(chain.from_iterable(g["params"] for g in saved),
                                        self._params())}
        for group, s in zip(groups, saved):
            for k, v in s.items():
                if k != "params":
                    group[k] = v
            group.setdefault("amsgrad", False)
        self.state = defaultdict(dict)
        for old, entry in state_dict["state"].items():
            p = ids[old]
            group = next(g for g in groups if any(q is p for q in g["params"]))
            step = entry.get("step", 0)
            self.state[p]["step"] = torch.tensor(float(step.item() if torch.is_tensor(step)
                                                       else step))
            if p.numel() == 0:
                continue  # no state in tiermem: nothing to hold
            slot = self._slot(p, group, init=False)
            master = entry.get("master_param", p.detach())
            vmax = entry.get("max_exp_avg_sq")
            self._write(slot, master, entry["exp_avg"], entry["exp_avg_sq"], vmax)

    def close(self):
        """Frees the state in tiermem and the workers (also done when collected)."""
        if self._overlap is not None:
            self._overlap.close()
            self._overlap = None
        if getattr(self, "_adam", None) is not None and self._adam.bits:
            _lib.tm_adam_destroy(self._adam)
            self._adam = _optim_capi.Adam()
        for slot in self._slots.values():
            if not self.runtime.closed:
                slot.tensor.destroy()
        self._slots = {}
        if self._own_runtime is not None:
            self._own_runtime.close()
            self._own_runtime = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001: interpreter shutdown
            pass
