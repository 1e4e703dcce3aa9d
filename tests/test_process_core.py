"""Tier 3 (core): a second process reuses the cache; the wheel installs and works without a compiler."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO, child_env, last_json, run_scenario, scenario_argv


@pytest.mark.compile
@pytest.mark.process
@pytest.mark.timeout(600)
def test_second_process_loads_from_cache_without_subprocess(session_cache: Path) -> None:
    import jitops

    # builds once per session (or reuses the session cache)
    first = jitops.get("softmax", device="cpu")
    report = run_scenario(
        "scenarios_inert.warm_get_softmax", env=child_env(JITOPS_CACHE_DIR=str(session_cache))
    )
    assert report["ok"] is True
    assert report["built"] is False
    assert report["key"] == first.library.key
    assert report["events"] == [], "the warm path started a subprocess"
    assert report["cpp_extension"] is False
    assert report["cache_api"] is False, "the warm path imported jitops.cache"


def _no_compiler_path(tmp_path: Path, venv: Path) -> str:
    """A PATH holding only the venv's python: no c++, g++, gcc, cc or ninja on it."""
    bindir = tmp_path / "bin-nocc"
    bindir.mkdir()
    for name in ("python", "python3"):
        (bindir / name).symlink_to(venv / "bin" / name)
    return str(bindir)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a fresh virtualenv with torch and jitops's wheel installed, as a user's pip does, the wheel)."""
    tmp = tmp_path_factory.mktemp("installed")
    dist = tmp / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheels = list(dist.glob("jitops-*.whl"))
    assert len(wheels) == 1 and wheels[0].name.endswith("-py3-none-any.whl"), wheels
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    torch_req = "torch==" + __import__("torch").__version__.split("+")[0]
    # Without PYTHONPATH: a checkout on it (with the jitops.egg-info `pip wheel` leaves) would make
    # pip skip jitops.
    subprocess.run(
        [*pip, torch_req, str(wheels[0])],
        check=True,
        capture_output=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    return venv, wheels[0]


@pytest.mark.compile
@pytest.mark.process
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_wheel_installs_without_compiler_and_builds_with_one(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    venv, wheel = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "jitops/kernels/softmax/softmax_cpu.cpp",
        "jitops/kernels/softmax/softmax_cuda.cu",
        "jitops/kernels/softmax/softmax_common.h",
        "jitops/include/jitops/op.h",
        "jitops/py.typed",
    ):
        assert required in names, required

    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CC", "PYTHONPATH")}
    env.update(PATH=_no_compiler_path(tmp_path, venv), JITOPS_CACHE_DIR=str(tmp_path / "cache"))
    python = str(venv / "bin" / "python")
    proc = subprocess.run(
        scenario_argv("scenarios_inert.installed_get_refused", python=python),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    report = last_json(proc.stdout)
    assert report["seconds"] < 2.0
    assert "no C++ compiler found" in report["error"] and "softmax" in report["error"]
    assert "CXX" in report["error"]
    assert not (tmp_path / "cache" / "v1" / "locks").exists(), (
        "a lock was taken before the toolchain check"
    )

    env["PATH"] = str(venv / "bin") + os.pathsep + os.environ["PATH"]
    proc = subprocess.run(
        scenario_argv("scenarios_inert.installed_get", python=python),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout) == {"ok": True, "built": True}


@pytest.mark.compile
@pytest.mark.process
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_four_op_bundle_serves_a_fresh_virtualenv_with_no_compiler(
    installed: tuple[Path, Path], session_cache: Path, tmp_path: Path
) -> None:
    """Issue 31: ``jitops bundle build`` of softmax, log_softmax, add and nms (from the session cache, built for real),
    pip-installed into the fresh virtualenv (jitops from its wheel, not this checkout); there, with CXX a compiler that
    fails and no c++/g++/cc on PATH, frozen, in an empty cache: every op is the bundle's native library, bit-identical
    to torch's op (nms: the reference), nothing compiled. A byte flipped in one installed library: refused, never
    mapped, and with no compiler the named error."""
    import contextlib
    import io

    from jitops.cli import main

    venv, _ = installed
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        mp.setenv("JITOPS_CACHE_DIR", str(session_cache))
        mp.setenv("JITOPS_PROGRESS", "0")
        # no key, no --sign: unsigned (test_bundles signs)
        mp.setenv("JITOPS_CONFIG_DIR", str(tmp_path / "config"))
        mp.delenv("JITOPS_REMOTE_SIGNING_KEY", raising=False)
        rc = main(
            [
                "bundle",
                "build",
                "--ops",
                "softmax,log_softmax,add,nms",
                "--out",
                str(tmp_path / "whl"),
                "--name",
                "four",
                "--version",
                "1.0",
            ]
        )
    assert rc == 0, printed.getvalue()
    (whl,) = (tmp_path / "whl").glob("*.whl")
    python = str(venv / "bin" / "python")
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(whl)],
        check=True,
        capture_output=True,
        timeout=240,
        env=clean,
    )
    (site,) = venv.glob("lib/python*/site-packages/jitops_bundle_four")  # where pip put it
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "PYTHONPATH", "CUDA_HOME")}
    env.update(
        PATH=_no_compiler_path(tmp_path, venv),
        CXX="/bin/false",
        JITOPS_CACHE_DIR=str(tmp_path / "cache"),
        JITOPS_FREEZE="error",
        JITOPS_STATE_DIR=str(tmp_path / "state"),
        JITOPS_PROGRESS="0",
    )

    def child() -> Any:
        proc = subprocess.run(
            scenario_argv("scenarios_bundles.get_every_op", python=python, bundle_root=str(site)),
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return last_json(proc.stdout)

    out = child()
    assert "error" not in out, out
    # jitops from the venv's wheel, not this checkout
    assert out["jitops_file"].startswith(str(venv))
    for op in ("softmax", "log_softmax", "add", "nms"):
        got = out[op]
        assert got["bit_identical"] is True and got["built"] is False, (op, got)
        assert str(got["entry"]).startswith(str(site)), (op, got)
        print(
            f"{op}: {got['seconds'] * 1e6:.1f} us a call from the bundle, baseline {got['baseline_seconds'] * 1e6:.1f} us"
        )
    assert len(out["mapped_from_bundle"]) == 3  # softmax's library holds log_softmax
    assert [
        argv
        for argv in out["spawned"]
        if "-###" not in argv and any(w in ("-c", "-shared", "-o") for w in argv[1:])
    ] == []

    (lib,) = site.glob("v1/entries/softmax/*/*/libsoftmax.so")
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0x01
    lib.write_bytes(bytes(data))
    for frozen, error in (("error", "FrozenError"), (None, "ToolchainError")):
        env.pop("JITOPS_FREEZE", None)
        if frozen:
            env["JITOPS_FREEZE"] = frozen
        out = child()
        assert out.get("error", {}).get("type") == error, out
        assert "JitopsError" in out["error"]["mro"] and "sha256" in out["error"]["msg"], out
        assert str(lib) not in out["mapped_from_bundle"]  # never the tampered code
