"""One rank of test_fsdp.py (run by torchrun, gloo, CPU): a small transformer under FSDP2's
fully_shard trained with tiermem's FSDPCPUAdam and with torch.optim.AdamW, each case's figures
written as JSON to $FSDP_OUT/<case>.rank<R>.json for test_fsdp.py to judge. FSDP_CASES lists the
cases to run (comma-separated). The swap files go to $FSDP_OUT/nvme-node<N> (one directory per
node, shared by its ranks as they share its drives), the checkpoints to $FSDP_OUT/dcp."""

import gc
import json
import warnings
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import CPUOffloadPolicy, FullyShardedDataParallel, fully_shard
from torch.distributed.device_mesh import init_device_mesh
from torch.nn import functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import tiermem  # noqa: E402
from tiermem.torch import FSDPCPUAdam  # noqa: E402
from fsdp_guard_cases import GuardCases  # noqa: E402
from fsdp_shard_cases import ShardCases  # noqa: E402
from swap_files import flip_swap_files, restore  # noqa: E402

torch.set_num_threads(1)  # two ranks on a shared 2-core machine
# CPUAdam's test uses these: lr 1e-3 keeps last-bit differences from growing (test_cpu_adam.py).
HYPER = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
STEPS, BATCH, SEQ, VOCAB = 20, 4, 16, 128
CLIP = 0.05
# Loss scales that put the gradients' norm far below max_grad_norm=1 (not clipped) or far above
# it (clipped): step by step, not clipped, clipped, clipped, not, not.
CLIP_SCALES = (1e-2, 1e4, 1e4, 1e-2, 1e-2)


class Net(nn.Module):
    """Stock nn modules: an embedding, pre-norm nn.TransformerEncoderLayer blocks, a head."""

    def __init__(self, hidden=64, heads=4, blocks=2):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, hidden)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(hidden, heads, 2 * hidden, dropout=0.0, batch_first=True,
                                       norm_first=True) for _ in range(blocks))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, VOCAB)

    def forward(self, x, y):
        h = self.tok(x)
        for layer in self.layers:
            h = layer(h, is_causal=False)
        # The loss in fp32: under a bf16 MixedPrecisionPolicy a bf16 loss rounds to 1/128 of
        # itself, and a last-bit difference in the parameters flips it a whole bf16 step (0.6%),
        # past the 1e-5 the curves are compared to (seen on a CPU with AMX: bf16 matmuls there
        # differ from the fp32 path in the last bits).
        logits = self.head(self.norm(h)).float()
        return F.cross_entropy(logits.view(-1, VOCAB), y.view(-1))


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=SEQ, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    return LlamaForCausalLM(cfg)


def build(kind="nn", **shard_opts):
    """The same initial weights on every rank and in every run, sharded block by block."""
    torch.manual_seed(0)
    if kind == "llama":
        model = llama()
        blocks = model.model.layers
    else:
        model = Net()
        blocks = model.layers
    for block in blocks:
        fully_shard(block, **shard_opts)
    fully_shard(model, **shard_opts)
    return model


def loss_of(model, x, y):
    if isinstance(model, Net):
        return model(x, y)
    return model(input_ids=x, labels=x).loss


def batch(i):
    g = torch.Generator().manual_seed(1000 * i + dist.get_rank())  # each rank its own data
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return x, torch.roll(x, -1, dims=1)


def train(model, opt, steps, start=0, clip=None, between=None):
    """clip: torch's clip_grad_norm_ before the step (the reference's clipping). between(i):
    called between backward and the step."""
    losses = []
    for i in range(start, start + steps):
        loss = loss_of(model, *batch(i))
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if between is not None:
            between(i)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def dcp_save(model, opt, path):
    dcp.save({"model": get_model_state_dict(model),
              "optim": get_optimizer_state_dict(model, opt)}, checkpoint_id=path)


def dcp_load(model, opt, path):
    """As docs/pytorch.md has it: get_state_dict, dcp.load, set_state_dict."""
    sd = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
    dcp.load(sd, checkpoint_id=path)
    set_model_state_dict(model, sd["model"])
    set_optimizer_state_dict(model, opt, sd["optim"])


def full(model):
    return {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}


def adamw(model):
    return torch.optim.AdamW(model.parameters(), foreach=False, **HYPER)


def compare(losses, params, ref_losses, ref_params, kind="nn"):
    """The worst relative difference of the losses; whether every parameter is within
    torch.testing.assert_close's float32 tolerance of the reference (|a - b| <= 1e-5 + 1.3e-6
    |b|: torch's own optimizer tests compare implementations so), and the worst difference; and
    the most a reference parameter moved from the initial weights (so that a run that did not
    step cannot pass). nn.MultiheadAttention's key bias (in_proj_bias[hidden:2 * hidden]) is
    left out of the parameters: softmax is invariant to it, so its gradient is zero in exact
    arithmetic and rounding noise in practice, which Adam scales to steps of +-lr, and a
    last-bit difference anywhere changes it by up to lr a step (here only those elements differ
    by more than 1e-6 relative)."""
    worst_loss = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    worst_param, close = 0.0, True
    for name, b in ref_params.items():
        a = params[name]
        if name.endswith("in_proj_bias"):
            h = b.numel() // 3
            a, b = torch.cat([a[:h], a[2 * h:]]), torch.cat([b[:h], b[2 * h:]])
        worst_param = max(worst_param, (a - b).abs().max().item())
        close = close and torch.allclose(a, b, rtol=1.3e-6, atol=1e-5)
    init = _initial(kind)
    moved = max((ref_params[n] - init[n]).abs().max().item() for n in init)
    identical = losses == ref_losses and all(torch.equal(params[n], ref_params[n])
                                             for n in ref_params)
    return dict(worst_loss=worst_loss, worst_param=worst_param, params_close=close,
                moved=moved, steps=len(losses), bit_identical=identical)


_INITIAL = {}


def _initial(kind):
    if kind not in _INITIAL:
        _INITIAL[kind] = full(build(kind))
    return _INITIAL[kind]


def state_bytes(model):
    return sum(12 * p.to_local().numel() for p in model.parameters())


class Cases(ShardCases, GuardCases):
    def __init__(self, base):
        self.nvme_dir = os.path.join(base, "nvme-node%s" % os.environ.get("GROUP_RANK", "0"))
        self.dcp_dir = os.path.join(base, "dcp")
        os.makedirs(self.nvme_dir, exist_ok=True)
        self._refs = {}
        self._dram = None

    def ref(self, kind="nn", clip=None):
        key = (kind, clip)
        if key not in self._refs:
            model = build(kind)
            losses = train(model, adamw(model), STEPS, clip=clip)
            self._refs[key] = losses, full(model)
        return self._refs[key]

    def runtime(self, **kw):
        settings = dict(device="emulated", hbm_bytes="8MiB", dram_bytes="4MiB",
                        log_level="error")
        settings.update(kw)
        return tiermem.Runtime(**settings)

    def dram(self):
        with self.runtime() as rt:
            model = build()
            opt = FSDPCPUAdam(model, runtime=rt, state_tier="dram", threads=1, **HYPER)
            losses = train(model, opt, STEPS)
            opt.close()
        self._dram = losses, full(model)
        return compare(*self._dram, *self.ref())

    def nvme(self):
        # A DRAM budget below this rank's state: each step streams the state through NVMe.
        # 128 KiB of it is the runtime's staging pool; the rest holds a few buckets.
        dram = 384 << 10
        with self.runtime(dram_bytes=dram, nvme_paths=self.nvme_dir, nvme_bytes="16MiB",
                          prefetch_depth=2) as rt:
            model = build()
            opt = FSDPCPUAdam(model, runtime=rt, state_tier="nvme", threads=1, **HYPER)
            losses = train(model, opt, STEPS)
            opt.close()
            stats, info = rt.stats(), rt.info()
        params = full(model)
        out = compare(losses, params, *self.ref())
        if self._dram is not None:  # the same steps, the state in another tier: the same bits
            out["vs_dram"] = compare(losses, params, *self._dram)
        out.update(dram_bytes=dram, state_bytes=state_bytes(model),
                   to_nvme=stats["bytes_moved"]["dram"]["nvme"],
                   from_nvme=stats["bytes_moved"]["nvme"]["dram"],
                   local_rank=info["local_rank"], local_world_size=info["local_world_size"])
        return out

    def pretrained(self):
        """A fine-tune as a DCP checkpointer starts it: the optimizer's state dict made first
        (get_optimizer_state_dict steps FSDPCPUAdam once with zero gradients: its masters are
        the initial weights), then pretrained weights loaded with set_model_state_dict. The
        masters were the initial weights still, and the first step put them back (an outside
        client): the run must follow AdamW's from the pretrained weights, state on NVMe."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions
        torch.manual_seed(7)
        pretrained = {n: t + 0.05 * torch.randn_like(t)
                      for n, t in Net().state_dict().items()}
        options = StateDictOptions(full_state_dict=True)

        def run(make):
            model = build()
            opt = make(model)
            get_optimizer_state_dict(model, opt)
            set_model_state_dict(model, pretrained, options=options)
            return model, opt, train(model, opt, 5)

        ref, ref_opt, ref_losses = run(adamw)
        with self.runtime(dram_bytes=384 << 10, nvme_paths=self.nvme_dir,
                          nvme_bytes="16MiB") as rt:
            model, opt, losses = run(lambda m: FSDPCPUAdam(m, runtime=rt, state_tier="nvme",
                                                           threads=1, **HYPER))
            # A clamp_ between backward and step(): the step prepared behind backward (the
            # default on a CPU mesh with the state on NVMe) stepped the masters from before it,
            # and the clamp was lost; now it is dropped (one UserWarning) and taken at step().
            def clamp(i):
                with torch.no_grad():
                    for p in (ref if clamping is ref else model).parameters():
                        p.clamp_(-0.05, 0.05)
            clamping = ref
            train(ref, ref_opt, 2, start=5, between=clamp)
            clamping = model
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                train(model, opt, 2, start=5, between=clamp)
            opt.close()
        out = compare(losses, full(model), ref_losses, full(ref))
        out["clamped"] = max(p.to_local().abs().max().item() for p in model.parameters())
        out["warned"] = [str(w.message) for w in caught if "was written" in str(w.message)]
        return out

    def clip(self):
        model = build()
        opt = FSDPCPUAdam(model, max_grad_norm=CLIP, threads=1, **HYPER)
        losses = train(model, opt, STEPS)
        opt.close()
        out = compare(losses, full(model), *self.ref(clip=CLIP))
        out["clipping_changed_the_reference"] = self.ref(clip=CLIP)[0] != self.ref()[0]
        return out

    def mixed(self):
        """MixedPrecisionPolicy(bf16 compute, fp32 reduce): the shards the optimizer steps stay
        fp32; against AdamW under the same policy."""
        from torch.distributed.fsdp import MixedPrecisionPolicy
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        ref = build(mp_policy=policy)
        ref_losses = train(ref, adamw(ref), STEPS)
        model = build(mp_policy=policy)
        opt = FSDPCPUAdam(model, threads=1, **HYPER)
        losses = train(model, opt, STEPS)
        opt.close()
        return compare(losses, full(model), ref_losses, full(ref))

    def llama(self):
        try:
            import transformers  # noqa: F401
        except ImportError as e:
            return dict(skipped="transformers is not installed (%s)" % e)
        model = build("llama")
        opt = FSDPCPUAdam(model, threads=1, **HYPER)
        losses = train(model, opt, STEPS)
        opt.close()
        return compare(losses, full(model), *self.ref("llama"), kind="llama")

    def budget(self):
        """A percentage budget is split over this node's ranks only (TIERMEM_DRAM_BYTES=1%:
        each of a node's ranks gets 1% of its RAM / its local world size)."""
        saved = os.environ.get("TIERMEM_DRAM_BYTES")
        os.environ["TIERMEM_DRAM_BYTES"] = "1%"
        try:
            with tiermem.Runtime(device="emulated", hbm_bytes="8MiB", log_level="error") as rt:
                info = rt.info()
        finally:
            if saved is None:
                del os.environ["TIERMEM_DRAM_BYTES"]
            else:
                os.environ["TIERMEM_DRAM_BYTES"] = saved
        return dict(dram=info["tier_bytes"]["dram"], local_rank=info["local_rank"],
                    local_world_size=info["local_world_size"], rank=dist.get_rank(),
                    node=int(os.environ.get("GROUP_RANK", "0")))

    def refusals(self):
        out = {}

        def refused(name, make):
            try:
                make()
            except (ValueError, TypeError) as e:
                out[name] = "%s: %s" % (type(e).__name__, e)
            else:
                out[name] = "accepted"

        torch.manual_seed(0)
        fsdp1 = nn.Sequential(FullyShardedDataParallel(Net(), device_id=torch.device("cpu")))
        refused("fsdp1", lambda: FSDPCPUAdam(fsdp1))
        refused("cpu_offload_policy",
                lambda: FSDPCPUAdam(build(offload_policy=CPUOffloadPolicy(pin_memory=False))))

        def tensor_parallel():
            from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
            mesh = init_device_mesh("cpu", (1, dist.get_world_size()),
                                    mesh_dim_names=("dp", "tp"))
            torch.manual_seed(0)
            model = Net()
            parallelize_module(model.head, mesh["tp"], ColwiseParallel())
            fully_shard(model, mesh=mesh["dp"])
            FSDPCPUAdam(model)

        refused("tensor_parallel", tensor_parallel)

        def ignored():
            torch.manual_seed(0)
            model = Net()
            fully_shard(model, ignored_params={model.head.bias})
            FSDPCPUAdam(model)

        refused("ignored_params", ignored)
        refused("not_sharded", lambda: FSDPCPUAdam(Net()))
        refused("shard_tier_without_runtime", lambda: FSDPCPUAdam(build(), shard_tier="nvme"))
        refused("grad_tier_without_shard_tier", lambda: FSDPCPUAdam(build(), grad_tier="dram"))
        refused("threads_negative", lambda: FSDPCPUAdam(build(), threads=-1))
        refused("state_tier_tape", lambda: FSDPCPUAdam(build(), state_tier="tape"))
        refused("state_tier_upper", lambda: FSDPCPUAdam(build(), state_tier="DRAM").close())
        return out

    def hooks(self):
        """Where a user's hooks run against FSDP2's own, as this torch runs them: the points a
        shard offload brings shards in and out (docs/pytorch.md, "FSDP2", "Parameter shards in
        tiermem"). Per block, in order: a pre-hook registered after fully_shard with
        prepend=True (before FSDP2's unshard?) and without (after it?); a gradient hook put on
        the block's output by a prepend=True forward hook (before FSDP2's pre-backward unshard
        of this block and of the one before it?); a gradient hook on the block's input (after
        its reduce-scatter set the sharded gradients?). And the shards' storage freed after
        each step and refilled in the root's prepend=True pre-hook: FSDPCPUAdam trains
        bit-identically to the run that kept them."""
        model = build()
        blocks = list(model.layers)
        log = []

        def unsharded(block):
            return block._get_fsdp_state()._fsdp_param_group.is_unsharded

        def grad_set(block):
            return all(p.grad is not None for p in block.parameters())

        for i, block in enumerate(blocks):
            def pre_first(mod, args, i=i):
                log.append(["pre_prepend", i, unsharded(mod)])
                if args[0].requires_grad:
                    args[0].register_hook(
                        lambda g, i=i: log.append(["input_grad", i, grad_set(blocks[i])]))

            def out_first(mod, args, out, i=i):
                out.register_hook(lambda g, i=i: log.append(
                    ["output_grad", i, unsharded(blocks[i]), i > 0 and unsharded(blocks[i - 1])]))

            block.register_forward_pre_hook(pre_first, prepend=True)
            block.register_forward_pre_hook(
                lambda mod, args, i=i: log.append(["pre_append", i, unsharded(mod)]))
            block.register_forward_hook(out_first, prepend=True)
        # The first block's input must require grad for its input hook: the embedding's output.
        loss_of(model, *batch(0)).backward()

        def run(swap):
            model = build()
            opt = FSDPCPUAdam(model, threads=1, **HYPER)
            saved = {}

            @torch.no_grad()
            def refill(*_):
                for storage, copy in saved.values():
                    storage.resize_(copy.nbytes())
                    storage.copy_(copy)
                saved.clear()

            if swap:
                model.register_forward_pre_hook(refill, prepend=True)
            losses = []
            for i in range(STEPS // 4):
                losses += train(model, opt, 1, start=i)
                if swap:
                    for p in model.parameters():
                        storage = p.to_local().untyped_storage()
                        if storage.data_ptr() not in saved:  # padded shards share one storage
                            saved[storage.data_ptr()] = storage, storage.clone()
                            storage.resize_(0)
            refill()
            opt.close()
            return losses, full(model)

        plain, swapped = run(False), run(True)
        return dict(log=log, swap=compare(*swapped, *plain))

    def dcp(self):
        """Saved and loaded through torch.distributed.checkpoint, mid-run: the resumed run
        is bit-identical to the one that went on; AdamW's checkpoint loads into FSDPCPUAdam and
        FSDPCPUAdam's into AdamW, each going on along the other's curve."""
        half = STEPS // 2

        ours, theirs = os.path.join(self.dcp_dir, "ours"), os.path.join(self.dcp_dir, "theirs")
        a = build()
        opt_a = FSDPCPUAdam(a, max_grad_norm=CLIP, threads=1, **HYPER)
        train(a, opt_a, half)
        dcp_save(a, opt_a, ours)
        layout_ours = layout(get_optimizer_state_dict(a, opt_a))
        groups_ours = sorted(opt_a.state_dict()["param_groups"][0])
        went_on = train(a, opt_a, half, start=half), full(a)

        b = build()
        opt_b = FSDPCPUAdam(b, max_grad_norm=CLIP, threads=1, **HYPER)
        dcp_load(b, opt_b, ours)
        resumed = train(b, opt_b, half, start=half), full(b)

        c = build()
        opt_c = adamw(c)
        train(c, opt_c, half, clip=CLIP)
        dcp_save(c, opt_c, theirs)
        layout_theirs = layout(get_optimizer_state_dict(c, opt_c))
        groups_theirs = sorted(opt_c.state_dict()["param_groups"][0])
        adamw_went_on = train(c, opt_c, half, start=half, clip=CLIP), full(c)

        d = build()
        opt_d = FSDPCPUAdam(d, max_grad_norm=CLIP, threads=1, **HYPER)
        dcp_load(d, opt_d, theirs)
        from_adamw = train(d, opt_d, half, start=half), full(d)

        e = build()
        opt_e = adamw(e)
        dcp_load(e, opt_e, ours)
        into_adamw = train(e, opt_e, half, start=half, clip=CLIP), full(e)
        for o in (opt_a, opt_b, opt_d):
            o.close()
        return dict(resumed=compare(*resumed, *went_on),
                    from_adamw=compare(*from_adamw, *adamw_went_on),
                    into_adamw=compare(*into_adamw, *went_on),
                    entries=len(layout_ours), same_layout=layout_ours == layout_theirs,
                    group_keys_ours=groups_ours, group_keys_theirs=groups_theirs)


    # ---- a fault on one rank: the step taken on no rank ----

    def fault(self, **shards):
        """Rank 1's NVMe state made unreadable (every swap-file byte inverted; checksums on,
        exclusive tiers, so the step reads NVMe): every rank raises the same TiermemError naming
        rank 1, no rank's parameters change; while the fault stays, every rank raises again;
        once it is undone, step() takes the step, and the run goes on with the bits of a run
        that never failed."""
        saved_env = os.environ.get("TIERMEM_DRAM_INCLUSIVE")
        os.environ["TIERMEM_DRAM_INCLUSIVE"] = "off"
        try:
            return self._fault(**shards)
        finally:
            if saved_env is None:
                del os.environ["TIERMEM_DRAM_INCLUSIVE"]
            else:
                os.environ["TIERMEM_DRAM_INCLUSIVE"] = saved_env

    def fault_shards(self):
        """fault with the shards and gradients on NVMe too: the step, prepared unit by unit,
        is still taken on no rank (no unit of any rank), and goes on once the fault is undone.
        Rank 1 fails reading its first unit's gradients back."""
        return self.fault(shard_tier="nvme", grad_tier="nvme")

    def _fault(self, **shards):
        def runtime():
            return self.runtime(dram_bytes=1 << 20, nvme_paths=self.nvme_dir,
                                nvme_bytes="32MiB", checksum="xxh3")

        def whole(opt, model):
            with opt.shards_in():
                return full(model)

        with runtime() as rt:
            model = build()
            opt = FSDPCPUAdam(model, runtime=rt, state_tier="nvme", max_grad_norm=CLIP,
                              threads=1, **HYPER)
            want = train(model, opt, 3), full(model)
            opt.close()
        out = dict(rank=dist.get_rank())
        with runtime() as rt:
            model = build()
            opt = FSDPCPUAdam(model, runtime=rt, state_tier="nvme", max_grad_norm=CLIP,
                              threads=1, **shards, **HYPER)
            losses = train(model, opt, 2)
            for slot in opt._adam._store.values():  # on NVMe only, where the fault strikes
                for t in slot.tensors:
                    t.offload("nvme")
                    t.sync()
            before = whole(opt, model)
            loss = loss_of(model, *batch(2))
            loss.backward()
            saved = flip_swap_files(self.nvme_dir) if dist.get_rank() == 1 else {}
            assert saved or dist.get_rank() != 1, "no swap file reached through /proc/self/fd"
            errors = []
            for _ in range(2):  # the fault stays: every rank raises again
                try:
                    opt.step()
                    errors.append(None)
                except tiermem.TiermemError as e:
                    errors.append([e.status_name, str(e)])
            out["errors"] = errors
            restore(saved)  # (before the shards are read back: they were corrupted too)
            out["unchanged"] = all(torch.equal(before[n], p)
                                   for n, p in whole(opt, model).items())
            opt.step()  # the same gradients: taken now
            opt.zero_grad()
            losses.append(loss.item())
            out["went_on"] = compare(losses, whole(opt, model), *want)["bit_identical"]
            opt.close()
        return out

    # ---- the step prepared behind backward (overlap) ----

    def overlap(self):
        """The state on NVMe without clipping: FSDPCPUAdam prepares the step behind backward
        (the state read and the new versions written while backward runs; step() agrees and
        commits). Against overlap=False, bit for bit: plain steps; two micro-batches a step
        (the second backward makes it step at step(), from then on); the gradients halved in
        place between backward and step (the parts dropped, the step taken whole). And a fault:
        rank 1's swap files corrupted before a backward, every rank raises, nothing changes,
        and the run goes on once undone."""
        def runtime():
            return self.runtime(dram_bytes=1 << 20, nvme_paths=self.nvme_dir,
                                nvme_bytes="32MiB", checksum="xxh3")

        def run(overlap, micro=1, halve=False, lr=False, swap=False, steps=3, clip=None,
                scales=None):
            with runtime() as rt, warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model = build()
                opt = FSDPCPUAdam(model, runtime=rt, state_tier="nvme", threads=1,
                                  overlap=overlap, max_grad_norm=clip, **HYPER)
                losses, moved = [], []
                for i in range(steps):
                    for k in range(micro):
                        loss = loss_of(model, *batch(micro * i + k))
                        before = rt.stats()["bytes_moved"]["dram"]["nvme"]
                        # scales: the gradients' norm far above max_grad_norm or far below
                        (loss if scales is None else loss * scales[i]).backward()
                        # What the worker wrote before step() (it may still be at it when
                        # backward returns: waited for here, so the count does not race it).
                        opt._adam._behind._idle()
                        moved.append(rt.stats()["bytes_moved"]["dram"]["nvme"] - before)
                    if halve:  # as clip_grad_norm_ would
                        torch._foreach_mul_([p.grad for p in model.parameters()], 0.5)
                    if swap and i == 1:  # the same sum, another gradient, the worker done
                        behind = opt._adam._behind
                        behind._idle()
                        g = next(model.parameters()).grad.to_local().view(-1)
                        first, second = g[0].item(), g[1].item()
                        g[0], g[1] = second, first
                    opt.step()
                    opt.zero_grad()
                    if lr:  # a schedule, between the step and the next backward
                        for group in opt.param_groups:
                            group["lr"] *= 0.5
                    losses.append(loss.item())
                early = opt._adam._behind.step_early
                opt.close()
            return losses, full(model), moved, early, [str(w.message) for w in caught]

        out = dict(rank=dist.get_rank())
        for name, kw in (("plain", {}), ("micro", dict(micro=2)), ("halve", dict(halve=True)),
                         ("lr", dict(lr=True)), ("swap", dict(swap=True)),
                         ("clip", dict(clip=1.0, steps=5, scales=CLIP_SCALES))):
            want = run(False, **kw)
            got = run(None, **kw)
            out[name] = dict(same=compare(got[0], got[1], want[0], want[1])["bit_identical"],
                             written_before_step=got[2], written_before_step_off=want[2],
                             early_after=got[3], warnings=got[4])
        with runtime() as rt:
            model = build()
            opt = FSDPCPUAdam(model, runtime=rt, state_tier="nvme", threads=1, **HYPER)
            want_losses = train(model, opt, 2)
            for slot in opt._adam._store.values():  # on NVMe only, where the fault strikes
                for t in slot.tensors:
                    t.offload("nvme")
                    t.sync()
            before = full(model)
            saved = flip_swap_files(self.nvme_dir) if dist.get_rank() == 1 else {}
            loss = loss_of(model, *batch(2))
            loss.backward()
            try:
                opt.step()
                out["fault_error"] = None
            except tiermem.TiermemError as e:
                out["fault_error"] = [e.status_name, str(e)]
            out["fault_unchanged"] = all(torch.equal(before[n], p)
                                         for n, p in full(model).items())
            restore(saved)
            opt.step()
            opt.zero_grad()
            want_losses.append(loss.item())
            ref = run(False)
            out["fault_went_on"] = compare(want_losses, full(model), ref[0],
                                           ref[1])["bit_identical"]
            opt.close()
        return out

    # ---- HSDP: a 2-D mesh, replicated across its first dimension, sharded within its second --

    def hsdp(self):
        """4 ranks as 2 replicas of 2 shards (init_device_mesh (2, 2), ("replicate", "shard")):
        FSDPCPUAdam with clipping against fully_shard + AdamW + clip_grad_norm_ on the same mesh;
        the state on NVMe below the DRAM budget bit-identical to DRAM; a DCP save mid-run loaded
        into a fresh model and optimizer going on bit-identically; and the replicas' shards
        equal, bit for bit."""
        mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2),
                                mesh_dim_names=("replicate", "shard"))
        ref = build(mesh=mesh)
        ref_losses = train(ref, adamw(ref), STEPS, clip=CLIP)
        ref_params = full(ref)

        def run(steps=STEPS, start=0, load=None, save=None, **kw):
            model = build(mesh=mesh)
            opt = FSDPCPUAdam(model, max_grad_norm=CLIP, threads=1, **HYPER, **kw)
            if load is not None:
                dcp_load(model, opt, load)
            losses = train(model, opt, steps, start=start)
            if save is not None:
                dcp_save(model, opt, save)
            shards = {n: p.to_local().detach().clone() for n, p in model.named_parameters()}
            out = losses, full(model), shards
            opt.close()
            return out

        losses, params, shards = run()
        out = compare(losses, params, ref_losses, ref_params)
        # The replicas stepped the same shards: gathered over the replicate dimension, equal.
        replicate = mesh.get_group("replicate")
        same = True
        for n, s in shards.items():
            others = [torch.empty_like(s) for _ in range(dist.get_world_size(replicate))]
            dist.all_gather(others, s, group=replicate)
            same = same and all(torch.equal(o, s) for o in others)
        out["replicas_equal"] = same
        with self.runtime(dram_bytes=320 << 10, nvme_paths=self.nvme_dir,
                          nvme_bytes="32MiB") as rt:
            nvme = run(runtime=rt, state_tier="nvme")
        out["nvme_vs_dram"] = compare(nvme[0], nvme[1], losses, params)["bit_identical"]
        path = os.path.join(self.dcp_dir, "hsdp")
        half = STEPS // 2
        run(half, save=path)
        resumed = run(half, start=half, load=path)
        out["resumed"] = compare(resumed[0], resumed[1], losses[half:], params)["bit_identical"]
        out["mesh"] = [mesh.get_local_rank("replicate"), mesh.get_local_rank("shard")]
        return out

    # ---- at a DRAM budget below the state: any budget trains, a resume goes on at it ----

    def _tight_run(self, dram, steps, start=0, load=None, save=None):
        """FSDPCPUAdam with its state on NVMe at a DRAM budget of `dram` bytes: `steps` steps
        from `start`, after loading the DCP checkpoint `load` (get_state_dict, dcp.load,
        set_state_dict, as docs/pytorch.md has it); save = (path, k): a checkpoint saved after
        k of the steps, the run going on."""
        with self.runtime(dram_bytes=dram, nvme_paths=self.nvme_dir, nvme_bytes="32MiB") as rt:
            model = build()
            opt = FSDPCPUAdam(model, runtime=rt, state_tier="nvme", threads=1, **HYPER)
            if load is not None:
                dcp_load(model, opt, load)
                # Left as a step leaves it: every state tensor on NVMe (a DRAM copy beside it
                # is clean, evictable), none only in DRAM, where the step would pin it whole.
                self.loaded_on_nvme = all("nvme" in t.residency()
                                          for slot in opt._adam._store.values()
                                          for t in slot.tensors)
            first = steps if save is None else save[1]
            losses = train(model, opt, first, start=start)
            if save is not None:  # mid-run, and the run goes on
                dcp_save(model, opt, save[0])
                losses += train(model, opt, steps - first, start=start + first)
            params = full(model)
            largest = max(12 * p.to_local().numel() for p in model.parameters())
            tier = rt.stats()["tiers"]["dram"]["capacity"]
            opt.close()
        return losses, params, largest, tier, state_bytes(model)

    def tight(self):
        """The DRAM budget swept from above the state down to a DRAM tier smaller than the
        largest tensor's state: each run bit-identical to the state held in DRAM."""
        steps = 6
        with self.runtime() as rt:
            model = build()
            opt = FSDPCPUAdam(model, runtime=rt, state_tier="dram", threads=1, **HYPER)
            ref = train(model, opt, steps), full(model)
            opt.close()
        runs = []
        for dram in (2 << 20, 1 << 20, 512 << 10, 256 << 10, 176 << 10, 160 << 10):
            losses, params, largest, tier, state = self._tight_run(dram, steps)
            runs.append(dict(dram_bytes=dram, tier=tier, largest=largest, state=state,
                             bit_identical=compare(losses, params, *ref)["bit_identical"]))
        return runs

    RESUME_DRAM = 320 << 10

    def resume_save(self):
        """Trained 4 steps at a DRAM budget below the state, saved, then 4 more: the run a
        resume in a new process (resume_load) must equal, kept on disk for it."""
        path = os.path.join(self.dcp_dir, "tight")
        losses, params, _, _, state = self._tight_run(self.RESUME_DRAM, 8, save=(path, 4))
        torch.save((losses[4:], params), os.path.join(self.dcp_dir, "went_on.rank%d.pt" %
                                                      dist.get_rank()))
        return dict(state_bytes=state, dram_bytes=self.RESUME_DRAM)

    def resume_load(self):
        """A new process: the checkpoint resume_save wrote, loaded at the same budget, and 4
        steps on: bit-identical to the run that went on."""
        path = os.path.join(self.dcp_dir, "tight")
        losses, params, _, _, _ = self._tight_run(self.RESUME_DRAM, 4, start=4, load=path)
        want = torch.load(os.path.join(self.dcp_dir, "went_on.rank%d.pt" % dist.get_rank()))
        return dict(steps=len(losses), loaded_on_nvme=self.loaded_on_nvme,
                    bit_identical=compare(losses, params, *want)["bit_identical"])


def layout(osd):
    """What DCP sees of an optimizer's state: per FQN the keys, DTensor or not, shapes."""
    from torch.distributed.tensor import DTensor
    return {fqn: {k: [type(v).__name__, list(v.shape) if torch.is_tensor(v) else None,
                      list(v.to_local().shape) if isinstance(v, DTensor) else None]
                  for k, v in sorted(entry.items())}
            for fqn, entry in sorted(osd["state"].items())}


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    out = os.environ["FSDP_OUT"]
    runner = Cases(out)
    for name in os.environ.get("FSDP_CASES", "dram,nvme,clip,refusals,dcp,llama").split(","):
        case = getattr(runner, name)
        result = case(sys.modules[__name__]) if name.startswith("shards") else case()
        with open(os.path.join(out, "%s.rank%d.json" % (name, dist.get_rank())), "w") as f:
            json.dump(result, f)
    # The cases' models and optimizers are cyclic garbage (FSDP2's hooks reference their
    # modules) holding FSDP2's gloo work objects and their tensors: collected here, while the
    # interpreter is whole. Left to interpreter finalization, their destruction takes the GIL of
    # a dying interpreter and aborts the process ("terminate called without an active exception",
    # pytorch/pytorch#179291), as a CI run did once after every case had passed.
    del runner
    gc.collect()
    dist.barrier()  # no rank tears its gloo pairs down while another still uses them
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
