"""One optimizer of bench/peers/cpu_adam.py in a process of its own, as a user runs it.

The parent (cpu_adam.py) starts one worker per optimizer and thread count and drives them over
a pipe, one JSON line per command and per answer, on the worker's stdin and on the stdout it had
at start (the worker's own prints, DeepSpeed's included, go to stderr). Between its turns a
worker waits in a blocking read of that pipe, its thread pools idle, so that whichever optimizer
is timed has the cores to itself: in one process the peers' OpenMP pools (DeepSpeed's libgomp,
torch's own) spun after their parallel regions and took the cores from the next optimizer.

Commands:
  {"cmd": "size", "n": N}                    build the parameters and gradients of N (or, when
                                             N is 0, free them); answers tensors and shapes
  {"cmd": "round", "dump": PATH or null}     reset the parameters to the start, build the
                                             optimizer afresh, --warmup untimed and --steps timed
                                             steps, close it; answers the step times (s) and, for
                                             cpu_adam_nvme, the bytes moved per step; with dump,
                                             writes the parameters after those steps to PATH
                                             (raw fp32, tensor after tensor) for the check
  {"cmd": "quit"}
The first answer, unasked, is {"kind": "env", ...} or {"kind": "skip", "why": ...} when the
optimizer cannot be built here (DeepSpeed missing).
"""

import gc
import json
import os
import shutil
import sys
import tempfile
import time

MIB = 1 << 20
HYPER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


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
    assert sum(numel(s) for s in shapes) == n
    return shapes


def numel(shape):
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


def _version(pkg):
    try:
        from importlib.metadata import version
        return version(pkg)
    except Exception:  # noqa: BLE001
        return None


class Worker:
    """One optimizer (name), its thread count, and the tensors of the current size."""

    def __init__(self, name, threads, warmup, steps, nvme_dir):
        import torch
        self.torch, self.name, self.threads = torch, name, threads
        self.warmup, self.steps, self.nvme_dir = warmup, steps, nvme_dir
        torch.set_num_threads(threads)
        self.n, self.params, self.nvme_root = 0, None, None
        if name == "deepspeed":
            from deepspeed.ops.adam import DeepSpeedCPUAdam
            self.ds = DeepSpeedCPUAdam
        elif name.startswith("cpu_adam"):
            import tiermem
            from tiermem.torch import CPUAdam
            self.tiermem, self.CPUAdam = tiermem, CPUAdam
        if name == "cpu_adam_nvme":
            os.makedirs(nvme_dir, exist_ok=True)
            self.nvme_root = tempfile.mkdtemp(prefix="tiermem-cpu-adam-", dir=nvme_dir)

    def env(self):
        from tiermem.torch.cpu_adam import isa
        torch = self.torch
        return dict(kind="env", opt=self.name, threads=self.threads, isa=isa()[1],
                    torch=torch.__version__, deepspeed=_version("deepspeed"),
                    omp=os.environ.get("OMP_NUM_THREADS"), torch_threads=torch.get_num_threads(),
                    pid=os.getpid())

    def size(self, n):
        torch = self.torch
        self.params = None
        gc.collect()
        self.n = n
        if not n:
            return dict(kind="size", n=0)
        self.shapes = shapes_for(n)
        self.params = [torch.nn.Parameter(torch.empty(s)) for s in self.shapes]
        gen = torch.Generator().manual_seed(n + 1)
        for p in self.params:
            p.grad = torch.empty(p.shape).normal_(0.0, 1e-3, generator=gen)
        return dict(kind="size", n=n, tensors=len(self.shapes), shapes=describe(self.shapes))

    def reset(self):
        """The same start in every worker and round, made afresh (keeping a copy would cost
        another 4 B/param in each of the workers alive at once)."""
        gen = self.torch.Generator().manual_seed(self.n)
        with self.torch.no_grad():
            for p in self.params:
                p.normal_(0.0, 0.02, generator=gen)

    def make(self):
        torch, name, threads, params = self.torch, self.name, self.threads, self.params
        if name == "cpu_adam":
            return self.CPUAdam(params, threads=threads, **HYPER), None
        if name == "cpu_adam_nvme":
            # ZeRO-Infinity's setting: the state on NVMe, DRAM a quarter of it (at least the
            # pipeline's stepping bucket, its new version and one read ahead each side).
            state_bytes = 12 * self.n
            largest = max(numel(s) for s in self.shapes) * 12
            dram = max(state_bytes // 4, 4 * largest) + 64 * MIB
            rt = self.tiermem.Runtime(device="emulated", hbm_bytes="16MiB", dram_bytes=dram,
                                      nvme_paths=self.nvme_root,
                                      nvme_bytes=2 * state_bytes + 256 * MIB,
                                      prefetch_depth=1, log_level="error")
            return self.CPUAdam(params, threads=threads, runtime=rt, state_tier="nvme",
                                **HYPER), rt
        if name == "deepspeed":
            return self.ds(params, bias_correction=True, adamw_mode=True,
                           fp32_optimizer_states=True, **HYPER), None
        if name == "torch_fused":
            return torch.optim.AdamW(params, fused=True, **HYPER), None
        if name == "torch_foreach":
            return torch.optim.AdamW(params, foreach=True, **HYPER), None
        raise ValueError(name)

    def round(self, dump):
        self.reset()
        opt, rt = self.make()
        for _ in range(self.warmup):
            opt.step()
        before = rt.stats()["bytes_moved"] if rt is not None else None
        times = []
        for _ in range(self.steps):
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
        moved = None
        if rt is not None:
            after = rt.stats()["bytes_moved"]
            moved = ((after["nvme"]["dram"] - before["nvme"]["dram"]) / self.steps,
                     (after["dram"]["nvme"] - before["dram"]["nvme"]) / self.steps)
        if hasattr(opt, "close"):
            opt.close()
        del opt
        if rt is not None:
            rt.close()
            del rt
            os.sync()  # the swap files' writeback here, not in the next worker's turn
        gc.collect()
        if dump:
            with open(dump, "wb") as f:
                for p in self.params:
                    f.write(p.detach().contiguous().numpy().tobytes())
        return dict(kind="round", times=times, nvme_moved=moved)

    def close(self):
        self.params = None
        if self.nvme_root is not None:
            shutil.rmtree(self.nvme_root, ignore_errors=True)


def serve(name, threads, warmup, steps, nvme_dir):
    """The worker's loop: answers on the stdout it was started with; prints go to stderr."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def answer(rec):
        out.write(json.dumps(rec) + "\n")
        out.flush()

    try:
        w = Worker(name, threads, warmup, steps, nvme_dir)
    except Exception as e:  # noqa: BLE001: reported; the parent runs the others
        answer(dict(kind="skip", opt=name, why="%s: %s" % (type(e).__name__, e)))
        return
    answer(w.env())
    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["cmd"] == "size":
                answer(w.size(cmd["n"]))
            elif cmd["cmd"] == "round":
                answer(w.round(cmd.get("dump")))
            elif cmd["cmd"] == "quit":
                break
    finally:
        w.close()
