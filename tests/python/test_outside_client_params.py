"""offload_parameters and offload_optimizer_state as an outside tester used them: models loaded
the usual ways (torch.load + load_state_dict(assign=True), mmap'd or not; transformers'
from_pretrained), whose storages cannot be resized, train bit-identically offloaded; an optimizer
state checkpoint from torch.load loads into an offloaded optimizer, and a load that fails leaves
it offloaded and stepping; torch.compile (aot_eager) trains an offloaded model bit-identically,
in either order; a second offload_parameters of the same parameters, a closed runtime and
arguments of the wrong type are refused with errors that name what to do."""

import copy

import pytest
import torch
import torch.nn.functional as F

import tiermem
import tiermem.torch as tt
from tiermem.torch.params import parameters
from tiermem.torch._shared.offloaded import _Offloaded
from tiermem.torch._shared.step_driver import _StepDriver

VOCAB, HIDDEN, SEQ = 64, 16, 8


class TinyLM(torch.nn.Module):
    """Embedding, two blocks (the units), a head tied to the embedding."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, HIDDEN)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(HIDDEN, 2 * HIDDEN), torch.nn.GELU(),
                                torch.nn.Linear(2 * HIDDEN, HIDDEN)) for _ in range(2))
        self.head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
        self.tie()

    def tie(self):
        self.head.weight = self.emb.weight

    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


def batches(steps=3):
    g = torch.Generator().manual_seed(5)
    return [(torch.randint(VOCAB, (4, SEQ), generator=g),
             torch.randint(VOCAB, (4, SEQ), generator=g)) for _ in range(steps)]


def train(model, opt, step_with=None, rt=None, steps=3, call=None):
    """Losses of `steps` AdamW steps (step_with: the handle whose step() steps), and the
    parameters after."""
    torch.use_deterministic_algorithms(True)
    step_with = opt if step_with is None else step_with
    call = model if call is None else call
    losses = []
    for x, y in batches(steps):
        if rt is not None:
            with rt.step():
                loss = F.cross_entropy(call(x).flatten(0, 1), y.flatten())
                loss.backward()
        else:
            loss = F.cross_entropy(call(x).flatten(0, 1), y.flatten())
            loss.backward()
        step_with.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def resizable(t):
    return t.untyped_storage().resizable()


# --- 1. parameters on storages that cannot be resized ---------------------------------------
@pytest.mark.parametrize("mmap", [False, True], ids=["torch.load", "torch.load-mmap"])
@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_params_loaded_with_assign(make_runtime, tmp_path, mmap, tier):
    torch.manual_seed(0)
    src = TinyLM()
    path = tmp_path / "model.pt"
    torch.save(src.state_dict(), path)
    ref = copy.deepcopy(src)
    ref_losses = train(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2))

    with torch.device("meta"):
        model = TinyLM()
    loaded = torch.load(path, mmap=mmap, weights_only=True)
    model.load_state_dict(loaded, assign=True)
    model.tie()
    assert not any(resizable(p) for p in model.parameters())  # what torch.load gives
    weight = model.blocks[0][0].weight
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rt = make_runtime(hbm_bytes="64KiB", dram_bytes="1MiB")
    handle = tt.offload_parameters(model, rt, tier=tier, optimizer=opt)
    assert len(handle.records) == len(list(model.parameters()))  # every one offloaded
    assert model.blocks[0][0].weight is weight  # the same Parameter objects
    losses = train(model, opt, handle, rt)
    handle.remove()
    assert losses == ref_losses
    assert same(params_of(model), params_of(ref))
    assert model.head.weight is model.emb.weight
    # The loaded dict keeps its own bytes, readable and unchanged.
    assert torch.equal(loaded["blocks.0.0.weight"], src.blocks[0][0].weight)


def test_from_pretrained(make_runtime, tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
        attention_dropout=0.0, use_cache=False, tie_word_embeddings=True)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    logits = lambda m: (lambda x: m(input_ids=x).logits)
    ref = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    ref_losses = train(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2), call=logits(ref))

    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    assert not all(resizable(p) for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rt = make_runtime(hbm_bytes="256KiB", dram_bytes="2MiB")
    handle = tt.offload_parameters(model, rt, optimizer=opt)
    assert len(handle.records) == len(list(model.parameters()))
    losses = train(model, opt, handle, rt, call=logits(model))
    handle.remove()
    assert losses == ref_losses
    assert same(params_of(model), params_of(ref))
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_params_sharing_one_storage(make_runtime, tmp_path):
    """Two Parameter objects over the same memory stay over the same memory (left alone:
    freeing one would free the other); parameters on disjoint parts of one storage that cannot
    be resized get one each and are offloaded."""
    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8),
                                    torch.nn.Linear(8, 8))
        model[1].weight = torch.nn.Parameter(model[0].weight.data)  # one storage, two objects
        flat = torch.randn(2 * 8)  # the biases of 1 and 2: disjoint views of one buffer
        model[1].bias = torch.nn.Parameter(flat[:8])
        model[2].bias = torch.nn.Parameter(flat[8:])
        return model

    torch.save(build().state_dict(), tmp_path / "m.pt")  # torch.save keeps the sharing
    x = torch.randn(4, 8)
    for assign in (False, True):
        ref, m = build(), build()
        if assign:  # the same through torch.load: storages that cannot be resized
            for each in (ref, m):
                each.load_state_dict(torch.load(tmp_path / "m.pt", weights_only=True),
                                     assign=True)
            assert not resizable(m[1].bias)
        assert m[0].weight.data_ptr() == m[1].weight.data_ptr()
        ref_out = ref(x)
        rt = make_runtime()
        handle = tt.offload_parameters(m, rt)
        offloaded = set(handle.records)
        assert id(m[0].weight) not in offloaded and id(m[1].weight) not in offloaded
        assert (id(m[1].bias) in offloaded) == assign  # a view of a resizable buffer: alone
        assert id(m[0].bias) in offloaded
        assert m[0].weight.data_ptr() == m[1].weight.data_ptr()
        assert torch.equal(m(x), ref_out)
        handle.remove()
        assert same(params_of(m), params_of(ref))
        assert m[0].weight.data_ptr() == m[1].weight.data_ptr()


def test_failed_offload_leaves_module_whole(make_runtime, monkeypatch):
    torch.manual_seed(0)
    model = TinyLM()
    ref = copy.deepcopy(model)
    made = []
    real = parameters._ViewedParam

    def failing(*args):
        if len(made) == 2:
            raise RuntimeError("injected")
        made.append(real(*args))
        return made[-1]

    monkeypatch.setattr(parameters, "_ViewedParam", failing)
    rt = make_runtime()
    with pytest.raises(RuntimeError, match="injected"):
        tt.offload_parameters(model, rt)
    monkeypatch.undo()
    x = batches(1)[0][0]
    assert torch.equal(model(x), ref(x))  # the parameters offloaded first came back
    handle = tt.offload_parameters(model, rt)  # and it can be offloaded again
    handle.remove()


# --- 2. optimizer state checkpoints from torch.load -----------------------------------------
def _checkpoint(tmp_path):
    """A model and its AdamW after two steps, the optimizer's state_dict saved; the model at
    that point, and the reference parameters after two more plain steps."""
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train(model, opt, steps=2)
    torch.save(opt.state_dict(), tmp_path / "opt.pt")
    at_save = copy.deepcopy(model)
    train(model, opt, steps=2)
    return at_save, params_of(model)


@pytest.mark.parametrize("mmap", [False, True], ids=["torch.load", "torch.load-mmap"])
def test_optstate_loads_torch_load(make_runtime, tmp_path, mmap):
    model, ref_params = _checkpoint(tmp_path)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rt = make_runtime(dram_bytes="1MiB")
    handle = tt.offload_optimizer_state(opt, rt, min_bytes=1)
    loaded = torch.load(tmp_path / "opt.pt", mmap=mmap, weights_only=True)
    handle.load_state_dict(loaded)
    assert handle.records and all(isinstance(s.tensor, _Offloaded)
                                  for per in handle.records.values() for s in per.values())
    saved = loaded["state"][0]["exp_avg"]
    assert not isinstance(saved, _Offloaded) and torch.isfinite(saved).all()
    train(model, opt, handle, rt, steps=2)
    handle.remove()
    assert same(params_of(model), ref_params)


def test_optstate_failed_load_keeps_it_offloaded(make_runtime, tmp_path):
    model, ref_params = _checkpoint(tmp_path)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt.load_state_dict(torch.load(tmp_path / "opt.pt", weights_only=True))
    rt = make_runtime(dram_bytes="1MiB")
    handle = tt.offload_optimizer_state(opt, rt, min_bytes=1)
    held = {k: dict(v) for k, v in handle.records.items()}
    bad = handle.state_dict()
    bad["param_groups"] = bad["param_groups"] * 2  # torch refuses it after our pre-hook
    with pytest.raises(ValueError):
        handle.load_state_dict(bad)
    # Still offloaded, the same state (none lost), and the steps go on as before.
    assert {k: set(v) for k, v in handle.records.items()} == {k: set(v) for k, v in held.items()}
    assert all(isinstance(s.tensor, _Offloaded)
               for per in handle.records.values() for s in per.values())
    train(model, opt, handle, rt, steps=2)
    handle.remove()
    assert same(params_of(model), ref_params)


# --- 3. torch.compile ------------------------------------------------------------------------
@pytest.mark.parametrize("order", ["offload-then-compile", "compile-then-offload"])
def test_compile_aot_eager(make_runtime, order):
    torch._dynamo.reset()
    torch.manual_seed(0)
    base = TinyLM()
    ref = copy.deepcopy(base)
    ref_losses = train(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2),
                       call=torch.compile(ref, backend="aot_eager"))
    torch._dynamo.reset()
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rt = make_runtime(hbm_bytes="64KiB", dram_bytes="1MiB")
    if order == "offload-then-compile":
        handle = tt.offload_parameters(model, rt, optimizer=opt)
        compiled = torch.compile(model, backend="aot_eager")
    else:
        compiled = torch.compile(model, backend="aot_eager")
        handle = tt.offload_parameters(compiled, rt, optimizer=opt, units=list(model.blocks))
        with pytest.raises(ValueError, match="offloaded already"):
            tt.offload_parameters(model, rt)  # the module under the compiled one: the same
    losses = train(model, opt, handle, rt, call=compiled)
    handle.remove()
    torch._dynamo.reset()
    assert losses == ref_losses
    assert same(params_of(model), params_of(ref))


@pytest.mark.parametrize("offloads", ["state", "params", "state+params"])
def test_a_compiled_optimizer_step(make_runtime, offloads):
    """opt.step() called from a torch.compile'd function: tiermem's step hooks run eagerly
    (dynamo traced into them and failed on the offloaded tensors, an outside client found), and
    the training is bit-identical to the plain one compiled the same way."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    base = TinyLM()

    def run(model, rt=None):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
        if rt is not None and "state" in offloads:
            tt.offload_optimizer_state(opt, rt, min_bytes=1)
        handle = None
        if rt is not None and "params" in offloads:
            handle = tt.offload_parameters(model, rt, optimizer=opt)

        @torch.compile(backend="aot_eager")
        def step():
            opt.step()

        class Stepper:
            def step(self):
                step()

        losses = train(model, opt, Stepper(), rt)
        if handle is not None:
            handle.remove()
        torch._dynamo.reset()
        if rt is None:
            return losses, 0
        s = rt.stats()
        return losses, s["copied_in_bytes"] + sum(v for r in s["bytes_moved"].values()
                                                  for v in r.values())

    ref = copy.deepcopy(base)
    ref_losses, _ = run(ref)
    model = copy.deepcopy(base)
    losses, moved = run(model, make_runtime(hbm_bytes="64KiB", dram_bytes="1MiB"))
    assert losses == ref_losses
    assert same(params_of(model), params_of(ref))
    assert moved > 0, "nothing was offloaded"


# --- 4. a second offload_parameters ----------------------------------------------------------
def test_second_offload_refused(make_runtime):
    torch.manual_seed(0)
    model = TinyLM()
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rt = make_runtime()
    handle = tt.offload_parameters(model, rt, optimizer=opt)
    with pytest.raises(ValueError, match="offloaded already"):
        tt.offload_parameters(model, rt, optimizer=opt)
    with pytest.raises(ValueError, match="offloaded already"):
        tt.offload_parameters(model.blocks[0], rt)  # a part of it
    other = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match="optimizer steps parameters offloaded already"):
        tt.offload_parameters(other, rt, optimizer=opt)
    # The first offload still works, untouched by the refusals.
    losses = train(model, opt, handle, rt)
    assert losses == train(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2))
    handle.remove()
    assert same(params_of(model), params_of(ref))
    tt.offload_parameters(model, rt, optimizer=opt).remove()  # after remove(): again


# --- 5. a closed runtime ---------------------------------------------------------------------
def test_optstate_closed_runtime_refused():
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rt = tiermem.Runtime(device="emulated", hbm_bytes="1MiB", dram_bytes="1MiB",
                         log_level="error")
    rt.close()
    with pytest.raises(tiermem.TiermemError, match="closed"):
        tt.offload_optimizer_state(opt, rt)
    assert _StepDriver._existing(opt) is None  # no hooks left on it
    model(torch.randn(2, 64)).sum().backward()
    opt.step()  # the optimizer's own, untouched


def test_step_checks_the_runtime_first(make_runtime):
    """A step whose runtime is gone raises before it changes a parameter (no half step)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rt = make_runtime()
    handle = tt.offload_optimizer_state(opt, rt)
    model(torch.randn(2, 64)).sum().backward()
    before = params_of(model)
    closed = make_runtime()
    closed.close()
    handle.runtime = closed  # as if its runtime went without bringing the state home
    for step in (handle.step, opt.step):
        with pytest.raises(tiermem.TiermemError, match="closed"):
            step()
        assert same(params_of(model), before)
    handle.runtime = rt
    handle.step()
    handle.remove()


# --- 6. arguments of the wrong type ----------------------------------------------------------
ARGS = {
    "params-runtime": (lambda rt: tt.offload_parameters(torch.nn.Linear(4, 4), "rt"),
                       TypeError, "runtime: expected a tiermem.Runtime, got str"),
    "params-module": (lambda rt: tt.offload_parameters([1, 2], rt),
                      TypeError, "module: expected a torch.nn.Module, got list"),
    "params-units-int": (lambda rt: tt.offload_parameters(torch.nn.Linear(4, 4), rt, units=5),
                         TypeError, "units: expected None, .* got int"),
    "params-units-module": (lambda rt: tt.offload_parameters(
        torch.nn.Sequential(torch.nn.Linear(4, 4)), rt, units=torch.nn.Linear(4, 4)),
        TypeError, "units: .*give \\[module\\]"),
    "params-optimizer": (lambda rt: tt.offload_parameters(torch.nn.Linear(4, 4), rt,
                                                          optimizer="adam"),
                         TypeError, "optimizer: expected a torch.optim.Optimizer"),
    "params-bucket-bytes": (lambda rt: tt.offload_parameters(torch.nn.Linear(4, 4), rt,
                                                             bucket_bytes="x"),
                            ValueError, "bucket_bytes: 'x' is not a size"),
    "optstate-optimizer": (lambda rt: tt.offload_optimizer_state("adam", rt),
                           TypeError, "optimizer: expected a torch.optim.Optimizer, got str"),
    "optstate-runtime": (lambda rt: tt.offload_optimizer_state(
        torch.optim.AdamW(torch.nn.Linear(4, 4).parameters()), "rt"),
        TypeError, "runtime: expected a tiermem.Runtime, got str"),
    "optstate-min-bytes": (lambda rt: tt.offload_optimizer_state(
        torch.optim.AdamW(torch.nn.Linear(4, 4).parameters()), rt, min_bytes="x"),
        ValueError, "min_bytes: 'x' is not a size"),
    "optstate-min-bytes-negative": (lambda rt: tt.offload_optimizer_state(
        torch.optim.AdamW(torch.nn.Linear(4, 4).parameters()), rt, min_bytes=-1),
        ValueError, "min_bytes: -1 is negative"),
    "saved-min-bytes": (lambda rt: tt.offload_saved_tensors(rt, min_bytes="x"),
                        ValueError, "min_bytes: 'x' is not a size"),
    "saved-stash-bytes": (lambda rt: tt.offload_saved_tensors(rt, stash_bytes=[1]),
                          TypeError, "stash_bytes: expected an int or a string"),
}


def test_saved_tensor_sizes_as_strings(make_runtime):
    ctx = tt.offload_saved_tensors(make_runtime(), min_bytes="16KiB", stash_bytes="1MiB")
    assert ctx.min_bytes == 16384 and ctx.stash.max_bytes == 1 << 20


@pytest.mark.parametrize("case", list(ARGS))
def test_argument_types(make_runtime, case):
    call, error, message = ARGS[case]
    rt = make_runtime()
    with pytest.raises(error, match=message):
        call(rt)
    assert rt.stats()["tensors"] == 0


def test_sizes_as_strings(make_runtime):
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    rt = make_runtime()
    state = tt.offload_optimizer_state(opt, rt, min_bytes="4KiB", bucket_bytes="1MiB")
    assert state.min_bytes == 4096 and state._driver.bucket_bytes == 1 << 20
    params = tt.offload_parameters(model, rt, optimizer=opt, bucket_bytes="1MiB")
    params.remove()
    state.remove()


def test_units_module_list(make_runtime):
    """units=model.blocks (a ModuleList: its blocks), not taken for a callable policy."""
    torch.manual_seed(0)
    model = TinyLM()
    handle = tt.offload_parameters(model, make_runtime(), units=model.blocks)
    assert [u.module for u in handle.units[1:]] == list(model.blocks)
    handle.remove()


def test_load_with_assign_into_offloaded_module_is_refused(make_runtime):
    """assign=True would swap in Parameter objects tiermem does not hold and the optimizer does
    not step; refused before anything is loaded, and a plain load still works."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    saved = {k: v.clone() + 1 for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters())
    params = tt.offload_parameters(model, make_runtime(), optimizer=opt)
    held = list(model.parameters())
    with pytest.raises(RuntimeError, match="assign=True"):
        model.load_state_dict(saved, assign=True)
    assert all(a is b for a, b in zip(model.parameters(), held))
    model.load_state_dict(saved)
    with params.gathered():
        for k, v in model.state_dict().items():
            assert torch.equal(v, saved[k])
    params.remove()

