"""One rank of test_ddp.py (run by torchrun): DDP over gloo with and without tiermem's offloads
must give bit-identical losses and parameters. Exits 0 when they do."""

import os
import sys
import tempfile

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))  # tinygpt.py

import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402
from tinygpt import TinyGPT, batches  # noqa: E402


def train(rt):
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    model = TinyGPT(vocab=128, seq=32, hidden=64, heads=4, blocks=2)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-2)
    handles = []
    if rt is not None:
        handles.append(tt.offload_parameters(model, rt, "nvme", optimizer=opt))
        handles.append(tt.offload_optimizer_state(opt, rt, "nvme"))
    losses = []
    rank = dist.get_rank()
    for i, (x, y) in enumerate(batches(6, 8, 32, 128)):
        x, y = x[rank::2].contiguous(), y[rank::2].contiguous()  # each rank its half
        if rt is not None:
            with rt.step():
                with tt.offload_saved_tensors(rt, "nvme", min_bytes=1024):
                    loss = ddp(x, y)
                loss.backward()
                handles[-1].step()  # the offloads' bucketed step
        else:
            loss = ddp(x, y)
            loss.backward()
            opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    for h in handles:
        h.remove()
    return losses, [p.detach().clone() for p in model.parameters()]


def main():
    dist.init_process_group("gloo")
    plain = train(None)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TIERMEM_TEST_NVME")) as d:
        with tiermem.Runtime(device="emulated", hbm_bytes="8MiB", dram_bytes="256KiB",
                             nvme_paths=d, nvme_bytes="64MiB", log_level="error") as rt:
            offloaded = train(rt)
            info, stats = rt.info(), rt.stats()
        left = os.listdir(d)
    ok = (plain[0] == offloaded[0] and
          all(torch.equal(a, b) for a, b in zip(plain[1], offloaded[1])))
    rank = dist.get_rank()
    print("rank %d: local_rank %d of %d, bit-identical %s, dram->nvme %d bytes, prefetches %d, "
          "files left %d" % (rank, info["local_rank"], info["local_world_size"], ok,
                             stats["bytes_moved"]["dram"]["nvme"], stats["prefetches"],
                             len(left)))
    dist.destroy_process_group()
    # The rank the library resolved is checked by test_ddp.py from the line printed above.
    good = ok and stats["bytes_moved"]["dram"]["nvme"] > 0 and stats["prefetches"] > 0 and \
        not left
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
