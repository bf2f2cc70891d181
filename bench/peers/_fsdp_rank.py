"""One rank of bench/peers/fsdp_offload.py: the model every mode trains (stock nn modules under
fully_shard, the same weights in every mode), each mode's optimizer (and tiermem runtime), the
host <-> device bytes computed from the shard sizes, and one timed training step."""

import os
import time

MIB = 1 << 20
HYPER = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


class Rank:
    """This process's rank: the model, each mode's build, one step."""

    def __init__(self, spec):
        import torch
        import torch.distributed as dist
        self.torch, self.dist, self.spec = torch, dist, spec
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ["LOCAL_RANK"])
        self.cuda = spec["device"] == "cuda"
        if self.cuda:
            torch.cuda.set_device(local_rank)
            self.device = torch.device("cuda", local_rank)
        else:
            self.device = torch.device("cpu")
        torch.set_num_threads(spec["threads"])
        dist.init_process_group("nccl" if self.cuda else "gloo",
                                device_id=self.device if self.cuda else None)
        self.cfg = spec["model"]
        from torch import nn
        self.mask = nn.Transformer.generate_square_subsequent_mask(self.cfg["seq"],
                                                                   device=self.device)

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def model(self, mode):
        """The same weights in every mode (one seed, built on the mesh's device), sharded block
        by block and then at the root."""
        torch = self.torch
        from torch import nn
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        from torch.nn import functional as F
        cfg = self.cfg
        V, H = cfg["vocab"], cfg["hidden"]

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.tok = nn.Embedding(V, H)
                self.layers = nn.ModuleList(
                    nn.TransformerEncoderLayer(H, cfg["heads"], 4 * H, dropout=0.0,
                                               batch_first=True, norm_first=True)
                    for _ in range(cfg["layers"]))
                self.norm = nn.LayerNorm(H)
                self.head = nn.Linear(H, V)

            def forward(self, x, y, mask):
                h = self.tok(x)
                for layer in self.layers:
                    h = layer(h, src_mask=mask, is_causal=True)
                logits = self.head(self.norm(h))
                return F.cross_entropy(logits.reshape(-1, V).float(), y.reshape(-1))

        torch.manual_seed(0)
        with torch.device(self.device):
            model = Net()
        opts = {}
        if cfg["bf16"]:
            opts["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                     reduce_dtype=torch.float32)
        if mode == "cpu_offload_policy":
            opts["offload_policy"] = CPUOffloadPolicy()  # pin_memory=True, its default
        for layer in model.layers:
            fully_shard(layer, **opts)
        fully_shard(model, **opts)
        return model

    def optimizer(self, mode, model):
        """(optimizer, runtime or None, figures)."""
        torch = self.torch
        local = [p.to_local() for p in model.parameters()]
        numel = sum(t.numel() for t in local)
        largest = max(t.numel() for t in local)
        if mode in ("no_offload", "cpu_offload_policy"):
            where = local[0].device.type
            try:  # torch's fastest AdamW for the shards' device, as its users would pick it
                opt = torch.optim.AdamW(model.parameters(), fused=True, **HYPER)
                impl = "torch.optim.AdamW fused=True, on %s" % where
            except (RuntimeError, ValueError) as e:
                opt = torch.optim.AdamW(model.parameters(), foreach=True, **HYPER)
                impl = "torch.optim.AdamW foreach=True, on %s (fused refused: %s)" % (
                    where, str(e)[:80])
            return opt, None, dict(impl=impl)
        import tiermem
        from tiermem.torch import FSDPCPUAdam
        from tiermem.torch.cpu_adam import CPUAdam, isa
        # What CPUAdam holds per parameter: fp32 master | exp_avg | exp_avg_sq (12 B), or the
        # moments alone (8 B) where this CPUAdam steps an fp32 host shard in place as its own
        # master (state in DRAM only).
        try:  # a build before in-place steps (older commits, for comparisons) steps a master
            from tiermem.torch.optim._state_store import in_place_ok  # noqa: F401
            steps_in_place = True
        except ImportError:
            steps_in_place = hasattr(CPUAdam, "_in_place_ok")
        in_place = (mode == "tiermem" and local[0].device.type == "cpu" and
                    local[0].dtype == torch.float32 and steps_in_place)
        state = (8 if in_place else 12) * numel
        settings = dict(device="emulated", hbm_bytes="2MiB", log_level="error")
        if mode == "tiermem":
            # The state and no more: the DRAM tier is resident from the start (pinned), and its
            # last part is the staging ring (an eighth to a quarter of the budget, at most 32
            # MiB), which a DRAM-only runtime does not use but still holds. From the least it
            # can be, 2 MiB more until the rest holds the state.
            dram = state + min(32 * MIB, state // 8) + MIB
            tier = "dram"
        else:
            # The fraction of the state, but room (the budget less the staging ring, a quarter
            # of it at these sizes) for 4 of the largest shard's state: the bucket stepping,
            # its new state (the step's shadow) and the next ones read ahead.
            dram = max(int(state * self.spec["nvme_dram_fraction"]), 16 * largest * 12 // 3)
            shards = sum(t.numel() * t.element_size() for t in local)
            settings.update(nvme_paths=self.spec["nvme_dir"],
                            nvme_bytes=2 * state + 4 * shards + 64 * MIB, prefetch_depth=2)
            tier = "nvme"
        settings["dram_bytes"] = -(-max(dram, 2 * MIB) // (2 * MIB)) * 2 * MIB
        rt = tiermem.Runtime(**settings)
        while mode == "tiermem" and rt.stats()["tiers"]["dram"]["capacity"] < state + MIB:
            rt.close()
            settings["dram_bytes"] += 2 * MIB
            rt = tiermem.Runtime(**settings)
        opt = FSDPCPUAdam(model, runtime=rt, state_tier=tier, threads=self.spec["threads"],
                          shard_tier="nvme" if mode == "tiermem_shards" else None,
                          grad_tier="nvme" if mode == "tiermem_shards" else None,
                          overlap=False if mode == "tiermem_nvme_at_step" else None,
                          max_grad_norm=self.spec.get("clip"), **HYPER)
        info = rt.info()
        return opt, rt, dict(
            impl="tiermem FSDPCPUAdam, kernel %s, state %s, %s" % (
                "/".join(isa()), tier, "fp32 host shards stepped in place (8 B/param)"
                if in_place else "12 B/param (fp32 master, exp_avg, exp_avg_sq)"),
            state_bytes=state, dram_budget=settings["dram_bytes"],
            dram_capacity=rt.stats()["tiers"]["dram"]["capacity"],
            largest_shard_state=12 * largest, local=[info["local_rank"], info["local_world_size"]])

    def link_bytes(self, mode, model):
        """Host <-> device bytes per step that are not tiermem's, from the shards' sizes."""
        from torch.distributed.fsdp import FSDPModule
        shard_bytes = sum(p.to_local().numel() * p.to_local().element_size()
                          for p in model.parameters())
        if not self.cuda or mode == "no_offload":
            return dict(h2d=0, d2h=0)
        if mode.startswith("tiermem"):  # each gradient shard down, each updated shard up
            return dict(h2d=shard_bytes, d2h=shard_bytes)
        up = 0  # CPUOffloadPolicy: each shard up before each all-gather, gradients (fp32) down
        try:  # FSDP2's private parameter groups: where each group reshards after forward
            for m in model.modules():
                if not isinstance(m, FSDPModule):
                    continue
                group = m._get_fsdp_state()._fsdp_param_group
                if group is None:
                    continue
                gathers = 2 if group.post_forward_mesh_info is not None else 1
                up += gathers * sum(fp._sharded_param_data.numel() *
                                    fp._sharded_param_data.element_size()
                                    for fp in group.fsdp_params)
        except AttributeError:  # moved in this torch: the figure is not known
            up = float("nan")
        return dict(h2d=up, d2h=shard_bytes)

    def batch(self, i):
        torch, cfg = self.torch, self.cfg
        g = torch.Generator().manual_seed(1000 * i + self.rank)  # each rank its own data
        x = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=g)
        return x[:, :-1].contiguous().to(self.device), x[:, 1:].contiguous().to(self.device)

    def step(self, model, opt, i):
        """One training step on batch i: (the slowest rank's seconds for the step, the slowest
        rank's for its optimizer part (step and zero_grad), the ranks' mean loss, the CPU
        seconds of every rank's process, all its threads, summed)."""
        torch, dist = self.torch, self.dist
        x, y = self.batch(i)
        self.sync()
        c0 = time.process_time()
        t0 = time.perf_counter()
        loss = model(x, y, self.mask)
        loss.backward()
        self.sync()
        t1 = time.perf_counter()
        clip = self.spec.get("clip")
        self.last_norm = None  # the gradient's total norm, where clip_grad_norm_ gave it
        if clip is not None and isinstance(opt, torch.optim.AdamW):  # FSDPCPUAdam's own
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            self.last_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        self.sync()
        t2 = time.perf_counter()
        c2 = time.process_time()
        slow = torch.tensor([t2 - t0, t2 - t1], dtype=torch.float64, device=self.device)
        mean = torch.tensor([loss.detach().float().item(), c2 - c0], dtype=torch.float64,
                            device=self.device)
        dist.all_reduce(slow, op=dist.ReduceOp.MAX)
        dist.all_reduce(mean, op=dist.ReduceOp.SUM)
        return slow[0].item(), slow[1].item(), mean[0].item() / self.world, mean[1].item()

    def close(self):
        self.dist.destroy_process_group()
