"""Hostile probe of the Python package: bad settings, odd saved tensors, exceptions, nesting,
closing the runtime with tensors saved, optimizer offload with frozen params."""
import gc, os, sys, tempfile, traceback
import torch
import tiermem
import tiermem.torch as tt

fails = []
def check(cond, what):
    if not cond:
        fails.append(what); print("FAIL", what)

def expect_raise(fn, types, what):
    try:
        fn()
    except types as e:
        print("ok  ", what, "->", type(e).__name__, str(e)[:160])
        return
    except Exception as e:
        check(False, "%s raised %s: %s" % (what, type(e).__name__, e)); return
    check(False, what + " did not raise")

d = tempfile.mkdtemp(dir="/var/tmp")
base = dict(device="emulated", hbm_bytes="8MiB", dram_bytes="16MiB", nvme_bytes="64MiB", nvme_paths=d)
for bad in [dict(dram_bytes=-1), dict(dram_bytes="lots"), dict(dram_bytes=1.5), dict(nvme_paths=["relative"]),
            dict(io_block_size=3), dict(device="gpu"), dict(placement="all"), dict(local_rank=-7),
            dict(local_rank=2, local_world_size=2), dict(hbm_bytes=2**64), dict(hbm_bytes="50%"),
            dict(bogus=1), dict(nvme_paths=[d, 5]), dict(trace="/nonexistent/x.json"), dict(prefetch_depth=-3),
            dict(dram_bytes=True), dict(numa_node="x")]:
    kw = dict(base); kw.update(bad)
    def mk(kw=kw):
        r = tiermem.Runtime(**kw)
        r.close()
    expect_raise(mk, (TypeError, ValueError, tiermem.TiermemError), "Runtime(%r)" % bad)

rt = tiermem.Runtime(**base)
def count():
    return rt.stats()["tensors"]
n0 = count()

# Odd saved tensors.
def fwd(x, w):
    return ((x @ w).relu() * 2).sum()
cases = {
  "zero-size": lambda: (torch.zeros(0, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)),
  "noncontig": lambda: (torch.randn(64, 128, requires_grad=True)[:, ::3], torch.randn(43, 64, requires_grad=True)),
  "view-of-requires-grad": lambda: (torch.randn(128, 128, requires_grad=True)[10:70], torch.randn(128, 32, requires_grad=True)),
  "expanded": lambda: (torch.randn(1, 128).expand(256, 128).requires_grad_(), torch.randn(128, 64, requires_grad=True)),
  "double": lambda: (torch.randn(64, 64, dtype=torch.float64, requires_grad=True), torch.randn(64, 64, dtype=torch.float64, requires_grad=True)),
}
for name, mkx in cases.items():
    torch.manual_seed(0)
    x, w = mkx()
    ref_loss = fwd(x, w); ref_loss.backward()
    gx = None if x.grad is None else x.grad.clone(); gw = w.grad.clone()
    x.grad = None; w.grad = None
    try:
        with rt.step():
            ctx = tt.offload_saved_tensors(rt, tier="nvme", min_bytes=1)
            with ctx:
                loss = fwd(x, w)
            loss.backward()
        check(torch.equal(loss, ref_loss), name + " loss")
        check(torch.equal(w.grad, gw), name + " grad w")
        if gx is not None and x.is_leaf:
            check(torch.equal(x.grad, gx), name + " grad x")
        print("ok  ", name, "packed", ctx.packed, "skipped", ctx.skipped)
    except Exception as e:
        traceback.print_exc(); check(False, "%s: %s" % (name, e))
gc.collect()
check(count() == n0, "tensors left after odd cases: %d" % (count() - n0))

# Sparse saved tensor.
try:
    i = torch.tensor([[0, 1, 2], [2, 0, 1]]); v = torch.randn(3, requires_grad=True)
    s = torch.sparse_coo_tensor(i, v, (3, 3))
    dense = torch.randn(3, 3, requires_grad=True)
    with tt.offload_saved_tensors(rt, min_bytes=1):
        out = torch.sparse.mm(s, dense).sum()
    out.backward()
    print("ok   sparse")
except Exception as e:
    traceback.print_exc(); check(False, "sparse: %s" % e)

# Huge tensor that does not fit DRAM (16 MiB) nor... 32 MiB float: fits NVMe (64 MiB).
try:
    x = torch.randn(8 << 20, requires_grad=True)
    ctx = tt.offload_saved_tensors(rt, tier="dram", min_bytes=1)
    with ctx:
        y = (x * x).sum()
    y.backward()
    check(torch.allclose(x.grad, 2 * x), "huge grad")
    print("ok   huge: packed", ctx.packed, "error", ctx.error)
except tiermem.TiermemError as e:
    print("ok   huge -> TiermemError", e.status_name, e.message[:150])
    y.backward() if 'y' in dir() else None
except Exception as e:
    traceback.print_exc(); check(False, "huge: %s" % e)
gc.collect()

# Exception inside the context: the graph is dropped; tensors destroyed.
class Boom(Exception): pass
try:
    with rt.step():
        with tt.offload_saved_tensors(rt, min_bytes=1):
            a = torch.randn(256, 256, requires_grad=True)
            b = (a @ a).relu().sum()
            raise Boom()
except Boom:
    pass
del a, b
gc.collect()
check(count() == n0, "tensors left after exception: %d" % (count() - n0))

# Nested contexts.
try:
    a = torch.randn(128, 128, requires_grad=True)
    c1 = tt.offload_saved_tensors(rt, tier="dram", min_bytes=1)
    with c1:
        h = (a @ a).relu()
        c2 = tt.offload_saved_tensors(rt, tier="nvme", min_bytes=1)
        with c2:
            h = (h @ a).tanh()
        h = (h * h).sum()
    h.backward()
    ref = a.detach().clone().requires_grad_()
    r = (((ref @ ref).relu() @ ref).tanh() ** 2).sum(); r.backward()
    check(torch.allclose(a.grad, ref.grad), "nested grads")
    print("ok   nested", c1.packed, c2.packed)
except Exception as e:
    traceback.print_exc(); check(False, "nested: %s" % e)
del a, h
gc.collect()
check(count() == n0, "tensors left after nested: %d" % (count() - n0))

# Optimizer offload with frozen params, SGD momentum and Adam.
for opt_name in ["sgd", "adam"]:
    torch.manual_seed(1)
    m1 = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    m2 = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    m2.load_state_dict(m1.state_dict())
    for m in (m1, m2):
        m[0].weight.requires_grad_(False)
    mk = (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)) if opt_name == "sgd" else (lambda p: torch.optim.Adam(p, lr=1e-2))
    o1 = mk([p for p in m1.parameters()]); o2 = mk([p for p in m2.parameters()])
    try:
        st = tt.offload_optimizer_state(o2, rt, tier="nvme", min_bytes=1)
        for i in range(3):
            x = torch.randn(16, 64)
            for m, o in ((m1, o1), (m2, o2)):
                o.zero_grad(); m(x).square().sum().backward(); o.step()
        same = all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))
        check(same, opt_name + ": params differ with state offload")
        sd = o2.state_dict()
        st.remove()
        print("ok  ", opt_name, "same", same)
    except Exception as e:
        traceback.print_exc(); check(False, "%s: %s" % (opt_name, e))
gc.collect()
check(count() == n0, "tensors left after optimizers: %d" % (count() - n0))

# Close the runtime while tensors are still saved, then run backward.
rt2 = tiermem.Runtime(**base)
a = torch.randn(256, 256, requires_grad=True)
with tt.offload_saved_tensors(rt2, min_bytes=1):
    b = (a @ a).relu().sum()
rt2.close()
try:
    b.backward()
    check(False, "backward after close did not raise")
except (tiermem.TiermemError, RuntimeError) as e:
    print("ok   backward after close ->", type(e).__name__, str(e)[:200])
except Exception as e:
    check(False, "backward after close: %s %s" % (type(e).__name__, e))
del b
gc.collect()
rt2.close()  # twice
rt.close()
print("py_probe: %d failures" % len(fails))
sys.exit(1 if fails else 0)
