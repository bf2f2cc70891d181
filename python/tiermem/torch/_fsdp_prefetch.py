"""FSDPCPUAdam's NVMe optimizer state read while backward still runs.

FSDP2 sets each sharded parameter's reduce-scattered gradient at the end of its unit's backward
and then runs the parameter's post-accumulate-grad hooks. From there, the parameter's optimizer
state (its CPUAdam slices, on NVMe) is started up into DRAM, in the order the gradients come
(the last layers first), up to a share of the DRAM tier; the step then takes the parameters in
that same order, so that what was read behind backward is stepped first and the step's own
pipeline reads the rest. The share is half the DRAM tier less the largest slice twice: the
step's pipeline keeps to the other half (lib/optim/step_stream.cc), so neither evicts the
other's reads. A read the runtime cannot start (no room, the tensor busy) is a hint dropped:
the step reads it itself."""

import tiermem


class _StatePrefetch:
    """The hooks on the parameters, and the order their gradients came in since the last
    step."""

    def __init__(self, adam, shards, capacity):
        # adam: the CPUAdam stepping the shards; shards: {parameter: its local shard's alias,
        # the CPUAdam's parameter}; capacity: the DRAM tier's bytes.
        self.adam, self.shards = adam, shards
        self.capacity = capacity
        self.order = {}  # alias -> None, in the order the gradients were set (a dict: ordered)
        self.started = 0  # state bytes started up this step
        self.full = False
        self._handles = [p.register_post_accumulate_grad_hook(self._gradient_set)
                         for p in shards if p.requires_grad]

    def _budget(self):
        largest = max((t.nbytes for slot in self.adam._slots.values()
                       for t, _, _, _ in slot.slices()), default=0)
        return max(0, self.capacity // 2 - 2 * largest)

    def _gradient_set(self, p):
        a = self.shards.get(p)
        if a is None or a in self.order:
            return
        self.order[a] = None
        slot = self.adam._slots.get(a)
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

    def take(self):
        """The aliases in the order their gradients came, for the step; the next step's
        prefetch starts afresh."""
        order = list(self.order)
        self.order, self.started, self.full = {}, 0, False
        return order

    def close(self):
        for h in self._handles:
            h.remove()
        self._handles = []
