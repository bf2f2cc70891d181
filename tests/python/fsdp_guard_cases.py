"""fsdp_worker.py's cases of reads between uses with FSDPCPUAdam(shard_tier=..., grad_tier=...):
each read of a shard or gradient held in tiermem raises a RuntimeError that names the parameter
and what to do instead (not a SIGSEGV), the run going on bit-identically; and an outside user's
hostile pass (odd sizes, parameters only in the root unit, zero_grad(set_to_none=False), step()
twice, close() twice), each against plain FSDPCPUAdam doing the same."""

import torch
from torch.distributed.fsdp import fully_shard

from tiermem.torch import FSDPCPUAdam


def _raised(read):
    """What read() raised, as "Type: message"; "returned" when it did not raise."""
    try:
        read()
    except Exception as e:  # noqa: BLE001 - the type is what the test judges
        return "%s: %s" % (type(e).__name__, e)
    return "returned"


class GuardCases:
    """Mixed into fsdp_worker.Cases (uses runtime(), nvme_dir and _plain of ShardCases)."""

    def shards_guard(self, w):
        """Shards and gradients on NVMe; at step 3, between backward and step: clip_grad_norm_
        and a gradient's to_local().sum(); between steps: full_tensor(), to_local().sum(), a
        DTensor op, a detached copy's sum. Each must raise; then shards_in() reads the exact
        values of a plain FSDPCPUAdam run in lockstep, and the run ends with its bits."""
        with self.runtime(dram_bytes="4MiB", nvme_paths=self.nvme_dir, nvme_bytes="16MiB") as rt:
            model, plain = w.build(), w.build()
            opt = FSDPCPUAdam(model, runtime=rt, threads=1, shard_tier="nvme", grad_tier="nvme",
                              **w.HYPER)
            popt = FSDPCPUAdam(plain, threads=1, **w.HYPER)
            weight = model.layers[0].linear1.weight
            errors, losses, plain_losses, exact = {}, [], [], None
            for i in range(w.STEPS):
                loss = w.loss_of(model, *w.batch(i))
                loss.backward()
                if i == 2:
                    errors["clip_grad_norm_"] = _raised(
                        lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
                    errors["grad_to_local_sum"] = _raised(lambda: weight.grad.to_local().sum())
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
                plain_losses += w.train(plain, popt, 1, start=i)
                if i == 2:
                    errors["full_tensor"] = _raised(lambda: weight.full_tensor())
                    errors["to_local_sum"] = _raised(lambda: weight.to_local().sum())
                    errors["dtensor_add"] = _raised(lambda: weight + 1)
                    errors["detach_sum"] = _raised(lambda: weight.detach().sum())
                    errors["module_to"] = _raised(lambda: model.to("cpu"))
                    shape = list(weight.shape) + [weight.to_local().numel()]  # metadata reads
                    with opt.shards_in():
                        exact = all(torch.equal(a, b) for a, b in
                                    zip(w.full(model).values(), w.full(plain).values()))
            with opt.shards_in():
                params = w.full(model)
            opt.close()
            popt.close()
        out = dict(errors=errors, shape=shape, exact_in_shards_in=exact,
                   vs_plain=w.compare(losses, params, plain_losses, w.full(plain)))
        return out

    def _hostile_run(self, w, rt, make, tiers, steps=6, set_to_none=True, step_twice=False):
        model = make()
        kw = dict(shard_tier="dram", grad_tier="dram") if tiers else {}
        opt = FSDPCPUAdam(model, runtime=rt, threads=1, max_grad_norm=w.CLIP, **kw, **w.HYPER)
        losses = []
        for i in range(steps):
            loss = w.loss_of(model, *w.batch(i))
            loss.backward()
            opt.step()
            if step_twice:
                opt.step()
            opt.zero_grad(set_to_none=set_to_none)
            losses.append(loss.item())
        with opt.shards_in():
            params = w.full(model)
        opt.close()
        opt.close()
        after = w.full(model)  # plain tensors again: readable without shards_in()
        w.loss_of(model, *w.batch(0)).backward()  # and the model trains on
        return losses, params, after

    def shards_hostile(self, w):
        """Each against plain FSDPCPUAdam doing the same (clipped at w.CLIP, 6 steps)."""
        def odd():  # hidden 33: every shard padded on one rank
            torch.manual_seed(0)
            model = w.Net(hidden=33, heads=3)
            for block in model.layers:
                fully_shard(block)
            fully_shard(model)
            return model

        def root_holds_most():  # only the first block a unit: the rest is the root's
            torch.manual_seed(0)
            model = w.Net()
            fully_shard(model.layers[0])
            fully_shard(model)
            return model

        runs = dict(odd=dict(make=odd), root_holds_most=dict(make=root_holds_most),
                    zero_grad_keep=dict(make=w.build, set_to_none=False),
                    step_twice=dict(make=w.build, step_twice=True))
        out = {}
        with self.runtime(dram_bytes="16MiB") as rt:
            for name, kw in runs.items():
                try:
                    held = self._hostile_run(w, rt, tiers=True, **kw)
                except Exception as e:  # noqa: BLE001 - reported to the test
                    out[name] = dict(error="%s: %s" % (type(e).__name__, e))
                    continue
                plain = self._hostile_run(w, rt, tiers=False, **kw)
                out[name] = dict(
                    bit_identical=held[0] == plain[0] and all(
                        torch.equal(held[1][n], plain[1][n]) for n in plain[1]),
                    after_close_equal=all(torch.equal(held[1][n], held[2][n]) for n in held[1]))
            out["assign"] = self._assign(w, rt)
        return out

    def _assign(self, w, rt):
        """load_state_dict(assign=True) between steps puts new parameter objects on the held
        storages: reading one raises, step() refuses (it would step the old ones), close()
        brings them back readable."""
        model = w.build()
        opt = FSDPCPUAdam(model, runtime=rt, threads=1, shard_tier="dram", grad_tier="dram",
                          **w.HYPER)
        w.train(model, opt, 2)
        model.load_state_dict(model.state_dict(), assign=True)
        replaced = model.layers[0].linear1.weight
        out = dict(step=_raised(lambda: w.train(model, opt, 1)))
        out["read"] = _raised(lambda: replaced.sum())  # after the forward let its unit go
        opt.close()
        out["after_close"] = _raised(lambda: w.full(model))
        return out
