"""What bench/peers/fsdp_offload.py prints from its ranks' figures: per mode the step times and
host peaks, the bytes moved, the loss checks against AdamW, and the paired per-round ratios."""

import os
import statistics
import sys

from _fsdp_rank import MIB


def ms(x):
    return 1000.0 * x


def report(args, modes, timing, memory, wall):
    t0 = timing[0]  # rank 0's figures (times are the slowest rank's, losses the ranks' mean)
    first = t0[modes[0]]
    print("info params total=%d per_rank_shard=%s (%d B/param)" % (
        first["params_total"], [t[modes[0]]["local_numel"] for t in timing],
        first["param_bytes"]))
    for mode in modes:
        print("info impl %s: %s" % (mode, t0[mode]["impl"]))
    for mode in ("tiermem", "tiermem_nvme", "tiermem_nvme_at_step"):
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
    for other in ("tiermem_nvme", "tiermem_nvme_at_step", "tiermem_shards"):
        if "tiermem" not in modes or other not in modes:
            continue
        diff = max(abs(a - b) for a, b in zip(t0[other]["losses"], t0["tiermem"]["losses"]))
        print("check loss_max_diff %s_vs_tiermem %.3g (the same kernel over the same values: 0 "
              "expected)" % (other, diff))
        bad = bad or diff > 0
    print("info losses %s: %s" % (modes[0], " ".join("%.4f" % x for x in t0[modes[0]]["losses"])))
    for mode in modes:
        norms = [n for n in t0[mode].get("norms", []) if n is not None]
        if args.clip is not None and norms:  # the timed steps' total norms, clip_grad_norm_'s
            print("info clipped %s: %d of %d timed steps clipped at max_grad_norm %g (total norm "
                  "%.3g-%.3g; the other modes train on the same gradients within AdamW's "
                  "tolerance)" % (mode, sum(n + 1e-6 > args.clip for n in norms), len(norms),
                                  args.clip, min(norms), max(norms)))

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
    cores = os.cpu_count() or 1
    for mode in modes:
        cpu = statistics.median(t0[mode]["cpu_times"])
        print("info cpu %s %.1f ms a step, every rank's threads (%.2f of %d cores busy over the "
              "step)%s" % (mode, ms(cpu), cpu / med[mode], cores, "" if mode == ref else
                           "; %.2fx %s's" % (cpu / statistics.median(t0[ref]["cpu_times"]),
                                              ref)))
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
    if bad:  # as fsdp_offload.py's fail(): the message on stderr, exit status 1
        print("fsdp_offload.py: the losses disagree (more than --loss-rtol %g against AdamW, or "
              "tiermem_nvme against tiermem)" % args.loss_rtol, file=sys.stderr)
        return 1
    return 0
