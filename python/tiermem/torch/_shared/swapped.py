"""One torch tensor whose memory is freed between uses while tiermem holds its bytes (optimizer
state, parameters)."""

import torch

from ... import TiermemError
from .offloaded import mark_in, mark_lost, mark_out
from .transfers import _TIER_HOME, _destroy_quietly, _fetch, _resize_storage, _send


class _Swapped:
    """One torch tensor whose bytes live in tiermem between uses."""

    __slots__ = ("tensor", "tm", "nbytes", "tier", "resident", "version", "refs", "name", "kind",
                 "home", "cls", "new", "flip", "replaceable")

    def __init__(self, runtime, tensor, cls, name, tier, replaceable=True):
        self.tensor = tensor
        self.name = name
        self.kind = (tensor.dtype, tensor.device, tensor.shape)
        self.nbytes = tensor.numel() * tensor.element_size()
        self.tier = tier
        self.cls = cls
        self.new = None  # the next version (write_new), until adopt_new or drop_new
        self.flip = False  # the names of the versions alternate: name, then name + "~"
        self.tm = runtime.tensor(self.nbytes, cls, _TIER_HOME[tier], name)
        self.refs = 0
        self.home = False  # restored for good: the tensor is ordinary again, this record inert
        # Whether the tensor may take a new storage when its own cannot be freed (_free): not
        # for storages others read by themselves (FSDP2's shards).
        self.replaceable = replaceable
        try:
            self.send()
        except BaseException:
            _destroy_quietly(self.tm)
            raise

    def send(self):
        """Copies the tensor's bytes to tiermem and frees its memory."""
        _send(self.tm, self.tensor, self.nbytes, self.tier)
        self._free()
        self.resident = False
        mark_out(self.tensor)

    def prefetch(self, tier=None):
        """Starts bringing the bytes up ahead of bring_in: to tier, or (None) to DRAM when they
        live on NVMe. A hint: tiermem drops it when there is no room."""
        if self.resident or self.home:
            return
        if tier is None:
            if self.tier != "nvme":
                return
            tier = "dram"
        try:
            self.tm.prefetch(tier)
        except TiermemError:
            # Busy (acquired, its HBM copy held for writing by a view something still holds,
            # or moving down): bring_in copies from where the bytes are.
            pass

    def bring_in(self):
        if self.resident:
            return
        mark_in(self.tensor)
        try:
            _resize_storage(self.tensor, self.nbytes)
            _fetch(self.tm, self.tensor, self.nbytes)
        except BaseException:
            _resize_storage(self.tensor, 0)
            mark_out(self.tensor)
            raise
        self.resident = True
        self.version = self.tensor._version

    def make_room(self):
        """Memory for the tensor, zeroed, its bytes not read: for a writer of them all (the
        optimizer step's updated shards, whose values its state holds). let_go(dirty=True)
        then writes them; let_go(dirty=False) gives the memory back, tiermem's copy as it was."""
        if self.resident or self.home:
            return
        mark_in(self.tensor)
        try:
            _resize_storage(self.tensor, self.nbytes)
            self.tensor.zero_()
        except BaseException:
            _resize_storage(self.tensor, 0)
            mark_out(self.tensor)
            raise
        self.resident = True
        self.version = self.tensor._version

    def write_new(self):
        """The bytes made by make_room (and written since) into a new tiermem tensor beside
        tiermem's copy, started down to the record's tier, the memory freed: the next version,
        which adopt_new() makes the record's and drop_new() forgets (tiermem's copy as it was).
        sync_new() waits for it and raises its failure."""
        self.flip = not self.flip
        new = self.tm._rt.tensor(self.nbytes, self.cls, _TIER_HOME[self.tier],
                                 self.name + ("~" if self.flip else ""))
        try:
            _send(new, self.tensor, self.nbytes, self.tier)
        except BaseException:
            _destroy_quietly(new)
            raise
        self.new = new
        self._free()
        self.resident = False
        mark_out(self.tensor)

    def sync_new(self):
        if self.new is not None:
            self.new.sync()

    def adopt_new(self):
        if self.new is not None:
            old, self.tm, self.new = self.tm, self.new, None
            _destroy_quietly(old)

    def drop_new(self):
        if self.new is not None:
            new, self.new = self.new, None
            _destroy_quietly(new)

    def converted(self):
        """Whether the tensor was converted (dtype, device or shape) since it was offloaded."""
        t = self.tensor
        return (t.dtype, t.device, t.shape) != self.kind

    def check_unconverted(self):
        """Raises when the tensor was converted while in (model.double(), .to(device)): its
        bytes no longer fit tiermem's copy, and letting go would undo the conversion silently."""
        dtype, device, shape = self.kind
        t = self.tensor
        if self.converted():
            raise RuntimeError(
                "%s was changed from %s on %s, shape %s, to %s on %s, shape %s while tiermem "
                "holds it (a model.double() / .half() / .to() between offload_parameters or "
                "offload_optimizer_state and remove()): convert before offloading, or after "
                "remove(), which keeps the converted tensor" % (
                    self.name, str(dtype).replace("torch.", ""), device, list(shape),
                    str(t.dtype).replace("torch.", ""), t.device, list(t.shape)))

    def let_go(self, dirty=None):
        """Frees the memory; writes the bytes back first when they changed since bring_in."""
        if not self.resident or self.home:
            return
        self.check_unconverted()
        if dirty is None:
            dirty = self.tensor._version != self.version
        if dirty:
            self.send()
        else:
            self._free()
            self.resident = False
            mark_out(self.tensor)

    def _free(self):
        """Frees the tensor's memory, keeping the tensor object. A storage made fixed-size while
        in (a NumPy array of it: .numpy() pins the pointer) cannot shrink: the tensor then takes
        a new, empty storage, and the old memory stays with what holds it (the array keeps the
        bytes it saw). Storages others read by themselves are not replaced: that raises."""
        try:
            _resize_storage(self.tensor, 0)
        except RuntimeError as e:
            if not self.replaceable:
                raise RuntimeError(
                    "%s: tiermem cannot free its memory to hold it between uses: its storage was "
                    "made fixed-size (%s: a NumPy array of it, from .numpy()?); read it with "
                    ".clone() or .tolist() instead" % (self.name, e)) from e
            fresh = torch.empty_like(self.tensor, memory_format=torch.contiguous_format)
            _resize_storage(fresh, 0)
            self.tensor.data = fresh
            self._replaced()

    def _replaced(self):
        """The tensor took a new storage (_free): what shares the old one is updated."""

    def restore(self):
        """Back to an ordinary tensor: resident, and tiermem's copy destroyed. From then on the
        record does nothing (hooks and autograd nodes made before may still call it: a backward
        after the runtime's close() brought everything home)."""
        if self.home:
            return
        self._restore()
        self.home = True

    def _restore(self):
        self.bring_in()
        _destroy_quietly(self.tm)

    def home_or_lose(self, fill=None):
        """close(force=True): restore() when the bytes can still come home (in, or readable);
        else the tensor is lost with the runtime: its storage empty and its reads raising
        (tiermem.torch._shared.offloaded.mark_lost), or with `fill`, an ordinary tensor of that
        value (for storages read by code no guard sees: FSDP2's all-gather). Either way the
        record does nothing from then on. True when it came home."""
        if self.home:
            return True
        try:
            self.restore()
            return True
        except Exception:
            self.lose(fill)
            return False

    def lose(self, fill=None):
        self.resident, self.home = False, True
        if fill is None:
            _resize_storage(self.tensor, 0)
            mark_lost(self.tensor)
            return
        mark_in(self.tensor)
        _resize_storage(self.tensor, self.nbytes)
        self.tensor.fill_(fill)
