#!/usr/bin/env python3
"""tiermem's FSDPCPUAdam against FSDP2's CPUOffloadPolicy and against no offload, like for like.

The same transformer (stock nn modules: nn.Embedding, --layers pre-norm causal
nn.TransformerEncoderLayer blocks, nn.LayerNorm, nn.Linear head), the same initial weights (one
seed, built on the mesh's device), the same batches (each rank its own, seeded by step and rank),
the same AdamW hyperparameters, under torch.distributed.fsdp.fully_shard (each block, then the
root), --nproc ranks (default 2 on the CPU with gloo, 1 on CUDA with NCCL, one GPU per rank):

  no_offload          fully_shard(model) + torch.optim.AdamW, fused where this torch has the
                      fused kernel for the device (else foreach; the line `info impl` says which).
                      Shards, gradients and AdamW state live on the mesh's device.
  cpu_offload_policy  fully_shard(model, offload_policy=CPUOffloadPolicy()) + torch.optim.AdamW
                      over the CPU shards (fused on the CPU where this torch has it, else
                      foreach), as its users run it: FSDP2 keeps shards, gradients and AdamW state
                      in pinned host memory, copies each shard up before each all-gather and each
                      reduced gradient down, and the optimizer steps on the CPU. CUDA only: on a
                      CPU mesh the default CPUOffloadPolicy() is refused (pinning needs a CUDA
                      driver) and CPUOffloadPolicy(pin_memory=False) changes nothing (the shards
                      are host tensors already, its copies are no-ops), so it is skipped there
                      with a `skip` line saying what this torch did when asked.
  tiermem             fully_shard(model) + tiermem.torch.FSDPCPUAdam(state_tier="dram"): shards
                      and gradients stay where FSDP2 keeps them (the mesh's device); this rank's
                      AdamW state (fp32 master, exp_avg, exp_avg_sq) lives in the rank's tiermem
                      runtime and steps on the CPU in tiermem's kernel (on CUDA: the gradient
                      copied down into a pinned buffer, the updated shard copied up). The
                      runtime's DRAM budget is the state plus the staging ring the runtime
                      carves from it (a quarter, at most 32 MiB): the tier is resident from the
                      start. The state is 12 B/param, or 8 B where CPUAdam steps an fp32 host
                      shard in place as its own master (the CPU mesh).
  tiermem_nvme        as tiermem with state_tier="nvme": the runtime's DRAM budget is
                      --nvme-dram-fraction of the rank's state (both printed, `info nvme_state`),
                      so every step streams the state from NVMe (--nvme-dir) and writes it back.
  tiermem_shards      as tiermem_nvme, and FSDPCPUAdam(shard_tier="nvme", grad_tier="nvme"):
                      each rank's parameter shards and reduce-scattered gradient shards too live
                      on NVMe between uses (ZeRO-Infinity), brought in before each unit's
                      all-gather and for its step, one or two units at a time.

Two phases, each in process groups of its own (fresh processes, torchrun's environment):

  timing  one process group holds every mode's model and optimizer at once and steps them in
          turn: --warmup untimed steps of each (state allocation, lazy init, first touch), then
          --rounds rounds, each running --steps consecutive steps of every mode, the order of the
          modes rotated each round. So the modes share the machine's moments: a round's modes
          run within seconds of each other (on a shared machine, runs a minute apart differ by
          2x). Every mode's i-th step trains on the same batch i. A step is forward, backward,
          optimizer step, zero_grad (CUDA synchronized at both ends, and between backward and
          the optimizer, whose part is given too); its time is the slowest rank's.
  memory  one process group per mode, alone (a process's RSS high-water mark and ru_maxrss only
          grow, and allocators keep what they freed: glibc's heap, torch's pinned host cache,
          pytorch#134051; a mode after another would carry the first one's peak). Each rank
          resets its high-water mark (`echo 5 > /proc/self/clear_refs`) once its model is
          sharded, before the optimizer and the runtime exist, takes --warmup + --mem-steps
          steps and reads VmHWM: `host_peak` is the rank's RSS high-water mark over optimizer
          construction and training (absolute: torch, the CUDA context and the sharded model
          included), `above base` the same less the RSS at the reset (what the mode added).
          Pinned and tiermem DRAM pages are resident and counted; NVMe and the page cache not.
          `steady` is the high-water mark over the --mem-steps steps alone (reset again after
          the warm-up): the first step of tiermem_shards holds its shards, the later ones not.

Per mode: the median step and [min-max] over all timed steps; `ratio` lines are paired: the
median over rounds of that round's median against the reference's median in the same round (the
per-round values on an `info` line). Targets (issue #45): `ratio
fsdp_step_tiermem_over_cpu_offload_policy` <= 1.0 (goal 0.7 on a GPU), at equal or lower host
memory (`info host_peak_..._over_...` <= 1.0). Where cpu_offload_policy is skipped (the CPU) the
ratios are against no_offload.

Bytes moved per step per rank: tiermem's from its runtime's tm_stats (bytes_moved between tiers,
over the timed steps, divided by the steps). The host <-> device copies that are not tiermem's
are computed from the shards' sizes, not measured: CPUOffloadPolicy copies each parameter shard
up before every all-gather (forward; again in backward for groups resharded after forward, every
group but the root's by default) and each reduced gradient shard down; FSDPCPUAdam on CUDA copies
each gradient shard down and each updated shard up once a step; on a CPU mesh nothing crosses a
link.

Losses: every step's loss (the ranks' mean) of every mode in the timing phase is compared with
no_offload's of the same step; `check loss_max_diff` gives the largest difference (CPUAdam's kernel and torch's
AdamW round differently in the last bit: about 1e-6 relative is expected), and tiermem_nvme
against tiermem (the same kernel over the same state: 0 expected).

    .venv/bin/python bench/peers/fsdp_offload.py [--device auto|cpu|cuda] [--nproc N]
        [--modes no_offload,cpu_offload_policy,tiermem,tiermem_nvme] [--rounds 5] [--warmup 2]
        [--steps 5] [--mem-steps 2] [--vocab V --hidden H --layers L --heads A --batch B --seq S]
        [--bf16 | --no-bf16] [--nvme-dir DIR] [--nvme-dram-fraction F] [--threads T]

Environment: TIERMEM_LIBRARY (the library), PEERS_NVME_DIR (default of --nvme-dir, else
/var/tmp). Exits 1 when a mode fails or the losses disagree by more than --loss-rtol (1e-4
relative in fp32, 3e-3 with --bf16).
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

MIB = 1 << 20
MODES = ["no_offload", "cpu_offload_policy", "tiermem", "tiermem_nvme", "tiermem_shards"]
HYPER = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
# Defaults by device: on the CPU a step of some 100s of ms on two shared cores (4.2M parameters,
# 16-24 MiB of AdamW state per rank of 2); on a GPU a model whose CPU step and copies matter
# (about 0.74B parameters: 8.8 GB of fp32 master + moments, 12 GB under CPUOffloadPolicy).
PRESETS = {
    "cpu": dict(vocab=2048, hidden=256, layers=4, heads=4, batch=4, seq=64, warmup=2, steps=5,
                rounds=5, bf16=False),
    "cuda": dict(vocab=32000, hidden=2048, layers=12, heads=16, batch=8, seq=1024, warmup=2,
                 steps=3, rounds=3, bf16=True),
}


def fail(msg, code=1):
    print("fsdp_offload.py: " + msg, file=sys.stderr)
    sys.exit(code)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--nproc", type=int, default=None,
                    help="ranks (default: 2 on the CPU, 1 on CUDA)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rounds", type=int, default=None, help="rounds, the mode order rotated")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps per mode")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per mode per round")
    ap.add_argument("--mem-steps", type=int, default=2,
                    help="steps after the warm-up in each mode's memory run")
    for k in ("vocab", "hidden", "layers", "heads", "batch", "seq"):
        ap.add_argument("--" + k, type=int, default=None)
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) in every "
                         "mode (default: on CUDA)")
    ap.add_argument("--nvme-dir", default=os.environ.get("PEERS_NVME_DIR", "/var/tmp"))
    ap.add_argument("--nvme-dram-fraction", type=float, default=0.5,
                    help="tiermem_nvme's runtime DRAM budget as a fraction of the rank's state")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads per rank for torch and CPUAdam (0: the cores / nproc)")
    ap.add_argument("--loss-rtol", type=float, default=None,
                    help="fail when a mode's loss differs from no_offload's by more (relative; "
                         "default 1e-4 in fp32, 3e-3 with --bf16, where a last-bit difference "
                         "of a weight can flip its bf16 rounding)")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per process group")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # a JSON spec: this process is a rank
    return ap.parse_args(argv)


# ---------------------------------------------------------------- the ranks

def proc_status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                k, v = line.split(":", 1)
                out[k] = int(v.split()[0]) * 1024
    return out


def reset_hwm():
    """Resets this process's RSS high-water mark to its RSS (Linux 4.0+); False when refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


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
        in_place = (mode == "tiermem" and local[0].device.type == "cpu" and
                    local[0].dtype == torch.float32 and hasattr(CPUAdam, "_in_place_ok"))
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
                          grad_tier="nvme" if mode == "tiermem_shards" else None, **HYPER)
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
        rank's for its optimizer part (step and zero_grad), the ranks' mean loss)."""
        torch, dist = self.torch, self.dist
        x, y = self.batch(i)
        self.sync()
        t0 = time.perf_counter()
        loss = model(x, y, self.mask)
        loss.backward()
        self.sync()
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        self.sync()
        t2 = time.perf_counter()
        slow = torch.tensor([t2 - t0, t2 - t1], dtype=torch.float64, device=self.device)
        mean = torch.tensor([loss.detach().float().item()], dtype=torch.float64,
                            device=self.device)
        dist.all_reduce(slow, op=dist.ReduceOp.MAX)
        dist.all_reduce(mean, op=dist.ReduceOp.SUM)
        return slow[0].item(), slow[1].item(), mean.item() / self.world

    def close(self):
        self.dist.destroy_process_group()


def moved_since(rt, before, steps):
    after = rt.stats()["bytes_moved"]
    return {"%s->%s" % (a, b): (after[a][b] - before[a][b]) / steps
            for a in after for b in after[a] if after[a][b] != before[a][b]}


def time_worker(r, spec):
    """Every mode at once, stepped in turn: warm-up, then rounds of --steps steps per mode."""
    modes = spec["modes"]
    runs = {}
    for mode in modes:
        model = r.model(mode)
        opt, rt, figures = r.optimizer(mode, model)
        runs[mode] = dict(model=model, opt=opt, rt=rt, figures=figures, losses=[], opt_times=[],
                          times=[[] for _ in range(spec["rounds"])])
    for i in range(spec["warmup"]):
        for mode in modes:
            runs[mode]["losses"].append(r.step(runs[mode]["model"], runs[mode]["opt"], i)[2])
    before = {m: run["rt"].stats()["bytes_moved"] for m, run in runs.items() if run["rt"]}
    for rnd in range(spec["rounds"]):
        order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]
        for mode in order:
            run = runs[mode]
            for k in range(spec["steps"]):
                i = spec["warmup"] + rnd * spec["steps"] + k
                dt, dt_opt, loss = r.step(run["model"], run["opt"], i)
                run["times"][rnd].append(dt)
                run["opt_times"].append(dt_opt)
                run["losses"].append(loss)
        if r.rank == 0:
            print("round %d: %s" % (rnd, "  ".join(
                "%s %.1f ms" % (m, 1000 * statistics.median(runs[m]["times"][rnd]))
                for m in order)), flush=True)
    out = {}
    for mode, run in runs.items():
        model = run["model"]
        res = dict(run["figures"], times=run["times"], opt_times=run["opt_times"],
                   losses=run["losses"],
                   link=r.link_bytes(mode, model),
                   params_total=sum(p.numel() for p in model.parameters()),
                   local_numel=sum(p.to_local().numel() for p in model.parameters()),
                   param_bytes=next(model.parameters()).element_size())
        if run["rt"] is not None:
            res["tiermem_moved"] = moved_since(run["rt"], before[mode],
                                               spec["rounds"] * spec["steps"])
            res["dram_peak"] = run["rt"].stats()["tiers"]["dram"]["peak"]
            held = run["opt"].shard_offload
            if held is not None:
                res["shards"] = dict(bytes=sum(r.nbytes for u in held.units for r in u.records),
                                     units=len(held.units), peak_units=held.peak_units)
            run["opt"].close()
            run["rt"].close()
        out[mode] = res
    return out


def memory_worker(r, spec):
    """One mode alone: the RSS high-water mark from the sharded model on."""
    import gc
    import resource
    mode = spec["modes"][0]
    model = r.model(mode)
    gc.collect()
    r.sync()
    hwm_reset = reset_hwm()
    base = proc_status()["VmRSS"]
    opt, rt, _ = r.optimizer(mode, model)
    for i in range(spec["warmup"]):
        r.step(model, opt, i)
    warm = proc_status()
    reset_hwm()
    for i in range(spec["warmup"], spec["warmup"] + spec["mem_steps"]):
        r.step(model, opt, i)
    status = proc_status()
    if rt is not None:
        opt.close()
        rt.close()
    return {mode: dict(host_peak=max(status["VmHWM"], warm["VmHWM"]), base=base,
                       steady_peak=status["VmHWM"], hwm_reset=hwm_reset,
                       ru_maxrss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)}


def worker(spec):
    r = Rank(spec)
    out = (time_worker if spec["phase"] == "time" else memory_worker)(r, spec)
    with open(os.path.join(spec["out"], "rank%d.json" % r.rank), "w") as f:
        json.dump(out, f)
    r.close()


# ---------------------------------------------------------------- the launcher

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_group(args, phase, modes, model, tmp):
    """One process group: --nproc ranks with torchrun's environment contract (RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT), which tiermem's runtime reads to split a
    percentage budget over the node's ranks. Returns each rank's figures, by mode."""
    out = tempfile.mkdtemp(dir=tmp, prefix=phase + ".")
    nvme_dir = tempfile.mkdtemp(dir=args.nvme_dir, prefix="fsdp_offload.")
    spec = dict(phase=phase, modes=modes, device=args.device, model=model, warmup=args.warmup,
                steps=args.steps, rounds=args.rounds, mem_steps=args.mem_steps,
                threads=args.threads, nvme_dir=nvme_dir, out=out,
                nvme_dram_fraction=args.nvme_dram_fraction)
    port = free_port()
    procs = []
    try:
        for r in range(args.nproc):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.nproc), LOCAL_RANK=str(r),
                       LOCAL_WORLD_SIZE=str(args.nproc), GROUP_RANK="0",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       OMP_NUM_THREADS=str(args.threads))
            # Rank 0 prints its progress here; every rank's output goes to its log too.
            log = open(os.path.join(out, "rank%d.log" % r), "w")
            procs.append((subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
                env=env, stdout=subprocess.PIPE if r == 0 else log, stderr=log, text=True), log))
        if procs[0][0].stdout is not None:
            for line in procs[0][0].stdout:
                print(line, end="", flush=True)
        deadline = time.monotonic() + args.timeout
        failed = None
        for r, (p, log) in enumerate(procs):
            try:
                rc = p.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                rc = "timeout"
            log.close()
            if rc != 0 and failed is None:
                failed = (r, rc)
        if failed is not None:
            r, rc = failed
            with open(os.path.join(out, "rank%d.log" % r)) as f:
                tail = f.read()[-4000:]
            fail("%s phase %s: rank %d exited %s:\n%s" % (phase, ",".join(modes), r, rc, tail))
        got = []
        for r in range(args.nproc):
            with open(os.path.join(out, "rank%d.json" % r)) as f:
                got.append(json.load(f))
        return got
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(nvme_dir, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)


def probe_cpu_offload_policy():
    """What this torch does with CPUOffloadPolicy on a CPU mesh (one gloo rank, in a child)."""
    code = r"""
import torch, torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
dist.init_process_group("gloo", rank=0, world_size=1)
for pin in (True, False):
    m = nn.Linear(4, 4)
    try:
        fully_shard(m, offload_policy=CPUOffloadPolicy(pin_memory=pin))
        m(torch.ones(2, 4)).sum().backward()
        print("CPUOffloadPolicy(pin_memory=%s) accepted, its shards on %s"
              % (pin, m.weight.to_local().device))
    except Exception as e:
        print("CPUOffloadPolicy(pin_memory=%s) refused: %s: %s"
              % (pin, type(e).__name__, str(e).split(chr(10))[0][:60]))
dist.destroy_process_group()
"""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("CPUOffloadPolicy")]
    return "; ".join(lines) or ("probe failed: " + r.stderr[-300:])


def ms(x):
    return 1000.0 * x


def main():
    args = parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    import torch
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: torch %s sees no GPU" % torch.__version__)
    cuda = args.device == "cuda"
    for k, v in PRESETS[args.device].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.nproc is None:
        args.nproc = 1 if cuda else 2
    if args.loss_rtol is None:
        args.loss_rtol = 3e-3 if args.bf16 else 1e-4
    if cuda and args.nproc > torch.cuda.device_count():
        fail("--nproc %d: %d GPUs" % (args.nproc, torch.cuda.device_count()))
    cores = len(os.sched_getaffinity(0))
    if args.threads <= 0:
        args.threads = max(1, cores // args.nproc)
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            fail("unknown mode %r (modes: %s)" % (m, ",".join(MODES)))
    print("# fsdp_offload: torch %s, %s, %d ranks (%s), %d threads per rank, %d cores" % (
        torch.__version__, torch.cuda.get_device_name() if cuda else "CPU", args.nproc,
        "nccl" if cuda else "gloo", args.threads, cores))
    if not cuda and "cpu_offload_policy" in modes:
        modes.remove("cpu_offload_policy")
        print("skip cpu_offload_policy: meaningless on a CPU mesh, so not run: %s. Its shards "
              "are host tensors already: it would be no_offload again" %
              probe_cpu_offload_policy())
    model = dict(vocab=args.vocab, hidden=args.hidden, layers=args.layers, heads=args.heads,
                 batch=args.batch, seq=args.seq, bf16=args.bf16)
    print("# model: stock nn, vocab %d hidden %d layers %d heads %d ffn %d, causal, batch %d x "
          "seq %d per rank, %s; AdamW lr %g betas %s eps %g wd %g" % (
              args.vocab, args.hidden, args.layers, args.heads, 4 * args.hidden, args.batch,
              args.seq, "bf16 compute (MixedPrecisionPolicy)" if args.bf16 else "fp32",
              HYPER["lr"], HYPER["betas"], HYPER["eps"], HYPER["weight_decay"]))
    print("# timing: one process group, every mode; %d warm-up steps each, then %d rounds x %d "
          "steps per mode, the mode order rotated" % (args.warmup, args.rounds, args.steps))
    tmp = tempfile.mkdtemp(prefix="fsdp_offload.")
    t_start = time.monotonic()
    try:
        timing = run_group(args, "time", modes, model, tmp)
        print("# memory: one process group per mode, %d + %d steps" % (args.warmup,
                                                                       args.mem_steps))
        memory = [{} for _ in range(args.nproc)]
        for mode in modes:
            t0 = time.monotonic()
            for rank, got in enumerate(run_group(args, "memory", [mode], model, tmp)):
                memory[rank].update(got)
            print("memory %s: %.1f s" % (mode, time.monotonic() - t0), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report(args, modes, timing, memory, time.monotonic() - t_start)


def report(args, modes, timing, memory, wall):
    t0 = timing[0]  # rank 0's figures (times are the slowest rank's, losses the ranks' mean)
    first = t0[modes[0]]
    print("info params total=%d per_rank_shard=%s (%d B/param)" % (
        first["params_total"], [t[modes[0]]["local_numel"] for t in timing],
        first["param_bytes"]))
    for mode in modes:
        print("info impl %s: %s" % (mode, t0[mode]["impl"]))
    for mode in ("tiermem", "tiermem_nvme"):
        if mode not in modes:
            continue
        for rank, t in enumerate(timing):
            f = t[mode]
            print("info %s_runtime rank %d: AdamW state %.1f MiB, DRAM budget %.1f MiB (%.2fx "
                  "the state; resident from the start), %.1f MiB of it for tensors (the rest the"
                  " staging ring), peak used %.1f MiB, local rank/size %s" % (
                      mode, rank, f["state_bytes"] / MIB, f["dram_budget"] / MIB,
                      f["dram_budget"] / f["state_bytes"], f["dram_capacity"] / MIB,
                      f["dram_peak"] / MIB, f["local"]))
    print("# mode                 median ms  [min - max] over %d timed steps, of it the optimizer"
          " (step + zero_grad); host peak per rank MiB (above base)" % (args.rounds * args.steps))
    med, peak, above = {}, {}, {}
    for mode in modes:
        times = [x for rnd in t0[mode]["times"] for x in rnd]
        med[mode] = statistics.median(times)
        peaks = [m[mode]["host_peak"] for m in memory]
        aboves = [m[mode]["host_peak"] - m[mode]["base"] for m in memory]
        peak[mode], above[mode] = max(peaks), max(aboves)
        opt_t = t0[mode]["opt_times"]
        print("step %-18s %9.1f  [%.1f - %.1f]  optimizer %.1f [%.1f - %.1f]  host_peak %s  "
              "(+%s) steady %s" % (
            mode, ms(med[mode]), ms(min(times)), ms(max(times)), ms(statistics.median(opt_t)),
            ms(min(opt_t)), ms(max(opt_t)),
            " ".join("r%d=%.0f" % (i, p / MIB) for i, p in enumerate(peaks)),
            " +".join("%.0f" % (a / MIB) for a in aboves),
            " ".join("%.0f" % (m[mode]["steady_peak"] / MIB) for m in memory)))
    if not all(m[mode]["hwm_reset"] for m in memory for mode in modes):
        print("info host_peak: /proc/self/clear_refs refused: the peaks are whole-process ones")
    print("# bytes moved per step per rank: tiermem's runtime (tm_stats, measured over the timed "
          "steps); host<->device link (computed from the shard sizes; 0 on a CPU mesh)")
    for mode in modes:
        moved = [t[mode].get("tiermem_moved") for t in timing]
        tm_s = "-" if moved[0] is None else " ".join(
            "r%d{%s}" % (i, ", ".join("%s %.1f MiB" % (k, v / MIB)
                                      for k, v in sorted(m.items())) or "none")
            for i, m in enumerate(moved))
        link = t0[mode]["link"]
        if "shards" in t0[mode]:
            sh = t0[mode]["shards"]
            print("info shards %s: %.1f MiB of parameter shards (and as much gradient) in %d "
                  "units on rank 0, at most %d units' shards in torch memory at once" % (
                      mode, sh["bytes"] / MIB, sh["units"], sh["peak_units"]))
        print("moved %-18s tiermem %s; link h2d %.1f MiB d2h %.1f MiB" % (
            mode, tm_s, link["h2d"] / MIB, link["d2h"] / MIB))

    bad = False
    steps = args.warmup + args.rounds * args.steps
    if "no_offload" in modes:
        ref = t0["no_offload"]["losses"]
        for mode in modes:
            if mode == "no_offload":
                continue
            pairs = list(zip(t0[mode]["losses"], ref))
            diff = max(abs(a - b) for a, b in pairs)
            rel = max(abs(a - b) / abs(b) for a, b in pairs)
            print("check loss_max_diff %s_vs_adamw %.3g (relative %.3g, over %d steps; at most "
                  "%g)" % (mode, diff, rel, steps, args.loss_rtol))
            bad = bad or rel > args.loss_rtol
    for other in ("tiermem_nvme", "tiermem_shards"):
        if "tiermem" not in modes or other not in modes:
            continue
        diff = max(abs(a - b) for a, b in zip(t0[other]["losses"], t0["tiermem"]["losses"]))
        print("check loss_max_diff %s_vs_tiermem %.3g (the same kernel over the same values: 0 "
              "expected)" % (other, diff))
        bad = bad or diff > 0
    print("info losses %s: %s" % (modes[0], " ".join("%.4f" % x for x in t0[modes[0]]["losses"])))

    ref = "cpu_offload_policy" if "cpu_offload_policy" in modes else modes[0]
    print("# ratio X_over_%s = X's step / %s's (the median over rounds of the round's medians' "
          "ratio): target <= 1.0 against cpu_offload_policy (goal 0.7 on a GPU)%s" % (
              ref, ref, "" if ref == "cpu_offload_policy" else
              "; here against %s: cpu_offload_policy cannot run on a CPU mesh" % ref))
    for mode in modes:
        if mode == ref or not mode.startswith("tiermem"):
            continue
        per = [statistics.median(a) / statistics.median(b)
               for a, b in zip(t0[mode]["times"], t0[ref]["times"])]
        name = "fsdp_step_%s_over_%s" % (mode, ref)
        print("ratio %s %.2f" % (name, statistics.median(per)))
        print("info %s_per_round %s" % (name, " ".join("%.2f" % x for x in per)))
    for mode in modes:
        if mode != ref:
            print("info fsdp_optimizer_%s_over_%s %.2f (medians of the optimizer part)" % (
                mode, ref, statistics.median(t0[mode]["opt_times"]) /
                statistics.median(t0[ref]["opt_times"])))
    if ref != "no_offload" and "no_offload" in modes:
        for mode in modes:
            if mode != "no_offload":
                per = [statistics.median(a) / statistics.median(b)
                       for a, b in zip(t0[mode]["times"], t0["no_offload"]["times"])]
                print("info fsdp_step_%s_over_no_offload %.2f" % (mode, statistics.median(per)))
    for mode in modes:
        if mode == ref:
            continue
        print("info host_peak_%s_over_%s %.2f (absolute RSS high-water, the larger rank: %.0f / "
              "%.0f MiB); above base %.2f (+%.0f / +%.0f MiB)" % (
                  mode, ref, peak[mode] / peak[ref], peak[mode] / MIB, peak[ref] / MIB,
                  above[mode] / max(above[ref], 1), above[mode] / MIB, above[ref] / MIB))
        steady = [max(m[x]["steady_peak"] for m in memory) for x in (mode, ref)]
        print("info steady_peak_%s_over_%s %.2f (%.0f / %.0f MiB)" % (
            mode, ref, steady[0] / steady[1], steady[0] / MIB, steady[1] / MIB))
    if "tiermem_shards" in modes and "tiermem_nvme" in modes and ref != "tiermem_nvme":
        pk = [max(m[x]["host_peak"] for m in memory) for x in ("tiermem_shards", "tiermem_nvme")]
        print("info host_peak_tiermem_shards_over_tiermem_nvme %.2f (%.0f / %.0f MiB: what "
              "holding the shards and gradients on NVMe saves)" % (pk[0] / pk[1], pk[0] / MIB,
                                                                    pk[1] / MIB))
    print("# wall %.0f s" % wall)
    if bad:
        fail("the losses disagree (more than --loss-rtol %g against AdamW, or tiermem_nvme "
             "against tiermem)" % args.loss_rtol)
    return 0


if __name__ == "__main__":
    sys.exit(main())
