"""FSDPCPUAdam under FSDP2 (fully_shard), 2 gloo ranks on the CPU run by torchrun: 20 steps of a
small transformer of stock nn modules, and of transformers' Llama from a small config, follow
fully_shard with torch.optim.AdamW; the state on NVMe below a DRAM budget gives the same bits as
in DRAM; clipping follows clip_grad_norm_ over the DTensor gradients; a MixedPrecisionPolicy
(bf16 compute) follows AdamW under the same policy; checkpoints through
torch.distributed.checkpoint resume bit-identically and move between FSDPCPUAdam and AdamW;
FSDP1, CPUOffloadPolicy, HSDP and ignored parameters are refused by name; a run over two
"nodes" (torchrun --nnodes 2 on 127.0.0.1) splits each node's budget over its own ranks; and
with shard_tier the parameter shards held in tiermem between uses give the bits of the run that
kept them (fsdp_shard_cases.py), and a read of one between uses raises a RuntimeError that says
what to do instead, the run going on bit-identically (fsdp_guard_cases.py).

One torchrun runs every single-node case (fsdp_worker.py; each case writes its figures as JSON),
and the tests below judge them; the two-node run is a second pair of torchruns."""

import glob
import json
import math
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "fsdp_worker.py")
CASES = ("dram,nvme,pretrained,clip,mixed,refusals,dcp,llama,budget,hooks,tight,resume_save,fault,"
         "fault_shards,overlap,"
         "shards_nvme,shards_llama,shards_dcp,shards_accumulate,shards_prefetch,shards_guard,"
         "shards_hostile,shards_rt_close,shards_overlap")
# The tolerance of test_cpu_adam.py: CPUAdam's kernel and torch's scalar AdamW round differently
# in the last bit (FMA or not), so the curves agree to 1e-5 relative, not bit for bit, at lr 1e-3.
LOSS_RTOL = 1e-5


def _fsdp2_available():
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
        from torch.distributed.tensor import DTensor  # noqa: F401
    except ImportError:
        return False
    return dist.is_available() and dist.is_gloo_available()


pytestmark = pytest.mark.skipif(not _fsdp2_available(),
                                reason="torch %s has no FSDP2 (fully_shard) with gloo" %
                                torch.__version__)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(out, cases, nnodes=1, node_rank=0, nproc=2, port=None):
    env = dict(os.environ, FSDP_OUT=str(out), FSDP_CASES=cases, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=%d" % nproc,
           "--nnodes=%d" % nnodes, "--node_rank=%d" % node_rank, "--master_addr=127.0.0.1",
           "--master_port=%d" % (port or free_port()), WORKER]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def finish(proc, timeout=240):
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
    assert proc.returncode == 0, output[-6000:]


def results(out, case):
    """Each rank's figures for a case, by rank."""
    files = sorted(glob.glob(os.path.join(str(out), "%s.rank*.json" % case)))
    got = {}
    for f in files:
        with open(f) as fh:
            got[int(f.rsplit("rank", 1)[1].split(".")[0])] = json.load(fh)
    assert sorted(got) == [0, 1], "%s: ranks %s wrote results" % (case, sorted(got))
    return got


@pytest.fixture(scope="module")
def single_node(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    finish(torchrun(out, CASES))
    return out


def assert_follows(r, what, steps=20, loss_rtol=LOSS_RTOL, param_atol=None):
    """param_atol: the parameters within it, instead of float32's tolerance."""
    assert r["steps"] == steps, what
    assert r["worst_loss"] <= loss_rtol, "%s: losses differ by %.3g relative" % (
        what, r["worst_loss"])
    close = r["params_close"] if param_atol is None else r["worst_param"] <= param_atol
    assert close, "%s: parameters differ by up to %.3g" % (what, r["worst_param"])
    assert r["moved"] > 0.01, "%s: the reference's parameters barely moved" % what


def test_follows_adamw_state_in_dram(single_node):
    for rank, r in results(single_node, "dram").items():
        assert_follows(r, "rank %d" % rank)


def test_state_on_nvme_below_the_dram_budget(single_node):
    for rank, r in results(single_node, "nvme").items():
        assert_follows(r, "rank %d" % rank)
        assert r["vs_dram"]["bit_identical"], "rank %d: NVMe and DRAM state differ" % rank
        assert r["dram_bytes"] < r["state_bytes"]
        # Every step reads the state back and writes it down: most of it, at least.
        assert r["from_nvme"] > 20 * r["state_bytes"] // 2, r
        assert r["to_nvme"] > 20 * r["state_bytes"] // 2, r
        assert (r["local_rank"], r["local_world_size"]) == (rank, 2)


def test_pretrained_weights_loaded_after_the_optimizer_are_what_it_steps(single_node):
    """get_optimizer_state_dict (a zero step: masters of the initial weights), then
    set_model_state_dict of pretrained weights, then training: as AdamW from the pretrained
    weights (the masters had put the initial weights back at the first step); then a clamp_
    between backward and step() (the step prepared behind backward had lost it)."""
    for rank, r in results(single_node, "pretrained").items():
        assert_follows(r, "rank %d" % rank, steps=5)
        # Then a clamp_ between backward and step() is in the next step, as with AdamW (the
        # parameters compared above are after those steps too).
        assert r["clamped"] <= 0.05 + 2 * 1e-3, "rank %d: the clamp was lost" % rank
        assert len(r["warned"]) == 1, r["warned"]


def test_clipping_follows_clip_grad_norm(single_node):
    for rank, r in results(single_node, "clip").items():
        assert r["clipping_changed_the_reference"], "CLIP must be small enough to clip"
        assert_follows(r, "rank %d" % rank)


def test_mixed_precision_policy_follows_adamw(single_node):
    # bf16 compute: a last-bit difference of an fp32 parameter (the kernel's FMA against torch's
    # scalar AdamW) flips its bf16 rounding now and then, and the forward and the gradients
    # carry that on: on a CPU with AMX, 2e-4 relative in the losses and 1.5e-3 in the
    # parameters over 20 steps (Adam moves an element whose gradient is noise by up to lr a
    # step either way). So the losses agree to bf16's resolution, 2^-8, and the parameters to
    # 4 x lr.
    for rank, r in results(single_node, "mixed").items():
        assert_follows(r, "rank %d" % rank, loss_rtol=2 ** -8, param_atol=4e-3)


def test_llama_follows_adamw(single_node):
    for rank, r in results(single_node, "llama").items():
        if "skipped" in r:
            pytest.skip(r["skipped"])
        assert_follows(r, "rank %d" % rank)


def test_a_fault_on_one_rank_steps_no_rank(single_node):
    """Rank 1's NVMe state unreadable: every rank raises the same TiermemError naming rank 1 and
    its cause (TM_ERR_CORRUPT), twice while the fault stays; no rank's parameters changed; once
    undone, step() goes on with the bits of a run that never failed."""
    for case in ("fault", "fault_shards"):
        check_fault(results(single_node, case), case)


def check_fault(got, case):
    for rank, r in got.items():
        for e in r["errors"]:
            assert e is not None, "%s: rank %d stepped while rank 1 failed" % (case, rank)
            assert e[0] == "TM_ERR_CORRUPT", e
            assert "rank 1 failed its step" in e[1] and "taken on no rank" in e[1], e
        assert r["unchanged"], "%s: rank %d: a parameter changed" % (case, rank)
        assert r["went_on"], "%s: rank %d: the run after the fault differs" % (case, rank)
    assert got[0]["errors"] == got[1]["errors"], "%s: the ranks raised different errors" % case


def test_the_step_prepared_behind_backward(single_node):
    """overlap (auto with the state on NVMe): the step prepared while backward runs,
    bit-identical to overlap=False, with clipping too (prepared unclipped, taken whole where a
    step clips); a learning rate changed between steps is followed;
    accumulation and a change of the gradients (a foreach mul, as clip_grad_norm_ makes; two
    elements swapped through to_local(), which keeps the sum) fall back to the whole step at
    step(), with a warning; a fault on one rank's NVMe before
    backward: every rank raises, nothing changes, the run goes on."""
    for rank, r in results(single_node, "overlap").items():
        for name in ("plain", "micro", "halve", "lr", "swap"):
            assert r[name]["same"], "rank %d, %s: differs from overlap=False" % (rank, name)
        # The new state is written before step() (its new versions, beside the old), by the
        # worker the gradients' hooks woke in backward: from the second step on (the first
        # makes the state), and not with overlap=False. (Counted once the worker is idle: how
        # much of it lands before backward returns is the scheduler's business.)
        assert all(m > 0 for m in r["plain"]["written_before_step"][1:]), r["plain"]
        assert not any(r["plain"]["written_before_step_off"]), r["plain"]
        assert r["plain"]["early_after"] and r["lr"]["early_after"], r
        assert not r["micro"]["early_after"], "accumulation: no longer steps early"
        assert not r["halve"]["early_after"], "gradients changed: no longer steps early"
        assert any("gradient changed" in w for w in r["halve"]["warnings"]), r["halve"]
        # Two elements swapped through to_local(): the sum kept, the version counter not.
        assert any("gradient changed" in w for w in r["swap"]["warnings"]), r["swap"]
        # With clipping the parts are prepared unclipped and committed only where the step
        # does not clip. Steps not clipped, clipped, clipped, not, not: the first makes the
        # state; the second's parts are dropped when it clips, so the third and fourth (after a
        # step that clipped) read ahead instead; the fourth does not clip, so the fifth is
        # prepared again.
        clip = r["clip"]
        assert clip["same"], "rank %d: clipping differs from overlap=False" % rank
        assert [m > 0 for m in clip["written_before_step"]] == [False, True, False, False,
                                                                 True], clip
        assert clip["early_after"] and not clip["warnings"], clip
        e = r["fault_error"]
        assert e is not None and e[0] == "TM_ERR_CORRUPT", e
        assert "rank 1 failed its step" in e[1], e
        assert r["fault_unchanged"], "rank %d: a parameter changed" % rank
        assert r["fault_went_on"], "rank %d: the run after the fault differs" % rank


def test_the_step_prepared_behind_backward_with_shards_on_nvme(single_node):
    """shard_tier and grad_tier with the state on NVMe: each unit's part of the step prepared
    as FSDP2 sets its gradients (none read back from NVMe), bit-identical to overlap=False, with
    clipping too; accumulation, and gradients changed in place, fall back with a warning; a
    failure of one rank's part behind backward: every rank raises it, no shard changes, and
    step() again goes on bit-identically."""
    for rank, r in results(single_node, "shards_overlap").items():
        for name, case in r.items():
            assert case["same"], "rank %d, %s: differs from overlap=False" % (rank, name)
            assert not any(case["early_off"]), "rank %d, %s: overlap=False stepped early" % (
                rank, name)
        for name in ("plain", "lr", "no_grad_tier"):
            # From the second step on (the first sends the shards down at its end): every
            # unit's part prepared behind backward.
            assert r[name]["early"][1:] == [3] * 3, (rank, name, r[name]["early"])
            assert r[name]["early_after"], (rank, name)
        # With clipping: prepared unclipped, dropped where the step clips (steps not clipped,
        # clipped, clipped, not, not), the backward after a step that clipped not prepared.
        assert r["clip"]["early"] == [0, 3, 0, 0, 3], (rank, r["clip"]["early"])
        assert r["clip"]["early_after"] and not r["clip"]["warnings"], r["clip"]
        # And again after the failed step (rank 1's worker stopped at its failure).
        assert r["fault"]["early"][3] == 3 and r["fault"]["early_after"], r["fault"]
        assert r["plain"]["grad_bytes_in"] == 0, r["plain"]  # read by the step in backward
        assert not r["micro"]["early_after"], "accumulation: no longer steps early"
        assert any("set twice" in m for m in r["micro"]["warnings"]), r["micro"]
        assert not r["halve"]["early_after"], "gradients changed: no longer steps early"
        assert any("gradient changed" in m for m in r["halve"]["warnings"]), r["halve"]
        e = r["fault"]["error"]
        assert e is not None and e[0] == "TM_ERR_IO", e
        assert "rank 1 failed its step" in e[1] and "injected" in e[1], e
        assert r["fault"]["unchanged"], "rank %d: a shard changed in the failed step" % rank
        # Every gradient read after backward raises on every rank, as with overlap=False (the
        # worker had sent them all down before backward returned), clip_grad_norm_ too, naming
        # max_grad_norm, and the run goes on with the bits of one that never tried.
        reads = r["reads"]
        assert reads["read_raised"] == reads["grads"] > 0, reads
        assert "max_grad_norm" in reads["clip"], reads["clip"]
        # The fallback's warning points at the user's step() call, not into torch.
        assert r["micro"]["warned_in"] == ["fsdp_shard_cases.py"], r["micro"]["warned_in"]
    errors = [r["fault"]["error"] for r in results(single_node, "shards_overlap").values()]
    assert errors[0] == errors[1], errors


def test_hsdp_follows_adamw(tmp_path_factory):
    """HSDP, 4 ranks as 2 replicas of 2 shards: FSDPCPUAdam with clipping (the norm summed
    within a replica only) follows fully_shard + AdamW + clip_grad_norm_ on the same 2-D mesh;
    the replicas hold the same shards; the state on NVMe below the DRAM budget is bit-identical
    to DRAM; a DCP checkpoint resumes bit-identically."""
    out = tmp_path_factory.mktemp("hsdp")
    finish(torchrun(out, "hsdp", nproc=4))
    files = sorted(glob.glob(os.path.join(str(out), "hsdp.rank*.json")))
    assert len(files) == 4, files
    meshes = set()
    for f in files:
        with open(f) as fh:
            r = json.load(fh)
        what = os.path.basename(f)
        assert_follows(r, what)
        assert r["replicas_equal"], what
        assert r["nvme_vs_dram"], what
        assert r["resumed"], what
        meshes.add(tuple(r["mesh"]))
    assert meshes == {(0, 0), (0, 1), (1, 0), (1, 1)}


def test_any_dram_budget_trains_bit_identically(single_node):
    """State on NVMe, the DRAM budget from above the state down to a DRAM tier smaller than the
    largest tensor's state: every run has the bits of the state held in DRAM."""
    for rank, runs in results(single_node, "tight").items():
        assert runs[0]["tier"] > runs[0]["state"], "the sweep starts above the state"
        assert runs[-1]["tier"] < runs[-1]["largest"], "and ends below the largest tensor's"
        for r in runs:
            assert r["bit_identical"], "rank %d at a DRAM budget of %d bytes" % (
                rank, r["dram_bytes"])


def test_dcp_resume_in_a_new_process_at_the_training_budget(single_node):
    """Trained below the state's size in DRAM, saved through DCP mid-run; a new torchrun loads
    it at the same budget and goes on: the bits of the run that went on."""
    for rank, r in results(single_node, "resume_save").items():
        assert r["dram_bytes"] < r["state_bytes"], r
    finish(torchrun(single_node, "resume_load"))
    for rank, r in results(single_node, "resume_load").items():
        assert r["steps"] == 4
        assert r["loaded_on_nvme"], "rank %d: the load left state only in DRAM" % rank
        assert r["bit_identical"], "rank %d: the resumed run differs" % rank


def test_dcp_round_trip(single_node):
    for rank, r in results(single_node, "dcp").items():
        assert r["resumed"]["bit_identical"], "rank %d: the resumed run differs" % rank
        assert r["resumed"]["steps"] == 10
        for way in ("from_adamw", "into_adamw"):  # 10 steps on from the checkpoint
            assert_follows(r[way], "rank %d, %s" % (rank, way), steps=10)
        assert r["entries"] > 0 and r["same_layout"], "rank %d: layouts differ" % rank
        assert r["group_keys_ours"] == r["group_keys_theirs"]


def test_refusals_name_what_is_refused(single_node):
    want = {
        "fsdp1": ["FullyShardedDataParallel (FSDP1)", "module '0'"],
        "cpu_offload_policy": ["CPUOffloadPolicy"],
        "tensor_parallel": ["2-D mesh", "tensor parallelism", "'head.weight'", "HSDP"],
        "ignored_params": ["'head.bias'", "ignored_params"],
        "not_sharded": ["not sharded by torch.distributed.fsdp.fully_shard"],
        "shard_tier_without_runtime": ["shard_tier needs a runtime="],
        "grad_tier_without_shard_tier": ["grad_tier=", "needs a shard_tier"],
        # A ValueError too (it was tm_adam_create's TiermemError); the tiers in any case.
        "threads_negative": ["threads=-1; want 0"],
        "state_tier_tape": ["state_tier='tape'; want \"dram\" or \"nvme\""],
    }
    for rank, got in results(single_node, "refusals").items():
        assert got.pop("state_tier_upper") == "accepted", rank
        assert sorted(got) == sorted(want)
        for case, words in want.items():
            assert got[case].startswith("ValueError: FSDPCPUAdam: "), (case, got[case])
            for w in words:
                assert w in got[case], (case, got[case])


def test_hook_points_for_a_shard_offload(single_node):
    """Not tiermem's behaviour but torch's, which a shard offload would rely on (docs/pytorch.md,
    FSDP2, "Parameter shards in tiermem"): fails when a torch changes it."""
    for rank, r in results(single_node, "hooks").items():
        log = [tuple(e) for e in r["log"]]
        blocks = sorted({e[1] for e in log})
        assert blocks == [0, 1], log
        for i in blocks:
            assert ("pre_prepend", i, False) in log, "rank %d: before FSDP2's unshard" % rank
            assert ("pre_append", i, True) in log, "rank %d: after FSDP2's unshard" % rank
            # Before this block's pre-backward unshard and the prefetch of the one before it.
            assert ("output_grad", i, False, False) in log, (rank, log)
            assert ("input_grad", i, True) in log, "rank %d: the sharded gradients set" % rank
        assert r["swap"]["bit_identical"], "rank %d: shards freed between steps differ" % rank


def test_two_nodes_split_their_own_budgets(single_node, tmp_path):
    # Two launches at most, each on a fresh port: one run in about ten of the two-node job
    # under a loaded ctest -j2 has ended with a rank's "terminate called without an active
    # exception" (SIGABRT) seconds after the rendezvous, before any result was written; the
    # cause is not known yet (not reproduced alone, nor with an unresolvable hostname). The
    # first attempt's output is printed, so a retry is seen, not hidden.
    for attempt in range(2):
        port = free_port()
        nodes = [torchrun(tmp_path, "budget,nvme", nnodes=2, node_rank=i, nproc=1, port=port)
                 for i in range(2)]
        try:
            for n in nodes:
                finish(n)
            break
        except AssertionError as e:
            for n in nodes:
                if n.poll() is None:
                    n.kill()
                n.communicate()
            if attempt == 1:
                raise
            print("two-node attempt 1 failed, launching again:\n%s" % str(e)[-3000:],
                  file=sys.stderr)
    budget = results(tmp_path, "budget")
    assert sorted((r["node"], r["local_rank"], r["local_world_size"])
                  for r in budget.values()) == [(0, 0, 1), (1, 0, 1)]
    # One rank on each node gets the node's whole 1%; two ranks on one node get half each.
    two_on_one = results(single_node, "budget")
    assert [r["local_world_size"] for r in two_on_one.values()] == [2, 2]
    for r in two_on_one.values():
        assert abs(2 * r["dram"] - budget[0]["dram"]) <= 4 << 20, (r, budget[0])
    for rank, r in results(tmp_path, "nvme").items():
        assert_follows(r, "rank %d of two nodes" % rank)


def assert_shards_held(r, what, tier):
    """The shards' storage empty between steps, tiermem's copy in `tier`, and moved."""
    assert r["released"], "%s: a shard stayed in torch memory between steps" % what
    # Per unit, per step: tiermem's copy in `tier` (NVMe shards may keep a clean copy in DRAM
    # beside: inclusive DRAM).
    assert len(r["tiers"]) == r["units"] and all(
        t in ([tier], ["dram", tier]) for unit in r["tiers"] for t in unit), (
        "%s: tiermem holds the units in %s" % (what, r["tiers"]))
    assert r["units"] == 3  # the root's own parameters and the two blocks
    # Each step brings every unit in for the forward, and writes it down after the step. The
    # step reads the shards too where they are their own masters (state in DRAM, fp32 on the
    # CPU); with the state on NVMe its masters give the new shards, which are not read.
    reads = 2 if tier == "dram" else 1
    assert r["bytes_in"] >= 19 * reads * r["shard_bytes"], r
    assert r["bytes_in"] < 19 * (reads + 1) * r["shard_bytes"], r
    assert r["bytes_out"] >= 19 * r["shard_bytes"], r
    # One unit at a time in forward and in the step; a block and the one FSDP2 prefetches in
    # backward.
    assert 1 <= r["peak_units"] <= 2, "%s: %d units in at once" % (what, r["peak_units"])
    # grad_tier: after each backward from the second on, every gradient shard in tiermem (on
    # NVMe, or still on its way there from DRAM), brought in for the step.
    assert r["grads_released"], "%s: a gradient stayed in torch memory after backward" % what
    assert all(t and set(t) <= {tier, "dram"} for unit in r["grad_tiers"] for t in unit), \
        r["grad_tiers"]
    assert r["grad_bytes_out"] >= 19 * r["shard_bytes"], r
    if r["early"]:  # the step prepared behind backward read them before they went down
        assert r["grad_bytes_in"] == 0, r
    else:
        assert r["grad_bytes_in"] >= 19 * r["shard_bytes"], r


def test_shards_and_grads_on_nvme_give_the_bits_of_the_plain_run(single_node):
    for rank, r in results(single_node, "shards_nvme").items():
        what = "rank %d" % rank
        assert r["vs_plain"]["bit_identical"], "%s: shards held in tiermem differ" % what
        assert_follows(r, what)
        assert r["early"], "%s: the step was not prepared behind backward" % what
        assert_shards_held(r, what, "nvme")
        assert r["dram_bytes"] < r["state_bytes"]
        assert r["stats"]["nvme"]["dram"] > 19 * r["shard_bytes"], r["stats"]


def test_llama_shards_and_grads_in_dram_with_clipping(single_node):
    for rank, r in results(single_node, "shards_llama").items():
        if "skipped" in r:
            pytest.skip(r["skipped"])
        what = "rank %d" % rank
        assert r["vs_plain"]["bit_identical"], "%s: shards held in tiermem differ" % what
        assert_follows(r, what)
        assert_shards_held(r, what, "dram")


def test_shards_dcp_round_trip(single_node):
    for rank, r in results(single_node, "shards_dcp").items():
        assert r["offloaded"] and r["released"], r
        assert r["resumed"]["bit_identical"], "rank %d: the resumed run differs" % rank
        assert r["went_on_vs_plain"]["bit_identical"], "rank %d: differs from plain" % rank


def test_gradient_accumulation_with_grads_in_tiermem(single_node):
    for rank, r in results(single_node, "shards_accumulate").items():
        assert r["vs_plain"]["bit_identical"], "rank %d: accumulated gradients differ" % rank
        assert r["grads_held_between_backwards"] == [True] * 5, r


def test_explicit_prefetch_lists_are_honoured(single_node):
    for rank, r in results(single_node, "shards_prefetch").items():
        assert r["vs_plain"]["bit_identical"], "rank %d: differs under explicit prefetch" % rank
        assert 1 <= r["peak_units"] <= 2, r


# The reads of test_reads_between_uses_raise_and_the_run_goes_on, each made on both ranks at step
# 3 (the first four between backward and step, the rest between steps): the text its error names
# besides the parameter and "shards_in()". Without the guard each reads an empty storage: SIGSEGV.
GUARDED_READS = {
    "clip_grad_norm_": ("the gradient of parameter 'tok.weight'", "grad_tier='nvme'",
                        "max_grad_norm=", "clip_grad_norm_"),
    "grad_to_local_sum": ("the gradient of parameter 'layers.0.linear1.weight'",),
    "full_tensor": ("parameter 'layers.0.linear1.weight'", "shard_tier='nvme'"),
    "to_local_sum": ("parameter 'layers.0.linear1.weight'", "shard_tier='nvme'"),
    "dtensor_add": ("parameter 'layers.0.linear1.weight'",),
    "detach_sum": ("parameter 'layers.0.linear1.weight'",),
    "module_to": ("to on parameter 'tok.weight'", "shard_tier='nvme'"),
}


def test_reads_between_uses_raise_and_the_run_goes_on(single_node):
    for rank, r in results(single_node, "shards_guard").items():
        what = "rank %d" % rank
        assert sorted(r["errors"]) == sorted(GUARDED_READS), r["errors"]
        for read, names in GUARDED_READS.items():
            error = r["errors"][read]
            assert error.startswith("RuntimeError: tiermem: "), "%s: %s: %s" % (what, read, error)
            for name in names + ("with opt.shards_in():",):
                assert name in error, "%s: %s: %r not in %s" % (what, read, name, error)
        assert r["shape"] == [128, 64, 64 * 64], r["shape"]  # metadata reads: shape, numel
        assert r["exact_in_shards_in"], "%s: shards_in() read other values than plain" % what
        assert r["vs_plain"]["bit_identical"], "%s: the run differs after the reads" % what


def test_hostile_pass_follows_plain(single_node):
    """hidden 33, parameters only in the root unit, zero_grad(set_to_none=False), step() twice
    without backward, close() twice: plain FSDPCPUAdam's bits, the model readable after; and
    load_state_dict(assign=True) between steps: clear errors, readable after close()."""
    for rank, r in results(single_node, "shards_hostile").items():
        assign = r.pop("assign")  # load_state_dict(assign=True): read raises, step refuses
        assert assign["read"].startswith("RuntimeError: tiermem: sum on parameter "), assign
        assert assign["step"].startswith("ValueError: FSDPCPUAdam: parameters ["), assign
        assert "assign=True" in assign["step"], assign
        assert assign["after_close"] == "returned", assign
        assert sorted(r) == ["odd", "root_holds_most", "step_twice", "zero_grad_keep"], r
        for name, got in r.items():
            assert got.get("bit_identical"), "rank %d: %s: %s" % (rank, name, got)
            assert got["after_close_equal"], "rank %d: %s: %s" % (rank, name, got)


def test_runtime_closed_first_brings_shards_and_state_home(single_node):
    """The runtime's close() (an exception inside its `with` block, after a backward) before the
    optimizer's: shards, gradient shards and state come home, the model reads as before without
    shards_in(), and training goes on with the bits of plain FSDPCPUAdam (it lost the weights and
    the next forward crashed both ranks)."""
    for rank, r in results(single_node, "shards_rt_close").items():
        what = "rank %d" % rank
        assert r["grads_held"], "%s: the gradients were not in tiermem when it closed" % what
        assert r["closed"] and r["shard_offload_off"], r
        assert r["reads_as_before"], "%s: the shards read otherwise after the close" % what
        assert r["vs_plain"]["bit_identical"], "%s: %s" % (what, r["vs_plain"])
        assert r["step_after_close"].startswith("TiermemError: TM_ERR_INVALID_HANDLE: "
                                                "FSDPCPUAdam.step: the optimizer was closed"), r
        depth = r["depth"]
        for bad in ("'x'", "2.5", "None", "True"):
            assert depth[bad].startswith("TypeError: FSDPCPUAdam: shard_prefetch_depth="), depth
        assert depth["-1"].startswith("ValueError: FSDPCPUAdam: shard_prefetch_depth=-1"), depth
        forced = r["forced"]
        if forced["flipped"]:  # (the swap files reached through /proc/self/fd)
            assert "FSDPCPUAdam" in forced["warned"] and "tensors lost" in forced["warned"], forced
            assert math.isnan(forced["loss_after"]), forced
            assert forced["loaded_as_before"], forced
            assert "went with the runtime" in forced["step_after"], forced
