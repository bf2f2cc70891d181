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
                      FSDPCPUAdam's overlap (its default) prepares the step behind backward:
                      each parameter's state read, stepped into its new version and written
                      down as FSDP2 sets its gradient; step() agrees and commits. With --clip
                      (max_grad_norm; the AdamW modes call clip_grad_norm_ before their step)
                      it is prepared unclipped and committed in the steps that do not clip; a
                      step that clips is taken whole at step(), and the next backward reads
                      ahead instead.
  tiermem_nvme_at_step  the same with overlap=False: the state read ahead behind backward (half
                      the DRAM tier), the step taken at step().
  tiermem_shards      as tiermem_nvme, and FSDPCPUAdam(shard_tier="nvme", grad_tier="nvme"):
                      each rank's parameter shards and reduce-scattered gradient shards too live
                      on NVMe between uses (ZeRO-Infinity), brought in before each unit's
                      all-gather, one or two units at a time; the step is prepared behind
                      backward unit by unit (overlap), each unit's new shards written down
                      beside the old ones before its gradients go down, not reading the old
                      shards (the state's masters hold them) nor the gradients back.

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

`info cpu` lines: the median over the timed steps of the CPU time of every rank's process (all
its threads, user and system, summed over the ranks) for a step, and how many of the machine's
cores that keeps busy over the step: where it nears the core count, the step is bound by CPU
work, not by waiting (on this VM, 2 ranks on 2 cores).

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

This file is the command line and the launcher; next to it, _fsdp_rank.py is a rank's model,
optimizers and step, _fsdp_phases.py the timing and memory phases a rank runs, _fsdp_report.py
what is printed from their figures.

Environment: TIERMEM_LIBRARY (the library), PEERS_NVME_DIR (default of --nvme-dir, else
/var/tmp). Exits 1 when a mode fails or the losses disagree by more than --loss-rtol (1e-4
relative in fp32, 3e-3 with --bf16).
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from _fsdp_phases import worker  # noqa: E402 - the ranks' side, next to this file
from _fsdp_rank import HYPER  # noqa: E402
from _fsdp_report import report  # noqa: E402

MODES = ["no_offload", "cpu_offload_policy", "tiermem", "tiermem_nvme", "tiermem_nvme_at_step",
         "tiermem_shards"]
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
    ap.add_argument("--clip", type=float, default=None,
                    help="max_grad_norm: clip_grad_norm_ before AdamW's step, FSDPCPUAdam's "
                         "max_grad_norm (default: no clipping)")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per process group")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # a JSON spec: this process is a rank
    return ap.parse_args(argv)


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
                nvme_dram_fraction=args.nvme_dram_fraction, clip=args.clip)
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


if __name__ == "__main__":
    sys.exit(main())
