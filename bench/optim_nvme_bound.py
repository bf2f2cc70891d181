"""Bigger than memory: CPUAdam with its state on NVMe through a DRAM budget smaller than the
state (by default a quarter of it) and smaller than the largest tensor's state, its step printed
beside the disk bound measured in the same run.

The model is transformers' Llama from a config (no download): by default vocabulary 32,000,
hidden 1,024, 12 layers, 220M parameters, 2.64 GB of fp32 state (master, exp_avg, exp_avg_sq),
its embedding and head 375 MiB each. The disk bound is the state read once and written once
at fio's sequential bandwidth with a reader and a writer at once, as the step moves them
(io_uring, O_DIRECT, the same directory, block size and queue depth each), measured before and
after the steps: bound = 2 x state / (read + write bandwidth together). Beside it, the serial bound: the state read at
fio's read speed, then written at its write speed. tiermem's counters say what the step moved. Steps are timed at
`opt.step()` alone (the forward and backward are the same with any optimizer); the first step,
which makes the state, is not counted.

    .venv/bin/python bench/optim_nvme_bound.py [--dram 512MiB] [--dir /var/tmp] [--steps 4]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import torch  # noqa: E402

import tiermem  # noqa: E402
from tiermem.torch import CPUAdam  # noqa: E402


def fio(directory, rw, size, block, depth):
    """fio's bandwidth in bytes/s, sequential, `size` bytes each way in fresh files under
    `directory`: "write", "read" (of a file written first), or "both": a reader and a writer at
    once, each at the queue depth, as the step keeps reads and writes in flight together (the
    two bandwidths summed)."""
    common = ["--ioengine=io_uring", "--direct=1", "--bs=%d" % block, "--iodepth=%d" % depth,
              "--size=%d" % size, "--registerfiles=1", "--fixedbufs=1",
              "--output-format=json"]
    rfile, wfile = os.path.join(directory, "fio.read"), os.path.join(directory, "fio.write")
    jobs = {"write": ["--name=w", "--filename=" + wfile, "--rw=write"],
            "read": ["--name=r", "--filename=" + rfile, "--rw=read"]}
    jobs["both"] = jobs["read"] + jobs["write"]
    try:
        if rw != "write":  # a file to read: laid out by a write first
            subprocess.run(["fio"] + common + ["--name=lay", "--filename=" + rfile,
                                               "--rw=write"], check=True, capture_output=True)
        out = subprocess.run(["fio"] + common + jobs[rw], check=True, capture_output=True,
                             text=True).stdout
    finally:
        for f in (rfile, wfile):
            if os.path.exists(f):
                os.unlink(f)
    return sum(job["read"]["bw_bytes"] + job["write"]["bw_bytes"]
               for job in json.loads(out)["jobs"])


def llama(vocab, hidden, layers, intermediate):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=hidden // 64,
                      num_key_value_heads=hidden // 64, max_position_embeddings=256,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dram", default="512MiB", help="TIERMEM_DRAM_BYTES of the runtime")
    ap.add_argument("--dir", default="/var/tmp", help="where the swap files and fio's go")
    ap.add_argument("--steps", type=int, default=4, help="steps timed (after a first one)")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--intermediate", type=int, default=2816)
    ap.add_argument("--fio-size", default="2GiB", help="bytes of each fio run")
    args = ap.parse_args()
    if shutil.which("fio") is None:
        sys.exit("fio not found: apt-get install fio")

    work = tempfile.mkdtemp(prefix="tiermem-bound-", dir=args.dir)
    try:
        run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args, work):
    model = llama(args.vocab, args.hidden, args.layers, args.intermediate)
    params = sum(p.numel() for p in model.parameters())
    largest = max(p.numel() for p in model.parameters())
    state = 12 * params
    rt = tiermem.Runtime(dram_bytes=args.dram, nvme_paths=work, nvme_bytes=2 * state + (1 << 30),
                         log_level="error")
    info = rt.info()
    block, depth = info["io_block_size"], info["io_queue_depth"]
    dram_tier = rt.stats()["tiers"]["dram"]["capacity"]
    fio_size = tiermem.parse_size(args.fio_size, "--fio-size")
    bw = {"read": [], "write": [], "both": []}

    def measure():
        for rw in ("write", "read", "both"):
            bw[rw].append(fio(work, rw, fio_size, block, depth))

    opt = CPUAdam(model.parameters(), runtime=rt, state_tier="nvme", lr=1e-4)
    print("model       Llama, %d parameters (%.1f M), largest tensor %d (%s of state)" %
          (params, params / 1e6, largest, human(12 * largest)))
    print("state       %s on NVMe; DRAM tier %s (TIERMEM_DRAM_BYTES %s: the state is %.1fx "
          "it); slices of at most %s" % (human(state), human(dram_tier), args.dram,
                                          state / dram_tier, human(opt.slice_bytes)))
    print("io          block %s, queue depth %d, %s" % (human(block), depth, args.dir))
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    t0 = time.perf_counter()
    opt.step()  # makes the state (written down) and takes the first step
    print("first step  %.2f s (makes the state)" % (time.perf_counter() - t0))
    measure()
    times, read, written = [], [], []
    for _ in range(args.steps):
        before = rt.stats()["bytes_moved"]
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
        after = rt.stats()["bytes_moved"]
        read.append(after["nvme"]["dram"] - before["nvme"]["dram"])
        written.append(after["dram"]["nvme"] - before["dram"]["nvme"])
    measure()
    rbw, wbw, mbw = max(bw["read"]), max(bw["write"]), max(bw["both"])
    r, w = statistics.median(read), statistics.median(written)
    serial = state / rbw + state / wbw  # the state read once, then written once
    bound = 2 * state / mbw  # both at once, as the step moves them
    step = statistics.median(times)
    print("fio         read %.2f GB/s [%s], write %.2f GB/s [%s], both at once %.2f GB/s [%s] "
          "(best of before and after)" % (rbw / 1e9, spread(bw["read"]), wbw / 1e9,
                                          spread(bw["write"]), mbw / 1e9, spread(bw["both"])))
    print("moved       %s read, %s written a step (%.2fx, %.2fx the state)" %
          (human(r), human(w), r / state, w / state))
    print("step        %.3f s median of %d [%.3f-%.3f]" % (step, len(times), min(times),
                                                            max(times)))
    print("disk bound  %.3f s (the state read and written once at fio's speed both at once); "
          "%.3f s read, then written" % (bound, serial))
    print("ratio       %.2fx the bound (target <= 1.25); %.2fx the serial one" %
          (step / bound, step / serial))
    opt.close()
    rt.close()


def spread(xs):
    return "-".join("%.2f" % (x / 1e9) for x in sorted(xs))


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return "%.4g %s" % (n, unit) if unit != "B" else "%d B" % n
        n /= 1024.0


if __name__ == "__main__":
    main()
