"""The saved-tensor hooks that offload_bench.py sets beside tiermem's: what each one copies, and
how many bytes, so that every row of the benchmark states the bytes it moved.

- `same_selection(t, min_bytes)`: the tensors tiermem's offload_saved_tensors leaves with autograd
  (parameters and views of them, tensors under min_bytes, non-strided ones), written out here so
  the like-for-like rows skip exactly those. The bench checks the bytes it selects against what
  tiermem reports packing, every step.
- `CountingSaveOnCpu`: stock torch.autograd.graph.save_on_cpu, wrapped only to count its bytes.
- `SaveOnCpuLikeForLike`: save_on_cpu's own mechanism (a pinned host tensor per saved tensor,
  copied back with non_blocking) over tiermem's selection.
- `SideStreamReference`: the reference. Written for this bench in the manner of torchtune's
  OffloadActivations, not copied from it: device-to-host copies on a side stream after an event
  on the compute stream, each source kept alive in a bounded stash until its copy has passed, so
  forward never waits for a copy; backward reloads on demand (no prefetch), the compute stream
  waiting on the reload.
"""

import torch


def _is_parameter(t):
    if isinstance(t, torch.nn.Parameter):
        return True
    base = getattr(t, "_base", None)
    return base is not None and isinstance(base, torch.nn.Parameter)


def same_selection(t, min_bytes):
    """True when tiermem's offload_saved_tensors would leave t with autograd."""
    if (t.layout != torch.strided or t.is_quantized or t.device.type not in ("cpu", "cuda")
            or t.numel() == 0):
        return True
    return _is_parameter(t) or t.numel() * t.element_size() < min_bytes


def _nbytes(t):
    return t.numel() * t.element_size()


class CountingSaveOnCpu(torch.autograd.graph.save_on_cpu):
    """Stock save_on_cpu(pin_memory=...): every saved tensor, the Linear weights included."""

    def __init__(self, pin_memory):
        super().__init__(pin_memory=pin_memory)
        pack, unpack = self.pack_hook, self.unpack_hook
        self.packed_bytes = 0
        self.unpacked_bytes = 0

        def counted_pack(t):
            self.packed_bytes += _nbytes(t)
            return pack(t)

        def counted_unpack(p):
            if p[0].type != "cpu":  # .to() of a CPU tensor to the CPU copies nothing
                self.unpacked_bytes += _nbytes(p[1])
            return unpack(p)

        self.pack_hook, self.unpack_hook = counted_pack, counted_unpack


class SaveOnCpuLikeForLike(torch.autograd.graph.saved_tensors_hooks):
    """save_on_cpu's copies, over the tensors tiermem offloads (min_bytes and larger, no
    parameters)."""

    def __init__(self, min_bytes):
        self.min_bytes = min_bytes
        self.packed_bytes = 0
        self.unpacked_bytes = 0
        super().__init__(self._pack, self._unpack)

    def _pack(self, t):
        if same_selection(t, self.min_bytes):
            return t
        host = torch.empty(t.size(), dtype=t.dtype, pin_memory=t.is_cuda)
        host.copy_(t)
        self.packed_bytes += _nbytes(t)
        return (t.device, host)

    def _unpack(self, p):
        if isinstance(p, torch.Tensor):
            return p
        device, host = p
        if device.type != "cpu":  # .to() of a CPU tensor to the CPU copies nothing
            self.unpacked_bytes += _nbytes(host)
        return host.to(device, non_blocking=True)


class SideStreamReference(torch.autograd.graph.saved_tensors_hooks):
    """The reference: side-stream D2H with a bounded stash, on-demand reload (see the module
    docstring). On a CPU there are no streams: a pack is a copy, a reload hands the copy back."""

    def __init__(self, min_bytes, stash_limit=8):
        self.min_bytes = min_bytes
        self.stash_limit = stash_limit
        self.stream = torch.cuda.Stream() if torch.cuda.is_available() else None
        self.stash = []  # (source, event): sources kept alive until their copies have passed
        self.packed_bytes = 0
        self.unpacked_bytes = 0
        super().__init__(self._pack, self._unpack)

    def _drain(self, keep):
        """Lets go of the sources whose copies have passed; waits for the oldest while more
        than `keep` remain (the stash is bounded)."""
        while self.stash and (len(self.stash) > keep or self.stash[0][1].query()):
            source, event = self.stash.pop(0)
            event.synchronize()

    def _pack(self, t):
        if same_selection(t, self.min_bytes):
            return t
        host = torch.empty(t.size(), dtype=t.dtype, pin_memory=t.is_cuda)
        self.packed_bytes += _nbytes(t)
        if self.stream is None or not t.is_cuda:
            host.copy_(t)
            return (t.device, host, None)
        self._drain(self.stash_limit - 1)
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            host.copy_(t, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        self.stash.append((t, event))
        return (t.device, host, event)

    def _unpack(self, p):
        if isinstance(p, torch.Tensor):
            return p
        device, host, event = p
        if event is None:
            return host  # no streams: the copy made in pack is handed back
        self.unpacked_bytes += _nbytes(host)
        self._drain(0)  # forward is over: every source may go once its copy has passed
        # On demand: the reload starts when autograd asks, and compute waits for it.
        with torch.cuda.stream(self.stream):
            out = host.to(device, non_blocking=True)
        torch.cuda.current_stream().wait_stream(self.stream)
        out.record_stream(torch.cuda.current_stream())
        return out

    def finish(self):
        """After backward: nothing of the step stays in the stash."""
        self._drain(0)
