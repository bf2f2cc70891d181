"""The commands a pip install puts on the PATH (tiermem-probe, tiermem-plan) and python -m tiermem
(tiermem._commands): which program each runs, that arguments and exit statuses pass through, and
that a same-named script on the PATH (the command itself) is never taken for the program."""

import os
import stat
import subprocess
import sys

import pytest

from tiermem import _commands

BUILD = os.environ.get("TIERMEM_BUILD_DIR")
needs_build = pytest.mark.skipif(BUILD is None, reason="TIERMEM_BUILD_DIR unset (ctest sets it)")
README_7B = ["--layers", "32", "--hidden", "4096", "--heads", "32", "--seq", "4096",
             "--micro-batch", "8", "--params", "7B", "--hbm", "80GiB", "--tflops", "400",
             "--link-gbps", "25", "--nvme-gbps", "6", "--dram-gbps", "100"]


def run_python(code_or_args, env_extra, module=False):
    env = dict(os.environ, **env_extra)
    args = [sys.executable] + (code_or_args if module else ["-c", code_or_args])
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)


@needs_build
def test_a_checkout_runs_its_own_build(monkeypatch):
    monkeypatch.setenv("BUILD_DIR", BUILD)
    for name in _commands.PROGRAMS:
        assert _commands.find(name) == os.path.join(BUILD, "tools", name)


def test_only_the_two_programs():
    with pytest.raises(ValueError, match="no program 'sh'"):
        _commands.find("sh")


def test_a_script_of_the_same_name_is_not_the_program(tmp_path, monkeypatch):
    script = tmp_path / "tiermem-probe"
    script.write_text("#!/bin/sh\necho should not run\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("BUILD_DIR", str(tmp_path / "no-build"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no tiermem-probe program found; tried .*" +
                       str(script)):
        _commands.find("tiermem-probe")


@needs_build
def test_plan_command_passes_arguments_through():
    r = run_python("import sys; sys.argv = ['tiermem-plan'] + %r; "
                   "from tiermem._commands import plan; plan()" % README_7B, {"BUILD_DIR": BUILD})
    assert r.returncode == 0, r.stderr
    assert ("recommended: per-layer recompute + optimizer-state offload (38.33 GiB, +1.4074 "
            "s/step, +38.1%)") in r.stdout


@needs_build
def test_plan_command_passes_the_exit_status_through():
    r = run_python("import sys; sys.argv = ['tiermem-plan', '--layers', 'x']; "
                   "from tiermem._commands import plan; plan()", {"BUILD_DIR": BUILD})
    assert r.returncode == 2, (r.returncode, r.stderr)  # tiermem-plan's usage error
    assert "--layers x: not a number" in r.stderr


@needs_build
def test_python_m_tiermem_is_the_probe():
    r = run_python(["-m", "tiermem", "--config"], {"BUILD_DIR": BUILD}, module=True)
    assert r.returncode == 0, r.stderr
    assert "TIERMEM_DEVICE" in r.stdout
