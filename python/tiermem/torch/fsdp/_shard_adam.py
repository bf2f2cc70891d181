"""The CPUAdam that steps one rank's shards for FSDPCPUAdam: the clipping norm is the whole
gradient's (one all_reduce over the shard dimension), and the ranks agree on each step's outcome
before any commits, so a failure on one rank leaves every rank as it was."""

import torch

import tiermem
from tiermem import _capi
from tiermem.torch.optim import CPUAdam


def _square_norm(g):
    return torch.linalg.vector_norm(g.detach(), 2.0).to(torch.float32) ** 2


class _ShardAdam(CPUAdam):
    """The CPUAdam stepping the local shards; only the clipping coefficient differs: the norm is
    the whole gradient's, across the ranks of the mesh."""

    _who = "FSDPCPUAdam"
    _display = "FSDPCPUAdam's state"  # in Runtime.close(force=True)'s warning

    def __init__(self, params, group, every, device, **kwargs):
        # group: the ranks holding different shards (the norm's); every: all the mesh's ranks,
        # which agree on each step's outcome (None: the default group).
        self._group, self._every, self._device = group, every, device
        self._scale = None  # the whole step's, while it is stepped unit by unit
        self._behind = None  # _BehindBackward, with the state on NVMe
        super().__init__(params, **kwargs)

    def _agree(self, failure):
        """Every rank has prepared its step (or failed to) and none has changed anything: one
        all_reduce of a flag (a step that went well costs no more), then every rank commits, or,
        when any rank failed, an all_gather of the outcomes and every rank raises the same
        TiermemError naming the rank that failed and why, its prepared step aborted. So no
        failure leaves the ranks out of step."""
        import torch.distributed as dist
        flag = torch.tensor([0 if failure is None else 1], dtype=torch.int32, device=self._device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._every)
        if not flag.item():
            return
        mine = None
        if failure is not None:
            status = getattr(failure, "status", _capi.STATUS_NAMES.index("TM_ERR_INTERNAL"))
            mine = (dist.get_rank(), int(status), str(failure))
        outcomes = [None] * dist.get_world_size(self._every)
        dist.all_gather_object(outcomes, mine, group=self._every)
        failed = [o for o in outcomes if o is not None]
        if not failed:
            return
        rank, status, why = failed[0]
        others = "" if len(failed) == 1 else " (and %d more rank%s: %s)" % (
            len(failed) - 1, "" if len(failed) == 2 else "s", ", ".join(str(r) for r, _, _ in failed[1:]))
        raise tiermem.TiermemError(
            status, "FSDPCPUAdam: rank %d failed its step%s: %s; the step was taken on no rank: "
            "every rank's shards and state are as before, and step() again, once the cause is "
            "gone, takes it" % (rank, others, why), "FSDPCPUAdam.step") from failure

    def _step_order(self, items):
        """The parameters whose state was started up behind backward first, in that order."""
        if self._behind is None:
            return items
        rank = {a: i for i, a in enumerate(self._behind.take())}
        return sorted(items, key=lambda it: rank.get(it[0], len(rank)))

    def _grad_scale(self, grads):
        if self._scale is not None:
            return self._scale
        # Every rank joins the all_reduce, also with no gradient of its own this step.
        if self.max_grad_norm is None:
            return 1.0
        return self._coefficient([_square_norm(g) for g in grads])

    def _coefficient(self, squares):
        """From this rank's gradients' squared 2-norms, in the parameters' order."""
        device = squares[0].device if squares else self._device
        total = torch.zeros((), dtype=torch.float32, device=device)
        for sq in squares:
            total += sq
        torch.distributed.all_reduce(total, group=self._group)
        # As torch.nn.utils.clip_grad_norm_ (and CPUAdam) make it from the total norm.
        coef = torch.clamp(self.max_grad_norm / (total.sqrt() + 1e-6), max=1.0)
        return float(coef.item())
