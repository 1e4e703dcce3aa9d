"""The toolchain self-check (jitops/selfcheck.py).

The crashing toolchain is a CXX wrapper around the system g++ that links with
``-Wl,--no-eh-frame-hdr``: the extension then has no unwind index, so a
TORCH_CHECK thrown inside it cannot unwind through its frames and the process
aborts (SIGABRT), exactly the symptom of issue 13 (a C++ error kills Python).
Tried here and rejected because the error still arrived as RuntimeError:
``-static-libgcc``, ``-static-libstdc++``, ``-fno-asynchronous-unwind-tables``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jitops import loader, registry, selfcheck
from jitops.errors import OfflineMiss
from jitops.settings import Settings
from jitops.target import probe
from tests.helpers import REPO, child_env, run_scenario

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs the system g++")


def crashing_cxx(folder: Path) -> Path:
    wrapper = folder / "crashing-g++"
    wrapper.write_text('#!/bin/sh\nexec g++ "$@" -Wl,--no-eh-frame-hdr\n')
    wrapper.chmod(0o755)
    return wrapper


def _compiler(**over: object) -> dict:
    base = {"path": "/usr/bin/x86_64-linux-gnu-g++-12", "version": "g++ (Debian 12.2.0-14) 12.2.0",
            "driver": "g++", "openmp": ["-fopenmp"]}
    return {**base, **over}


# ------------------------------------------------------------------ pure


def test_identity_changes_with_each_ingredient_of_the_probe() -> None:
    system = probe({})
    base = selfcheck.identity(system, _compiler())
    assert selfcheck.identity(system, _compiler()) == base
    others = {
        "driver": selfcheck.identity(system, _compiler(driver="c++")),
        "version": selfcheck.identity(system, _compiler(version="g++ (Debian 13.1.0) 13.1.0")),
        "openmp": selfcheck.identity(system, _compiler(openmp=["-fopenmp=libgomp"])),
        "LDFLAGS": selfcheck.identity(probe({"LDFLAGS": "-static-libgcc"}), _compiler()),
        "CXXFLAGS": selfcheck.identity(probe({"CXXFLAGS": "-O1"}), _compiler()),
        "torch": selfcheck.identity(dataclasses.replace(system, torch_version="9.9.9"), _compiler()),
    }
    assert base not in others.values() and len(set(others.values())) == len(others)
    # what does not shape the probe's binary does not re-run it
    assert selfcheck.identity(probe({"MAX_JOBS": "3", "TORCH_CUDA_ARCH_LIST": "9.0"}), _compiler()) == base


def test_fake_builder_and_offline_never_run_the_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: object, **k: object) -> None:
        raise AssertionError("the probe ran")

    monkeypatch.setattr(selfcheck, "run_probe", boom)
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("JITOPS_BUILDER", "fake")
    plan = loader.make_plan(registry.lookup("softmax"), "cpu")
    selfcheck.ensure_sound(plan, Settings.from_env())  # skipped: the fake builder compiles no C++
    monkeypatch.delenv("JITOPS_BUILDER")
    plan = loader.make_plan(registry.lookup("softmax"), "cpu")
    with pytest.raises(OfflineMiss):
        loader.ensure_entry(plan, offline=True)
    assert not (tmp_path / "cache").exists()
    assert selfcheck.doctor(plan.system, tmp_path / "t", Settings.from_env(), offline=True)[0] == "info"


def test_the_self_check_runs_before_a_local_build_but_not_for_a_remote_hit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Miss path: before_first_build runs the self-check before any lock. With a remote tier it runs only
    if the tier calls back to build: a remote hit builds nothing, so needs no sound local toolchain."""
    import jitops.remote
    from jitops import entry

    ran: list[str] = []

    def probe_ran(*a: object, **k: object) -> None:
        ran.append("probe")
        raise AssertionError("the probe ran")

    monkeypatch.setattr(selfcheck, "run_probe", probe_ran)
    selfcheck._passed.clear()
    local = Settings.from_env({"JITOPS_CACHE_DIR": str(tmp_path / "c")})
    plan = loader.make_plan(registry.lookup("softmax"), "cpu", settings=local)
    if plan.compiler is None:
        pytest.skip("needs a C++ compiler on PATH (only its identity is asked)")
    with pytest.raises(AssertionError, match="the probe ran"):
        entry.ensure_entry(plan, settings=local)
    assert ran == ["probe"] and not (tmp_path / "c" / "v1" / "locks").exists()  # before any lock

    class Tier:  # stands in for the remote tier: a hit, or a miss that builds locally
        def __init__(self, hit: bool) -> None:
            self.hit = hit

        def obtain(self, plan: object, cache: object, build: object, wait_limit: object = None,
                   built_here: object = None) -> tuple[object, bool]:  # Tier.obtain's parameters
            return ("remote manifest", False) if self.hit else (build(), True)  # type: ignore[operator]

    remote = Settings.from_env({"JITOPS_CACHE_DIR": str(tmp_path / "c"), "JITOPS_REMOTE_CACHE": f"file://{tmp_path}/r"})
    for hit in (True, False):
        ran.clear()
        monkeypatch.setattr(jitops.remote, "active_tier", lambda settings, hit=hit: Tier(hit))
        if hit:
            got = entry.ensure_entry(plan, settings=remote)
            assert got.manifest == "remote manifest" and ran == []  # type: ignore[comparison-overlap]
        else:
            with pytest.raises(AssertionError, match="the probe ran"):
                entry.ensure_entry(plan, settings=remote)
            assert ran == ["probe"]


# ------------------------------------------------------------------ real compiler


@pytest.mark.compile
@needs_gxx
def test_sound_toolchain_passes_once_and_is_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    system = probe({})
    compiler = _compiler(path=os.path.realpath(shutil.which("g++")), driver="g++")
    tool_dir = tmp_path / "v1" / "toolchains"
    first = selfcheck.check(system, compiler, shutil.which("g++"), tool_dir, record=True)
    assert first.ok and not first.cached, first.detail
    records = list(tool_dir.glob("selfcheck-*.json"))
    assert len(records) == 1 and json.loads(records[0].read_text())["ok"] is True
    print(f"self-check cost: {first.seconds:.1f} s")

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("the probe ran again")

    monkeypatch.setattr(selfcheck, "run_probe", boom)
    selfcheck._passed.clear()  # as a fresh process: only the record on disk remains
    second = selfcheck.check(system, compiler, shutil.which("g++"), tool_dir, record=True)
    assert second.ok and second.cached


@pytest.mark.process
@pytest.mark.timeout(300)
@needs_gxx
def test_crashing_toolchain_fails_doctor_and_get_refuses_before_building(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = child_env(CXX=str(crashing_cxx(tmp_path)), JITOPS_CACHE_DIR=str(cache), JITOPS_BUILDER=None,
                    JITOPS_OFFLINE=None)
    doctor = subprocess.run([sys.executable, "-m", "jitops", "doctor"], env=env, cwd=REPO, capture_output=True,
                            text=True, timeout=240)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    line = next(ln for ln in doctor.stdout.splitlines() if "self-check" in ln)
    assert line.startswith("FAIL") and "crashing-g++" in line and "SIGABRT" in line, doctor.stdout
    assert "unset CXX" in doctor.stdout and "torch.__config__.show()" in doctor.stdout

    out = run_scenario("scenarios_inert.get_or_refusal", name="add", env=env, timeout=240)
    assert "REFUSED" in out and "crashing-g++" in out and "crash the process" in out, out
    assert "unset CXX" in out and "torch.__config__.show()" in out
    # refused before building anything: no entry, no staging dir, not even a cache root
    assert not (cache / "v1" / "entries").exists() and not (cache / "v1" / "staging").exists()
