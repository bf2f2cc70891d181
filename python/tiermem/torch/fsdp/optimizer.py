"""FSDPCPUAdam: CPUAdam over the shards of a model sharded by FSDP2 (torch.distributed.fsdp.
fully_shard), so that each rank's fp32 master weights and Adam moments live in its own tiermem
runtime (DRAM, or NVMe with state_tier="nvme") and its step runs on the CPU over its local shard.

    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    opt = FSDPCPUAdam(model, lr=1e-3, max_grad_norm=1.0, runtime=rt, state_tier="nvme")
    loss.backward(); opt.step(); opt.zero_grad()

FSDP2 keeps each parameter as a DTensor sharded over a 1-D mesh, or under HSDP over a 2-D mesh
(replicated across its first dimension, the nodes; sharded within its second); after backward
it leaves the reduce-scattered (and across replicas all-reduced) gradient on it as a DTensor
with the same placement. FSDPCPUAdam steps each
DTensor's local tensor through a CPUAdam of its own (imported, not copied), whose parameters are
plain tensors aliasing the local shards: the kernel writes the updated shard in place, where
FSDP2's next all-gather reads it; HSDP's replicas step the same shard with the same gradient and
stay equal. Clipping by global norm needs the whole gradient's norm: each rank sums its shards'
squared norms and one all_reduce over the shard dimension adds the ranks' sums (under HSDP not
across the replicas, which hold the same gradient).

The optimizer holds the model's own DTensor parameters in its param_groups, and state_dict()
returns torch.optim.AdamW's layout with each state tensor a DTensor sharded as its parameter, so
torch.distributed.checkpoint's get/set_optimizer_state_dict treat it as they treat AdamW's, and
checkpoints move between the two. Nothing of the model is changed (no wrapper). With the state
on NVMe, post-accumulate-grad hooks on the parameters start each one's state up into DRAM as
backward sets its gradient, and the step takes them in that order; the step itself is prepared
there, part by part, and step() commits it (_prefetch.py; with clipping, as if the coefficient
were 1, which step() checks: a clipped step is taken whole instead). With
shard_tier / grad_tier the parameter and gradient shards live in tiermem too (_shards.py:
hooks on the model). close() removes the hooks and brings every shard back; the runtime's
close() does too, with the state, if it comes first.

Refused, by name: FSDP1 (FullyShardedDataParallel), fully_shard's offload_policy=CPUOffloadPolicy
(the state would be offloaded twice), placements other than fully_shard's 1-D sharding and
HSDP's (FSDP2's replicate, FSDP with tensor parallelism) and parameters FSDP2 does not shard
(ignored_params).
"""

import contextlib
import operator
from collections import defaultdict

import torch

from tiermem.torch._shared.adam import (_adamw_defaults, _adamw_flags, _check_hyper,
                                        _check_threads, _closed_error, _tier_word)
from tiermem.torch._shared.transfers import _check_runtime
from tiermem.torch.fsdp._guard import local
from tiermem.torch.fsdp._mesh import _check_module, _check_param, _fsdp2, _shard_dim
from tiermem.torch.fsdp._prefetch import _BehindBackward
from tiermem.torch.fsdp._shard_adam import _ShardAdam, _square_norm
from tiermem.torch.fsdp._shards import _ShardOffload

__all__ = ["FSDPCPUAdam"]


class FSDPCPUAdam(torch.optim.Optimizer):
    """Adam / AdamW over FSDP2's sharded parameters, stepped on the CPU over state in tiermem.

    module: the model fully_shard sharded (its root). params: its parameters or parameter
    groups (None: every parameter of module that requires grad), each a DTensor fully_shard
    made. lr, betas, eps, weight_decay, amsgrad, adamw, max_grad_norm, runtime, state_tier,
    threads, slice_bytes: as CPUAdam, for this rank's shards (runtime: this rank's; None: a
    private DRAM one sized for the shards). max_grad_norm clips by the norm of the whole
    gradient, all ranks together, as torch.nn.utils.clip_grad_norm_ over the DTensor gradients
    (under HSDP, summed within a replica). A step is all or nothing across the mesh's ranks:
    each prepares, one all_reduce of a failure flag, then all commit or all raise the same
    TiermemError.

    shard_tier ("dram" or "nvme"; None: off) holds the parameter shards themselves in runtime's
    tier between uses (module _shards): from the end of the first step() after a forward,
    each fully_shard unit's shards come in just before FSDP2 all-gathers them and for the
    step, and their torch storage is empty otherwise. Read them between steps inside
    shards_in(); elsewhere a read (p.full_tensor(), p.to_local().sum(), p + 1) raises a
    RuntimeError naming the parameter (module _guard), instead of reading the empty
    storage. shard_prefetch_depth: how many units ahead an NVMe shard is prefetched.
    grad_tier ("dram" or "nvme"; CPU meshes only) holds each unit's reduce-scattered gradient
    shards there too, from FSDP2's post-backward to the unit's step and until zero_grad(); read
    them in between only inside shards_in(): elsewhere a read raises a RuntimeError (clip with
    max_grad_norm, not clip_grad_norm_, which raises).

    With state_tier="nvme" the state's I/O runs behind backward (module _prefetch):
    overlap (None: where it can be; True: insist; False: off) prepares the step itself there,
    part by part as FSDP2 sets the gradients (with shard_tier unit by unit, the new shards
    written down beside the old), for step() to agree on and commit; it needs a CPU
    mesh. With max_grad_norm the parts are prepared unclipped, and step() commits them when the
    coefficient is 1 (the norm within max_grad_norm: clipping changes nothing); a step that
    clips drops them and is taken whole with its coefficient, and the backward after it reads
    ahead instead of preparing (until a step does not clip). A gradient set twice
    (accumulation), changed
    (clip_grad_norm_) or a hyperparameter changed between backward and step() makes step() take
    the step whole, and turns overlap off with a warning. Without overlap each parameter's state
    is read ahead into DRAM as its gradient comes, within half the DRAM tier.

    The runtime's close() before this optimizer's (a `with tiermem.Runtime(...)` block ending
    first, an exception in it) brings everything home first: the shards and gradient shards
    into their torch storages for good (shard_tier off from then on, the hooks gone), the state
    into torch tensors, where step() goes on; a later close() only frees the rest.
    """

    def __init__(self, module, params=None, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=1e-2, amsgrad=False, *, adamw=True, max_grad_norm=None,
                 runtime=None, state_tier="dram", threads=0, shard_tier=None,
                 shard_prefetch_depth=1, grad_tier=None, slice_bytes=None, overlap=None,
                 **adamw_flags):
        self._closed = False
        self._names = names = _check_module(module)
        self._offload = None
        _check_hyper(lr, betas, eps, weight_decay, amsgrad, max_grad_norm, "FSDPCPUAdam")
        flags = _adamw_flags(adamw_flags, adamw, "FSDPCPUAdam")
        try:  # an int, numpy's too; not a bool, a float or None
            if isinstance(shard_prefetch_depth, bool):
                raise TypeError
            shard_prefetch_depth = operator.index(shard_prefetch_depth)
        except TypeError:
            raise TypeError("FSDPCPUAdam: shard_prefetch_depth=%r; want an int, the units "
                            "prefetched ahead (0: none)" % (shard_prefetch_depth,)) from None
        if shard_prefetch_depth < 0:
            raise ValueError("FSDPCPUAdam: shard_prefetch_depth=%d; want 0 or more (0: no "
                             "prefetch)" % shard_prefetch_depth)
        state_tier = _tier_word(state_tier, "state_tier", "FSDPCPUAdam")
        shard_tier = _tier_word(shard_tier, "shard_tier", "FSDPCPUAdam", optional=True)
        grad_tier = _tier_word(grad_tier, "grad_tier", "FSDPCPUAdam", optional=True)
        _check_threads(threads, "FSDPCPUAdam")
        if shard_tier is not None:
            if runtime is None:
                raise ValueError("FSDPCPUAdam: shard_tier needs a runtime= sized for the shards "
                                 "and the state")
        if grad_tier is not None and shard_tier is None:
            raise ValueError("FSDPCPUAdam: grad_tier=%r needs a shard_tier (the gradient shards "
                             "are held with the parameter shards); pass shard_tier=\"dram\" or "
                             "\"nvme\" too" % (grad_tier,))
        if runtime is not None:
            _check_runtime(runtime)
        if params is None:
            params = [p for p in module.parameters() if p.requires_grad]
        defaults = _adamw_defaults(adamw)
        defaults.update(flags)  # (the inner optimizer's groups are these groups' keys)
        defaults.update(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
        super().__init__(params, defaults)  # refuses an empty list
        meshes = set()
        for p in self._params():
            _check_param(p, names.get(p))
            meshes.add((tuple(p.device_mesh.shape), tuple(p.device_mesh.mesh.flatten().tolist())))
        if len(meshes) != 1:
            raise ValueError("FSDPCPUAdam: the parameters are sharded over different meshes %s; "
                             "one mesh is supported" % sorted(meshes))
        first = next(iter(self._params()))
        mesh = first.device_mesh
        # Plain tensors aliasing the local shards: CPUAdam's state is keyed by them, and the
        # kernel writes the updated values into the shards' memory through them; their .grad
        # is set for the step only, so that no attribute of FSDP2's own tensors changes.
        with torch.no_grad():
            self._shards = {p: local(p).detach() for p in self._params()}
        self._versions = {p: p._version for p in self._params()}  # see _sync_user
        # FSDP2 sets the sharded gradients itself at the end of backward (no accumulate-grad
        # hook fires), so CPUAdam's overlap with backward does not apply.
        device = next(iter(self._shards.values())).device
        # The clipping norm is summed over the ranks that hold different shards: under HSDP only
        # within a replica (the shard dimension); after FSDP2's all-reduce across the replicas
        # each holds the same gradient, and summing over them too would count it twice.
        # Every rank of the mesh agrees on each step's outcome (_ShardAdam._agree).
        ranks = sorted(mesh.mesh.flatten().tolist())
        if mesh.ndim == 1:
            every = mesh.get_group()
        elif len(ranks) == torch.distributed.get_world_size():
            every = None
        else:
            every = torch.distributed.new_group(ranks)
        self._adam = _ShardAdam(self._inner_groups(self.param_groups),
                                mesh.get_group(_shard_dim(first)), every, device,
                                lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                amsgrad=amsgrad, adamw=adamw, max_grad_norm=max_grad_norm,
                                runtime=runtime, state_tier=state_tier, threads=threads,
                                overlap=False, slice_bytes=slice_bytes)
        if overlap is not None and not isinstance(overlap, bool):
            raise TypeError("FSDPCPUAdam: overlap=%r; want None (auto), True or False" %
                            (overlap,))
        early = state_tier == "nvme" and device.type == "cpu"
        if overlap and not early:
            raise ValueError(
                "FSDPCPUAdam: overlap=True steps behind backward, which needs state_tier="
                "\"nvme\" and a CPU mesh (on CUDA the gradient's copy down is not ordered "
                "yet); this has state_tier=%r, a %s mesh" % (state_tier, device.type))
        if state_tier == "nvme":  # read behind backward (hooks on the parameters)
            self._adam._behind = _BehindBackward(
                self._adam, self._shards, self.runtime.stats()["tiers"]["dram"]["capacity"],
                step_early=early and overlap is not False, sync=self._sync_user)
        if shard_tier is not None:
            if grad_tier is not None and device.type != "cpu":
                raise ValueError("FSDPCPUAdam: grad_tier is supported on a CPU mesh only, not %s"
                                 " (the copy down would have to wait for FSDP2's private "
                                 "post-reduce event)" % device.type)
            self._offload = _ShardOffload(module, runtime, shard_tier, shard_prefetch_depth,
                                          grad_tier)
            behind = self._adam._behind
            if behind is not None:  # backward's own traffic in DRAM: two units'
                largest = max((sum(local(p).untyped_storage().nbytes() for p in u.params)
                               for u in self._offload.units), default=0)
                behind.reserve = 2 * largest * (2 if grad_tier else 1)
                if behind.step_early:  # the step prepared unit by unit behind backward
                    behind.by_unit(self._offload)
            unowned = [names.get(p) for p in self._params() if p not in self._offload.unit_of]
            if unowned:
                raise ValueError("FSDPCPUAdam: parameters %s belong to no fully_shard unit of "
                                 "the module; shard_tier needs every one in a unit" % unowned)
            # Its close() brings the shards home first (the state: _ShardAdam registered too).
            runtime._bring_home_at_close(self)

    def _runtime_closing(self):
        """The runtime is closing (Runtime.close, before it destroys its tensors): the shards and
        gradient shards back into their torch storages for good, the hooks off (as close()
        does), then the state into torch tensors (CPUAdam._runtime_closing), where step() goes
        on. Without this the shards' bytes went with the runtime: reads raised, close() raised
        and the next forward all-gathered freed storage (SIGSEGV)."""
        self._close_behind()  # (its prepared step's new shard versions dropped first)
        if self._offload is not None:
            self._offload.close()
            self._offload = None
        self._adam._runtime_closing()

    def _abandon(self):
        """close(force=True), _runtime_closing having failed: what can come home does, the rest
        goes with the runtime (_ShardOffload.abandon); the state stays with the runtime (step()
        raises that it was closed). Returns how many shard storages were lost."""
        self._close_behind()
        lost = 0
        if self._offload is not None:
            lost = self._offload.abandon()
            self._offload = None
        return lost

    def _close_behind(self):
        if self._adam._behind is not None:
            self._adam._behind.close()
            self._adam._behind = None

    def _params(self):
        return (p for g in self.param_groups for p in g["params"])

    def _inner_groups(self, groups):
        return [dict({k: v for k, v in g.items() if k != "params"},
                     params=[self._shards[p] for p in g["params"]]) for g in groups]

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        if hasattr(self, "_adam"):  # not while torch.optim.Optimizer.__init__ adds the first
            group = self.param_groups[-1]
            for p in group["params"]:
                _check_param(p, self._names.get(p))
                with torch.no_grad():
                    self._shards[p] = local(p).detach()
                self._versions[p] = p._version
            self._adam.add_param_group(self._inner_groups([group])[0])

    @property
    def runtime(self):
        """The tiermem.Runtime holding this rank's state."""
        return self._adam.runtime

    def _sync(self):
        """The hyperparameters as the user (or a scheduler) left them in param_groups, and the
        aliases on the shards as FSDP2 holds them now (a load_state_dict may re-pad them)."""
        self._sync_user()
        with torch.no_grad():
            for p, a in self._shards.items():
                a.data = local(p)

    def _sync_user(self):
        """What the user changed since the last step, into the CPUAdam stepping the shards: the
        hyperparameters (a scheduler's) and which parameters were written (DCP's
        set_model_state_dict after get_optimizer_state_dict stepped this optimizer, a
        load_state_dict, a clamp_): a write through the DTensor moves its _version, not the
        alias's, and the step then takes the written values into the masters."""
        self._sync_hyper()
        store = self._adam._store
        for p, a in self._shards.items():
            version = p._version
            if self._versions.get(p) != version:
                self._versions[p] = version
                store.written(a)

    def _sync_hyper(self):
        for outer, inner in zip(self.param_groups, self._adam.param_groups):
            for k, v in outer.items():
                if k != "params":
                    inner[k] = v

    def _mirror_state(self):
        # The same dicts as CPUAdam's ("step"): DCP's get_optimizer_state_dict looks at
        # optimizer.state to tell a fresh optimizer from one that has stepped.
        inner = self._adam.state
        self.state = defaultdict(dict, {p: inner[a] for p, a in self._shards.items()
                                        if a in inner})

    def _check_open(self, what):
        if self._closed:
            raise _closed_error("FSDPCPUAdam." + what)
        self._adam._check_open(what)  # its state lost with a runtime closed by force

    @torch.no_grad()
    def step(self, closure=None):
        self._check_open("step")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._offload is not None and self._offload.offloaded:
            replaced = self._offload.replaced()
            if replaced:
                raise ValueError(
                    "FSDPCPUAdam: parameters %s were replaced after FSDPCPUAdam was made (a "
                    "load_state_dict(assign=True)?), so stepping would not train the model: "
                    "opt.close(), then make a new FSDPCPUAdam, or load without assign=True"
                    % replaced[:4])
        self._sync()
        for p, a in self._shards.items():
            a.grad = None if p.grad is None else local(p.grad)
        adam = self._adam
        try:
            behind = adam._behind
            scale = None
            if behind is not None and behind.step_early and adam.max_grad_norm is not None:
                # The step prepared behind backward assumed no clipping: the coefficient, every
                # rank's same (one all_reduce), says whether it holds (the fallback reuses it).
                behind._idle()
                scale = adam._coefficient(self._squares())
            taken = behind is not None and behind.finish(
                {a: a.grad for a in self._shards.values() if a.grad is not None}, scale)
            adam._scale = scale
            if taken:
                pass
            elif self._offload is None or not self._offload.offloaded:
                adam.step()
            else:
                self._step_by_unit()
        finally:
            adam._scale = None
            for a in self._shards.values():
                a.grad = None
            self._mirror_state()
        if self._offload is not None and self._offload.forward_order:
            self._offload.start()  # after FSDP2's lazy init (the first forward)
        return loss

    def _step_by_unit(self):
        """The step of the shards held in tiermem: the clipping coefficient of all of them, then
        the units one at a time, so that one unit's gradients are in torch memory at a time.
        Per element the same arithmetic as one step of all.

        With the state on NVMe the step is one, all or nothing across the units and the ranks
        (CPUAdam._step_in_parts): each unit's gradients come in (the next unit's prefetched
        meanwhile) and its buckets are prepared into the step; its shards are not read (the
        state's masters hold their values), only made for the commit to write, then written
        down. Otherwise (state in DRAM, the shards their own masters) each unit is brought in,
        stepped and written back in turn."""
        grads = {a: a.grad for a in self._shards.values()}
        adam = self._adam
        offload = self._offload
        if adam._scale is not None:  # the coefficient step() took already
            scale = adam._scale
        elif adam.max_grad_norm is None:
            scale = 1.0
        else:
            scale = adam._coefficient(self._squares())
        units = [u for u in offload.units
                 if any(grads.get(self._shards.get(p)) is not None for p in u.params)]
        if adam._behind is not None:  # the units whose state was read behind backward first
            rank = {a: i for i, a in enumerate(adam._behind.take())}
            units.sort(key=lambda u: min((rank.get(self._shards.get(p), len(rank))
                                          for p in u.params), default=len(rank)))
        if adam.state_tier == "nvme" and not adam._store.home:
            self._step_units_in_parts(units, grads, scale)
            return
        offload.prefetch_all()
        adam._scale = scale
        try:
            for u in units:
                mine = {id(self._shards[p]) for p in u.params if p in self._shards}
                for a, g in grads.items():
                    a.grad = g if id(a) in mine else None
                offload.bring_in(u)
                offload.grads_in(u, keep=True)
                adam.step()
                offload.release(u, dirty=True)
                offload.grads_out(u)
        finally:
            adam._scale = None

    def _squares(self):
        """This rank's gradients' squared 2-norms, in the parameters' order, for the clipping
        coefficient: a gradient in tiermem (grad_tier) gives the one taken before it went down."""
        offload = self._offload
        squares = []
        for p, a in self._shards.items():
            if a.grad is not None:
                u = None if offload is None else offload.unit_of.get(p)
                held = u is not None and u.grads and p in u.grad_sq
                squares.append(u.grad_sq[p] if held else _square_norm(a.grad))
        return squares

    def _step_units_in_parts(self, units, grads, scale):
        """The step with the state on NVMe: one step of every unit, all or nothing across the
        units and the ranks, one unit's gradients and shards in torch memory at a time. Each
        unit's gradients come in (the next unit's prefetched meanwhile), its shards are made
        without reading them (the state's masters hold their values), its buckets are added to
        the step, which writes the updated shards there, and they go down beside the old ones
        as new versions; once every rank has prepared, the new versions are taken (or
        dropped, every shard as it was)."""
        offload = self._offload
        group_of = {id(a): g for g in self._adam.param_groups for a in g["params"]}
        for u in units:  # a unit still in torch memory: written down first if it changed
            offload.release(u)
        parts = []
        for i, u in enumerate(units):
            items = [(a, group_of[id(a)], grads[a]) for a in
                     (self._shards[p] for p in u.params if p in self._shards)
                     if grads.get(a) is not None]

            def enter(u=u, after=units[i + 1:i + 2]):
                offload.grads_in(u, keep=True)
                for t in after:
                    offload.prefetch_grads(t)
                offload.room_for(u)

            def leave(u=u):
                offload.grads_out(u)
                offload.write_new(u)

            parts.append((items, enter, leave))
        try:
            self._adam._step_in_parts(parts, scale, scratch=True,
                                      before_agree=lambda: offload.sync_new(units))
        except BaseException:
            for u in units:
                offload.release(u)  # a unit left in by a failure: unread, so not written
                offload.drop_new([u])
            raise
        offload.adopt_new(units)

    def _forget_behind(self):
        """A step prepared behind backward dropped (a zero_grad before step(), a checkpoint
        read or load in between): step() takes the step whole."""
        if self._adam._behind is not None:
            self._adam._behind.discard()
            self._adam._behind.take()

    def zero_grad(self, set_to_none=True):
        self._forget_behind()
        if self._offload is not None:
            if set_to_none:
                self._offload.drop_grads()
            else:
                for u in self._offload.units:
                    self._offload.grads_in(u)
        super().zero_grad(set_to_none)

    @property
    def shard_offload(self):
        """The shards' holder with shard_tier (units, residency(), bytes_in / bytes_out);
        None without."""
        return self._offload

    def shards_in(self):
        """A context in which every parameter shard of this rank is in torch memory (to read
        or change them: full_tensor(), a copy_); each goes back at its exit, written down. A
        no-op without shard_tier."""
        if self._offload is None:
            return contextlib.nullcontext()
        return self._offload.all_in()

    def state_dict(self):
        """torch.optim.AdamW's layout; each state tensor a DTensor sharded as its parameter."""
        self._check_open("state_dict")
        DTensor = _fsdp2()[3]
        self._forget_behind()
        self._sync()
        sd = self._adam.state_dict()
        params = list(self._params())
        for i, entry in sd["state"].items():
            p = params[i]
            for k, v in entry.items():
                if k != "step" and torch.is_tensor(v):
                    entry[k] = DTensor.from_local(v, p.device_mesh, p.placements, run_check=False,
                                                  shape=p.shape, stride=p.stride())
        return sd

    def load_state_dict(self, state_dict):
        """From state_dict()'s layout or torch.optim.AdamW's (DTensor state, as DCP loads it, or
        this rank's local shards)."""
        self._check_open("load_state_dict")
        DTensor = _fsdp2()[3]
        self._forget_behind()
        self._sync()
        params = list(self._params())
        saved = [i for g in state_dict["param_groups"] for i in g["params"]]
        index = dict(zip(saved, range(len(saved))))
        state = {}
        for key, entry in state_dict["state"].items():
            if key not in index or index[key] >= len(params):
                raise ValueError("FSDPCPUAdam.load_state_dict: state %r names no parameter of "
                                 "this optimizer" % (key,))
            shard = self._shards[params[index[key]]]
            local = {}
            for k, v in entry.items():
                if isinstance(v, DTensor):
                    v = v.to_local()
                if k != "step" and torch.is_tensor(v) and v.shape != shard.shape:
                    raise ValueError("FSDPCPUAdam.load_state_dict: %r of state %r has shape %s, "
                                     "this rank's shard %s" % (k, key, tuple(v.shape),
                                                               tuple(shard.shape)))
                local[k] = v
            state[key] = local
        self._adam.load_state_dict(dict(state_dict, state=state))
        for outer, inner in zip(self.param_groups, self._adam.param_groups):
            for k, v in inner.items():
                if k != "params":
                    outer[k] = v
        self._mirror_state()

    def close(self):
        """Frees this rank's state in tiermem (also done when the optimizer is collected);
        with shard_tier, the shards come back into torch memory for good, the hooks go. Once: a
        second call does nothing; step() and state_dict() after it raise."""
        self._closed = True
        self._close_behind()
        if self._offload is not None:
            self._offload.close()
            self._offload = None
        self._adam.close()
