"""The cost model and the chooser of tiermem.torch.fit: per block keep, offload to DRAM, offload
to NVMe or recompute, priced from measured times and bytes (docs/planner.md, "The fitted plan").

Time: a step is simulated block by block on three serial resources: the compute stream, the
link in each direction (one copy engine: two blocks' copies queue behind each other, they never
overlap for free) and the NVMe drive. Forward: block i computes f_i; its saved bytes go down the
link from the block's start, after the copies queued before them, and land no earlier than the
block's end. Backward, last block first: an offloaded block's bytes come back up the link after
its D2H (and NVMe read) has landed and no earlier than the backward of the block before it in
backward order began (the schedule prefetches about one block ahead); the block's backward
waits for them, then computes b_i, plus f_i again when it is recomputed. Per phase this is the
overlap bound max(compute, bytes / link) with serialized transfers, plus what cannot overlap at
the ends. Two measured corrections: the host cost of packing and unpacking a byte (seconds per
byte offloaded, per phase) and the cost of a recompute relative to the block's forward, both
calibrated on one offload-all and one checkpoint-all step.

Memory: the bytes of saved activations held in HBM ("resident"): the rest of the model's (never
offloaded), each kept block's, a recomputed block's checkpointed input, and an offloaded
block's tensors below min_bytes; at the end of forward, the D2H bytes still in flight; in the
backward of block i, the blocks below it, block i's whole activations (unpacked, recomputed or
kept) and the next offloaded block's prefetched tensors."""

import itertools
import statistics

KEEP, DRAM, NVME, RECOMPUTE = "keep", "dram", "nvme", "recompute"
CHOICES = (KEEP, DRAM, NVME, RECOMPUTE)
EXHAUSTIVE_MAX_BLOCKS = 7  # 4^7 = 16384 plans priced exhaustively; more blocks: greedy


class BlockCost:
    """What one block costs, measured: forward / backward seconds, the bytes its saved tensors
    hold in HBM when kept (distinct storages), the bytes offloading moves (each saved tensor at
    least min_bytes, as packed), the bytes of the small ones that stay, the checkpoint's bytes
    (its inputs) and the sizes of its largest offloaded tensors (the prefetch window).
    recomputable: some input requires grad (a block fed only data, the model's first one taking
    the batch itself, has no backward to replay: under a checkpoint it runs as it is and keeps
    its activations, so recompute is not a choice for it)."""

    __slots__ = ("name", "fwd", "bwd", "kept", "moved", "small", "ckpt", "largest",
                 "recomputable")

    def __init__(self, name, fwd, bwd, kept, moved, small, ckpt, largest=(), recomputable=True):
        self.name, self.fwd, self.bwd = name, float(fwd), float(bwd)
        self.kept, self.moved, self.small, self.ckpt = int(kept), int(moved), int(small), int(ckpt)
        self.largest = tuple(sorted((int(x) for x in largest), reverse=True))
        self.recomputable = bool(recomputable)

    def window(self, depth):
        return sum(self.largest[:max(0, depth)])


class RestCost:
    """What no block holds (embeddings, head, loss): its forward and backward seconds before the
    first block (pre) and after the last one (post), and its saved bytes, always kept."""

    __slots__ = ("pre_f", "post_f", "pre_b", "post_b", "kept")

    def __init__(self, pre_f, post_f, pre_b, post_b, kept):
        self.pre_f, self.post_f, self.pre_b, self.post_b = (float(pre_f), float(post_f),
                                                             float(pre_b), float(post_b))
        self.kept = int(kept)


class Machine:
    """Bandwidths (bytes/s; None: that tier is not available) and the calibrated corrections."""

    __slots__ = ("d2h", "h2d", "nvme_write", "nvme_read", "pack_fwd", "pack_bwd",
                 "recompute_factor", "prefetch_depth", "sources")

    def __init__(self, d2h, h2d, nvme_write=None, nvme_read=None, prefetch_depth=4):
        self.d2h, self.h2d = float(d2h), float(h2d)
        self.nvme_write, self.nvme_read = nvme_write, nvme_read
        self.pack_fwd = self.pack_bwd = 0.0  # seconds per byte offloaded, on the compute thread
        self.recompute_factor = 1.0  # a recompute's cost / the block's forward
        self.prefetch_depth = int(prefetch_depth)
        self.sources = {}


# A recompute runs the blocks' forward again: a calibrated figure below half of it is the
# machine's noise (another process's load on one step of a pair), not a cheaper forward.
RECOMPUTE_FLOOR = 0.5


def recompute_factor(keep_bwd, recompute_bwd, fwd):
    """r, a recompute's cost over the blocks' forward time fwd, from the backward times of the
    all-keep and all-recompute steps of the same profile rounds (the i-th of each in round i):
    the median of the rounds' differences, so that a load on the machine during one round weighs
    on both sides of it; (r, how: "measured", or "floor" when it was raised to
    RECOMPUTE_FLOOR)."""
    if fwd <= 0 or not keep_bwd:
        return 1.0, "measured"
    r = statistics.median(b - k for k, b in zip(keep_bwd, recompute_bwd)) / fwd
    return (r, "measured") if r >= RECOMPUTE_FLOOR else (RECOMPUTE_FLOOR, "floor")


class Prediction:
    __slots__ = ("fwd", "bwd", "peak", "inflight")

    def __init__(self, fwd, bwd, peak, inflight):
        self.fwd, self.bwd, self.peak, self.inflight = fwd, bwd, peak, inflight

    @property
    def step(self):
        return self.fwd + self.bwd


def resident(block, choice):
    """Bytes of saved activations block holds in HBM between its forward and its backward."""
    if choice == KEEP:
        return block.kept
    if choice == RECOMPUTE:
        return block.ckpt
    return block.small


def predict(blocks, rest, choices, m, budget=None):
    """Prediction of a plan (choices, one per block): forward and backward seconds and the peak
    resident bytes; rest is a RestCost. With a budget, the D2H bytes in flight at once are
    bounded by what it leaves (the stash makes the host wait beyond it): that wait is added to
    the forward."""
    pre_f, post_f, pre_b, post_b = rest.pre_f, rest.post_f, rest.pre_b, rest.post_b
    t = pre_f
    link = nvme = 0.0
    d2h_end = {}
    nvme_end = {}
    moved_total = 0
    for i, (b, c) in enumerate(zip(blocks, choices)):
        start = t
        t += b.fwd
        if c in (DRAM, NVME):
            t += m.pack_fwd * b.moved
            moved_total += b.moved
            link = max(max(link, start) + b.moved / m.d2h, t)
            d2h_end[i] = link
            if c == NVME:
                nvme = max(nvme, link) + b.moved / m.nvme_write
                nvme_end[i] = nvme
    t += post_f
    inflight = max(0.0, link - t) * m.d2h
    if budget is not None:
        slack = max(0.0, budget - peak_bytes(blocks, rest, choices, m))
        if inflight > slack:
            t += (inflight - slack) / m.d2h
            inflight = slack
    fwd = t
    # Backward, last block first.
    t += post_b
    up = fwd  # the H2D direction: free from the end of the forward (the last packs start then)
    read = max([fwd] + list(nvme_end.values()))
    prev_start = fwd
    for i in reversed(range(len(blocks))):
        b, c = blocks[i], choices[i]
        if c in (DRAM, NVME):
            ready = max(d2h_end[i], prev_start)
            if c == NVME:
                read = max(read, nvme_end[i], prev_start) + b.moved / m.nvme_read
                ready = max(ready, read)
            up = max(up, ready) + b.moved / m.h2d
            t = max(t, up)
        prev_start = t
        t += b.bwd
        if c == RECOMPUTE:
            t += m.recompute_factor * b.fwd
        if c in (DRAM, NVME):
            t += m.pack_bwd * b.moved
    t += pre_b
    return Prediction(fwd, t - fwd, peak_bytes(blocks, rest, choices, m, inflight), inflight)


def peak_bytes(blocks, rest, choices, m, inflight=0):
    res = [resident(b, c) for b, c in zip(blocks, choices)]
    peak = rest.kept + sum(res) + inflight
    below = rest.kept
    for i, (b, c) in enumerate(zip(blocks, choices)):
        if c == RECOMPUTE:
            active = b.ckpt + b.kept
        elif c in (DRAM, NVME):
            active = b.small + b.moved
        else:
            active = b.kept
        ahead = 0
        for j in range(i - 1, -1, -1):  # the next offloaded block in backward order
            if choices[j] in (DRAM, NVME):
                ahead = min(blocks[j].moved, blocks[j].window(m.prefetch_depth))
                break
        peak = max(peak, below + active + ahead)
        below += res[i]
    return peak


def _allowed(blocks, choices, dram_free, nvme_free, m):
    if any(c == RECOMPUTE and not b.recomputable for b, c in zip(blocks, choices)):
        return False
    dram = sum(b.moved for b, c in zip(blocks, choices) if c == DRAM)
    nvme = sum(b.moved for b, c in zip(blocks, choices) if c == NVME)
    if nvme and (m.nvme_write is None or nvme > nvme_free):
        return False
    # NVMe blocks pass through DRAM; the last ones stay there (saved_tensors' recent packs).
    return dram <= dram_free


def choose(blocks, rest, m, budget, dram_free, nvme_free):
    """The choices (one of CHOICES per block) with the least predicted step whose predicted peak
    is within budget, and its Prediction; None when no plan fits. Exhaustive up to
    EXHAUSTIVE_MAX_BLOCKS blocks, greedy beyond."""
    if len(blocks) <= EXHAUSTIVE_MAX_BLOCKS:
        return _exhaustive(blocks, rest, m, budget, dram_free, nvme_free)
    return _greedy(blocks, rest, m, budget, dram_free, nvme_free)


def _rank(blocks, rest, choices, m, budget):
    p = predict(blocks, rest, choices, m, budget)
    # Ties (a link fast enough to hide everything): fewer moved bytes, then fewer changes.
    moved = sum(b.moved for b, c in zip(blocks, choices) if c in (DRAM, NVME))
    return (round(p.step, 9), moved, sum(c != KEEP for c in choices)), p


def _exhaustive(blocks, rest, m, budget, dram_free, nvme_free):
    best = None
    for choices in itertools.product(CHOICES, repeat=len(blocks)):
        if not _allowed(blocks, choices, dram_free, nvme_free, m):
            continue
        key, p = _rank(blocks, rest, choices, m, budget)
        if p.peak <= budget and (best is None or key < best[0]):
            best = (key, list(choices), p)
    return None if best is None else (best[1], best[2])


def _greedy(blocks, rest, m, budget, dram_free, nvme_free):
    """From all kept: while over the budget, the one change of one block that frees the most
    bytes per second added; then, within the budget, any single change that makes the step
    faster (until none does)."""
    choices = [KEEP] * len(blocks)
    p = predict(blocks, rest, choices, m, budget)
    while p.peak > budget:
        best = None
        for i, c in itertools.product(range(len(blocks)), CHOICES):
            if c == choices[i]:
                continue
            trial = choices[:i] + [c] + choices[i + 1:]
            if not _allowed(blocks, trial, dram_free, nvme_free, m):
                continue
            q = predict(blocks, rest, trial, m, budget)
            freed = p.peak - q.peak
            if freed <= 0:
                continue
            score = freed / max(q.step - p.step, 1e-9)
            if best is None or score > best[0]:
                best = (score, trial, q)
        if best is None:
            return None
        choices, p = best[1], best[2]
    improved = True
    while improved:
        improved = False
        for i, c in itertools.product(range(len(blocks)), CHOICES):
            trial = choices[:i] + [c] + choices[i + 1:]
            if c == choices[i] or not _allowed(blocks, trial, dram_free, nvme_free, m):
                continue
            q = predict(blocks, rest, trial, m, budget)
            if q.peak <= budget and q.step < p.step * (1 - 1e-6):
                choices, p, improved = trial, q, True
    return choices, p
