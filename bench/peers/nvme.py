#!/usr/bin/env python3
"""tiermem's DRAM <-> NVMe path against DeepNVMe's ds_io (DeepSpeed) and fio, like for like.

The same file size, block size, queue depth, one I/O thread each, O_DIRECT, in the same
directory; write, then read back what that side wrote. Each run is one untimed pass and then
--loops timed passes in one direction (ds_io's --warmup_loops 1 --loops N; its figure is the timed
bytes over the timed seconds, and so is each side's here):

  tiermem  one tensor of --size in a fresh runtime (fresh swap file), exclusive tiers
           (TIERMEM_DRAM_INCLUSIVE=off, so that no clean DRAM copy answers a read): write =
           tm_tensor_offload to NVMe + sync, each pass made dirty first (an acquire for writing,
           untimed); read = tm_tensor_prefetch to DRAM + sync, put back on NVMe between passes
           (a clean offload, untimed, which writes nothing: checked). io_uring, the settings
           below as tm_config fields. The bytes moved are checked against tm_stats, the swap
           file's O_DIRECT flag against /proc, and the data read back against what was written.
  ds_io    DeepSpeed's own ds_io (DeepNVMe aio_handle: libaio, O_DIRECT, page-locked buffer),
           --block_size --queue_depth --loops, one process, intra-op parallelism 1; its write
           makes a fresh file, which its read then reads (renamed to the name ds_io reads).
           Its "GB/sec" is GiB/s: converted here from its per-pass latencies to 10^9 B/s.
  fio      io_uring, --direct=1 --fixedbufs --registerfiles, one job, a fresh file each round
           written once untimed and then --loops times timed, then read; its buffers on huge
           pages (--iomem=shmhuge, reserved for the run and released after) when they can be
           reserved, as bench/fio_compare.sh does (tiermem's DRAM pool is on huge pages).

--rounds rounds, the order of the three sides rotated each round (on a virtual disk the host's
writeback of one run slows the next); medians with the [min-max] spread. Prints `ratio` lines
for the targets (tiermem >= 1.0x ds_io, read and write) and `info` lines for fio.

    .venv/bin/python bench/peers/nvme.py [--dir /var/tmp] [--size 1GiB] [--block-size 1MiB]
                                        [--queue-depth 32] [--rounds 3] [--loops 3]
"""

import argparse
import contextlib
import ctypes
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
sys.path.insert(0, os.path.join(ROOT, "python"))

import tiermem  # noqa: E402
from tiermem import parse_size  # noqa: E402

MIB = 1 << 20
HUGEPAGES = "/proc/sys/vm/nr_hugepages"


def fail(msg):
    print("nvme.py: " + msg, file=sys.stderr)
    sys.exit(1)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/var/tmp", help="directory of every side's files")
    ap.add_argument("--size", default="1GiB", help="bytes per pass (file and buffer size)")
    ap.add_argument("--block-size", default="1MiB", help="bytes per I/O request")
    ap.add_argument("--queue-depth", type=int, default=32, help="requests in flight")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the side order rotated")
    ap.add_argument("--loops", type=int, default=3,
                    help="timed passes per run, after one untimed (ds_io's --loops)")
    ap.add_argument("--ds-io", default=None, help="ds_io (default: beside this Python, or PATH)")
    ap.add_argument("--fio", default=None, help="fio (default: PATH)")
    a = ap.parse_args()
    a.size = parse_size(a.size, "--size")
    a.block_size = parse_size(a.block_size, "--block-size")
    bs = a.block_size
    if bs < 4096 or bs > 64 * MIB or bs & (bs - 1):
        ap.error("--block-size must be a power of two from 4KiB to 64MiB (tiermem's range)")
    if a.size < bs or a.size % bs:
        ap.error("--size must be a whole number of blocks")
    if not 1 <= a.queue_depth <= 4096:
        ap.error("--queue-depth must be 1 to 4096")
    if a.rounds < 3:
        ap.error("--rounds must be at least 3 (the order rotates over the three sides)")
    if a.loops < 1:
        ap.error("--loops must be at least 1")
    if not os.path.isdir(a.dir):
        ap.error("--dir %s is not a directory" % a.dir)
    return a


def find_tools(a):
    """ds_io and fio, or one error naming everything that is missing."""
    missing = []
    ds_io = a.ds_io or os.path.join(os.path.dirname(sys.executable), "ds_io")
    if not (os.path.isfile(ds_io) and os.access(ds_io, os.X_OK)):
        ds_io = shutil.which("ds_io") if a.ds_io is None else None
    if ds_io is None:
        missing.append("ds_io (DeepSpeed's DeepNVMe benchmark: pip install -r "
                       "bench/peers/requirements.txt into .venv, with Debian's libaio-dev)")
    fio = a.fio or shutil.which("fio")
    if fio is None or not os.access(fio, os.X_OK):
        missing.append("fio (apt-get install fio)")
    if missing:
        fail("missing: " + "; ".join(missing))
    return ds_io, fio


def human(n):
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return "%d %s" % (n >> k, unit)
    return "%d B" % n


# ---------------------------------------------------------------------------------------------
# tiermem


def check_o_direct(folder):
    """Every file this process has open under folder (the swap file, O_TMPFILE) is O_DIRECT."""
    seen = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if not target.startswith(folder + "/"):
            continue
        with open("/proc/self/fdinfo/" + fd) as f:
            flags = int(re.search(r"^flags:\s*([0-7]+)", f.read(), re.M).group(1), 8)
        if not flags & os.O_DIRECT:
            fail("tiermem's swap file %s is open without O_DIRECT (flags %o)" % (target, flags))
        seen += 1
    if not seen:
        fail("no tiermem swap file open under %s" % folder)


def fill(addr, nbytes, block):
    """A random block, with each block's index in its first 8 bytes (so misplaced blocks show)."""
    pattern = bytearray(os.urandom(block))
    for i in range(nbytes // block):
        pattern[:8] = i.to_bytes(8, "little")
        ctypes.memmove(addr + i * block, bytes(pattern), block)
    return bytes(pattern[8:])


def verify(addr, nbytes, block, tail):
    for i in range(nbytes // block):
        got = ctypes.string_at(addr + i * block, block)
        if got[:8] != i.to_bytes(8, "little") or got[8:] != tail:
            fail("tiermem read back different bytes in block %d" % i)


@contextlib.contextmanager
def exclusive_tiers():
    saved = os.environ.get("TIERMEM_DRAM_INCLUSIVE")
    os.environ["TIERMEM_DRAM_INCLUSIVE"] = "off"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TIERMEM_DRAM_INCLUSIVE"]
        else:
            os.environ["TIERMEM_DRAM_INCLUSIVE"] = saved


def run_tiermem(a, work):
    """(write, read) GB/s: timed bytes over timed seconds, after one untimed pass each."""
    folder = os.path.join(work, "tiermem")
    os.makedirs(folder, exist_ok=True)
    n, bs = a.size, a.block_size
    staging = 8 * max(4 * MIB, bs)
    with exclusive_tiers(), tiermem.Runtime(
            device="emulated", hbm_bytes="64MiB", dram_bytes=n + staging + 64 * MIB,
            nvme_paths=folder, nvme_bytes=n + 64 * MIB, io_engine="uring", io_block_size=bs,
            io_queue_depth=a.queue_depth, io_threads=1, prefetch_depth=0,
            checksum="off") as rt:
        if rt.config_value("TIERMEM_DRAM_INCLUSIVE") != "off":
            fail("tiermem's tiers are not exclusive (TIERMEM_DRAM_INCLUSIVE=%s)" %
                 rt.config_value("TIERMEM_DRAM_INCLUSIVE"))
        info = rt.info()
        if (info["io_engine"], info["io_block_size"], info["io_queue_depth"],
                info["io_threads"]) != ("uring", bs, a.queue_depth, 1):
            fail("tiermem runs other I/O settings than asked: %s" % info)
        check_o_direct(folder)
        t = rt.tensor(n, "other", "dram", "nvme-peer")
        addr = t.acquire("dram", "write")
        tail = fill(addr, n, bs)
        t.release("dram")
        moved = lambda: rt.stats()["bytes_moved"]  # noqa: E731
        before = moved()
        w = []
        for i in range(1 + a.loops):
            if i:  # dirty again, so that the offload really writes (no bytes move: WRITE access)
                t.acquire("dram", "write")
                t.release("dram")
            t0 = time.perf_counter()
            t.offload("nvme")
            t.sync()
            w.append(time.perf_counter() - t0)
        r = []
        for i in range(1 + a.loops):
            if t.residency() != {"nvme"}:
                fail("tiermem's tensor is in %s before a read, not on NVMe alone" %
                     sorted(t.residency()))
            t0 = time.perf_counter()
            t.prefetch("dram")
            t.sync()
            r.append(time.perf_counter() - t0)
            if i < a.loops:
                t.offload("nvme")  # clean: frees the DRAM copy, writes nothing
                t.sync()
        after = moved()
        wrote = after["dram"]["nvme"] - before["dram"]["nvme"]
        read = after["nvme"]["dram"] - before["nvme"]["dram"]
        if wrote != (1 + a.loops) * n or read != (1 + a.loops) * n:
            fail("tiermem moved %d bytes to NVMe and %d back, not %d each" %
                 (wrote, read, (1 + a.loops) * n))
        if rt.stats()["clean_read_bytes"]:
            fail("tiermem read from a clean DRAM copy")
        addr = t.acquire("dram", "read")
        verify(addr, n, bs, tail)
        t.release("dram")
        t.destroy()
    return a.loops * n / sum(w[1:]) / 1e9, a.loops * n / sum(r[1:]) / 1e9


# ---------------------------------------------------------------------------------------------
# ds_io


def ds_env():
    env = dict(os.environ)
    env.setdefault("DS_ACCELERATOR", "cpu")
    return env


def ds_preflight():
    """DeepNVMe's aio op loads (JIT-built with ninja on first use: minutes on a small VM)."""
    code = ("from deepspeed.ops.op_builder import AsyncIOBuilder as B\n"
            "import deepspeed, sys\n"
            "b = B()\n"
            "if not b.is_compatible(verbose=True): sys.exit('DeepNVMe aio op not compatible "
            "(libaio-dev missing?)')\n"
            "b.load(verbose=False)\n"
            "print(deepspeed.__version__)\n")
    p = subprocess.run([sys.executable, "-c", code], env=ds_env(), capture_output=True,
                       text=True, timeout=3600)
    if p.returncode:
        fail("DeepSpeed's aio op does not load:\n" + (p.stdout + p.stderr)[-3000:])
    return p.stdout.strip().splitlines()[-1]


def run_ds_io(a, ds_io, work, read):
    """GB/s (10^9 B/s) of one ds_io run: its timed passes' bytes over their task latencies."""
    folder = os.path.join(work, "ds_io")
    os.makedirs(folder, exist_ok=True)
    cmd = [ds_io, "--folder", folder, "--io_size", str(a.size), "--block_size",
           str(a.block_size), "--queue_depth", str(a.queue_depth), "--loops", str(a.loops),
           "--warmup_loops", "1", "--io_parallel", "1", "--engine", "aio_handle"]
    if read:
        # ds_io reads _aio_read_SIZE.pt.0_0 (and would dd one from /dev/urandom, through the
        # page cache, were it missing): the file its write of this round made.
        src = os.path.join(folder, "_aio_write_%d.pt.0_0" % a.size)
        if not os.path.isfile(src):
            fail("ds_io's write left no %s to read" % src)
        os.replace(src, os.path.join(folder, "_aio_read_%d.pt.0_0" % a.size))
        cmd.append("--read")
    p = subprocess.run(cmd, env=ds_env(), capture_output=True, text=True, timeout=1800)
    out = p.stdout + p.stderr
    lat = re.search(r"task_latency_sec = \[([^\]]*)\]", out)
    speed = re.search(r"Task (?:Read|Write) Speed = ([0-9.eE+-]+) GB/sec", out)
    if p.returncode or not lat or not speed:
        fail("ds_io failed (%s):\n%s" % (" ".join(cmd), out[-3000:]))
    secs = [float(x) for x in lat.group(1).split(",")]
    if len(secs) != 1 + a.loops:
        fail("ds_io ran %d passes, not %d:\n%s" % (len(secs), 1 + a.loops, out[-2000:]))
    gbps = a.loops * a.size / sum(secs[1:]) / 1e9
    # Its own figure, in GiB/s, must agree with ours.
    if abs(float(speed.group(1)) * (1 << 30) / 1e9 - gbps) > 0.01 * gbps:
        fail("ds_io's figure %s GiB/s does not match its latencies %s" % (speed.group(1), secs))
    return gbps


# ---------------------------------------------------------------------------------------------
# fio


@contextlib.contextmanager
def fio_hugepages(a):
    """'shmhuge' with depth x block of 2 MiB huge pages reserved for the run, else 'malloc'."""
    need = (a.block_size * a.queue_depth + 2 * MIB - 1) // (2 * MIB) + 8
    try:
        with open(HUGEPAGES) as f:
            saved = int(f.read())
        with open(HUGEPAGES, "w") as f:
            f.write(str(saved + need))
        with open(HUGEPAGES) as f:
            got = int(f.read())
    except OSError:
        yield "malloc"
        return
    try:
        yield "shmhuge" if got >= saved + need else "malloc"
    finally:
        with contextlib.suppress(OSError), open(HUGEPAGES, "w") as f:
            f.write(str(saved))


def fio_pass(a, fio, path, rw, iomem, loops):
    cmd = [fio, "--name=nvme-peer", "--filename=" + path, "--ioengine=io_uring", "--direct=1",
           "--fixedbufs", "--registerfiles", "--iomem=" + iomem, "--rw=" + rw,
           "--bs=%d" % a.block_size, "--iodepth=%d" % a.queue_depth, "--numjobs=1",
           "--size=%d" % a.size, "--loops=%d" % loops, "--output-format=json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode:
        fail("fio failed (%s):\n%s" % (" ".join(cmd), (p.stdout + p.stderr)[-3000:]))
    job = json.loads(p.stdout[p.stdout.index("{"):])["jobs"][0]
    side = job["write" if rw == "write" else "read"]
    if side["io_bytes"] != loops * a.size or job["error"]:
        fail("fio moved %d bytes, not %d (error %d)" % (side["io_bytes"], loops * a.size,
                                                        job["error"]))
    return side["io_bytes"] / (side["runtime"] / 1e3) / 1e9 if side["runtime"] else 0.0


def run_fio(a, fio, work, iomem):
    """(write, read) GB/s: a fresh file, one untimed pass each way, then --loops timed."""
    path = os.path.join(work, "fio.dat")
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
    fio_pass(a, fio, path, "write", iomem, 1)
    w = fio_pass(a, fio, path, "write", iomem, a.loops)
    fio_pass(a, fio, path, "read", iomem, 1)
    r = fio_pass(a, fio, path, "read", iomem, a.loops)
    os.remove(path)
    return w, r


# ---------------------------------------------------------------------------------------------


def fio_version(fio):
    return subprocess.run([fio, "--version"], capture_output=True, text=True).stdout.strip()


def fs_of(path):
    """'ext4 on /dev/vda' for the mount holding path."""
    best = ("", "?", "?")
    with open("/proc/self/mounts") as f:
        for line in f:
            dev, mnt, fstype = line.split()[:3]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
                best = (mnt, dev, fstype)
    return "%s on %s" % (best[2], best[1])


def main():
    a = parse_args()
    ds_io, fio = find_tools(a)
    t_start = time.perf_counter()
    ds_version = ds_preflight()
    load = os.getloadavg()
    w = {k: [] for k in ("tiermem", "ds_io", "fio")}
    r = {k: [] for k in ("tiermem", "ds_io", "fio")}
    sides = ["tiermem", "ds_io", "fio"]
    with tempfile.TemporaryDirectory(prefix="tiermem-nvme-peer-", dir=a.dir) as work, \
            fio_hugepages(a) as iomem:
        print("nvme peers: %s a pass, block %s, queue depth %d, one I/O thread each, O_DIRECT, "
              "directory %s (%s); each run 1 untimed + %d timed passes; %d rounds, side order "
              "rotated; GB/s = 10^9 B/s, medians [min-max]; load average at start %.2f on %d "
              "cores" % (human(a.size), human(a.block_size), a.queue_depth, a.dir, fs_of(a.dir),
                         a.loops, a.rounds, load[0], os.cpu_count()), flush=True)
        for rnd in range(a.rounds):
            order = sides[rnd % 3:] + sides[:rnd % 3]
            figures = []
            for s in order:
                if s == "tiermem":
                    ws, rs = run_tiermem(a, work)
                elif s == "ds_io":
                    ws = run_ds_io(a, ds_io, work, read=False)
                    rs = run_ds_io(a, ds_io, work, read=True)
                else:
                    ws, rs = run_fio(a, fio, work, iomem)
                w[s].append(ws)
                r[s].append(rs)
                figures.append("%s %.2f/%.2f" % (s, ws, rs))
            print("info round %d (write/read GB/s): %s" % (rnd + 1, ", ".join(figures)),
                  flush=True)
    engines = {
        "tiermem": "io_uring, runtime offload/prefetch, exclusive tiers (tiermem %s)" %
                   ".".join(map(str, tiermem.version())),
        "ds_io": "libaio aio_handle, page-locked buffer (DeepSpeed %s)" % ds_version,
        "fio": "io_uring fixedbufs registerfiles, iomem %s (%s)" % (iomem, fio_version(fio)),
    }
    print("%-8s %22s %22s  %s" % ("side", "write GB/s [min-max]", "read GB/s [min-max]",
                                  "engine"))
    med = {}
    for s in sides:
        med[s] = (statistics.median(w[s]), statistics.median(r[s]))
        print("%-8s %22s %22s  %s" % (
            s, "%.2f [%.2f-%.2f]" % (med[s][0], min(w[s]), max(w[s])),
            "%.2f [%.2f-%.2f]" % (med[s][1], min(r[s]), max(r[s])), engines[s]))
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        thp = re.search(r"\[(\w+)\]", f.read()).group(1)
    print("  ds_io's buffer is DeepNVMe's page-locked tensor (posix_memalign + mlock, no "
          "MADV_HUGEPAGE: 4 KiB pages unless transparent huge pages are 'always'; here '%s'); "
          "tiermem's DRAM pool (MADV_HUGEPAGE) and fio's shmhuge buffers are on 2 MiB pages" % thp)
    print("info seconds %.0f, load average at end %.2f" %
          (time.perf_counter() - t_start, os.getloadavg()[0]))
    print("ratio nvme_write_over_ds_io %.2f" % (med["tiermem"][0] / med["ds_io"][0]))
    print("ratio nvme_read_over_ds_io %.2f" % (med["tiermem"][1] / med["ds_io"][1]))
    # fio is the reference, not a target: info lines.
    print("info nvme_write_over_fio %.2f" % (med["tiermem"][0] / med["fio"][0]))
    print("info nvme_read_over_fio %.2f" % (med["tiermem"][1] / med["fio"][1]))


if __name__ == "__main__":
    main()
