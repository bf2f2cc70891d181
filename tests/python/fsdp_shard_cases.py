"""fsdp_worker.py's cases of FSDPCPUAdam(..., shard_tier=...): the parameter shards held in
tiermem between uses. Each trains as the plain FSDPCPUAdam case it mirrors and must give its
bits; while training it records what a test can fail on: the shards' torch storage empty and
tiermem's copy on NVMe between steps, at most the schedule's units in torch memory at each of
the model's forward pre-hooks, and the bytes moved."""

import os
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)

import tiermem
from tiermem import _capi
from tiermem.torch import FSDPCPUAdam
from swap_files import flip_swap_files


class ShardCases:
    """Mixed into fsdp_worker.Cases: uses its runtime(), ref(), _dram and the worker's build,
    train, batch, compare, full and HYPER (passed in as `w`, the worker module)."""

    def _plain(self, key, make):
        cache = self.__dict__.setdefault("_plain_runs", {})
        if key not in cache:
            cache[key] = make()
        return cache[key]

    def _shard_run(self, w, rt, kind="nn", steps=None, clip=None, **kw):
        """steps of FSDPCPUAdam with shard_tier; per step after the first, what was resident."""
        model = w.build(kind)
        opt = FSDPCPUAdam(model, runtime=rt, threads=1, max_grad_norm=clip, **kw, **w.HYPER)
        held = opt.shard_offload
        losses, between, after_backward = [], [], []
        for i in range(steps or w.STEPS):
            loss = w.loss_of(model, *w.batch(i))  # w.train's step, looked at after backward
            loss.backward()
            after_backward.append(held.residency())
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            between.append(held.residency())
        with opt.shards_in():
            params = w.full(model)
        out = dict(units=len(held.units), peak_units=held.peak_units, bytes_in=held.bytes_in,
                   bytes_out=held.bytes_out, stats=rt.stats()["bytes_moved"],
                   shard_bytes=sum(r.nbytes for u in held.units for r in u.records))
        # From the first step's end on, no shard is in torch memory between steps.
        out["released"] = all(r["torch_bytes"] == 0 for step in between[1:] for r in step)
        # Per unit, the tiers holding tiermem's copy between steps, in every step.
        out["tiers"] = [[sorted(step[i]["tiers"]) for step in between[1:]]
                        for i in range(len(held.units))]
        # With grad_tier: from the second backward on, every gradient shard in tiermem.
        out["grads_released"] = all(r["grad_torch_bytes"] == 0 for step in after_backward[1:]
                                    for r in step)
        out["grad_tiers"] = [[sorted(step[i]["grad_tiers"]) for step in after_backward[1:]]
                             for i in range(len(held.units))]
        out.update(grad_bytes_in=held.grad_bytes_in, grad_bytes_out=held.grad_bytes_out)
        behind = opt._adam._behind  # the step prepared behind backward, unit by unit
        out["early"] = behind is not None and behind.step_early
        opt.close()
        return losses, params, out

    def shards_nvme(self, w):
        """Shards, gradients and state on NVMe, the DRAM budget below one rank's state: the bits of
        FSDPCPUAdam without shard offload, and AdamW's curve."""
        dram = 384 << 10
        with self.runtime(dram_bytes=dram, nvme_paths=self.nvme_dir, nvme_bytes="16MiB",
                          prefetch_depth=2) as rt:
            losses, params, out = self._shard_run(w, rt, state_tier="nvme", shard_tier="nvme",
                                                  grad_tier="nvme")
        out.update(w.compare(losses, params, *self.ref()), dram_bytes=dram,
                   state_bytes=w.state_bytes(w.build()))
        out["vs_plain"] = w.compare(losses, params, *self._plain("nn", lambda: self._run_plain(w)))
        return out

    def _run_plain(self, w, kind="nn", clip=None):
        model = w.build(kind)
        opt = FSDPCPUAdam(model, threads=1, max_grad_norm=clip, **w.HYPER)
        losses = w.train(model, opt, w.STEPS)
        opt.close()
        return losses, w.full(model)

    def shards_llama(self, w):
        """Llama with its shards and gradients in DRAM, clipped (the norm from the squared norms
        taken before the gradients went down): the bits of the plain run, AdamW's curve."""
        try:
            import transformers  # noqa: F401
        except ImportError as e:
            return dict(skipped="transformers is not installed (%s)" % e)
        with self.runtime(dram_bytes="16MiB") as rt:
            losses, params, out = self._shard_run(w, rt, "llama", clip=w.CLIP, shard_tier="dram",
                                                  grad_tier="dram")
        out.update(w.compare(losses, params, *self.ref("llama", clip=w.CLIP), kind="llama"))
        plain = self._plain("llama-clip", lambda: self._run_plain(w, "llama", w.CLIP))
        out["vs_plain"] = w.compare(losses, params, *plain, kind="llama")
        return out

    def shards_dcp(self, w):
        """Saved through DCP at step 10 with the shards on NVMe, loaded into a fresh model and
        optimizer with shards on NVMe: 10 more steps give the bits of the run that went on."""
        half = w.STEPS // 2
        path = os.path.join(self.dcp_dir, "shards")
        results = []
        with self.runtime(dram_bytes="4MiB", nvme_paths=self.nvme_dir, nvme_bytes="32MiB") as rt:
            for resume in (False, True):
                model = w.build()
                opt = FSDPCPUAdam(model, runtime=rt, threads=1, shard_tier="nvme", **w.HYPER)
                if not resume:
                    w.train(model, opt, half)
                    dcp.save({"model": get_model_state_dict(model),
                              "optim": get_optimizer_state_dict(model, opt)},
                             checkpoint_id=path)
                else:
                    sd = {"model": get_model_state_dict(model),
                          "optim": get_optimizer_state_dict(model, opt)}
                    dcp.load(sd, checkpoint_id=path)
                    set_model_state_dict(model, sd["model"])
                    set_optimizer_state_dict(model, opt, sd["optim"])
                losses = w.train(model, opt, half, start=half)
                released = all(r["torch_bytes"] == 0 for r in opt.shard_offload.residency())
                with opt.shards_in():
                    results.append((losses, w.full(model), released,
                                    opt.shard_offload.offloaded))
                opt.close()
        (went_losses, went, rel_a, off_a), (res_losses, res, rel_b, off_b) = results
        plain = self._plain("nn", lambda: self._run_plain(w))
        return dict(resumed=w.compare(res_losses, res, went_losses, went),
                    went_on_vs_plain=w.compare(went_losses, went, plain[0][half:], plain[1]),
                    released=rel_a and rel_b, offloaded=off_a and off_b)

    def shards_accumulate(self, w):
        """Gradient accumulation (two backwards a step) with shards and gradients in DRAM: the
        second backward adds into gradients tiermem held, brought back before FSDP2's
        post-backward adds to them; the bits of plain FSDPCPUAdam accumulating the same way."""
        def run(rt, **kw):
            model = w.build()
            opt = FSDPCPUAdam(model, runtime=rt, threads=1, max_grad_norm=w.CLIP, **kw,
                              **w.HYPER)
            losses, held_after_first = [], []
            for i in range(6):
                for micro in range(2):
                    loss = w.loss_of(model, *w.batch(2 * i + micro))
                    loss.backward()
                    losses.append(loss.item())
                    if micro == 0 and opt.shard_offload is not None:
                        held_after_first.append(all(
                            r["grad_torch_bytes"] == 0 for r in opt.shard_offload.residency()))
                opt.step()
                opt.zero_grad()
            with opt.shards_in():
                params = w.full(model)
            opt.close()
            return losses, params, held_after_first

        with self.runtime(dram_bytes="16MiB") as rt:
            plain = run(rt)
            held = run(rt, shard_tier="dram", grad_tier="dram")
        return dict(vs_plain=w.compare(held[0], held[1], plain[0], plain[1]),
                    grads_held_between_backwards=held[2][1:], steps=6)

    def shards_prefetch(self, w):
        """FSDP2's explicit prefetch (set_modules_to_forward_prefetch / _backward_prefetch) with
        shards and gradients on NVMe: each target comes in before the module that prefetches it
        all-gathers it; the bits of plain FSDPCPUAdam under the same prefetch lists."""
        def run(rt, **kw):
            model = w.build()
            a, b = model.layers
            model.set_modules_to_forward_prefetch([a])
            a.set_modules_to_forward_prefetch([b])
            b.set_modules_to_backward_prefetch([a])
            opt = FSDPCPUAdam(model, runtime=rt, threads=1, **kw, **w.HYPER)
            losses = w.train(model, opt, 6)
            with opt.shards_in():
                params = w.full(model)
            peak = opt.shard_offload.peak_units if opt.shard_offload is not None else None
            opt.close()
            return losses, params, peak

        with self.runtime(dram_bytes="4MiB", nvme_paths=self.nvme_dir, nvme_bytes="16MiB") as rt:
            plain = run(rt)
            held = run(rt, shard_tier="nvme", grad_tier="nvme")
        return dict(vs_plain=w.compare(held[0], held[1], plain[0], plain[1]),
                    peak_units=held[2])

    def shards_rt_close(self, w):
        """The runtime closed before the optimizer, by an exception inside its `with` block
        after a backward (shards, gradient shards and state on NVMe): its close() brings them
        all home, the model reads as it did inside shards_in(), and the step and 14 more go on:
        the bits of plain FSDPCPUAdam; close() after that returns. Also the refused
        shard_prefetch_depth values, and step() after close()."""
        out = dict(depth={})
        with self.runtime(dram_bytes="1MiB", nvme_paths=self.nvme_dir,
                          nvme_bytes="16MiB") as rt:
            for depth in (-1, "x", 2.5, None, True):
                try:
                    FSDPCPUAdam(w.build(), runtime=rt, shard_tier="nvme",
                                shard_prefetch_depth=depth)
                    out["depth"][repr(depth)] = "accepted"
                except Exception as e:  # noqa: BLE001 - reported to the test
                    out["depth"][repr(depth)] = "%s: %s" % (type(e).__name__, e)
        model = w.build()
        losses = []
        try:
            with self.runtime(dram_bytes="1MiB", nvme_paths=self.nvme_dir,
                              nvme_bytes="16MiB") as rt:
                opt = FSDPCPUAdam(model, runtime=rt, threads=1, state_tier="nvme",
                                  shard_tier="nvme", grad_tier="nvme", **w.HYPER)
                losses += w.train(model, opt, 5)
                with opt.shards_in():
                    before = w.full(model)
                loss = w.loss_of(model, *w.batch(5))
                loss.backward()
                losses.append(loss.item())
                out["grads_held"] = all(r["grad_torch_bytes"] == 0
                                        for r in opt.shard_offload.residency())
                raise KeyboardInterrupt  # the `with` block ends first
        except KeyboardInterrupt:
            pass
        out["closed"] = rt.closed
        out["shard_offload_off"] = opt.shard_offload is None
        after = w.full(model)  # no shards_in(): ordinary tensors again
        out["reads_as_before"] = all(torch.equal(after[n], before[n]) for n in before)
        opt.step()
        opt.zero_grad()
        losses += w.train(model, opt, w.STEPS - 6, start=6)
        params = w.full(model)
        opt.close()
        opt.close()
        try:
            opt.step()
            out["step_after_close"] = "returned"
        except Exception as e:  # noqa: BLE001 - reported to the test
            out["step_after_close"] = "%s: %s" % (type(e).__name__, e)
        out["vs_plain"] = w.compare(losses, params, *self._plain("nn", lambda: self._run_plain(w)))
        out["forced"] = self._forced_close(w)
        return out

    def _forced_close(self, w):
        """Every swap file corrupt (checksums on): close(force=True) closes, the shards that
        could not come home lost. The next forward all-gathered their empty storages (a SIGSEGV
        on every rank); now they hold NaN, and a checkpoint loaded into the model (DCP's
        set_model_state_dict) gives back the loss it had before."""
        model = w.build()
        os.environ["TIERMEM_DRAM_INCLUSIVE"] = "off"  # no clean DRAM copy to come home from
        try:
            rt = self.runtime(dram_bytes="1MiB", nvme_paths=self.nvme_dir, nvme_bytes="16MiB",
                              checksum="xxh3")
        finally:
            del os.environ["TIERMEM_DRAM_INCLUSIVE"]
        opt = FSDPCPUAdam(model, runtime=rt, threads=1, state_tier="nvme", shard_tier="nvme",
                          **w.HYPER)
        w.train(model, opt, 2)
        saved = {k: v.detach().clone() for k, v in get_model_state_dict(model).items()}
        x = w.batch(2)
        with torch.no_grad():
            want = w.loss_of(model, *x).item()
        for u in opt.shard_offload.units:
            for r in u.records:
                r.tm.offload("nvme")
                r.tm.sync()
        out = dict(flipped=bool(flip_swap_files(self.nvme_dir)))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rt.close(force=True)
        out["warned"] = " | ".join(str(c.message) for c in caught)
        with torch.no_grad():
            out["loss_after"] = w.loss_of(model, *x).item()  # NaN (no crash)
        try:  # the state went with the runtime: step() says so (with no gradient it returned)
            opt.step()
            out["step_after"] = "returned"
        except tiermem.TiermemError as e:
            out["step_after"] = str(e)
        set_model_state_dict(model, saved)
        with torch.no_grad():
            out["loaded_as_before"] = w.loss_of(model, *x).item() == want
        opt.close()
        return out

    def shards_overlap(self, w):
        """Shards, gradients and state on NVMe, no clipping: the step prepared behind backward
        unit by unit (each unit's part once FSDP2 has set its gradients: its state read, its new
        state and new shards written down beside the old), step() agreeing and committing.
        Against overlap=False, bit for bit: plain steps; two micro-batches a step (falls back
        to the step at step(), with a warning); a learning rate changed between steps; without
        grad_tier, the gradients halved in place before step() (falls back). And a failure of
        rank 1's part behind backward (injected once): every rank raises the same
        TiermemError, no rank's shards change, and step() again takes the step, the run going
        on with the bits of one that never failed. And what a user meets reading the gradients
        after backward (every one raises, on every rank: backward returned once the worker had
        sent them all down) and calling clip_grad_norm_ (raises, nothing changed)."""
        def fail_once(adam):
            # The first part added to the next step fails, once its C step was begun.
            real = adam.begin_parts

            def begin(*args, **kwargs):
                adam.begin_parts = real
                step = real(*args, **kwargs)

                def failing(*a, **k):
                    del step._prepare_part
                    raise tiermem.TiermemError(_capi.STATUS_NAMES.index("TM_ERR_IO"),
                                               "injected: a unit's state unreadable",
                                               "tm_adam_step_groups_extend")
                step._prepare_part = failing
                return step
            adam.begin_parts = begin

        def run(overlap, grad_tier="nvme", micro=1, halve=False, lr=False, fail=False, steps=4,
                read=False, clip=None, scales=None):
            out = {}
            with self.runtime(dram_bytes=1 << 20, nvme_paths=self.nvme_dir,
                              nvme_bytes="32MiB") as rt, \
                    warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model = w.build()
                opt = FSDPCPUAdam(model, runtime=rt, threads=1, state_tier="nvme",
                                  shard_tier="nvme", grad_tier=grad_tier, overlap=overlap,
                                  max_grad_norm=clip, **w.HYPER)
                behind = opt._adam._behind
                losses, early = [], []
                for i in range(steps):
                    if fail and i == 2 and dist.get_rank() == 1:
                        fail_once(opt._adam)
                    for k in range(micro):
                        loss = w.loss_of(model, *w.batch(micro * i + k))
                        (loss if scales is None else loss * scales[i]).backward()
                    behind._idle()
                    early.append(len(behind.units))  # the units prepared behind backward
                    if halve:  # as clip_grad_norm_ would
                        torch._foreach_mul_([p.grad for p in model.parameters()], 0.5)
                    if read and i == 2:  # what a user's logging or clipping meets
                        out["grads"] = sum(p.grad is not None for p in model.parameters())
                        out["read_raised"] = 0
                        for p in model.parameters():
                            try:
                                p.grad.to_local().norm().item()
                            except RuntimeError:
                                out["read_raised"] += 1
                        try:
                            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
                            out["clip"] = "clipped"
                        except RuntimeError as e:
                            out["clip"] = str(e)
                    if fail and i == 2:
                        try:
                            opt.step()
                            out["error"] = None
                        except tiermem.TiermemError as e:
                            out["error"] = [e.status_name, str(e)]
                        with opt.shards_in():
                            now = w.full(model)
                        out["unchanged"] = all(torch.equal(before[n], p) for n, p in now.items())
                    opt.step()
                    opt.zero_grad()
                    if lr:  # a schedule, between the step and the next backward
                        for group in opt.param_groups:
                            group["lr"] *= 0.5
                    losses.append(loss.item())
                    if fail and i == 1:
                        with opt.shards_in():
                            before = w.full(model)
                out.update(early=early, early_after=behind.step_early,
                           grad_bytes_in=opt.shard_offload.grad_bytes_in,
                           warnings=[str(m.message) for m in caught],
                           warned_in=sorted({os.path.basename(m.filename) for m in caught}))
                with opt.shards_in():
                    params = w.full(model)
                opt.close()
            return losses, params, out

        result = {}
        for name, kw in (("plain", {}), ("micro", dict(micro=2)), ("lr", dict(lr=True)),
                         ("halve", dict(halve=True, grad_tier=None)),
                         ("no_grad_tier", dict(grad_tier=None)), ("fault", dict(fail=True)),
                         ("clip", dict(clip=1.0, steps=5, scales=w.CLIP_SCALES)),
                         ("reads", dict(read=True))):
            want = run(False, **{k: v for k, v in kw.items() if k not in ("fail", "read")})
            got = run(None, **kw)
            result[name] = dict(got[2], same=w.compare(got[0], got[1], want[0],
                                                       want[1])["bit_identical"],
                                early_off=want[2]["early"])
        return result
