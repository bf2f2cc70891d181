"""Where CPUAdam's state lives: one slot a parameter, its fp32 master (unless the parameter is
its own) and moments in tiermem tensors, sliced so that any DRAM budget steps any model, and
brought home into torch tensors when the runtime closes. The store owns the slots and their
tiermem tensors; the optimizer asks it for a parameter's slot and steps what it is given."""

import torch

import tiermem
from tiermem import _capi
from tiermem.torch._shared.offloaded import _Offloaded

_lib = tiermem._lib
_check = tiermem._check

# A slice's elements are a multiple of this: 64 floats, four AVX-512 vectors (the kernel's
# vector loop and its tiles start at a slice's first element, and end at the tensor's last
# only where a slice ends it, so every element takes the same path as in the whole tensor).
SLICE_ALIGN = 64
# The largest slice of state, in bytes: beyond it a bigger slice saves no time (the disk runs at
# its speed from a few MiB a request) and costs DRAM the pipeline could read ahead with.
_SLICE_MAX = 64 << 20
# The least slice chosen for the caller: the NVMe tier's allocation block (4 KiB). A smaller one
# wastes the rest of its block on NVMe (a 1.4 MB state took 6.5 MiB in 2 KiB slices) and, in a
# DRAM tier of a few dozen KiB, was read twice a step; 4 KiB slices read it once, in 2.7 MiB.
_SLICE_MIN = 4 << 10
# The DRAM tier holds this many slices: the one stepping and its new version, the slices read
# ahead and the new versions written behind, with room to spare for other tensors and for the
# holes between pinned copies (every copy needs one hole of its size).
_SLICES_IN_DRAM = 16


def in_place_ok(p, state_tier):
    """The parameter can be its own master: fp32, contiguous, in host memory, state in DRAM."""
    return (state_tier == "dram" and p.dtype == torch.float32 and p.device.type == "cpu" and
            p.is_contiguous())


def words_per_element(amsgrad, in_place):
    """fp32 words of state a parameter's element: the moments, the master but for a parameter
    stepped in place, the maximum with amsgrad."""
    return (3 if amsgrad else 2) + (not in_place)


def _slice_bounds(count, per):
    """Element bounds [0, ..., count] of slices of at most `per` elements."""
    return list(range(0, count, per)) + [count] if count > 0 else [0, 0]


class Slot:
    """One parameter's state in tiermem and, for a parameter on a GPU, pinned buffers for its
    gradient and its updated value. The state is [master | exp_avg | exp_avg_sq |
    max_exp_avg_sq] in fp32, or without the master (`in_place`) for an fp32 CPU parameter with
    its state in DRAM: that parameter is its own master, stepped in place as AdamW and DeepSpeed
    step it (28 bytes a parameter moved instead of 36 with a master beside it).

    The state is cut into slices of the parameter's elements, one tiermem tensor each in that
    layout: elements [bounds[i], bounds[i + 1]) in tensors[i], each slice a bucket of the step.
    The step reads, steps and writes a slice at a time, so a tensor bigger than the DRAM tier
    steps through it; Adam is elementwise and the bounds are multiples of the kernel's vector
    width, so the result is bit for bit that of the whole tensor. Once the runtime closed
    (StateStore.bring_home), the whole layout in `home`, one flat fp32 torch tensor, and no
    tiermem tensor. The store changes where the state lives; the step reads the layout and
    keeps its own buffers here (grad_host, out_host)."""

    __slots__ = ("tensors", "handles", "bounds", "count", "amsgrad", "in_place", "grad_host",
                 "out_host", "ready", "home", "seed", "version")

    def __init__(self, tensors, bounds, count, amsgrad, in_place, home=None):
        self.count, self.amsgrad, self.in_place = count, amsgrad, in_place
        self.tensors, self.bounds = tensors, bounds
        # The C handles (the tensors are destroyed only by the store).
        self.handles = [t._handle() for t in tensors]
        self.home = home
        self.grad_host = self.out_host = self.ready = None
        # The master is to be the parameter's value, taken when the parameter is next in (a
        # checkpoint without masters loaded while offload_parameters held the parameters).
        self.seed = False
        # The parameter's _version when the master was last known to be its value (None: not
        # known); a write to the parameter since (a load_state_dict, a clamp_) moves it.
        self.version = None

    @property
    def parts(self):
        """fp32 words a parameter (see words_per_element)."""
        return words_per_element(self.amsgrad, self.in_place)

    def slices(self):
        """(tiermem tensor, its handle, first element, elements) of each slice."""
        b = self.bounds
        return [(t, h, b[i], b[i + 1] - b[i])
                for i, (t, h) in enumerate(zip(self.tensors, self.handles))]


def _destroy_all(tensors):
    for t in tensors:
        try:
            t.destroy()
        except tiermem.TiermemError:
            pass  # the runtime destroys it anyway


class StateStore:
    """The slots of an optimizer's parameters, in `runtime` (state_tier "dram" or "nvme",
    slices of at most slice_bytes, see slice_bytes_for), or at home in torch tensors once
    bring_home() ran. A slot is in the store only once its state is whole."""

    def __init__(self, runtime, state_tier, slice_bytes):
        self.runtime = runtime
        self.state_tier = state_tier
        self.slice_bytes = self._slice_bytes(slice_bytes)
        self.home = False  # bring_home() ran: every slot's state in torch memory
        self._slots = {}

    def __contains__(self, p):
        return p in self._slots

    def __getitem__(self, p):
        return self._slots[p]

    def get(self, p):
        return self._slots.get(p)

    def values(self):
        return self._slots.values()

    def slot(self, p, amsgrad, init=True):
        """p's slot, made (its state zeros, the master p's value, unless init=False: the caller
        writes it) when p has none, and given a master when p can no longer be its own."""
        slot = self._slots.get(p)
        amsgrad = bool(amsgrad)
        if slot is not None and slot.amsgrad != amsgrad and amsgrad:
            raise ValueError("CPUAdam: amsgrad was turned on after the state was made")
        if slot is None:
            n = p.numel()
            slot = self._new_slot(n, amsgrad, in_place_ok(p, self.state_tier))
            if init:
                zeros = torch.zeros(n, dtype=torch.float32)
                self._written(slot, p.detach().reshape(-1), zeros, zeros,
                              zeros if amsgrad else None, p)
                slot.version = p._version
            self._slots[p] = slot  # only once its state is whole
        elif slot.in_place and not in_place_ok(p, self.state_tier):
            self._add_master(p, slot)
        elif slot.seed and not isinstance(p, _Offloaded):
            self._seed(slot, p)
        return slot

    def load(self, p, amsgrad, master, m, v, vmax):
        """p's state replaced by a checkpoint's: into a new slot written whole before it joins
        the store (a failed write leaves no slot half written), or over p's slot. master None:
        the parameter's value (a checkpoint of fp32 parameters has none), taken when p is next
        in if offload_parameters holds it now."""
        seed = master is None and isinstance(p, _Offloaded)
        if master is None and not seed:
            master = p.detach()
        elif seed:
            master = torch.zeros(p.shape, dtype=torch.float32)  # replaced at the seed
        if p in self._slots:
            slot = self._slots[p] if seed else self.slot(p, amsgrad, init=False)
            self.write(slot, master, m, v, vmax, p)
        else:
            slot = self._new_slot(p.numel(), bool(amsgrad), in_place_ok(p, self.state_tier))
            self._written(slot, master, m, v, vmax, p)
            self._slots[p] = slot
        slot.seed = seed and not slot.in_place
        slot.version = None if slot.seed else p._version

    def forget(self, p):
        """p's state goes (a checkpoint loaded without it): its next step starts afresh."""
        slot = self._slots.pop(p, None)
        if slot is not None and not self.runtime.closed:
            _destroy_all(slot.tensors)

    def own_write(self, p):
        """The optimizer wrote p's value from the master and moved p's _version for it."""
        slot = self._slots.get(p)
        if slot is not None and slot.version is not None:
            slot.version = p._version

    def was_written(self, p):
        """written() said so since take_writes last looked at p."""
        slot = self._slots.get(p)
        return slot is not None and slot.version is None and not slot.seed

    def written(self, p):
        """p was written in a way its own _version does not show (FSDPCPUAdam's alias of a
        shard, written through its DTensor): take_writes looks at it."""
        slot = self._slots.get(p)
        if slot is not None:
            slot.version = None

    def take_writes(self, slot, p):
        """Where p has a master and was written since the master was last its value (its
        _version moved: a model.load_state_dict() after the optimizer's, DCP's
        set_model_state_dict() after get_optimizer_state_dict() stepped the optimizer, a clamp_
        between steps), each element of the master whose value rounded to p's dtype is not p's
        takes p's; the others keep the master's precision. Without it the master, unchanged,
        overwrote the parameter at the next step. A parameter held out by offload_parameters is
        looked at once it is in. Writes through p.data move no _version, as for autograd."""
        if slot.in_place or slot.seed or slot.version == p._version or isinstance(p, _Offloaded):
            return
        # (The version is None once written() said so, or for a master not yet known.)
        value = p.detach().to("cpu").reshape(-1)
        master = self._read_master(slot)
        changed = master.to(p.dtype) != value
        if bool(changed.any()):
            master = torch.where(changed, value.to(torch.float32), master)
            if slot.home is not None:
                slot.home[:slot.count] = master
            else:  # the master is the first part of each slice's layout
                self._write_slices(slot, lambda first, n: master[first:first + n].contiguous())
        slot.version = p._version

    def _read_master(self, slot):
        """The master as a flat fp32 tensor (a copy): the first part of each slice's layout."""
        if slot.home is not None:
            return slot.home[:slot.count].clone()
        rt = self.runtime._handle()
        master = torch.empty(slot.count, dtype=torch.float32)
        for _, h, first, n in slot.slices():
            piece = master[first:first + n]
            _check(_lib.tm_tensor_read(rt, h, 0, piece.data_ptr(), n * 4), "tm_tensor_read")
        return master

    def write(self, slot, master, m, v, vmax, p):
        """The slot's state set to these (flat or shaped, any dtype and device); a parameter
        stepped in place takes `master` as its value."""
        parts = [m, v] + ([vmax if vmax is not None else torch.zeros_like(v)]
                          if slot.amsgrad else [])
        if slot.in_place:  # the parameter is the master
            if not isinstance(master, _Offloaded) and not isinstance(p, _Offloaded) and \
                    master.data_ptr() != p.data_ptr():
                p.detach().view(-1).copy_(master.to(torch.float32).reshape(-1))
        else:
            parts.insert(0, master)
        parts = [t.detach().to("cpu", torch.float32).reshape(-1) for t in parts]
        if slot.home is not None:
            # A new tensor (cat): the old one may still be read by the caller.
            slot.home = torch.cat(parts)
            return
        self._write_slices(slot, lambda first, n: torch.cat([t[first:first + n] for t in parts]))

    def _write_slices(self, slot, piece):
        """Writes piece(first, n) (contiguous fp32) at the start of each slice's tensor; with
        state on NVMe, written down, as a step leaves it: a write lands in a DRAM copy when
        there is one, and state found only in DRAM is pinned whole through the next step (the
        step of state in DRAM), which a budget below the state cannot hold."""
        rt = self.runtime._handle()
        for _, h, first, n in slot.slices():
            flat = piece(first, n)
            _check(_lib.tm_tensor_write(rt, h, 0, flat.data_ptr(), flat.numel() * 4),
                   "tm_tensor_write")
            if self.state_tier == "nvme":
                _check(_lib.tm_tensor_offload(rt, h, _capi.TIER_NVME), "tm_tensor_offload")
        if self.state_tier == "nvme":
            for _, h, _, _ in slot.slices():
                _check(_lib.tm_tensor_sync(rt, h), "tm_tensor_sync")

    def read(self, slot, p, rt=None, master=True):
        """[master, exp_avg, exp_avg_sq(, max_exp_avg_sq)] as flat fp32 tensors (the master of a
        parameter stepped in place is the parameter itself); without the master when master is
        False (then p is not read: offload_parameters may hold it)."""
        parts = slot.parts
        if slot.home is not None:
            out = list(slot.home.split(slot.count))  # views: callers that keep them clone them
        else:
            rt = self.runtime._handle() if rt is None else rt
            out = [torch.empty(slot.count, dtype=torch.float32) for _ in range(parts)]
            for _, h, first, n in slot.slices():
                flat = torch.empty(parts * n, dtype=torch.float32)
                _check(_lib.tm_tensor_read(rt, h, 0, flat.data_ptr(), flat.numel() * 4),
                       "tm_tensor_read")
                for whole, piece in zip(out, flat.split(n)):
                    whole[first:first + n] = piece
        if not master:
            return out if slot.in_place else out[1:]
        if slot.in_place:
            out.insert(0, p.detach().reshape(-1))
        return out

    def bring_home(self):
        """The runtime is closing: every slot's state comes home into a torch tensor of the same
        layout, all read before any tiermem tensor goes (a failed read raises, nothing
        changed); from then on the slots are stepped there (tm_adam_step over host memory needs
        no runtime) and new ones are made there."""
        if self.home:
            return
        rt = self.runtime._handle()
        homes = {}
        for p, slot in self._slots.items():
            if slot.seed and not isinstance(p, _Offloaded):
                self._seed(slot, p)
            # The layout as it is in tiermem: a parameter stepped in place is not read (it is
            # its own master, and offload_parameters may hold it now).
            homes[p] = torch.cat(self.read(slot, p, rt, master=not slot.in_place))
        for p, slot in self._slots.items():
            old = slot.tensors
            slot.tensors, slot.handles, slot.home = [], [], homes[p]
            slot.bounds = [0, slot.count]
            _destroy_all(old)
        self.home = True

    def close(self):
        """Destroys every slot's tiermem tensors (those of a closed runtime went with it)."""
        if not self.runtime.closed:
            for slot in self._slots.values():
                for t in slot.tensors:
                    t.destroy()
        self._slots = {}

    def _written(self, slot, master, m, v, vmax, p):
        """write() into a new slot: when it fails (the NVMe tier full, ...) the slot's tensors
        go, and the error says that nothing changed. A slot kept with half its state written
        would be stepped from zeros at the next step() (the parameters then +-lr)."""
        try:
            self.write(slot, master, m, v, vmax, p)
        except BaseException as e:
            _destroy_all(slot.tensors)
            if isinstance(e, tiermem.TiermemError):
                raise tiermem.TiermemError(
                    e.status, "CPUAdam: making the state of a parameter of %d elements: %s (the "
                    "step was not taken: every state and parameter is as before)" % (
                        slot.count, e.message), e.call) from e
            raise

    def _seed(self, slot, p):
        """The master of each slice set to the parameter's value (see Slot.seed)."""
        value = p.detach().to("cpu", torch.float32).reshape(-1)
        if slot.home is not None:
            slot.home[:slot.count] = value
        else:  # the master is the first part of each slice's layout
            self._write_slices(slot, lambda first, n: value[first:first + n].contiguous())
        slot.seed = False
        slot.version = p._version

    def _add_master(self, p, slot):
        """A parameter stepped in place that no longer can be (made bf16, moved, made a strided
        view): its state gets a master again, the parameter's value widened to fp32."""
        _, m, v, *vmax = self.read(slot, p)
        new = self._new_slot(slot.count, slot.amsgrad, False)
        self._written(new, p.detach().reshape(-1), m, v, vmax[0] if vmax else None, p)
        old = slot.tensors
        slot.tensors, slot.handles, slot.bounds = new.tensors, new.handles, new.bounds
        slot.home, slot.in_place = new.home, False
        slot.version = p._version
        for t in old:
            t.destroy()

    def _slice_bytes(self, asked):
        """The bytes of state a slice holds at most: `asked`, or with state on NVMe a sixteenth
        of the DRAM tier (4 KiB to 64 MiB); with state in DRAM, none (one slice a parameter: it is
        all in DRAM anyway, and stepped in place there)."""
        if asked is not None:
            return asked
        if self.state_tier != "nvme":
            return None
        dram = self.runtime.stats()["tiers"]["dram"]["capacity"]
        return max(_SLICE_MIN, min(_SLICE_MAX, dram // _SLICES_IN_DRAM))

    def _new_slot(self, n, amsgrad, in_place):
        """A slot of n elements: its slices' tiermem tensors, or once the runtime closed its
        state at home (zeros, one slice)."""
        words = words_per_element(amsgrad, in_place)
        if self.home:
            return Slot([], [0, n], n, amsgrad, in_place,
                        torch.zeros(words * n, dtype=torch.float32))
        per = n
        if self.slice_bytes is not None and not in_place:  # in place: in DRAM, pinned whole
            per = max(SLICE_ALIGN, self.slice_bytes // (4 * words) // SLICE_ALIGN * SLICE_ALIGN)
        bounds = _slice_bounds(n, per)
        tensors = []
        try:
            for i in range(len(bounds) - 1):
                tensors.append(self.runtime.tensor(
                    4 * words * (bounds[i + 1] - bounds[i]), cls="optimizer_state",
                    home=self.state_tier, name=self.runtime.next_name("cpu_adam")))
        except BaseException:
            for t in tensors:
                t.destroy()
            raise
        return Slot(tensors, bounds, n, amsgrad, in_place)
