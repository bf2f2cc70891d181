#!/usr/bin/env python3
"""tiermem.torch.CPUAdam against DeepSpeedCPUAdam and torch.optim.AdamW on the CPU, like for like.

One step of AdamW (decoupled weight decay, bias correction) over the same fp32 parameters and
gradients, with the same lr / betas / eps / weight_decay, by:

  cpu_adam       tiermem.torch.CPUAdam, its state in DRAM (a private runtime, the default)
  cpu_adam_nvme  tiermem.torch.CPUAdam(state_tier="nvme") over a runtime whose DRAM budget is a
                 quarter of the state (docs/pytorch.md, "CPUAdam"), swap files in --nvme-dir;
                 at --nvme-sizes only (default: up to 64M; 256M moves 6 GiB a step, ~2 s)
  deepspeed      deepspeed.ops.adam.DeepSpeedCPUAdam (the real package, JIT-built on first use)
  torch_fused    torch.optim.AdamW(fused=True)
  torch_foreach  torch.optim.AdamW(foreach=True)

The parameters are a transformer's shapes (an embedding, then blocks of qkv, projection, two MLP
matrices and a norm) summing to exactly --sizes parameters; the gradients are fixed random
tensors, the same for every step and every optimizer. Threads, each through its own knob:
torch.set_num_threads and OMP_NUM_THREADS (read once by OpenMP, which DeepSpeed's kernel uses:
each thread count runs in a subprocess of its own) and CPUAdam(threads=N). For each size, each
of --rounds rounds builds each optimizer afresh over the parameters reset to the same start (one
optimizer at a time, freed before the next: at 256M one optimizer's state is 2-3 GiB), takes
--warmup untimed steps (state allocation, first touch) and then --steps timed steps; the order
of the optimizers is rotated each round. Per configuration: the median and [min-max] of the
timed steps of all rounds, and `ratio` lines, peer_ms / tiermem_ms of the medians (> 1.0:
tiermem faster). `info roofline_ms`: 28 B per parameter (read p, m, v, g; write p, m, v) over
the DRAM triad of tiermem-probe (`tiermem-probe --json`, dram.triad_gbps, one thread per core).
`check` lines: the largest absolute difference between the parameters tiermem and DeepSpeed (and
torch foreach) reach after the same steps from the same start.

    .venv/bin/python bench/peers/cpu_adam.py [--sizes 16M,64M,256M] [--threads 1,2]
        [--rounds 3] [--warmup 1] [--steps 2] [--nvme-dir /var/tmp] [--nvme-sizes ...]
        [--optimizers cpu_adam,cpu_adam_nvme,deepspeed,torch_fused,torch_foreach]
        [--triad-gbps X]

Environment: TIERMEM_LIBRARY (the library), TIERMEM_PROBE (tiermem-probe; default: tools/ beside
the library's lib/), PEERS_NVME_DIR (default of --nvme-dir). Exits 77 when DeepSpeed is missing.
"""

import argparse
import gc
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 1 << 20
ALL = ["cpu_adam", "cpu_adam_nvme", "deepspeed", "torch_fused", "torch_foreach"]
PEERS = ["deepspeed", "torch_fused", "torch_foreach"]
HYPER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
BYTES_PER_PARAM = 28  # fp32: read param, exp_avg, exp_avg_sq, grad; write param, exp_avg, exp_avg_sq


def fail(msg, code=1):
    print("cpu_adam.py: " + msg, file=sys.stderr)
    sys.exit(code)


def parse_count(text):
    """16M, 256M, 1G, 65536, 4K; a bare number under 4096 is in M (as optim_bench's --sizes)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError("bad size %r (want e.g. 16M)" % text)
    n, unit = int(m.group(1)), m.group(2).upper()
    if not unit:
        unit = "M" if n < 4096 else ""
    return n << {"": 0, "K": 10, "M": 20, "G": 30}[unit]


def size_name(n):
    for shift, unit in ((30, "G"), (20, "M"), (10, "K")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return "%d%s" % (n >> shift, unit)
    return str(n)


def shapes_for(n):
    """A transformer's parameter shapes totalling exactly n: hidden h (16M: 512, 64M: 1024,
    256M: 2048), blocks of [3h, h] qkv, [h, h] projection, [4h, h] and [h, 4h] MLP, [h] norm,
    and an embedding [rows, h] taking the rest."""
    h = 16
    while 4 * (2 * h) * (2 * h) * 16 <= n:  # h ~ sqrt(n / 64), a power of two
        h *= 2
    per_block = 12 * h * h + h
    blocks = max(1, min(5, (n - h * h) // per_block)) if n > per_block + h else 0
    rest = n - blocks * per_block
    shapes = []
    if rest >= h and rest % h == 0:
        shapes.append((rest // h, h))
    elif rest > 0:
        shapes.append((rest,))
    for _ in range(blocks):
        shapes += [(3 * h, h), (h, h), (4 * h, h), (h, 4 * h), (h,)]
    assert sum(_numel(s) for s in shapes) == n
    return shapes


def _numel(shape):
    out = 1
    for d in shape:
        out *= d
    return out


def describe(shapes):
    emb, rest = shapes[0], shapes[1:]
    blocks = len(rest) // 5
    text = "x".join(map(str, emb))
    if blocks:
        text += " + %d x (%s)" % (blocks, ", ".join("x".join(map(str, s)) for s in rest[:5]))
    return text


# ---- the child: one thread count, every size ----

def child(args):
    import torch

    import tiermem
    from tiermem.torch import CPUAdam
    from tiermem.torch.cpu_adam import isa

    threads = args.child_threads
    torch.set_num_threads(threads)
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except Exception as e:  # noqa: BLE001: reported, the others still run
        DeepSpeedCPUAdam = None
        emit(kind="skip", opt="deepspeed", why="%s: %s" % (type(e).__name__, e))
    emit(kind="env", threads=threads, isa=isa()[1], torch=torch.__version__,
         deepspeed=_version("deepspeed"), omp=os.environ.get("OMP_NUM_THREADS"),
         torch_threads=torch.get_num_threads())
    nvme_root = None
    if "cpu_adam_nvme" in args.optimizers:
        os.makedirs(args.nvme_dir, exist_ok=True)
        nvme_root = tempfile.mkdtemp(prefix="tiermem-cpu-adam-", dir=args.nvme_dir)
    try:
        for n in args.sizes:
            one_size(args, n, threads, torch, tiermem, CPUAdam, DeepSpeedCPUAdam, nvme_root)
    finally:
        if nvme_root is not None:
            shutil.rmtree(nvme_root, ignore_errors=True)


def _version(pkg):
    try:
        from importlib.metadata import version
        return version(pkg)
    except Exception:  # noqa: BLE001
        return None


def emit(**record):
    print("RECORD " + json.dumps(record), flush=True)


def one_size(args, n, threads, torch, tiermem, CPUAdam, DeepSpeedCPUAdam, nvme_root):
    shapes = shapes_for(n)
    gen = torch.Generator().manual_seed(n)
    start = [torch.randn(s, generator=gen) * 0.02 for s in shapes]
    grads = [torch.randn(s, generator=gen) * 1e-3 for s in shapes]
    opts = [o for o in args.optimizers
            if not (o == "deepspeed" and DeepSpeedCPUAdam is None)
            and not (o == "cpu_adam_nvme" and n not in args.nvme_sizes)]
    emit(kind="size", size=n, threads=threads, tensors=len(shapes), shapes=describe(shapes),
         order=opts)
    state_bytes = 12 * n
    largest = max(_numel(s) for s in shapes) * 12

    def make(name, params):
        if name == "cpu_adam":
            return CPUAdam(params, threads=threads, **HYPER), None
        if name == "cpu_adam_nvme":
            # ZeRO-Infinity's setting: the state on NVMe, DRAM a quarter of it (at least the
            # pipeline's stepping bucket, its new version and one read ahead each side).
            dram = max(state_bytes // 4, 4 * largest) + 64 * MIB
            rt = tiermem.Runtime(device="emulated", hbm_bytes="16MiB", dram_bytes=dram,
                                 nvme_paths=nvme_root, nvme_bytes=2 * state_bytes + 256 * MIB,
                                 prefetch_depth=1, log_level="error")
            return CPUAdam(params, threads=threads, runtime=rt, state_tier="nvme", **HYPER), rt
        if name == "deepspeed":
            return DeepSpeedCPUAdam(params, bias_correction=True, adamw_mode=True,
                                    fp32_optimizer_states=True, **HYPER), None
        if name == "torch_fused":
            return torch.optim.AdamW(params, fused=True, **HYPER), None
        if name == "torch_foreach":
            return torch.optim.AdamW(params, foreach=True, **HYPER), None
        raise ValueError(name)

    times = {o: [] for o in opts}
    nvme_moved = []
    finals = {}  # optimizer -> its parameters after warmup + steps (round 0, for the check)
    diffs = {}
    pairs = [(a, b) for a, b in (("cpu_adam", "deepspeed"), ("cpu_adam", "torch_foreach"))
             if a in opts and b in opts]
    # One set of parameters, reset to the start before each optimizer (fresh tensors would
    # fault in their pages again each time: seconds at 256M on a VM).
    params = [torch.nn.Parameter(p.clone()) for p in start]
    for p, g in zip(params, grads):
        p.grad = g
    t_size = time.perf_counter()
    for r in range(args.rounds):
        k = r % len(opts)
        for name in opts[k:] + opts[:k]:
            with torch.no_grad():
                for p, s in zip(params, start):
                    p.copy_(s)
            opt, rt = make(name, params)
            for _ in range(args.warmup):
                opt.step()
            before = rt.stats()["bytes_moved"] if rt is not None else None
            for _ in range(args.steps):
                t0 = time.perf_counter()
                opt.step()
                times[name].append(time.perf_counter() - t0)
            if rt is not None:
                after = rt.stats()["bytes_moved"]
                nvme_moved.append(((after["nvme"]["dram"] - before["nvme"]["dram"]) / args.steps,
                                   (after["dram"]["nvme"] - before["dram"]["nvme"]) / args.steps))
            if hasattr(opt, "close"):
                opt.close()
            del opt
            if rt is not None:
                rt.close()
                del rt
            if r == 0 and any(name in pair for pair in pairs):
                finals[name] = [p.detach().clone() for p in params]
                for a, b in pairs:
                    if a in finals and b in finals and (a, b) not in diffs:
                        diffs[(a, b)] = max(float((x - y).abs().max())
                                            for x, y in zip(finals[a], finals[b]))
                for held in list(finals):  # kept only while a check still needs them
                    if all(pair in diffs for pair in pairs if held in pair):
                        del finals[held]
            gc.collect()
        emit(kind="progress", size=n, threads=threads, round=r + 1, rounds=args.rounds,
             seconds=time.perf_counter() - t_size)
    finals.clear()
    emit(kind="result", size=n, threads=threads, times=times,
         steps=args.warmup + args.steps, nvme_moved=nvme_moved,
         diffs={"%s_vs_%s" % k: v for k, v in diffs.items()})
    del start, grads, params
    gc.collect()


# ---- the parent ----

def probe_triad(args):
    """(GB/s, threads, where from) of tiermem-probe's DRAM triad."""
    if args.triad_gbps:
        return args.triad_gbps, None, "--triad-gbps"
    candidates = [os.environ.get("TIERMEM_PROBE")]
    lib = os.environ.get("TIERMEM_LIBRARY")
    if lib:
        candidates.append(os.path.join(os.path.dirname(os.path.dirname(lib)), "tools",
                                       "tiermem-probe"))
    candidates += [os.path.join(ROOT, "build", "tools", "tiermem-probe"),
                   shutil.which("tiermem-probe")]
    for exe in candidates:
        if exe and os.access(exe, os.X_OK):
            try:
                out = subprocess.run([exe, "--json", "--no-sweep", "--no-demo"],
                                     capture_output=True, text=True, timeout=300,
                                     env=dict(os.environ, TIERMEM_LOG_LEVEL="error"))
                dram = json.loads(out.stdout[out.stdout.index("{"):])["dram"]
                return dram["triad_gbps"], dram["threads"], exe
            except Exception as e:  # noqa: BLE001
                print("cpu_adam.py: %s --json: %s" % (exe, e), file=sys.stderr)
    return None, None, "no tiermem-probe found (set TIERMEM_PROBE)"


def fmt_ms(xs):
    ms = [x * 1e3 for x in xs]
    return "%8.1f [%.1f-%.1f]" % (statistics.median(ms), min(ms), max(ms))


def report(rec, triad):
    n, t, times = rec["size"], rec["threads"], rec["times"]
    tag = "size=%s threads=%d" % (size_name(n), t)
    med = {o: statistics.median(v) for o, v in times.items() if v}
    for o, v in times.items():
        if v:
            print("time %-14s %s %s ms median [min-max] of %d steps" % (o, tag, fmt_ms(v), len(v)))
    for ours in ("cpu_adam", "cpu_adam_nvme"):
        if ours not in med:
            continue
        for peer in PEERS:
            if peer in med:
                print("ratio %s_over_%s %s %.2f" % (ours, peer, tag, med[peer] / med[ours]))
    if triad:
        print("info roofline_ms %s %.1f (28 B/param / %.2f GB/s triad)" %
              (tag, BYTES_PER_PARAM * n / (triad * 1e9) * 1e3, triad))
    if rec["nvme_moved"]:
        rd = statistics.median(x[0] for x in rec["nvme_moved"]) / 2**30
        wr = statistics.median(x[1] for x in rec["nvme_moved"]) / 2**30
        print("info nvme_per_step %s read_GiB=%.2f write_GiB=%.2f (state %.2f GiB)" %
              (tag, rd, wr, 12 * n / 2**30))
    for k, v in sorted(rec["diffs"].items()):
        print("check max_abs_diff %s %s %.3g (after %d steps from the same start)" %
              (k, tag, v, rec["steps"]))
    sys.stdout.flush()


def parent(args):
    print("# CPU Adam: tiermem.torch.CPUAdam against DeepSpeedCPUAdam and torch.optim.AdamW "
          "(fused=True, foreach=True); fp32, AdamW lr=%g betas=%s eps=%g weight_decay=%g" %
          (HYPER["lr"], HYPER["betas"], HYPER["eps"], HYPER["weight_decay"]))
    print("# ratio X_over_PEER = PEER_ms / X_ms (medians): > 1.0 means tiermem (X) is faster. "
          "%d rounds (order rotated) x %d timed steps after %d warm-up, per optimizer" %
          (args.rounds, args.steps, args.warmup))
    triad, triad_threads, where = probe_triad(args)
    if triad:
        print("info triad_gbps %.2f (%s%s)" % (triad, where, ", dram.triad_gbps, %d threads" %
                                                 triad_threads if triad_threads else ""))
    else:
        print("info triad_gbps n/a (%s)" % where)
    sys.stdout.flush()
    skipped_ds = False
    for t in args.threads:
        env = dict(os.environ, OMP_NUM_THREADS=str(t))
        env.setdefault("DS_ACCELERATOR", "cpu")
        cmd = [sys.executable, os.path.abspath(__file__), "--child-threads", str(t),
               "--sizes", ",".join(str(n) for n in args.sizes),
               "--nvme-sizes", ",".join(str(n) for n in args.nvme_sizes),
               "--rounds", str(args.rounds), "--warmup", str(args.warmup),
               "--steps", str(args.steps), "--nvme-dir", args.nvme_dir,
               "--optimizers", ",".join(args.optimizers)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        for line in proc.stdout:
            if not line.startswith("RECORD "):
                sys.stderr.write(line)
                continue
            rec = json.loads(line[7:])
            if rec["kind"] == "env":
                print("info threads=%d torch_threads=%d OMP_NUM_THREADS=%s isa=%s torch=%s "
                      "deepspeed=%s" % (rec["threads"], rec["torch_threads"], rec["omp"],
                                        rec["isa"], rec["torch"], rec["deepspeed"]))
            elif rec["kind"] == "skip":
                skipped_ds = True
                print("info skipped %s: %s" % (rec["opt"], rec["why"]))
            elif rec["kind"] == "size":
                print("info params size=%s threads=%d tensors=%d shapes=%s" %
                      (size_name(rec["size"]), rec["threads"], rec["tensors"], rec["shapes"]))
            elif rec["kind"] == "progress":
                print("# size=%s threads=%d round %d of %d done (%.0f s)" %
                      (size_name(rec["size"]), rec["threads"], rec["round"], rec["rounds"],
                       rec["seconds"]),
                      file=sys.stderr, flush=True)
            elif rec["kind"] == "result":
                report(rec, triad)
            sys.stdout.flush()
        if proc.wait() != 0:
            fail("the run with %d thread(s) failed (exit %d)" % (t, proc.returncode))
    if skipped_ds:
        sys.exit(77)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    count_list = lambda s: [parse_count(x) for x in s.split(",") if x.strip()]  # noqa: E731
    ap.add_argument("--sizes", type=count_list, default=[16 * MIB, 64 * MIB, 256 * MIB])
    ap.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--nvme-dir", default=os.environ.get("PEERS_NVME_DIR", "/var/tmp"))
    ap.add_argument("--nvme-sizes", type=count_list, default=None,
                    help="sizes that also run cpu_adam_nvme (default: those of --sizes up to "
                         "64M: at 256M each step moves 6 GiB through the disk, ~2 s)")
    ap.add_argument("--optimizers", type=lambda s: s.split(","), default=ALL)
    ap.add_argument("--triad-gbps", type=float, default=None)
    ap.add_argument("--child-threads", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.nvme_sizes is None:
        args.nvme_sizes = [n for n in args.sizes if n <= 64 * MIB]
    bad = [o for o in args.optimizers if o not in ALL]
    if bad:
        fail("unknown optimizer(s) %s; known: %s" % (bad, ",".join(ALL)), 2)
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0:
        fail("--rounds and --steps want >= 1, --warmup >= 0", 2)
    if args.child_threads is not None:
        sys.path.insert(0, os.path.join(ROOT, "python"))
        child(args)
    else:
        parent(args)


if __name__ == "__main__":
    main()
