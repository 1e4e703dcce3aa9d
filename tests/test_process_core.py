"""Tier 3 (core): a second process reuses the cache; the wheel installs and works without a compiler."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO, child_env, last_json, run_scenario, scenario_argv


@pytest.mark.compile
@pytest.mark.process
@pytest.mark.timeout(600)
def test_second_process_loads_from_cache_without_subprocess(session_cache: Path) -> None:
    import jitops

    first = jitops.get("softmax", device="cpu")  # builds once per session (or reuses the session cache)
    report = run_scenario("scenarios_inert.warm_get_softmax", env=child_env(JITOPS_CACHE_DIR=str(session_cache)))
    assert report["ok"] is True
    assert report["built"] is False
    assert report["key"] == first.library.key
    assert report["events"] == [], "the warm path started a subprocess"
    assert report["cpp_extension"] is False


def _no_compiler_path(tmp_path: Path, venv: Path) -> str:
    """A PATH holding only the venv's python: no c++, g++, gcc, cc or ninja on it."""
    bindir = tmp_path / "bin-nocc"
    bindir.mkdir()
    for name in ("python", "python3"):
        (bindir / name).symlink_to(venv / "bin" / name)
    return str(bindir)


@pytest.mark.compile
@pytest.mark.process
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_wheel_installs_without_compiler_and_builds_with_one(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    wheels = list(dist.glob("jitops-*.whl"))
    assert len(wheels) == 1 and wheels[0].name.endswith("-py3-none-any.whl"), wheels
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    for required in ("jitops/kernels/softmax/softmax_cpu.cpp", "jitops/kernels/softmax/softmax_cuda.cu",
                     "jitops/kernels/softmax/softmax_common.h", "jitops/include/jitops/op.h", "jitops/py.typed"):
        assert required in names, required

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    torch_req = "torch==" + __import__("torch").__version__.split("+")[0]
    subprocess.run([*pip, torch_req, str(wheels[0])], check=True, capture_output=True, timeout=600)

    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CC", "PYTHONPATH")}
    env.update(PATH=_no_compiler_path(tmp_path, venv), JITOPS_CACHE_DIR=str(tmp_path / "cache"))
    python = str(venv / "bin" / "python")
    proc = subprocess.run(scenario_argv("scenarios_inert.installed_get_refused", python=python), env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = last_json(proc.stdout)
    assert report["seconds"] < 2.0
    assert "no C++ compiler found" in report["error"] and "softmax" in report["error"]
    assert "CXX" in report["error"]
    assert not (tmp_path / "cache" / "v1" / "locks").exists(), "a lock was taken before the toolchain check"

    env["PATH"] = str(venv / "bin") + os.pathsep + os.environ["PATH"]
    proc = subprocess.run(scenario_argv("scenarios_inert.installed_get", python=python), env=env, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout) == {"ok": True, "built": True}
