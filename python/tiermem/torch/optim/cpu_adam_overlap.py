"""CPUAdam's overlap with backward on a GPU (torch >= 2.1: register_post_accumulate_grad_hook).

As backward produces each gradient, it is copied down into a pinned buffer on a side stream; a
worker thread waits for the copy and steps that parameter's bucket on the CPU while backward
goes on (the C step releases the GIL), then copies the updated parameter up on an upload stream.
step() waits for the worker, and makes the current stream wait for the uploads: the next forward
waits only for them.

Clipping by global norm: each gradient's norm is computed on the side stream as it lands, and
the CPU steps wait until backward is over and the global norm is known (the coefficient must
multiply every gradient). The downloads still overlap with backward; the steps do not. Stepping
speculatively and redoing when clipping triggers would need a copy of the state (12 more bytes
written per parameter, ~40% more DRAM traffic on every step); left out.

Assumes one backward per step (no gradient accumulation over micro-batches with overlap=True).
Not exercised on this machine (no GPU): tests/python/test_cpu_adam.py skips it with a reason.
"""

import queue
import threading

import torch


class Overlap:
    def __init__(self, opt):
        self.opt = opt
        self.side = torch.cuda.Stream()
        self.up = torch.cuda.Stream()
        self.queue = queue.Queue()
        self.cv = threading.Condition()
        self.pending = 0
        self.error = None
        self.norms = []
        self.landed = []
        self.group_of = {}
        self.handles = []
        for group in opt.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.numel() > 0:  # an empty one has nothing to step
                    self.group_of[p] = group
                    self.handles.append(p.register_post_accumulate_grad_hook(self._on_grad))
        self.worker = threading.Thread(target=self._run, name="cpu_adam_overlap", daemon=True)
        self.worker.start()

    def _on_grad(self, p):
        group = self.group_of[p]
        slot = self.opt._store.slot(p, group["amsgrad"])
        g = p.grad.detach()
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            if slot.grad_host is None or slot.grad_host.dtype != g.dtype:
                slot.grad_host = torch.empty(slot.count, dtype=g.dtype, pin_memory=True)
            slot.grad_host.copy_(g.reshape(-1), non_blocking=True)
            if self.opt.max_grad_norm is not None:
                self.norms.append(torch.norm(g, 2.0))
            landed = torch.cuda.Event()
            landed.record(self.side)
        g.record_stream(self.side)
        with self.cv:
            self.pending += 1
        self.queue.put((p, group, slot.grad_host, landed))

    def _run(self):
        while True:
            item = self.queue.get()
            if item is None:
                return
            p, group, host, landed = item
            try:
                landed.synchronize()
                if self.opt.max_grad_norm is None:
                    with torch.cuda.stream(self.up):
                        self.opt._step_params([(p, group, host)], 1.0)
                else:
                    self.landed.append((p, group, host))
            except Exception as e:  # noqa: BLE001: reported by step()
                self.error = self.error or e
            with self.cv:
                self.pending -= 1
                self.cv.notify_all()

    def drain(self):
        with self.cv:
            while self.pending:
                self.cv.wait()

    def finish(self):
        self.drain()
        if self.error is not None:
            e, self.error = self.error, None
            raise e
        if self.landed:
            self.side.synchronize()
            total = torch.norm(torch.stack(self.norms), 2.0)
            coef = torch.clamp(self.opt.max_grad_norm / (total + 1e-6), max=1.0)
            with torch.cuda.stream(self.up):
                self.opt._step_params(self.landed, float(coef.float().item()))
        self.landed, self.norms = [], []
        torch.cuda.current_stream().wait_stream(self.up)

    def close(self):
        for h in self.handles:
            h.remove()
        self.queue.put(None)
        self.worker.join()
