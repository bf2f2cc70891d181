"""The two phases a rank of bench/peers/fsdp_offload.py runs (its docstring says what each
measures): timing (every mode in one process group, stepped in rotated rounds) and memory (one
mode alone, its RSS high-water marks); worker() is a rank's entry point."""

import json
import os
import statistics

from _fsdp_rank import Rank


def proc_status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                k, v = line.split(":", 1)
                out[k] = int(v.split()[0]) * 1024
    return out


def reset_hwm():
    """Resets this process's RSS high-water mark to its RSS (Linux 4.0+); False when refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def moved_since(rt, before, steps):
    after = rt.stats()["bytes_moved"]
    return {"%s->%s" % (a, b): (after[a][b] - before[a][b]) / steps
            for a in after for b in after[a] if after[a][b] != before[a][b]}


def time_worker(r, spec):
    """Every mode at once, stepped in turn: warm-up, then rounds of --steps steps per mode."""
    modes = spec["modes"]
    runs = {}
    for mode in modes:
        model = r.model(mode)
        opt, rt, figures = r.optimizer(mode, model)
        runs[mode] = dict(model=model, opt=opt, rt=rt, figures=figures, losses=[], opt_times=[],
                          cpu_times=[], norms=[], times=[[] for _ in range(spec["rounds"])])
    for i in range(spec["warmup"]):
        for mode in modes:
            runs[mode]["losses"].append(r.step(runs[mode]["model"], runs[mode]["opt"], i)[2])
    before = {m: run["rt"].stats()["bytes_moved"] for m, run in runs.items() if run["rt"]}
    for rnd in range(spec["rounds"]):
        order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]
        for mode in order:
            run = runs[mode]
            for k in range(spec["steps"]):
                i = spec["warmup"] + rnd * spec["steps"] + k
                dt, dt_opt, loss, cpu = r.step(run["model"], run["opt"], i)
                run["times"][rnd].append(dt)
                run["opt_times"].append(dt_opt)
                run["cpu_times"].append(cpu)
                run["losses"].append(loss)
                run["norms"].append(r.last_norm)
        if r.rank == 0:
            print("round %d: %s" % (rnd, "  ".join(
                "%s %.1f ms" % (m, 1000 * statistics.median(runs[m]["times"][rnd]))
                for m in order)), flush=True)
    out = {}
    for mode, run in runs.items():
        model = run["model"]
        res = dict(run["figures"], times=run["times"], opt_times=run["opt_times"],
                   cpu_times=run["cpu_times"], norms=run["norms"],
                   losses=run["losses"],
                   link=r.link_bytes(mode, model),
                   params_total=sum(p.numel() for p in model.parameters()),
                   local_numel=sum(p.to_local().numel() for p in model.parameters()),
                   param_bytes=next(model.parameters()).element_size())
        if run["rt"] is not None:
            res["tiermem_moved"] = moved_since(run["rt"], before[mode],
                                               spec["rounds"] * spec["steps"])
            res["dram_peak"] = run["rt"].stats()["tiers"]["dram"]["peak"]
            held = run["opt"].shard_offload
            if held is not None:
                res["shards"] = dict(bytes=sum(r.nbytes for u in held.units for r in u.records),
                                     units=len(held.units), peak_units=held.peak_units)
            run["opt"].close()
            run["rt"].close()
        out[mode] = res
    return out


def memory_worker(r, spec):
    """One mode alone: the RSS high-water mark from the sharded model on."""
    import gc
    import resource
    mode = spec["modes"][0]
    model = r.model(mode)
    gc.collect()
    r.sync()
    hwm_reset = reset_hwm()
    base = proc_status()["VmRSS"]
    opt, rt, _ = r.optimizer(mode, model)
    for i in range(spec["warmup"]):
        r.step(model, opt, i)
    warm = proc_status()
    reset_hwm()
    for i in range(spec["warmup"], spec["warmup"] + spec["mem_steps"]):
        r.step(model, opt, i)
    status = proc_status()
    if rt is not None:
        opt.close()
        rt.close()
    return {mode: dict(host_peak=max(status["VmHWM"], warm["VmHWM"]), base=base,
                       steady_peak=status["VmHWM"], hwm_reset=hwm_reset,
                       ru_maxrss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)}


def worker(spec):
    r = Rank(spec)
    out = (time_worker if spec["phase"] == "time" else memory_worker)(r, spec)
    with open(os.path.join(spec["out"], "rank%d.json" % r.rank), "w") as f:
        json.dump(out, f)
    r.close()
