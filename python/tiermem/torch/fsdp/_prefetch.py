"""FSDPCPUAdam's work on the NVMe optimizer state while backward still runs.

FSDP2 sets each sharded parameter's reduce-scattered gradient at the end of its unit's backward
and then runs the parameter's post-accumulate-grad hooks. From there:

- read ahead (when it does not step early): the parameter's optimizer state (its CPUAdam
  slices, on NVMe) is started up into DRAM, in the order the gradients come (the last layers
  first), up to a share of the DRAM tier: half of it less the largest slice twice (the step's
  pipeline keeps to the other half, so neither evicts the other's reads), and with shard_tier
  less two units' shards and gradients (what backward brings in and sends down meanwhile). The
  step takes the parameters in that same order, so that what was read behind backward is
  stepped first. A read the runtime cannot start (no room, the tensor busy) is a hint dropped:
  the step reads it itself.
- step early (overlap): the step itself is prepared part by part behind backward: a worker
  thread adds the parameters whose gradients came to a step prepared part by part
  (CPUAdam.begin_parts: each one's state read, stepped into its new version and
  written down, nothing changed yet; the C call releases the GIL), and step() only agrees across
  the ranks and commits. With shard_tier (by_unit) the worker takes a unit at a time, once
  FSDP2 has set all its gradients (_shards' hook hands it over): its shard storages made, not
  read, its part prepared into them, the new shards sent down beside the old, then its
  gradients sent down (grad_tier); step() adopts the new shards once committed. The training
  thread waits for a unit the worker holds before it touches it (_shards.wait_unit). What the
  step would see differently falls back to stepping it all at
  step(), the parts aborted: a gradient set twice (accumulation over micro-batches), a gradient
  changed since its part was prepared (seen by _mark: the version counters of the DTensor and of
  its local tensor, which in-place writes bump, and the sum, for the foreach ops over DTensors,
  which bump neither, as clip_grad_norm_ makes them; a foreach op that keeps every gradient's
  sum is not seen), a hyperparameter changed (a learning rate set before
  step()), a state_dict() or load_state_dict() or zero_grad() in between. After such a fallback
  the optimizer steps at step() from then on, and says why once (a warning). A failure in a part
  is that rank's failure of the step: step() raises it on every rank.
- with clipping (max_grad_norm) the parts are prepared as if the coefficient were 1; step()
  computes it (one all_reduce: every rank the same) and commits them when it is 1, exactly what
  clipping would have done, or drops them and takes the step whole with it. The backward after
  a step that clipped reads ahead instead of preparing (norms move slowly from step to step),
  until a step does not clip."""

import threading
import warnings

import torch

import tiermem

from ._guard import local


class _BehindBackward:
    """The hooks on the parameters, the order their gradients came in since the last step, and
    with step_early the parts prepared."""

    def __init__(self, adam, shards, capacity, step_early, sync):
        # adam: the CPUAdam stepping the shards; shards: {parameter: its local shard's alias,
        # the CPUAdam's parameter}; capacity: the DRAM tier's bytes.
        self.adam, self.shards = adam, shards
        self.capacity = capacity
        # DRAM the rest of backward needs meanwhile (with shard_tier: two units' shards and
        # gradients coming in and going down), left out of the read-ahead's share.
        self.reserve = 0
        self.step_early = step_early
        # With clipping the parts are prepared as if the coefficient were 1 (the gradients
        # unscaled), which step() checks: the last step's coefficient below 1 (clipped) makes
        # this backward read ahead instead, as overlap=False does.
        self.clipped = False
        self.sync = sync  # what the user changed (a scheduler's lr, the parameters) into adam's
        self.order = {}  # alias -> None, in the order the gradients were set (a dict: ordered)
        self.started = 0  # state bytes started up this step
        self.full = False
        self.cv = threading.Condition()
        self.pending = []  # (alias, local gradient) not yet taken by the worker
        # With shard_tier (by_unit): the units whose gradients FSDP2 has set, each with its
        # [(alias, local gradient, DTensor gradient)], not yet taken by the worker; and the
        # units the worker has been given and not finished (the training thread waits on them
        # before it touches one).
        self.offload = None
        self.drained_task = -1  # the backward whose end waits for the worker (by_unit)
        self.pending_units = []
        self.inflight = set()
        self.busy = False
        self.worker = None
        self.stopping = False
        self._reset_parts()
        self._handles = [p.register_post_accumulate_grad_hook(self._gradient_set)
                         for p in shards if p.requires_grad]

    def _reset_parts(self):
        # alias -> (the local gradient, the DTensor gradient, _mark of them) when prepared
        self.prepared = {}
        self.hyper = {}  # id(param group) -> its hyperparameters when a part used it
        self.parts = None  # the step prepared part by part (CPUAdam.begin_parts)
        self.units = []  # by_unit: the units prepared, their new shard versions written
        self.failure = None
        self.again = False  # a gradient set twice before the step

    def by_unit(self, offload):
        """With shard_tier (offload: the _ShardOffload): the step is prepared unit by unit,
        each once FSDP2 has set all its gradients: its shards made (not read: the state's masters
        hold their values), its part of the step prepared into them, and written down as new
        versions beside the old, then its gradients sent down (grad_tier); step() agrees,
        commits and adopts the new versions (or drops them)."""
        self.offload = offload
        offload.grads_ready = self._unit_ready
        offload.wait_unit = self._wait_unit

    @property
    def preparing(self):
        """Whether this backward prepares the step (else its state is read ahead)."""
        return self.step_early and not self.clipped

    def _stop_early(self):
        self.step_early = False
        if self.offload is not None:
            self.offload.grads_ready = self.offload.send_grads

    # ---- backward's side ----

    def _budget(self):
        largest = max((t.nbytes for slot in self.adam._store.values()
                       for t, _, _, _ in slot.slices()), default=0)
        return max(0, self.capacity // 2 - 2 * largest - self.reserve)

    def _gradient_set(self, p):
        a = self.shards.get(p)
        if a is None:
            return
        if a in self.order:
            self.again = True
            return
        self.order[a] = None
        if not self.preparing:  # (stepping early reads it right away)
            self._read_ahead(a)
        elif self.offload is None and p.grad is not None and self.adam._store.get(a) is not None:
            # (A state is made at step(), on this thread: made on the worker, its transient
            # zeros stayed in the worker's malloc arena, resident, 12-16 MiB at the bench's
            # sizes; made here they are reused.)
            with self.cv:
                self.pending.append((a, local(p.grad), p.grad))
                self._start_worker()
                self.cv.notify_all()

    def _unit_ready(self, u):
        """FSDP2 has set every gradient of unit u (the offload's hook, after its own): u goes
        to the worker, which prepares its part of the step, then sends its gradients down."""
        take = []
        for p in u.params:
            a = self.shards.get(p)
            if a is not None and p.grad is not None:
                take.append((a, local(p.grad), p.grad))
        with self.cv:
            self.pending_units.append((u, take))
            self.inflight.add(u)
            self._start_worker()
            self.cv.notify_all()
        # backward() returns once the worker is done with every unit: their gradients all sent
        # down and covered, so that what the user does next (read one, clip_grad_norm_) meets
        # them all alike, on every rank, never a storage being resized under it.
        task = torch._C._current_graph_task_id()
        if task != -1 and task != self.drained_task:
            self.drained_task = task
            torch.autograd.Variable._execution_engine.queue_callback(self._idle)

    def _wait_unit(self, u):
        if u in self.inflight:
            with self.cv:
                while u in self.inflight:
                    self.cv.wait()

    def _start_worker(self):
        if self.worker is None:
            self.worker = threading.Thread(target=self._run, daemon=True,
                                           name="tiermem_fsdp_step")
            self.worker.start()

    def _read_ahead(self, a):
        slot = self.adam._store.get(a)
        if slot is None or self.full or slot.home is not None:
            return
        budget = self._budget()
        for t, _, _, _ in slot.slices():
            if self.started + t.nbytes > budget:
                self.full = True
                return
            try:
                t.prefetch("dram")
            except tiermem.TiermemError:
                continue  # busy, or no room: the step reads it
            self.started += t.nbytes

    # ---- the worker ----

    def _run(self):
        while True:
            with self.cv:
                while not self.pending and not self.pending_units and not self.stopping:
                    self.cv.wait()
                if self.stopping:
                    return
                take, self.pending = self.pending, []
                units, self.pending_units = self.pending_units, []
                self.busy = True
            try:
                if take and not self.again and self.failure is None:
                    self._prepare(take)
            except Exception as e:  # noqa: BLE001: the step's failure, raised by step()
                self.failure = e
            finally:
                for u, items in units:
                    self._run_unit(u, items)
                with self.cv:
                    self.busy = False
                    self.cv.notify_all()

    def _run_unit(self, u, take):
        """On the worker: u's part of the step, then its gradients down (also when the part
        is not prepared here: step() prepares it, or falls back to the whole step)."""
        try:
            if (self.preparing and not self.again and self.failure is None and
                    not u.resident and take and
                    all(self.adam._store.get(a) is not None for a, _, _ in take)):
                self._prepare(take, u)
        except Exception as e:  # noqa: BLE001: the step's failure, raised by step()
            self.failure = self.failure or e
        try:
            self.offload.send_grads(u)
        except Exception as e:  # noqa: BLE001: likewise (the gradients stay in torch memory)
            self.failure = self.failure or e
        finally:
            with self.cv:
                self.inflight.discard(u)
                self.cv.notify_all()

    def _prepare(self, take, unit=None):
        """take [(alias, local gradient, DTensor gradient)] added to the step prepared; with a
        unit (by_unit), made into its shards' memory and written down as their new versions."""
        adam = self.adam
        self.sync()  # as the user left them after the last step (a scheduler's lr)
        group_of = {id(a): g for g in adam.param_groups for a in g["params"]}
        take = [(a, g, dt) for a, g, dt in take if id(a) in group_of]
        items = [(a, group_of[id(a)], g) for a, g, _ in take]
        marks = [_mark(g, dt) for _, g, dt in take]  # before: a change from here on is seen
        for _, group, _ in items:
            self.hyper.setdefault(id(group), _hyper(group))
        if self.parts is None:
            self.parts = adam.begin_parts()
        if unit is None:
            self.parts.add(items)
        else:
            self.offload.make_new(unit)
            try:
                self.parts.add(items, scratch=True)
            except BaseException:
                self.offload.unmake(unit)
                raise
            self.units.append(unit)  # (its new versions dropped if sending them fails)
            self.offload.send_new(unit)
        for (a, g, dt), m in zip(take, marks):
            self.prepared[a] = (g, dt, m)

    def _idle(self):
        with self.cv:
            while self.pending or self.pending_units or self.busy:
                self.cv.wait()

    # ---- the step's side ----

    def take(self):
        """The aliases in the order their gradients came, for the step; the next step's
        read-ahead starts afresh."""
        order = list(self.order)
        self.order, self.started, self.full = {}, 0, False
        return order

    def finish(self, grads, scale=None):
        """The step prepared behind backward, taken: grads {alias: local gradient} of this
        step, scale the clipping coefficient (None: no clipping). Returns False where it falls
        back (the parts aborted: step the usual way), True once taken; raises as CPUAdam's step
        raises (on every rank)."""
        self._idle()
        if scale is not None:
            # The parts assumed 1 (no clipping): below it they are dropped and the step is
            # taken whole with the coefficient, and the next backward reads ahead instead.
            # Every rank has the same coefficient, so every rank decides alike.
            self.clipped = scale != 1.0
            if self.clipped:
                self.discard()
                return False
        if self.parts is None and self.failure is None:
            return False
        adam = self.adam
        group_of = {id(a): gr for gr in adam.param_groups for a in gr["params"]}
        why = self._stale(grads, group_of)
        if why:
            self.discard()
            if self.step_early:
                self._stop_early()
                warnings.warn("FSDPCPUAdam: %s between backward and step(), so the step "
                              "prepared behind backward was dropped and is taken at step(), "
                              "from now on (overlap=False says so up front)" % why,
                              stacklevel=5)
            return False
        self.take()
        failure = self.failure
        units = self.units
        if self.parts is None:
            self.parts = adam.begin_parts()
        try:
            if failure is None:
                try:
                    self._prepare_rest(grads, group_of)
                    if self.offload is not None:
                        self.offload.sync_new(units)
                except Exception as e:  # noqa: BLE001: through the agreement
                    failure = e
            self.parts.commit(failure, copy_out=self.offload is None)
        except BaseException:
            if self.offload is not None:
                self.offload.drop_new(units)
            raise
        finally:
            self.parts.abort()  # unless committed
            self._reset_parts()
        if self.offload is not None:
            self.offload.adopt_new(units)
        return True

    def _prepare_rest(self, grads, group_of):
        """What the worker did not prepare, prepared now (on the training thread): the
        gradients set after their part was taken, or by_unit the units whose gradients were
        not all set (or that were in torch memory)."""
        adam = self.adam
        if self.offload is None:
            rest = [(a, group_of[id(a)], g) for a, g in grads.items()
                    if a not in self.prepared and id(a) in group_of]
            if rest:
                self.parts.add(rest)
            return
        off = self.offload
        for u in off.units:
            take = [(a, grads[a], p.grad) for p in u.params
                    for a in (self.shards.get(p),) if a in grads and a not in self.prepared]
            if not take:
                continue
            off.release(u)  # in torch memory (shards_in()): written down first if changed
            off.grads_in(u, keep=True)
            try:
                self._prepare(take, u)
            finally:
                off.grads_out(u)

    def _stale(self, grads, group_of):
        """Why the parts prepared would not be the step now ("" when they would)."""
        if self.again:
            return "a gradient was set twice (accumulation over micro-batches)"
        store = self.adam._store
        if any(store.was_written(a) for a in self.prepared):
            # Its masters are the parameters' values before that write (FSDPCPUAdam._sync_user)
            return "a parameter was written (a clamp_, a load_state_dict)"
        held = self._held()
        for a, (g, dt, m) in self.prepared.items():
            if a in grads and (grads[a] is not g or (a not in held and _mark(g, dt) != m)):
                return ("a gradient changed (clip_grad_norm_, clip with max_grad_norm instead; "
                        "or GradScaler.unscale_)")
        if self.offload is not None:
            for u in self.offload.units:  # a unit is prepared whole, or not at all
                mine = [self.shards.get(p) for p in u.params]
                if len({a in self.prepared for a in mine if a in grads}) > 1:
                    return "a gradient was set after its unit's part was prepared"
        for gid, hyper in self.hyper.items():
            group = next((gr for gr in self.adam.param_groups if id(gr) == gid), None)
            if group is None or _hyper(group) != hyper:
                return "a hyperparameter changed"
        return ""

    def _held(self):
        """The aliases whose gradients tiermem holds now, as the worker sent them after their
        part read them (grad_tier): unchanged since, as nothing but tiermem can write them."""
        if self.offload is None:
            return set()
        return {self.shards.get(p) for u in self.offload.units
                if u.grads and not any(r.resident for r in u.grads) for p in u.params}

    def discard(self):
        """The parts prepared so far aborted (every state as before, the new shard versions
        dropped): the step comes whole at step()."""
        self._idle()
        if self.parts is not None:
            self.parts.abort()
        if self.offload is not None:
            self.offload.drop_new(self.units)
        self._reset_parts()

    def close(self):
        self.discard()
        with self.cv:
            self.stopping = True
            self.cv.notify_all()
        if self.worker is not None:
            self.worker.join()
        for h in self._handles:
            h.remove()
        self._handles = []


def _mark(g, dt):
    """What tells a gradient changed since: the version counters of FSDP2's DTensor gradient and
    of its local tensor (a write through either: a DTensor op, or an element set through
    to_local()), and the sum (a torch._foreach_mul_ over the DTensors, as clip_grad_norm_ makes,
    bumps neither counter)."""
    return dt._version, g._version, _sum(g)


def _sum(g):
    """A gradient's fingerprint: its sum, in fp32 at least (a scaling, a clip, an add changes
    it; the same tensor sums to the same bits). An fp32 gradient is summed as it is: asked for
    float64, torch made a float64 copy of it first."""
    g = g.detach()
    return float(g.sum() if g.dtype == torch.float32 else g.sum(dtype=torch.float32))


def _hyper(group):
    return tuple((k, group[k]) for k in ("lr", "betas", "eps", "weight_decay", "amsgrad")
                 if k in group)

