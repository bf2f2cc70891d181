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
tensors, the same for every step and every optimizer. Each optimizer runs in a process of its
own, as a user runs one (bench/peers/_cpu_adam_worker.py): in one process the peers' OpenMP
pools (DeepSpeed's libgomp, torch's) spun after their parallel regions and took the 2 cores of
this VM from whichever optimizer ran next (64M, 2 threads, quiet: DeepSpeed 204 ms mixed,
28 ms alone).
Per thread count one worker per optimizer is started and set up once per size; in each of
--rounds rounds the parent gives each worker its turn, the order rotated each round, while the
others wait in a blocking pipe read (and 0.2 s between turns lets spinning threads sleep). A
turn resets the parameters to the same seeded start, builds the optimizer afresh, takes
--warmup untimed steps (state allocation, first touch) and then --steps timed steps, and frees
the state. Threads, each through its own knob: OMP_NUM_THREADS in each worker's environment
(read once by OpenMP, which DeepSpeed's kernel and torch use), torch.set_num_threads and
CPUAdam(threads=N). All workers stay alive at once when their tensors fit in MemAvailable
(8 B/param idle, 12 more while stepping and checking); otherwise each peer runs paired with
cpu_adam (`info groups`), and a peer's ratio is against cpu_adam of its own pair.
Per configuration: the median and [min-max] of the timed steps of all rounds, and `ratio`
lines, peer_ms / tiermem_ms of the medians (> 1.0: tiermem faster). `info roofline_ms`: 28 B
per parameter (read p, m, v, g; write p, m, v) over the DRAM triad of tiermem-probe
(`tiermem-probe --json`, dram.triad_gbps, one thread per core): a yardstick, not a ceiling (the
triad pays a write-allocate it does not count; a fused step runs at about 1.5x it). `check` lines: the largest
absolute difference between the parameters tiermem and DeepSpeed (and torch foreach) reach
after the same steps from the same start (round 0, all the parameters, via files in /dev/shm).

    .venv/bin/python bench/peers/cpu_adam.py [--sizes 16M,64M,256M] [--threads 1,2]
        [--rounds 3] [--warmup 1] [--steps 2] [--nvme-dir /var/tmp] [--nvme-sizes ...]
        [--optimizers cpu_adam,cpu_adam_nvme,deepspeed,torch_fused,torch_foreach]
        [--triad-gbps X]

Environment: TIERMEM_LIBRARY (the library), TIERMEM_PROBE (tiermem-probe; default: tools/ beside
the library's lib/), PEERS_NVME_DIR (default of --nvme-dir). Exits 77 when DeepSpeed is missing.
"""

import argparse
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
SETTLE_S = 0.2  # between turns: OpenMP threads spin a while after their last region
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


class WorkerProcess:
    """One optimizer's worker (bench/peers/_cpu_adam_worker.py), driven over its pipes."""

    def __init__(self, name, threads, args):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        env.setdefault("DS_ACCELERATOR", "cpu")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", name,
               "--child-threads", str(threads), "--warmup", str(args.warmup),
               "--steps", str(args.steps), "--nvme-dir", args.nvme_dir]
        self.name = name
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def answer(self):
        line = self.proc.stdout.readline()
        if not line:
            fail("the %s worker died (exit %s)" % (self.name, self.proc.wait()))
        return json.loads(line)

    def close(self):
        try:
            self.proc.stdin.write(json.dumps(dict(cmd="quit")) + "\n")
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait()


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def plan_groups(args, opts):
    """All optimizers' workers alive at once when their tensors fit, else each peer with
    cpu_adam (and cpu_adam_nvme with cpu_adam)."""
    need = len(opts) * 512 * MIB + max(
        (8 * sum(1 for o in opts if o != "cpu_adam_nvme" or n in args.nvme_sizes) + 20) * n
        for n in args.sizes)
    avail = mem_available()
    if avail is None or need <= 0.85 * avail or "cpu_adam" not in opts or len(opts) <= 2:
        return [opts], need, avail
    others = [o for o in opts if o != "cpu_adam"]
    return [["cpu_adam", o] for o in others], need, avail


def max_abs_diff(path_a, path_b):
    import numpy as np
    a = np.memmap(path_a, dtype=np.float32, mode="r")
    b = np.memmap(path_b, dtype=np.float32, mode="r")
    chunk, out = 16 * MIB, 0.0
    for i in range(0, a.size, chunk):
        out = max(out, float(np.abs(a[i:i + chunk] - b[i:i + chunk]).max()))
    return out


def run_size(workers, n, t, args, dump_dir):
    """The rounds of one size over the live workers; the record report() prints."""
    live = [w for w in workers if w.name != "cpu_adam_nvme" or n in args.nvme_sizes]
    for w in workers:
        rec = w.ask(cmd="size", n=n if w in live else 0)
        if w in live:
            shapes = rec
    print("info params size=%s threads=%d tensors=%d shapes=%s workers=%s" %
          (size_name(n), t, shapes["tensors"], shapes["shapes"], ",".join(w.name for w in live)))
    sys.stdout.flush()
    names = [w.name for w in live]
    pairs = [(a, b) for a, b in (("cpu_adam", "deepspeed"), ("cpu_adam", "torch_foreach"))
             if a in names and b in names]
    checked = {x for pair in pairs for x in pair}
    times = {w.name: [] for w in live}
    nvme_moved, diffs, dumps = [], {}, {}
    t_size = time.perf_counter()
    for r in range(args.rounds):
        k = r % len(live)
        for w in live[k:] + live[:k]:
            time.sleep(SETTLE_S)
            dump = None
            if r == 0 and w.name in checked:
                dump = dumps[w.name] = os.path.join(dump_dir, "%s-%d.f32" % (w.name, n))
            rec = w.ask(cmd="round", dump=dump)
            times[w.name] += rec["times"]
            if rec["nvme_moved"]:
                nvme_moved.append(rec["nvme_moved"])
        if r == 0:
            for a, b in pairs:
                diffs["%s_vs_%s" % (a, b)] = max_abs_diff(dumps[a], dumps[b])
            for path in dumps.values():
                os.unlink(path)
        print("# size=%s threads=%d round %d of %d done (%.0f s)" %
              (size_name(n), t, r + 1, args.rounds, time.perf_counter() - t_size),
              file=sys.stderr, flush=True)
    return dict(size=n, threads=t, times=times, steps=args.warmup + args.steps,
                nvme_moved=nvme_moved, diffs=diffs)


def run_threads(t, opts, args, triad, dump_dir):
    """Every size at one thread count; False when DeepSpeed was skipped."""
    groups, need, avail = plan_groups(args, opts)
    if len(groups) > 1:
        print("info groups threads=%d %s (all at once would need ~%.1f GiB, %.1f available)" %
              (t, " ".join("+".join(g) for g in groups), need / 2**30, avail / 2**30))
    ok = True
    for group in groups:
        workers = [WorkerProcess(o, t, args) for o in group]
        try:
            started = []
            for w in workers:
                rec = w.answer()
                if rec["kind"] == "skip":
                    ok = False
                    print("info skipped %s: %s" % (rec["opt"], rec["why"]))
                    w.close()
                    continue
                started.append(w)
                if len(started) == 1:
                    print("info threads=%d torch_threads=%d OMP_NUM_THREADS=%s isa=%s torch=%s "
                          "deepspeed=%s" % (rec["threads"], rec["torch_threads"], rec["omp"],
                                            rec["isa"], rec["torch"], rec["deepspeed"]))
            print("info workers threads=%d %s (one process each)" %
                  (t, " ".join(w.name + ":" + str(w.proc.pid) for w in started)))
            sys.stdout.flush()
            workers = started
            for n in args.sizes:
                report(run_size(workers, n, t, args, dump_dir), triad)
        finally:
            for w in workers:
                w.close()
    return ok


def parent(args):
    print("# CPU Adam: tiermem.torch.CPUAdam against DeepSpeedCPUAdam and torch.optim.AdamW "
          "(fused=True, foreach=True); fp32, AdamW lr=1e-3 betas=(0.9, 0.999) eps=1e-08 "
          "weight_decay=0.01; each optimizer in a process of its own")
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
    dump_dir = tempfile.mkdtemp(prefix="tiermem-cpu-adam-check-",
                                dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    ok = True
    try:
        for t in args.threads:
            ok = run_threads(t, args.optimizers, args, triad, dump_dir) and ok
    finally:
        shutil.rmtree(dump_dir, ignore_errors=True)
    if not ok:
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
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.nvme_sizes is None:
        args.nvme_sizes = [n for n in args.sizes if n <= 64 * MIB]
    bad = [o for o in args.optimizers if o not in ALL]
    if bad:
        fail("unknown optimizer(s) %s; known: %s" % (bad, ",".join(ALL)), 2)
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0:
        fail("--rounds and --steps want >= 1, --warmup >= 0", 2)
    if args.worker is not None:
        sys.path.insert(0, os.path.join(ROOT, "python"))
        from _cpu_adam_worker import serve
        serve(args.worker, args.child_threads, args.warmup, args.steps, args.nvme_dir)
    else:
        parent(args)


if __name__ == "__main__":
    main()
