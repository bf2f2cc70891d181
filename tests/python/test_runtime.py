"""tiermem.Runtime and tiermem.Tensor: settings, errors, stats, steps, the library's lookup."""

import ctypes
import ctypes.util
import json
import glob
import os
import re
import subprocess
import sys

import pytest

import tiermem


def test_settings_sizes_and_info(make_runtime):
    rt = make_runtime(dram_bytes="1MiB", prefetch_depth=2, placement="zero-offload")
    info = rt.info()
    assert info["device"] == "emulated"
    assert info["tier_bytes"]["nvme"] == 64 << 20
    assert info["prefetch_depth"] == 2
    assert info["placement"] == "zero-offload"
    assert info["local_world_size"] >= 1
    assert rt.config_value("TIERMEM_PREFETCH_DEPTH") == "2"


def test_parse_size():
    assert tiermem.parse_size("64MiB") == 64 << 20
    assert tiermem.parse_size("2 G") == 2 << 30
    assert tiermem.parse_size(4096) == 4096
    for bad in ("12 parsecs", "-1", "50%", "1.5GiB", "1MB"):
        with pytest.raises(ValueError):
            tiermem.parse_size(bad)


def test_unknown_setting_is_refused():
    with pytest.raises(TypeError, match="dram_byts"):
        tiermem.Runtime(dram_byts="1MiB")
    with pytest.raises(ValueError, match="placement"):
        tiermem.Runtime(placement="everywhere")


def test_every_setting_is_a_keyword_or_named_environment_only():
    # Every tm_config field (the ABI mirror's) is a keyword; every variable of
    # docs/environment.md's table is a keyword's or one that tm_config has no field for, and
    # such a keyword is refused naming its variable, not as unknown.
    fields = {name for name, _ in tiermem._capi.Config._fields_} - {
        "struct_size", "api_version", "device_allocator_user"}
    assert fields == set(tiermem._SETTINGS)
    doc = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "environment.md")
    with open(doc) as f:
        variables = set(re.findall(r"^\| `(TIERMEM_[A-Z_]+)` \|", f.read(), re.M))
    keyword = {"TIERMEM_NUMA": "numa_node"}
    no_variable = {"device_alloc", "device_free"}  # the framework's allocator: code, not text
    by_design = {"TIERMEM_ENV_FILE", "TIERMEM_LIBRARY"}  # the file itself; the package's lookup
    env_only = set(tiermem._ENVIRONMENT_ONLY.values())
    assert variables - by_design - env_only == set(keyword) | {
        "TIERMEM_" + k.upper() for k in fields - no_variable - set(keyword.values())}
    for key, variable in tiermem._ENVIRONMENT_ONLY.items():
        assert variable in variables
        with pytest.raises(TypeError, match="%s has no tm_config field.*%s" % (key, variable)):
            tiermem.Runtime(**{key: "on"})


def test_library_error_is_a_tiermem_error(nvme_dir):
    with pytest.raises(tiermem.TiermemError) as e:
        tiermem.Runtime(device="emulated", hbm_bytes="8MiB", dram_bytes="256KiB",
                        nvme_paths=str(nvme_dir / "missing"), nvme_bytes="1MiB")
    assert e.value.status == tiermem.TM_ERR_CONFIG
    assert e.value.status_name == "TM_ERR_CONFIG"
    assert "missing" in e.value.message


@pytest.mark.parametrize("inclusive", ["on", "off"])
def test_tensor_round_trip_through_nvme(make_runtime, inclusive):
    rt = make_runtime(dram_inclusive=inclusive)
    data = bytes(range(256)) * 400
    with rt.tensor(len(data), "activation", "dram", "x") as t:
        t.write(data)
        t.offload("nvme")
        t.sync()
        # Inclusive DRAM (the default) keeps a clean copy while DRAM has room.
        assert t.residency() == ({"dram", "nvme"} if inclusive == "on" else {"nvme"})
        assert t.read() == data
        assert rt.stats()["bytes_moved"]["dram"]["nvme"] >= len(data)
        assert rt.stats()["clean_reads"] == (1 if inclusive == "on" else 0)
    assert rt.stats()["tensors"] == 0
    with pytest.raises(tiermem.TiermemError) as e:
        t.sync()
    assert e.value.status == tiermem.TM_ERR_INVALID_HANDLE


def test_tensor_copied_in(make_runtime):
    # One call makes the tensor and fills it: host memory into DRAM lands before it returns.
    rt = make_runtime()
    data = bytes(range(256)) * 64
    buf = ctypes.create_string_buffer(data, len(data))
    t, done = rt.tensor_copied_in(ctypes.addressof(buf), len(data), "activation", "dram", "x")
    assert done and t.copy_done() and t.nbytes == len(data)
    assert t.residency() == {"dram"} and t.read() == data
    assert rt.stats()["tensors"] == 1
    t.destroy()
    # A bad source leaves no tensor behind.
    with pytest.raises(tiermem.TiermemError) as e:
        rt.tensor_copied_in(None, 64, "activation", "dram", "y")
    assert e.value.status == tiermem.TM_ERR_INVALID_ARGUMENT and "src" in e.value.message
    assert rt.stats()["tensors"] == 0


def test_step_and_close(make_runtime):
    rt = make_runtime()
    with rt.step():
        assert rt.next_name("saved") == "saved.0"
        assert rt.next_name("saved") == "saved.1"
    with rt.step():
        assert rt.next_name("saved") == "saved.0"  # names repeat step after step
    assert rt.step_index == 2
    rt.close()
    assert rt.closed
    with pytest.raises(tiermem.TiermemError):
        rt.stats()


def test_a_failed_move_at_the_step_end_warns_not_raises(make_runtime):
    """A move between tiers that failed in the step (an offload to a full NVMe tier) left its
    tensor valid where it was: the step's work stands, and its end warns (tiermem.TiermemWarning)
    rather than raising an error that would have the step repeated. Found by an outside client:
    a saved-tensor offload to a full NVMe tier made `with rt.step():` raise after opt.step()."""
    import time
    import warnings
    rt = make_runtime(nvme_bytes="1MiB", dram_bytes="4MiB", dram_inclusive="off")
    data = bytes(range(256)) * (2 << 12)  # 2 MiB: more than the NVMe tier
    t = rt.tensor(len(data), "activation", "dram", "big")
    t.write(data)
    failed = rt.stats()["moves_failed"]
    with pytest.warns(tiermem.TiermemWarning) as w:
        with rt.step():
            t.offload("nvme")  # queued; it fails on a mover
            deadline = time.monotonic() + 30
            while rt.stats()["moves_failed"] == failed and time.monotonic() < deadline:
                time.sleep(0.001)
    assert rt.stats()["moves_failed"] == failed + 1
    assert rt.stats()["moves_failed_lost"] == 0
    err = w[0].message.error
    assert err.status == tiermem.TM_ERR_NO_SPACE and "big" in err.message
    assert "left its tensor valid where it was: nothing was lost" in err.message
    assert err.nothing_lost  # tm_last_error_flags: TM_ERROR_NOTHING_LOST
    assert t.read() == data
    with pytest.raises(tiermem.TiermemError) as other:
        t.read(1, offset=len(data))  # out of range: a failure of another kind
    assert not other.value.nothing_lost
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with rt.step():  # reported once: the next step ends quietly
            t.read(4096)
    t.destroy()


def test_steps_do_not_nest(make_runtime):
    rt = make_runtime()
    t = rt.tensor(4096, "activation", "dram", "t")
    with rt.step():
        t.write(b"x" * 4096)
        with pytest.raises(tiermem.TiermemError) as e:
            with rt.step():
                pass
        assert e.value.status == tiermem.TM_ERR_INVALID_ARGUMENT
        assert "steps do not nest" in e.value.message
        t.read(4096)
    # The outer step went on and ended; the next one begins as usual.
    assert rt.step_index == 1
    with rt.step():
        t.read(4096)
    assert rt.step_index == 2
    t.destroy()


def test_exit_with_a_step_open_is_quiet(tmp_path):
    """An interpreter leaving with `with rt.step():` (and a saved-tensor context) still entered
    ends the step in the generator's GeneratorExit after this module's globals may be None:
    nothing may be printed ("Exception ignored in <generator Runtime.step>: TypeError: catching
    classes that do not inherit from BaseException")."""
    code = """if True:
        import torch, tiermem, tiermem.torch as tt
        rt = tiermem.Runtime(device="emulated", dram_bytes="4MiB", nvme_paths=%r,
                             nvme_bytes="16MiB", log_level="error")
        m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
        params = tt.offload_parameters(m, rt, tier="nvme",
                                       optimizer=torch.optim.AdamW(m.parameters()))
        step = rt.step(); step.__enter__()
        saved = tt.offload_saved_tensors(rt, tier="nvme", min_bytes=1); saved.__enter__()
        loss = m(torch.randn(8, 64)).sum()  # the graph alive, its saved tensors in tiermem
        print("exiting", flush=True)
    """ % str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "exiting\n", out.stdout
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_forked_child_refuses_the_runtime_and_exits_cleanly(tmp_path):
    """A fork()ed child (a DataLoader worker, multiprocessing's fork) cannot use the parent's
    runtime, whose threads stayed in the parent: a read there raises TiermemError naming the
    fork (it hung forever in the I/O queue), and the child's normal exit, whose finalizers
    destroy the inherited runtime, is clean (it crashed in pthread_join, or hung). A runtime
    the child makes works; the parent's goes on. Found by an outside client."""
    code = """
import os, sys
import tiermem
def make(path):
    return tiermem.Runtime(device="emulated", hbm_bytes="8MiB", dram_bytes="8MiB",
                           nvme_paths=path, nvme_bytes="16MiB", log_level="error")
rt = make(%r)
t = rt.tensor(1 << 20, "activation", "dram", "cached")
t.write(bytes(range(256)) * 4096)
t.offload("nvme")
t.sync()
pid = os.fork()
if pid == 0:
    code = 0
    try:
        t.read(16)
        code = 3
    except tiermem.TiermemError as e:
        if e.status != tiermem.TM_ERR_INVALID_HANDLE or "forked" not in e.message:
            code = 4
    with make(%r) as mine:
        x = mine.tensor(4096, "activation", "dram", "x")
        x.write(b"y" * 4096)
        if x.read() != b"y" * 4096:
            code = 5
    sys.exit(code)  # a normal exit: the finalizers destroy the inherited runtime
_, status = os.waitpid(pid, 0)
assert t.read(16) == bytes(range(16))
rt.close()
print("child exit", os.waitstatus_to_exitcode(status), flush=True)
""" % (str(tmp_path / "parent"), str(tmp_path / "child"))
    (tmp_path / "parent").mkdir()
    (tmp_path / "child").mkdir()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "child exit 0\n", (out.stdout, out.stderr)
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_close_from_another_thread_waits_for_the_step(make_runtime):
    """A watchdog thread's close() while the training thread is in a step waits for that step
    to end (an outside client's crashed the process in 5 runs of 20, reading a parameter view
    of memory the close freed, or lost a parameter); no step begins after it, and the model
    keeps its weights, brought home."""
    import threading
    import torch
    import tiermem.torch as tt
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(3)])
    ref = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(3)])
    ref.load_state_dict(m.state_dict())
    rt = make_runtime(hbm_bytes="64KiB", dram_bytes="1MiB")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    params = tt.offload_parameters(m, rt, "nvme", optimizer=opt, units=list(m))
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    x = torch.randn(4, 32)
    closer = threading.Thread(target=rt.close)
    with rt.step():
        closer.start()  # it waits for this step
        m(x).sum().backward()
        params.step()
        opt.zero_grad()
    closer.join()
    assert rt.closed
    with pytest.raises(tiermem.TiermemError, match="closed"):
        with rt.step():
            pass
    ref(x).sum().backward()
    ref_opt.step()
    for a, b in zip(m.parameters(), ref.parameters()):
        assert torch.equal(a.detach(), b.detach()), "a weight was lost or changed"
    params.remove()


def test_close_from_another_thread_stops_a_loop_that_steps_on(make_runtime):
    """A loop stepping on while a watchdog closes: the step in progress is the last one (an
    outside client's close() waited while 17 more steps began, until the loop stopped by
    itself); the loop's next step raises "closed", and close() returns."""
    import threading
    rt = make_runtime()
    t = rt.tensor(4096, "activation", "dram", "t")
    t.write(b"x" * 4096)
    in_step, begun, outcome = threading.Event(), [], []

    def loop():
        try:
            for _ in range(100000):
                with rt.step():
                    # Whether close() had begun (its flag set, under the runtime's lock) when
                    # this step's body ran: only the step in progress then may see it. (Not a
                    # clock read before close(): steps begun between that read and the flag
                    # are no fault, and a loaded machine lets several in.)
                    begun.append(rt._closing)
                    in_step.set()
                    t.read(4)
        except tiermem.TiermemError as e:
            outcome.append(e)

    looper = threading.Thread(target=loop)
    looper.start()
    in_step.wait()
    rt.close()
    looper.join(60)
    assert not looper.is_alive() and outcome and "closed" in outcome[0].message, outcome
    assert sum(begun) <= 1, "%d steps ran after close() began" % sum(begun)


def test_a_step_begun_while_another_thread_closes_waits_for_the_close(make_runtime):
    """A watchdog's close() brings the offloads home outside the runtime's lock: the training
    thread's next step raised "closed" at once, and the loop, going on without tiermem, ran
    beside the close (an outside client: parameters read while offloaded, a step raising that
    a tensor was destroyed, half the trials). The step now waits for the close to end, then
    raises; a close that fails lets it step on."""
    import threading
    import time
    rt = make_runtime()
    home = threading.Event()
    calls = []

    class SlowHome:  # an offload that takes its time coming home
        def _runtime_closing(self):
            calls.append("home")
            time.sleep(0.3)
            home.set()

    slow = SlowHome()
    rt._bring_home_at_close(slow)
    closer = threading.Thread(target=rt.close)
    closer.start()
    while not rt._closing:
        time.sleep(0.001)
    with pytest.raises(tiermem.TiermemError, match="closed"):
        with rt.step():
            pass
    assert home.is_set(), "the step was refused before the close had brought its offloads home"
    closer.join(10)
    assert rt.closed and calls == ["home"]

    rt = make_runtime()

    class Refuses:
        def _runtime_closing(self):
            time.sleep(0.3)
            raise RuntimeError("not now")

    refuses = Refuses()
    rt._bring_home_at_close(refuses)
    failed = []
    closer = threading.Thread(target=lambda: failed.append(pytest.raises(
        tiermem.TiermemError, rt.close)))
    closer.start()
    while not rt._closing:
        time.sleep(0.001)
    with rt.step():  # the close failed: the runtime is open, and the step goes on
        pass
    closer.join(10)
    assert failed and not rt.closed
    rt._homecoming.discard(refuses)  # (the fixture closes it)


def test_close_inside_a_step_on_its_thread_is_refused(make_runtime):
    """close() inside a step on the same thread (a signal handler's) raises TM_ERR_BUSY and
    changes nothing: the step goes on, and close() after it works."""
    rt = make_runtime()
    t = rt.tensor(4096, "activation", "dram", "t")
    with rt.step():
        t.write(b"x" * 4096)
        with pytest.raises(tiermem.TiermemError, match="a step is in progress") as e:
            rt.close()
        assert e.value.status == tiermem.TM_ERR_BUSY
        assert t.read() == b"x" * 4096
    rt.close()
    assert rt.closed


def test_a_tiermem_error_crosses_processes(tmp_path):
    """multiprocessing sends a worker's exception to its parent pickled, and a DataLoader
    re-raises its worker's by type and text: a TiermemError survives both, status and all (an
    outside client's fork Pool hung, its result thread dead on unpickling, and its DataLoader
    raised a RuntimeError that `except TiermemError` missed)."""
    import pickle
    e = tiermem.TiermemError(tiermem.TM_ERR_IO, "the disk said no", "tm_tensor_read", True)
    back = pickle.loads(pickle.dumps(e))
    assert (type(back), back.status, back.message, back.call, back.nothing_lost, str(back)) == (
        tiermem.TiermemError, e.status, e.message, e.call, True, str(e))
    text = tiermem.TiermemError("Caught TiermemError in DataLoader worker process 0.\n"
                                "tiermem.TiermemError: tm_tensor_read: TM_ERR_INVALID_HANDLE: "
                                "made before this process was forked")
    assert text.status == tiermem.TM_ERR_INVALID_HANDLE and "forked" in text.message
    code = """
import multiprocessing, sys
import tiermem
rt = tiermem.Runtime(device="emulated", hbm_bytes="8MiB", dram_bytes="8MiB",
                     nvme_paths=%r, nvme_bytes="16MiB", log_level="error")
t = rt.tensor(4096, "activation", "dram", "cached")
t.write(b"z" * 4096)
def work(i):
    return t.read(4)
with multiprocessing.get_context("fork").Pool(2) as pool:
    try:
        pool.map(work, range(4))
    except tiermem.TiermemError as e:
        print("caught", e.status_name, "forked" in e.message, flush=True)
rt.close()
""" % str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "caught TM_ERR_INVALID_HANDLE True\n", (out.stdout, out.stderr)


def test_a_closed_runtime_is_refused_entering_a_with_block(make_runtime):
    rt = make_runtime()
    rt.close()
    with pytest.raises(tiermem.TiermemError, match="closed"):
        with rt:
            pass


def test_an_uncaught_exception_still_writes_the_trace(tmp_path):
    """TIERMEM_TRACE is written at the runtime's destroy; a process ending on an uncaught
    exception keeps its runtime alive (the traceback, the autograd graph holding saved
    tensors), so the trace is written at the process's exit instead: an outside client found
    only the empty hidden file where the crash was what the trace was wanted for."""
    trace = tmp_path / "crash.json"
    code = """if True:
        import torch, tiermem, tiermem.torch as tt
        rt = tiermem.Runtime(device="emulated", dram_bytes="4MiB", nvme_paths=%r,
                             nvme_bytes="16MiB", log_level="error", trace=%r)
        m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh())
                                  for _ in range(12)])
        with rt.step():
            with tt.offload_saved_tensors(rt, tier="nvme", min_bytes=1):
                loss = m(torch.randn(8, 64)).sum()  # the graph alive, its saved tensors out
            rt.sync()  # the older ones written down to NVMe: moves in the trace
            raise RuntimeError("out of data")
    """ % (str(tmp_path), str(trace))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1 and "out of data" in out.stderr, out.stderr
    assert trace.exists(), os.listdir(tmp_path)
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events), "no move in the trace"
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def _configured_source(build):
    """The source tree the CMake build folder was configured from."""
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            if line.startswith("CMAKE_HOME_DIRECTORY:"):
                return line.split("=", 1)[1].strip()
    raise AssertionError("no CMAKE_HOME_DIRECTORY in %s/CMakeCache.txt" % build)


def test_installed_package_finds_its_library(tmp_path):
    """cmake --install puts the package into the site directory with the library's path."""
    build = os.environ.get("TIERMEM_BUILD_DIR")
    if not build:
        pytest.skip("TIERMEM_BUILD_DIR is not set (ctest sets it)")
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", build, "--prefix", str(prefix)], check=True,
                   stdout=subprocess.DEVNULL)
    sites = glob.glob(str(prefix / "lib" / "python*" / "*-packages"))
    assert len(sites) == 1, sites
    assert os.path.exists(os.path.join(sites[0], "tiermem", "_paths.py"))
    env = dict(os.environ, PYTHONPATH=sites[0])
    env.pop("TIERMEM_LIBRARY", None)
    out = subprocess.run([sys.executable, "-c", "import tiermem; print(tiermem.library_path())"],
                         env=env, check=True, capture_output=True, text=True,
                         cwd=str(tmp_path)).stdout.strip()
    assert out.startswith(str(prefix)) and os.path.exists(out), out
    # tiermem.torch is a package of subpackages: every module of the build's source is installed.
    source = _configured_source(build)
    torch_dir = os.path.join(source, "python", "tiermem", "torch")
    modules = [os.path.relpath(p, torch_dir)
               for p in glob.glob(os.path.join(torch_dir, "**", "*.py"), recursive=True)]
    assert "__init__.py" in modules, modules
    for module in modules:
        assert os.path.exists(os.path.join(sites[0], "tiermem", "torch", module)), module
    out = subprocess.run([sys.executable, "-c", "import tiermem.torch as tt; print(tt.__file__)"],
                         env=env, check=True, capture_output=True, text=True,
                         cwd=str(tmp_path)).stdout.strip()
    assert out.startswith(str(prefix)), out


def test_source_checkout_finds_its_own_build(tmp_path):
    # The README's order: build with tools/build.sh, then run an example from the checkout, with
    # nothing installed and no TIERMEM_LIBRARY: the package finds <checkout>/build/lib (here the
    # build folder ctest runs from, named by BUILD_DIR).
    built = os.environ["TIERMEM_LIBRARY"]
    build_dir = os.path.dirname(os.path.dirname(os.path.realpath(built)))
    if not os.path.exists(os.path.join(build_dir, "lib", "libtiermem.so")):
        pytest.fail("the build tree has no lib/libtiermem.so: " + build_dir)
    env = {k: v for k, v in os.environ.items() if k != "TIERMEM_LIBRARY"}
    env["BUILD_DIR"] = build_dir
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(tiermem.__file__)))
    code = "import tiermem; print(tiermem.library_path())"
    out = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, %r); %s" % (package_root, code)],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == os.path.join(build_dir, "lib", "libtiermem.so"), out


def test_a_bad_tiermem_library_is_named(tmp_path):
    """TIERMEM_LIBRARY naming a missing file or another library: an OSError naming the variable
    (it was ctypes' own OSError or AttributeError, which never said where the path came from)."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(tiermem.__file__)))
    code = "import sys; sys.path.insert(0, %r); import tiermem" % package_root
    libz = ctypes.util.find_library("z") or "libz.so.1"
    for bad, says in ((str(tmp_path / "absent.so"), "cannot be loaded"),
                      (libz, "is not libtiermem")):
        env = dict(os.environ, TIERMEM_LIBRARY=bad)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, cwd=str(tmp_path))
        assert r.returncode != 0
        assert "TIERMEM_LIBRARY=%s %s" % (bad, says) in r.stderr, r.stderr[-2000:]


def test_tensor_names_are_checked(make_runtime, tmp_path):
    """A name is a str (UTF-8) or bytes; anything else, a NUL byte (which would cut the C string
    silently) or a str that UTF-8 cannot encode is refused naming the argument, and no tensor is
    made. Bytes that are not UTF-8 reach the library as they are (the trace shows U+FFFD)."""
    trace = tmp_path / "names.json"
    rt = make_runtime(trace=str(trace))
    for bad in (123, 1.5, ["x"], object()):
        with pytest.raises(TypeError, match="name must be a str or bytes"):
            rt.tensor(4096, "activation", "dram", bad)
    for bad in ("nul\x00inside", b"nul\x00inside", "bad\udcff"):
        with pytest.raises(ValueError, match="name: "):
            rt.tensor(4096, "activation", "dram", bad)
        with pytest.raises(ValueError, match="name: "):
            rt.tensor_copied_in(0, 0, "activation", "dram", bad)
    assert rt.stats()["tensors"] == 0, "a refused name made no tensor"
    data = bytes(range(256)) * 16
    for name in (b"raw\xff", bytearray(b"array"), "", None, "ok"):
        with rt.tensor(len(data), "activation", "dram", name) as t:
            t.write(data)
            t.offload("nvme")
            t.sync()
            assert t.read() == data
    rt.close()
    names = {e["name"] for e in json.loads(trace.read_text(encoding="utf-8"))["traceEvents"]}
    assert {"raw\ufffd", "array", "ok"} <= names, names
