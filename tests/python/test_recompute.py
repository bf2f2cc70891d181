"""Tensor.set_recompute (tm_tensor_set_recompute) through the ctypes package: a tensor cheaper to
rebuild than to write down is dropped under pressure and rebuilt bit-exact by its next read; the
callback stays alive with the tensor; an exception in it is a TiermemError raised from it, with
nothing served; clearing rebuilds first; bad costs are refused."""

import ctypes
import gc
import math

import pytest

import tiermem

MIB = 1 << 20


def pattern(seed, n=MIB):
    return bytes((seed * 131 + i * 7) & 0xFF for i in range(n))


@pytest.fixture
def runtime(make_runtime, monkeypatch):
    # 1 GB/s: 1 MiB down and back up is 2.1 ms; a rebuild priced at 1 us is cheaper.
    monkeypatch.setenv("TIERMEM_LINK_GBPS", "1")
    return make_runtime(hbm_bytes="3MiB", dram_bytes="8MiB", prefetch_depth=0)


def fill_hbm(rt, count=3, seed=100):
    out = []
    for i in range(count):
        t = rt.tensor(MIB, name="filler%d" % i, home="hbm")
        t.write(pattern(seed + i))
        out.append(t)
    return out


def rebuilder(seed, calls):
    data = pattern(seed)

    def rebuild(tier, address, nbytes, stream):
        calls.append((tier, nbytes, stream))
        ctypes.memmove(address, data, nbytes)  # the emulated device's HBM is host memory

    return rebuild


def test_dropped_then_rebuilt_bit_exact(runtime):
    calls = []
    a = runtime.tensor(MIB, name="act", home="hbm")
    a.write(pattern(7))
    a.set_recompute(rebuilder(7, calls), cost_seconds=1e-6)
    gc.collect()  # the ctypes callback must outlive any collection while the tensor lives
    fill_hbm(runtime)
    assert a.residency() == set()
    s = runtime.stats()
    assert s["recompute_drops"] == 1 and s["recompute_drop_bytes"] == MIB
    assert s["bytes_moved"]["hbm"]["dram"] == 0
    assert calls == []
    assert a.read() == pattern(7)
    assert calls == [("dram", MIB, None)]
    s = runtime.stats()
    assert s["recomputes"] == 1 and s["recompute_failures"] == 0 and s["recompute_ns"] > 0


def test_costly_recompute_is_written_down(runtime):
    calls = []
    a = runtime.tensor(MIB, name="act", home="hbm")
    a.write(pattern(3))
    a.set_recompute(rebuilder(3, calls), cost_seconds=10.0)
    fill_hbm(runtime)
    assert a.residency() == {"dram"}
    assert runtime.stats()["recompute_drops"] == 0
    assert a.read() == pattern(3) and calls == []


def test_exception_in_the_callback_raises_from_it_and_serves_nothing(runtime):
    a = runtime.tensor(MIB, name="act-failing", home="hbm")
    a.write(pattern(9))

    def broken(tier, address, nbytes, stream):
        ctypes.memset(address, 0xAB, nbytes // 2)
        raise ValueError("the layer's input is gone")

    a.set_recompute(broken, cost_seconds=1e-6)
    fill_hbm(runtime)
    with pytest.raises(tiermem.TiermemError) as err:
        a.acquire("hbm")
    assert "recompute callback" in str(err.value) and "act-failing" in str(err.value)
    assert isinstance(err.value.__cause__, ValueError)
    assert a.residency() == set()
    assert runtime.stats()["recompute_failures"] == 1
    a.set_recompute(rebuilder(9, []), cost_seconds=1e-6)
    assert a.read() == pattern(9)


def test_clearing_rebuilds_and_destroying_a_dropped_tensor(runtime):
    calls = []
    a = runtime.tensor(MIB, name="act", home="hbm")
    a.write(pattern(21))
    a.set_recompute(rebuilder(21, calls), cost_seconds=1e-6)
    fill_hbm(runtime)
    assert a.residency() == set()
    a.set_recompute(None)
    assert len(calls) == 1 and a.residency() != set()
    assert a.read() == pattern(21)

    b = runtime.tensor(MIB, name="act-b", home="hbm")
    b.write(pattern(22))
    b.set_recompute(rebuilder(22, calls), cost_seconds=1e-6)
    fill_hbm(runtime, seed=200)
    assert b.residency() == set()
    b.destroy()
    assert len(calls) == 1


@pytest.mark.parametrize("cost", [-1.0, math.nan, math.inf])
def test_bad_costs_are_refused(runtime, cost):
    a = runtime.tensor(MIB, name="act", home="hbm")
    with pytest.raises(tiermem.TiermemError) as err:
        a.set_recompute(lambda *args: None, cost_seconds=cost)
    assert err.value.status_name == "TM_ERR_INVALID_ARGUMENT"
    assert "cost_seconds" in err.value.message
    with pytest.raises(tiermem.TiermemError):
        a.set_recompute(None, cost_seconds=1.0)
    with pytest.raises(TypeError):
        a.set_recompute(42, cost_seconds=1.0)
