"""FSDP2's parameter shards held in tiermem between uses (FSDPCPUAdam(..., shard_tier=...)).

Each fully_shard unit (a module fully_shard was called on, with parameters of its own) keeps its
rank's padded local shards in torch storages that FSDP2's all-gather reads. Here each such
storage is a _Swapped record: its bytes live in the runtime (DRAM, or NVMe) and the storage is
resized to 0 between uses, the tensor objects FSDP2 holds unchanged (as FSDP2 itself frees its
unsharded parameters). A shard is brought in only where something reads it:

- forward: a pre-hook registered after fully_shard with prepend=True runs before FSDP2's
  pre-forward unshard: the unit's shards come in, with those of the units FSDP2 will prefetch
  from there (set_modules_to_forward_prefetch); a second pre-hook, registered after FSDP2's,
  lets them go once FSDP2 has all-gathered them.
- backward: a forward hook registered with prepend=True puts a gradient hook on the unit's
  outputs that fires before FSDP2's pre-backward unshard: the unit comes in (unless FSDP2 did
  not reshard it after forward), with the unit FSDP2 prefetches from there (the one before it
  in the post-forward order, or set_modules_to_backward_prefetch's); a gradient hook added after
  FSDP2's lets the unit go once its all-gather is done.
- the optimizer step brings the units in one at a time, steps them, and writes them back;
  with the state on NVMe it makes them without reading them (the state's masters hold their
  values) and writes the new shards beside the old, behind backward where the step is
  prepared there (_prefetch: the unit handed over by grads_ready once all its gradients are
  set, the training thread waiting for it in wait_unit before it touches the unit).
- state_dict() / load_state_dict() bring each unit they reach in (the root's, as DCP's
  get/set_model_state_dict call them: every unit), counted as changed (DCP loads into the
  tensors it was given); they go back at their next release. shards_in() does the same for a
  user's own reads (full_tensor()).
- while a unit's shards (or gradients) are out, the parameter DTensors and gradient DTensors a
  user reaches, and their local tensors, are covered by _guard: a read raises a
  RuntimeError naming the parameter and what to do instead (not a SIGSEGV on the empty storage).

The learned schedule is the order of the units' forwards (and of their post-forwards, for
backward): with shards on NVMe, each release prefetches the next `prefetch_depth` units of that
order from NVMe into DRAM, so that their bring-in copies from DRAM. On CPU everything here is
synchronous; on CUDA the copies are ordered on the current stream (not run on a GPU yet).

With grad_tier, each unit's reduce-scattered gradient shards go to tiermem too, from the
post-accumulate-grad hooks FSDP2 runs on its sharded parameters once its post-backward has set
them (the squared norms taken first, for clipping), until the unit's step and again until
zero_grad(); a unit's gradients come back before its next pre-backward (FSDP2 adds a second
backward's into them). CPU meshes only: on CUDA FSDP2 runs the hooks on its reduce-scatter
stream, and that path is not written or tested. Not held here: the unsharded parameters FSDP2
all-gathers (it frees them itself after use)."""

import contextlib

import torch
from torch.utils._pytree import tree_flatten

from .._shared.swapped import _Swapped
from .._shared.transfers import _destroy_quietly
from ._guard import _Cover, local


def _fsdp_state(module):
    get = getattr(module, "_get_fsdp_state", None)
    return get() if get is not None else None


class _Unit:
    """One fully_shard unit: its module, its own parameters, and their storages in tiermem."""

    __slots__ = ("module", "params", "records", "resident", "dirty", "grads", "grad_sq",
                 "grads_set", "cover", "grad_cover")

    def __init__(self, module, params):
        self.module, self.params = module, params
        self.records = []
        self.resident = True
        self.dirty = False
        self.grads = []  # the gradient storages' records while tiermem holds them
        self.grad_sq = {}  # parameter -> its gradient's squared 2-norm, taken before it went
        self.grads_set = set()  # the parameters FSDP2 has set a gradient on this backward
        self.cover = None  # _guard's cover of the shards' user-visible tensors
        self.grad_cover = None  # and of the gradients' while tiermem holds them

    def unsharded(self):
        """Whether FSDP2 holds the unit all-gathered now (it reads no shard to unshard it)."""
        group = getattr(_fsdp_state(self.module), "_fsdp_param_group", None)
        return bool(getattr(group, "is_unsharded", False))


class _ShardOffload:
    """The shards of every unit under `module`, in `runtime`'s `tier` between uses."""

    def __init__(self, module, runtime, tier, prefetch_depth=1, grad_tier=None):
        from torch.distributed.fsdp import FSDPModule
        self.runtime, self.tier, self.prefetch_depth = runtime, tier, prefetch_depth
        self.grad_tier = grad_tier
        self.root = module
        self.names = {p: n for n, p in module.named_parameters()}
        mods = [m for m in module.modules() if isinstance(m, FSDPModule)]
        owner = {}
        for m in mods:  # pre-order: an inner unit comes later and takes its own parameters
            for p in m.parameters():
                owner[p] = m
        self.units = []
        by_module = {}
        for m in mods:
            params = [p for p in m.parameters() if owner[p] is m]
            if params:
                by_module[m] = _Unit(m, params)
                self.units.append(by_module[m])
        self._by_state = {_fsdp_state(m): u for m, u in by_module.items()}
        self.unit_of = {p: u for u in self.units for p in u.params}
        self.forward_order, self.post_forward_order = [], []
        self.offloaded = False
        self.bytes_in = self.bytes_out = 0
        self.grad_bytes_in = self.grad_bytes_out = 0
        # The most units in torch memory at once by the schedule (not counting all_in()).
        self.peak_units = 0
        # What a unit's gradients do once FSDP2 has set them all (send_grads: to tiermem, with
        # grad_tier); with the step prepared behind backward, _prefetch's worker takes them
        # first (and sends them once its kernel has read them).
        self.grads_ready = self.send_grads
        # Waits until no other thread works on a unit (that worker): called by everything here
        # that changes a unit's shards or gradients on the training thread.
        self.wait_unit = lambda u: None
        self._handles = []
        for u in self.units:
            m = u.module
            self._handles += [
                m.register_forward_pre_hook(lambda *_, u=u: self._before_forward(u),
                                            prepend=True),
                m.register_forward_pre_hook(lambda *_, u=u: self._after_forward(u)),
                m.register_forward_hook(lambda mod, a, out, u=u: self._on_output(u, out, True),
                                        prepend=True),
                m.register_forward_hook(lambda mod, a, out, u=u: self._on_output(u, out, False)),
            ]
            # FSDP2 runs a sharded parameter's post-accumulate-grad hooks once its post-backward
            # has set the reduce-scattered gradient (on CUDA, on the stream that made it).
            self._handles += [p.register_post_accumulate_grad_hook(
                lambda p, u=u: self._grad_set(u, p)) for p in u.params if p.requires_grad]
            # A unit's own state_dict() / load_state_dict() (also a submodule's, or the root's
            # through DCP) runs these before it reads or copies into the unit's parameters.
            self._handles += [
                m.register_state_dict_pre_hook(lambda *_, u=u: self._unit_in(u)),
                m.register_load_state_dict_pre_hook(lambda *_, u=u: self._unit_in(u))]

    # ---- the schedule ----

    def _targets(self, u, attr):
        """The units FSDP2 unshards from u's hooks besides u (its explicit prefetch lists)."""
        states = getattr(_fsdp_state(u.module), attr, None) or []
        return [self._by_state[s] for s in states if s in self._by_state]

    def _before_forward(self, u):
        if u not in self.forward_order:
            self.forward_order.append(u)
        if not self.offloaded:
            return
        for t in [u] + self._targets(u, "_states_to_forward_prefetch"):
            if not t.unsharded():
                self.bring_in(t)

    def _after_forward(self, u):
        if self.offloaded:
            self.release(u)
            self._prefetch_after(u, self.forward_order)

    def _on_output(self, u, out, before):
        if before and u not in self.post_forward_order:
            self.post_forward_order.append(u)
        if not torch.is_grad_enabled():
            return
        hook = (lambda g: self._before_backward(u)) if before else (
            lambda g: self._after_backward(u))
        for t in tree_flatten(out)[0]:
            if torch.is_tensor(t) and t.requires_grad:
                t.register_hook(hook)

    def _before_backward(self, u):
        if not self.offloaded:
            return
        self.grads_in(u)  # FSDP2's post-backward adds into a gradient that is there already
        targets = self._targets(u, "_states_to_backward_prefetch")
        if not targets:  # FSDP2's implicit prefetch: the unit before it in post-forward order
            order = self.post_forward_order
            i = order.index(u) if u in order else 0
            targets = order[i - 1:i] if i > 0 else []
        for t in [u] + targets:
            if not t.unsharded():
                self.bring_in(t)

    def _after_backward(self, u):
        if self.offloaded:
            self.release(u)
            self._prefetch_after(u, self.post_forward_order[::-1])

    def _prefetch_after(self, u, order):
        if self.tier != "nvme" or u not in order:
            return
        i = order.index(u)
        for t in order[i + 1:i + 1 + self.prefetch_depth]:
            if not t.resident:
                for r in t.records:
                    r.prefetch()

    # ---- the gradient shards ----

    def _grad_set(self, u, p):
        """FSDP2 set p's sharded gradient; once every parameter of u has one, grads_ready(u)
        (with grad_tier their squared norms taken first, for clipping)."""
        if not self.offloaded:
            return
        if self.grad_tier is not None:
            g = local(p.grad)
            u.grad_sq[p] = torch.linalg.vector_norm(g.detach(), 2.0).to(torch.float32) ** 2
        u.grads_set.add(p)
        if len(u.grads_set) < sum(q.requires_grad for q in u.params):
            return
        u.grads_set.clear()
        self.grads_ready(u)

    def send_grads(self, u):
        """u's gradient storages to tiermem (grad_tier; otherwise nothing), covered."""
        if self.grad_tier is None or u.grads:
            return
        grads = [local(q.grad) for q in u.params if q.grad is not None]
        for r in self._send_storages(grads, "grad", self.grad_tier, "fsdp_grad"):
            u.grads.append(r)
            self.grad_bytes_out += r.nbytes
        u.grad_cover = _Cover("grad", self.grad_tier)
        self._cover_grads(u)

    def _cover_grads(self, u):
        if u.grad_cover is not None:
            for q in u.params:
                if q.grad is not None:
                    u.grad_cover.add(q.grad, self.names.get(q, "?"))

    def grads_in(self, u, keep=False):
        """u's gradients back in torch memory: for good (keep=False: tiermem's copies go), or
        for the step (keep=True: let go again by grads_out, nothing written)."""
        self.wait_unit(u)
        for r in u.grads:
            if not r.resident:
                r.bring_in()
                self.grad_bytes_in += r.nbytes
            if not keep:
                r.restore()
        if u.grad_cover is not None:
            u.grad_cover.uncover()
        if not keep:
            u.grads, u.grad_cover = [], None

    def grads_out(self, u):
        self.wait_unit(u)
        for r in u.grads:
            r.let_go(dirty=False)
        self._cover_grads(u)

    def drop_grads(self):
        """zero_grad(set_to_none=True): tiermem's copies of the gradients go with them."""
        for u in self.units:
            self.wait_unit(u)
            for r in u.grads:
                _destroy_quietly(r.tm)
            if u.grad_cover is not None:  # a p.grad kept by the user stays empty: say so
                u.grad_cover.dropped = True
            u.grads, u.grads_set, u.grad_cover = [], set(), None
            u.grad_sq.clear()

    # ---- bringing in and letting go ----

    def start(self):
        """Sends every unit's shards to tiermem (after FSDP2's lazy init, which re-pads the
        shards it finds: it must find them in)."""
        if self.offloaded:
            return
        for u in self.units:
            shards = [local(p) for p in u.params]
            for r in self._send_storages(shards, "param", self.tier, "fsdp_shard"):
                u.records.append(r)
                self.bytes_out += r.nbytes
            u.resident, u.dirty = False, False
            u.cover = _Cover("shard", self.tier)
            self._cover_shards(u)
        self.offloaded = True

    def _send_storages(self, tensors, cls, tier, prefix):
        """Each distinct storage under `tensors` sent to `tier` whole (padding included, as FSDP2
        made it), as a _Swapped record, yielded as it goes (the caller keeps each one at once, so
        that a failure leaves none it does not know of); empty storages (more ranks than rows)
        and one already sent are skipped."""
        seen = set()
        for t in tensors:
            storage = t.untyped_storage()
            if storage.nbytes() == 0 or storage.data_ptr() in seen:
                continue
            seen.add(storage.data_ptr())
            flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(
                storage, 0, (storage.nbytes() // t.element_size(),))
            # (not replaceable: FSDP2 reads this storage itself)
            yield _Swapped(self.runtime, flat, cls, self.runtime.next_name(prefix), tier,
                           replaceable=False)

    def bring_in(self, u, dirty=False):
        self.wait_unit(u)
        u.dirty = u.dirty or dirty
        if u.resident or not self.offloaded:
            return
        for r in u.records:
            r.bring_in()
            self.bytes_in += r.nbytes
        u.resident = True
        if u.cover is not None:
            u.cover.uncover()
        if not dirty:
            self.peak_units = max(self.peak_units, sum(t.resident for t in self.units))

    def room_for(self, u):
        """u's shard storages made, not read, for a step that writes every shard (its state
        holds their values: the fp32 masters); release(u, dirty=True) writes them down once it
        has, release(u) gives the memory back with tiermem's copies as they were. A unit in
        torch memory already is left as it is."""
        self.wait_unit(u)
        if u.resident or not self.offloaded:
            return
        self.make_new(u)
        u.resident = True
        if u.cover is not None:
            u.cover.uncover()
        self.peak_units = max(self.peak_units, sum(t.resident for t in self.units))

    def make_new(self, u):
        """room_for's memory, the unit still out for everyone else (its covers on): for the
        step prepared behind backward, on its worker; send_new() or unmake() after."""
        try:
            for r in u.records:
                r.make_room()
        except BaseException:
            self.unmake(u)
            raise

    def unmake(self, u):
        for r in u.records:
            r.let_go(dirty=False)

    def send_new(self, u):
        """make_new's memory, written by the step, down as new versions (write_new's)."""
        try:
            for r in u.records:
                if r.resident:
                    r.write_new()
                    self.bytes_out += r.nbytes
        except BaseException:
            self.unmake(u)
            raise

    def write_new(self, u):
        """u's shards, made by room_for and written by the step, written down as new versions
        beside tiermem's copies (the unit out of torch memory again): adopt_new() once the step
        is taken, drop_new() if it is not."""
        if not u.resident:
            return
        self.send_new(u)
        u.resident, u.dirty = False, False
        self._cover_shards(u)

    def sync_new(self, units):
        for u in units:
            for r in u.records:
                r.sync_new()

    def adopt_new(self, units):
        for u in units:
            for r in u.records:
                r.adopt_new()

    def drop_new(self, units):
        for u in units:
            for r in u.records:
                r.drop_new()

    def prefetch_grads(self, u):
        """Starts u's gradient shards up from NVMe (a hint), for its step."""
        if self.grad_tier == "nvme":
            for r in u.grads:
                r.prefetch()

    def release(self, u, dirty=False):
        """Frees u's shards; writes them down first when they changed since they came in."""
        self.wait_unit(u)
        if not u.resident or not self.offloaded:
            return
        dirty = dirty or u.dirty
        for r in u.records:
            r.let_go(dirty=dirty)
            if dirty:
                self.bytes_out += r.nbytes
        u.resident, u.dirty = False, False
        self._cover_shards(u)

    def _cover_shards(self, u):
        """The parameters as FSDP2 holds them now covered while the unit is out: a
        load_state_dict may give one a new local tensor, load_state_dict(assign=True) puts new
        parameter objects on the same storages (replaced() names them)."""
        if u.cover is not None:
            for p in u.params:
                u.cover.add(p, self.names.get(p, "?"))
            for fp in self._fsdp_params(u):
                if not any(fp.sharded_param is p for p in u.params):
                    u.cover.add(fp.sharded_param, getattr(fp, "_param_fqn", None) or "?")

    @staticmethod
    def _fsdp_params(u):
        """FSDP2's records of u's parameters (private: FSDP2 has no getter for the sharded
        parameter it all-gathers); none where that moved."""
        group = getattr(_fsdp_state(u.module), "_fsdp_param_group", None)
        return [fp for fp in getattr(group, "fsdp_params", ()) if hasattr(fp, "sharded_param")]

    def replaced(self):
        """The names of the parameters FSDP2 no longer holds (load_state_dict(assign=True)
        replaced them after FSDPCPUAdam was made): stepping them would not train the model."""
        out = []
        for u in self.units:
            now = self._fsdp_params(u)
            if now:
                held = [fp.sharded_param for fp in now]
                out += [self.names.get(p, "?") for p in u.params
                        if not any(p is q for q in held)]
        return out

    def prefetch_all(self):
        if self.tier == "nvme":
            for u in self.units:
                if not u.resident:
                    for r in u.records:
                        r.prefetch()

    def _unit_in(self, u):
        self.bring_in(u, dirty=True)
        self.grads_in(u)

    def _all_in(self):
        for u in self.units:
            self._unit_in(u)

    @contextlib.contextmanager
    def all_in(self):
        self._all_in()
        try:
            yield
        finally:
            for u in self.units:
                self.release(u, dirty=True)

    def residency(self):
        """Per unit, the storages' bytes in torch and the tiers holding tiermem's copies (once
        no other thread works on it)."""
        for u in self.units:
            self.wait_unit(u)
        return [dict(torch_bytes=sum(local(p).untyped_storage().nbytes() for p in u.params),
                     tiers=sorted(set().union(*[r.tm.residency() for r in u.records]))
                     if u.records else [],
                     grad_torch_bytes=sum(local(p.grad).untyped_storage().nbytes()
                                          for p in u.params if p.grad is not None),
                     grad_tiers=sorted(set().union(*[r.tm.residency() for r in u.grads]))
                     if u.grads else [])
                for u in self.units]

    def abandon(self):
        """close(force=True), close() having failed: the hooks removed, each shard and gradient
        shard that can still come home does, the others are lost with the runtime: a shard
        filled with NaN (FSDP2's all-gather reads its storage with no guard to stop it: empty,
        a SIGSEGV), a gradient dropped (p.grad None). Returns how many storages were lost."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self.grads_ready = self.send_grads
        lost = 0
        for u in self.units:
            self.wait_unit(u)
            grads_lost = sum(not r.home_or_lose(float("nan")) for r in u.grads)
            for r in u.records:
                lost += not r.home_or_lose(float("nan"))
            for cover in (u.cover, u.grad_cover):
                if cover is not None:
                    cover.uncover()
            if grads_lost:
                for q in u.params:
                    q.grad = None
            lost += grads_lost
            u.records, u.grads, u.resident, u.cover, u.grad_cover = [], [], True, None, None
        return lost

    def close(self):
        """Every shard back in torch memory for good, the hooks removed."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self.grads_ready = self.send_grads
        for u in self.units:
            self.grads_in(u)
            for r in u.records:
                r.restore()
            if u.cover is not None:
                u.cover.uncover()
            u.records, u.resident, u.cover = [], True, None
