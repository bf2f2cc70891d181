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
from tiermem import _capi
from tiermem.torch._shared.adam import (_adamw_defaults, _adamw_flags, _check_hyper,
                                        _check_threads, _closed_error, _tier_word)
from tiermem.torch._shared.transfers import _check_runtime, _size_arg
from tiermem.torch.optim._adam_kernel import DTYPES, AdamKernel, isa, set_isa_limit
from tiermem.torch.optim._state_store import (SLICE_ALIGN, StateStore, in_place_ok,
                                               words_per_element)

__all__ = ["CPUAdam", "isa", "set_isa_limit"]

_lib = tiermem._lib
_check = tiermem._check


def _on_nvme(rt, handle):
    """Whether the state tensor has an NVMe copy: the step reads its gradient while it is
    prepared (else at the commit)."""
    mask = ctypes.c_uint32(0)
    _check(_lib.tm_tensor_residency(rt, handle, ctypes.byref(mask)), "tm_tensor_residency")
    return bool(mask.value & (1 << _capi.TIER_NVME))


class CPUAdam(torch.optim.Optimizer):
    """Adam / AdamW stepped on the CPU over state held in tiermem.

    params, lr, betas, eps, weight_decay, amsgrad: as torch.optim.AdamW (adamw=False: Adam, the
    decay added to the gradient). max_grad_norm: clip the gradients by their global L2 norm,
    exactly as torch.nn.utils.clip_grad_norm_ (the coefficient is folded into the step's read of
    the gradient, no extra pass). runtime: a tiermem.Runtime for the state (None: a private one
    sized for it, DRAM only). state_tier: "dram" or "nvme". threads: CPU threads stepping, the
    caller of step() counted where it shares the workers' NUMA node (0: the cores of the DRAM
    tier's node). An fp32 CPU parameter with its state in DRAM is its own master, stepped in
    place (docs/pytorch.md). overlap: on a GPU, copy each gradient down on a side stream as
    backward produces it and step each parameter on the CPU while backward goes on (None: when
    the parameters are on a GPU and torch has register_post_accumulate_grad_hook). slice_bytes:
    the most bytes of state one slice holds (bytes or a size string; None: with state_tier
    "nvme", a sixteenth of the runtime's DRAM tier, 4 KiB to 64 MiB): each parameter's state is
    stepped in slices, bit-identically, so that any DRAM budget steps any model.

    The runtime's close() (a `with tiermem.Runtime(...)` block ending before close(), an
    exception in it) brings the state home first, into torch tensors: step(), state_dict() and
    load_state_dict() go on over them, stepped by the same kernel. After close(), step(),
    state_dict() and load_state_dict() raise.
    """

    _who = "CPUAdam"  # in messages (FSDPCPUAdam's own CPUAdam says FSDPCPUAdam)

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, adamw=True, max_grad_norm=None, runtime=None,
                 state_tier="dram", threads=0, overlap=None, slice_bytes=None, **adamw_flags):
        self._closed = False  # close() called
        self._lost = 0  # parameters whose state went with a runtime closed by force
        who = self._who
        _check_hyper(lr, betas, eps, weight_decay, amsgrad, max_grad_norm, who)
        flags = _adamw_flags(adamw_flags, adamw, who)
        state_tier = _tier_word(state_tier, "state_tier", who)
        threads = _check_threads(threads, who)
        if runtime is not None:
            _check_runtime(runtime)
        # AdamW's keys (foreach, maximize, capturable, differentiable, fused, ...), so that a
        # checkpoint of either loads into the other through DCP, which wants every key.
        defaults = _adamw_defaults(adamw)
        defaults.update(flags)
        defaults.update(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
        super().__init__(params, defaults)
        for p in self._params():
            if p.dtype not in DTYPES:
                raise TypeError("%s: a parameter is %s; fp32, bf16 and fp16 are supported" %
                                (who, p.dtype))
        self.adamw, self.max_grad_norm, self.state_tier = bool(adamw), max_grad_norm, state_tier
        if slice_bytes is not None:
            slice_bytes = _size_arg(slice_bytes, "%s: slice_bytes" % who)
            if slice_bytes < 16 * SLICE_ALIGN:
                raise ValueError("%s: slice_bytes=%r, want at least %d (the smallest slice: "
                                 "%d parameters of up to 16 bytes of state) or None" %
                                 (who, slice_bytes, 16 * SLICE_ALIGN, SLICE_ALIGN))
        if runtime is None:
            if state_tier == "nvme":
                raise ValueError("%s: state_tier='nvme' needs a runtime with nvme_paths" % who)
            # The state as _slot lays it out (8 bytes a parameter stepped in place, 12 with a
            # master, 4 more with amsgrad), and room for the largest to get a master later.
            need = sum(words_per_element(g["amsgrad"], in_place_ok(p, state_tier)) * 4 * p.numel()
                       for g in self.param_groups for p in g["params"])
            need += max((16 * p.numel() for p in self._params()), default=0)
            runtime = tiermem.Runtime(device="emulated", hbm_bytes="16MiB",
                                      dram_bytes=need + (64 << 20), log_level="error")
            self._own_runtime = runtime
        else:
            self._own_runtime = None
        self.runtime = runtime
        if state_tier == "dram" and self._own_runtime is None:
            # State in DRAM is stepped pinned whole: more than the tier can ever hold fails every
            # step; said now rather than at the first step.
            need = sum(words_per_element(g["amsgrad"], in_place_ok(p, "dram")) * 4 * p.numel()
                       for g in self.param_groups for p in g["params"])
            tier = runtime.stats()["tiers"]["dram"]["capacity"]
            if need > tier:
                raise ValueError(
                    "%s: state_tier=\"dram\" holds the state (%d bytes, %.2f MiB) in DRAM whole, "
                    "more than this runtime's whole DRAM tier (%d bytes, %.2f MiB): give "
                    "state_tier=\"nvme\" (the state streams through DRAM) or a runtime with "
                    "more dram_bytes" % (who, need, need / 2**20, tier, tier / 2**20))
        self._store = StateStore(runtime, state_tier, slice_bytes)
        self.slice_bytes = self._store.slice_bytes
        self._kernel = AdamKernel(runtime, threads, adamw, who)
        self._counters = {}  # param -> (its step tensor, a ctypes view of its float)
        self._stepped, self._unfinished = set(), None
        # One C step at a time (the overlap's worker, FSDPCPUAdam's, and step()); reentrant for
        # a step in parts, which holds it across its parts' calls.
        self._lock = threading.RLock()
        self._overlap = None
        cuda = any(p.is_cuda for p in self._params())
        hooks = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
        if overlap is not None and not isinstance(overlap, bool):
            raise TypeError("%s: overlap=%r; want None (on for GPU parameters), True or False" %
                            (who, overlap))
        if overlap and not (cuda and hooks):
            raise ValueError("%s: overlap=True copies each gradient down on a CUDA side stream as "
                             "backward makes it, which needs parameters on a GPU%s; give None "
                             "or False" % (who, "" if hooks else " and torch >= 2.1"))
        if overlap is None:
            overlap = cuda and hooks
        if overlap:
            from tiermem.torch.optim.cpu_adam_overlap import Overlap  # CUDA only
            self._overlap = Overlap(self)
        # Its close() brings the state home first (even a private runtime's, reachable as
        # .runtime), as it brings offload_optimizer_state's.
        runtime._bring_home_at_close(self)

    def _runtime_closing(self):
        """The runtime is closing (Runtime.close, before it destroys its tensors): every slot's
        state comes home into torch tensors (StateStore.bring_home; a failed read refuses the
        close, nothing changed), and from then on the optimizer steps them with the same kernel.
        Without this the close destroyed the moments and the masters, silently."""
        if self._closed or self._store.home:
            return
        if self._overlap is not None:
            self._overlap.drain()  # the steps backward queued, over the state still in tiermem
        with self._lock:
            self._store.bring_home()

    def _abandon(self):
        """close(force=True), _runtime_closing having failed: the state went with the runtime
        (bring_home is all or nothing). Returns how many parameters' states were lost."""
        self._lost = len(list(self._store.values()))
        return self._lost

    def _check_open(self, what):
        if self._closed:
            raise _closed_error("%s.%s" % (self._who, what))
        if self._lost and not self._store.home:
            raise tiermem.TiermemError(
                _capi.STATUS_NAMES.index("TM_ERR_INVALID_HANDLE"),
                "%s.%s: the runtime was closed by close(force=True) before the state of %d "
                "parameters could come home, and it went with the runtime: make a new optimizer "
                "and load a checkpoint's state into it" % (self._who, what, self._lost))

    def _params(self):
        return chain.from_iterable(g["params"] for g in self.param_groups)

    # ---- the step ----

    def _grad_scale(self, grads):
        """The clipping coefficient, computed as torch.nn.utils.clip_grad_norm_ computes it."""
        if self.max_grad_norm is None or not grads:
            return 1.0
        norms = [torch.norm(g.detach(), 2.0) for g in grads]
        total = torch.norm(torch.stack([n.to(norms[0].device) for n in norms]), 2.0)
        coef = torch.clamp(self.max_grad_norm / (total + 1e-6), max=1.0)
        return float(coef.to(torch.float32).item())

    def _grad(self, slot, grad):
        if grad.is_sparse:
            raise RuntimeError("CPUAdam does not support sparse gradients")
        if grad.is_cuda:
            grad = self._download(slot, grad.detach())
        if grad.dtype not in DTYPES:
            grad = grad.float()
        return grad.contiguous()

    def _download(self, slot, g):
        if slot.grad_host is None or slot.grad_host.dtype != g.dtype:
            slot.grad_host = torch.empty(slot.count, dtype=g.dtype, pin_memory=True)
        slot.grad_host.copy_(g.reshape(-1))
        return slot.grad_host

    def _counter(self, p, t):
        """The float of p's step tensor `t` (0-dim fp32 on the CPU, as AdamW keeps it) as a
        ctypes view, read and counted without a torch op each (~2 us a tensor otherwise); None
        for a step tensor of another kind, counted by torch."""
        cached = self._counters.get(p)
        if cached is not None and cached[0] is t:
            return cached[1]
        c = None
        if t.dtype == torch.float32 and t.is_cpu and t.numel() == 1 and t.is_contiguous():
            c = ctypes.c_float.from_address(t.data_ptr())
        self._counters[p] = (t, c)  # keeps t alive with its view
        return c

    def _runs(self, items):
        """items: (param, group, grad) in order, as runs, one a C group: (group, step number,
        [(param, grad, counter)]) per parameter group and step count (a parameter added to a
        group later has taken fewer steps); and the (param, counter) of the empty parameters
        (no elements, nothing to update: torch.optim.AdamW counts them too)."""
        runs = {}  # (id(group), step number) -> (group, step, [(param, grad, counter)])
        empty = []
        state = self.state
        for p, group, grad in items:
            st = state[p]
            t = st.get("step")
            if t is None:
                t = st["step"] = torch.tensor(0.0)
            c = self._counter(p, t)
            if p.numel() == 0:
                empty.append((p, c))
                continue
            step = int(c.value if c is not None else t.item()) + 1
            run = runs.get((id(group), step))
            if run is None:
                run = runs[(id(group), step)] = (group, step, [])
            run[2].append((p, grad, c))
        return list(runs.values()), empty

    def _step_params(self, items, grad_scale):
        """items: (param, group, grad) in order; steps them all in one call through tiermem,
        all or nothing, each C group with its parameter group's hyperparameters."""
        runs, empty = self._runs(items)
        with self._lock:
            if runs:
                self._step_groups(runs, grad_scale)
            self._count(empty)  # once the others have stepped: all or nothing

    def begin_parts(self, grad_scale=1.0):
        """A step to prepare part by part (_PartStep): FSDPCPUAdam's units, behind backward or
        in step()."""
        return _PartStep(self, grad_scale)

    def _step_in_parts(self, parts, grad_scale, scratch=False, before_agree=None):
        """One step, all or nothing, of parameters brought into memory part by part (a sharded
        model's units): parts is [(items, enter, leave)], items as _step_params'. For each part
        in turn: enter() (its gradients in, its param_out memory made), its buckets added to
        the step (_PartStep.add), leave() (its gradients may go: NVMe state has read them by
        then). A part with state only in DRAM reads its gradients at the commit: its leave()
        waits for it. Then before_agree() (what else can fail), and the commit (the outcome
        agreed, or the abort).

        scratch: the parameters' memory is not the live copy (the caller keeps that elsewhere
        and adopts the new values only once the step is taken): each part's updated parameters
        are written as it is prepared (TM_ADAM_OUT_SCRATCH), for leave() to take away. A state
        slice only in DRAM is written to NVMe first, so that none waits for the commit. For
        state not stepped in place."""
        deferred = []
        step = self.begin_parts(grad_scale)
        with self._lock:  # one step at a time: the parts' calls take it again (an RLock)
            try:
                failure = None
                try:
                    for items, enter, leave in parts:
                        enter()
                        late = False  # until prepared: nothing of the part waits
                        try:
                            late = step.add(items, scratch)
                        finally:
                            if late:
                                deferred.append(leave)
                            else:
                                leave()
                    if before_agree is not None:
                        before_agree()
                except Exception as e:  # noqa: BLE001: every failure goes through _agree
                    failure = e
                step.commit(failure, copy_out=not scratch)
            finally:
                step.abort()  # unless committed: the ranks did not agree (or an interrupt)
                for leave in deferred:
                    leave()

    def _step_groups(self, runs, grad_scale):
        """Parameters stepped in place (their own master, state in DRAM: one tm_adam_step per
        run, over the state acquired in DRAM), or over state at home in torch tensors once the
        runtime closed (the same call), and the others (tm_adam_step_groups, one call, all or
        nothing). Everything that can fail is done before anything changes: the state
        acquired, the hyperparameters checked, the groups' step prepared (it changes nothing
        when it fails); then _agree decides (across ranks, for FSDPCPUAdam) and the prepared
        step is committed, or aborted; the in-place steps after it cannot fail."""
        kernel = self._kernel
        grads = []  # the gradients the in-place steps read
        began = False  # a step prepared here, not yet committed: aborted on the way out
        bucket_runs, in_place_runs = [], []
        acquired = []
        rt = None if self._store.home else self.runtime._handle()
        try:
            failure = None
            try:
                for group, step, pairs in runs:
                    here, there = [], []
                    for p, grad, c in pairs:
                        slot = self._store.slot(p, group["amsgrad"])
                        self._store.take_writes(slot, p)
                        g = self._grad(slot, grad)
                        (here if slot.in_place or slot.home is not None else there).append(
                            (p, slot, g, c))
                    if here:
                        grads += [g for _, _, g, _ in here]
                        in_place_runs.append((group, step, here))
                    if there:
                        bucket_runs.append((group, step, there))
                spans = [kernel.spans(rt, here, acquired) for _, _, here in in_place_runs]
                cfgs = [kernel.config(group) for group, _, _ in in_place_runs]
                for cfg in cfgs:  # checked now; set again before each run's step when several
                    kernel.set_config(cfg)
                if bucket_runs:
                    began = True  # (begin() aborts nothing when it fails)
                    kernel.begin(grad_scale, bucket_runs)
            except Exception as e:  # noqa: BLE001: every failure goes through _agree
                failure = e
            self._agree(failure)
            if bucket_runs:
                began = False
                self._commit_buckets(bucket_runs)
            for (_, step, here), arr, cfg in zip(in_place_runs, spans, cfgs):
                if len(cfgs) > 1:
                    kernel.set_config(cfg)
                kernel.step_in_place(step, grad_scale, arr, len(here))
                self._count([(p, c) for p, _, _, c in here])
                for p, slot, _, _ in here:
                    if slot.out_host is not None and slot.home is not None:
                        p.data.copy_(slot.out_host.view(p.shape), non_blocking=True)
        finally:
            if began:  # the ranks did not agree (or an interrupt): every state as before
                kernel.abort()
            release = _lib.tm_tensor_release
            for slot in acquired:
                release(rt, slot.handles[0], _capi.TIER_DRAM)

    def _count(self, counted):
        """(param, counter) pairs: each parameter's step counted (see _counter)."""
        for p, c in counted:
            self._stepped.add(p)
            if c is not None:
                c.value += 1.0  # as AdamW's step += 1 in fp32
            else:
                self.state[p]["step"] += 1

    def _step_order(self, items):
        """The order the parameters are stepped in (each one's update is its own: any order
        gives the same bits); FSDPCPUAdam's follows its reads behind backward."""
        return items

    def _agree(self, failure):
        """The outcome of the step, once everything that can fail has been done (the state
        acquired, the new state prepared) and nothing has changed: here, this process's own
        (raises its failure). FSDPCPUAdam's agrees across its ranks."""
        if failure is not None:
            raise failure

    def _commit_buckets(self, runs, copy_out=True):
        """Commits the step prepared of runs: all or nothing across every group (the kernel
        says whether nothing changed, not even the CPU parameters that receive the update in
        place, or every bucket did), each parameter stepped counted and uploaded."""
        done, status = self._kernel.commit()
        if done:
            for _, _, pairs in runs:
                self._count([(p, c) for p, _, _, c in pairs])
                for p, slot, _, _ in pairs:
                    if slot.out_host is not None and copy_out:
                        # In the parameter's logical order (as its master was written and its
                        # gradient read): any strides, a transposed weight's too.
                        p.data.copy_(slot.out_host.view(p.shape), non_blocking=True)
        _check(status, "tm_adam_step_commit")

    @torch.no_grad()
    def step(self, closure=None):
        self._check_open("step")
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
        items = self._step_order(items)
        self._stepped = set()
        try:
            self._step_params(items, scale)
        except tiermem.TiermemError:
            self._unfinished = ({p for p, _, _ in items if p not in self._stepped}, scale)
            raise
        finally:
            self._wrote([p for p, _, _ in items if p in self._stepped])
        self._unfinished = None
        return loss

    def _wrote(self, params):
        """The parameters a step updated, through their addresses (a write torch does not
        see): their _version moves, as a torch op's in-place write moves it, so that what keeps
        a copy of a parameter sees the write (offload_parameters without optimizer=, a unit
        copied in: the update was dropped when the unit went out); the store knows the version
        as its own (take_writes reads nothing for it)."""
        bump = getattr(torch.autograd.graph, "increment_version", None)
        if bump is None or not params:
            return
        with torch.no_grad():
            bump(params)
        for p in params:
            self._store.own_write(p)

    # ---- checkpoints, in torch.optim.AdamW's layout ----

    def state_dict(self):
        self._check_open("state_dict")
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
            slot = self._store.get(p)
            if slot is None and p.numel() > 0:
                # No moments yet (a first step that failed left its counter only): as AdamW,
                # which has no entry for a parameter it never stepped, so that the checkpoint
                # loads there too.
                continue
            entry = {k: v.clone() if torch.is_tensor(v) else v for k, v in st.items()}
            if slot is None and p.numel() == 0 and "step" in st:
                # As torch.optim.AdamW keeps it, so that the checkpoint loads there too.
                entry["exp_avg"] = torch.zeros(p.shape, dtype=torch.float32)
                entry["exp_avg_sq"] = torch.zeros(p.shape, dtype=torch.float32)
                if any(p is q and g["amsgrad"] for g in self.param_groups for q in g["params"]):
                    entry["max_exp_avg_sq"] = torch.zeros(p.shape, dtype=torch.float32)
            if slot is not None:
                self._store.take_writes(slot, p)  # the master as the parameter is now
                # The master weights are more than the parameter only when it is not fp32 (and
                # known once taken from it: see Slot.seed). The parameter itself is not read:
                # offload_parameters may hold it.
                master = p.dtype != torch.float32 and not slot.seed
                parts = self._store.read(slot, p, master=master)
                if master:
                    entry["master_param"] = parts.pop(0).clone().view(p.shape)
                entry["exp_avg"] = parts[0].clone().view(p.shape)
                entry["exp_avg_sq"] = parts[1].clone().view(p.shape)
                if slot.amsgrad:
                    entry["max_exp_avg_sq"] = parts[2].clone().view(p.shape)
            state[i] = entry
        sd["state"] = state
        return sd

    def load_state_dict(self, state_dict):
        self._check_open("load_state_dict")
        groups, saved = self.param_groups, state_dict["param_groups"]
        if len(groups) != len(saved) or any(len(a["params"]) != len(b["params"])
                                            for a, b in zip(groups, saved)):
            raise ValueError("CPUAdam.load_state_dict: the checkpoint's parameter groups do not "
                             "match this optimizer's")
        ids = {old: p for old, p in zip(chain.from_iterable(g["params"] for g in saved),
                                        self._params())}
        self._check_checkpoint(state_dict["state"], ids)  # before anything changes
        for group, s in zip(groups, saved):
            for k, v in s.items():
                if k != "params":
                    group[k] = v
            group.setdefault("amsgrad", False)
            if "decoupled_weight_decay" in group:  # what this optimizer steps, as AdamW sets it
                group["decoupled_weight_decay"] = self.adamw
        # A parameter with no moments in the checkpoint starts afresh, as in AdamW (which
        # replaces its whole state): its state here goes.
        kept = {id(ids[old]) for old, entry in state_dict["state"].items() if "exp_avg" in entry}
        for p in self._params():
            if id(p) not in kept:
                self._store.forget(p)
        self.state = defaultdict(dict)
        for old, entry in state_dict["state"].items():
            p = ids[old]
            group = next(g for g in groups if any(q is p for q in g["params"]))
            step = entry.get("step", 0)
            self.state[p]["step"] = torch.tensor(float(step.item() if torch.is_tensor(step)
                                                       else step))
            if p.numel() == 0 or "exp_avg" not in entry:
                continue  # no state in tiermem: nothing to hold (or, never stepped, nothing yet)
            self._store.load(p, group["amsgrad"], entry.get("master_param"), entry["exp_avg"],
                             entry["exp_avg_sq"], entry.get("max_exp_avg_sq"))

    def _check_checkpoint(self, state, ids):
        """Raises ValueError naming the first entry of a checkpoint's state that cannot be this
        optimizer's: one that names no parameter, or whose moments (or master) are not tensors
        of its parameter's shape (a checkpoint of another model, or of the parameters in
        another order: AdamW fails at its next step; this would step the wrong state)."""
        who = "%s.load_state_dict" % self._who
        for old, entry in state.items():
            p = ids.get(old)
            if p is None:
                raise ValueError("%s: state %r names no parameter of this optimizer (it has %d)"
                                 % (who, old, len(ids)))
            if not isinstance(entry, dict):
                raise ValueError("%s: state %r is a %s, not a dict of tensors; nothing was "
                                 "loaded" % (who, old, type(entry).__name__))
            if ("exp_avg" in entry) != ("exp_avg_sq" in entry):
                raise ValueError("%s: state %r has %s but not %s; nothing was loaded" % (
                    (who, old) + (("exp_avg", "exp_avg_sq") if "exp_avg" in entry
                                  else ("exp_avg_sq", "exp_avg"))))
            if "step" not in entry:
                raise ValueError("%s: state %r has no step; nothing was loaded" % (who, old))
            step = entry["step"]
            try:
                if torch.is_tensor(step) and step.numel() != 1:
                    raise TypeError
                count = float(step.item() if torch.is_tensor(step) else step)
            except (TypeError, ValueError, RuntimeError):
                count = None
            if count is None or isinstance(step, (bool, str)) or not 0 <= count < float("inf"):
                raise ValueError("%s: the step of state %r is %r; want a number of steps taken, "
                                 "0 or more; nothing was loaded" % (who, old, step))
            for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "master_param"):
                v = entry.get(k)
                if v is None:
                    continue
                if not torch.is_tensor(v):
                    raise ValueError("%s: %r of state %r is a %s, not a tensor; nothing was "
                                     "loaded" % (who, k, old, type(v).__name__))
                if not v.is_floating_point():
                    raise ValueError("%s: %r of state %r is a %s tensor; want a floating-point "
                                     "one; nothing was loaded" % (who, k, old, v.dtype))
                if v.shape != p.shape:
                    raise ValueError("%s: %r of state %r is a %s tensor of shape %s, its "
                                     "parameter's shape is %s (a checkpoint of another model, or "
                                     "of its parameters in another order?); nothing was loaded" %
                                     (who, k, old, v.dtype, tuple(v.shape), tuple(p.shape)))

    def close(self):
        """Frees the state in tiermem (or brought home by the runtime's close) and the workers
        (also done when collected). Once: a second call does nothing."""
        self._closed = True
        if self._overlap is not None:
            self._overlap.close()
            self._overlap = None
        if getattr(self, "_kernel", None) is not None:
            self._kernel.close()
        if getattr(self, "_store", None) is not None:
            self._store.close()
        self._counters = {}
        if self._own_runtime is not None:
            self._own_runtime.close()
            self._own_runtime = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001: interpreter shutdown
            pass


class _PartStep:
    """One all-or-nothing step of a CPUAdam prepared part by part (a sharded model's units):
    begun empty (AdamKernel.begin with no runs) at the first add(), each part's buckets added
    (AdamKernel.extend: its state read, stepped into new versions and written down beside the
    old; nothing changes yet), then commit(): the outcome agreed (CPUAdam._agree: across
    FSDPCPUAdam's ranks) and the new versions taken, or abort(): every state as before. The
    kernel keeps what the C step reads until then; this keeps which parameters it steps."""

    def __init__(self, adam, grad_scale):
        self._adam, self._scale = adam, grad_scale
        self._empties, self._runs = [], []
        self._begun = False  # a step begun here, not yet committed or aborted

    def add(self, items, scratch=False):
        """items: (param, group, grad) in order, added to the step (raises: the step is
        aborted by the caller, nothing changed). scratch: as CPUAdam._step_in_parts. Returns
        whether the part's gradients are read at the commit (state only in DRAM): the caller
        keeps them until then."""
        adam = self._adam
        with adam._lock:
            if not self._begun:
                self._begun = True  # before the call, as in CPUAdam._step_groups
                adam._kernel.begin(self._scale)
            return self._prepare_part(items, scratch)

    def commit(self, failure=None, copy_out=True):
        """Agrees on the outcome with `failure` (this process's, or None) and commits: raises
        when it (or, for FSDPCPUAdam, another rank) failed, the caller then aborts. copy_out:
        the updated values of parameters on a GPU or strided copied back (False: the caller
        takes them from scratch memory)."""
        adam = self._adam
        with adam._lock:
            adam._agree(failure)
            if self._begun:
                self._begun = False
                adam._commit_buckets(self._runs, copy_out=copy_out)
            adam._count(self._empties)

    def abort(self):
        """Every state as before, unless committed (then nothing)."""
        if self._begun:
            self._begun = False
            with self._adam._lock:
                self._adam._kernel.abort()

    def _prepare_part(self, items, scratch):
        """The part's buckets added to the step begun; returns whether its gradients are read
        at the commit (state only in DRAM)."""
        adam, rt = self._adam, self._adam.runtime._handle()
        runs, empty = adam._runs(items)
        self._empties += empty
        bucket_runs = []
        late = False
        for group, step, pairs in runs:
            there = []
            for p, grad, c in pairs:
                slot = adam._store.slot(p, group["amsgrad"])
                adam._store.take_writes(slot, p)
                if slot.in_place or slot.home is not None:
                    raise RuntimeError("CPUAdam: a step in parts is for state stepped through "
                                       "tiermem, not in place (a %d-element parameter)" %
                                       p.numel())
                for t, h, _, _ in slot.slices():
                    if not _on_nvme(rt, h):
                        if not scratch:
                            late = True
                            break
                        t.offload("nvme")
                        t.sync()
                there.append((p, slot, adam._grad(slot, grad), c))
            bucket_runs.append((group, step, there))
        if bucket_runs:
            adam._kernel.extend(self._scale, bucket_runs, scratch=scratch)
            self._runs += bucket_runs
            if scratch:  # the updated values where the caller's leave() takes them from
                for _, _, pairs in bucket_runs:
                    for p, slot, _, _ in pairs:
                        if slot.out_host is not None:
                            p.data.copy_(slot.out_host.view(p.shape))
        return late
