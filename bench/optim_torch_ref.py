#!/usr/bin/env python3
"""The reference for bench/optim_bench: torch.optim.AdamW on CPU over one flat fp32 parameter.

Usage: optim_torch_ref.py N THREADS REPS, run by bench/optim_bench under its --python (the
Python whose torch is measured: tools/gpu_check.sh passes the one it runs the PyTorch tests
with). Prints "foreach SECONDS" and "fused SECONDS" (the
best step time of REPS after a warm-up step, as optim_bench takes its own), or "fused unavailable: WHY" where this torch has no
fused CPU AdamW (torch < 2.4).
"""
import sys
import time

import torch


def best_step(n, reps, **kwargs):
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n)
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, **kwargs)
    opt.step()  # creates the state
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    del opt, p
    return min(times)


def main():
    n, threads, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    print("foreach %.6f" % best_step(n, reps, foreach=True), flush=True)
    try:
        print("fused %.6f" % best_step(n, reps, fused=True), flush=True)
    except (TypeError, RuntimeError, ValueError) as e:
        print("fused unavailable: %s" % str(e).splitlines()[0], flush=True)


if __name__ == "__main__":
    main()
