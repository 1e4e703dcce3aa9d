"""Diagnostics: missing tools fail fast and before any lock; an OOM-killed compiler says so;
waiting on another build reports its holder and honours JITOPS_LOCK_TIMEOUT; file systems
without locking warn once. Every error is a JitopsError naming the op, the cause and a fix."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.helpers import child_env, run_scenario

pytestmark = pytest.mark.process


def _assert_fast_toolchain_error(r: dict, *words: str) -> None:
    assert r["type"] == "ToolchainError" and "JitopsError" in r["mro"], r
    assert r["seconds"] <= 2.0, r
    assert not r["filelock_imported"], "failed before any lock"
    for w in words:
        assert w in r["msg"], (w, r["msg"])


@pytest.mark.timeout(60)
def test_missing_compiler(tmp_path: Path) -> None:
    env = child_env(JITOPS_CACHE_DIR=str(tmp_path / "c"), PATH=str(tmp_path / "empty"), CXX=None)
    r = run_scenario("attempt_get", env=env)
    _assert_fast_toolchain_error(r, "'softmax'", "c++", "CXX", "Fix:")
    assert not (tmp_path / "c" / "v1" / "locks").exists()
    env["CXX"] = "/nonexistent/g++"
    r = run_scenario("attempt_get", env=env)
    _assert_fast_toolchain_error(r, "'softmax'", "CXX='/nonexistent/g++'", "Fix:")


@pytest.mark.timeout(60)
def test_missing_ninja(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "c++").symlink_to("/usr/bin/c++")
    env = child_env(JITOPS_CACHE_DIR=str(tmp_path / "c"), PATH=str(bindir))
    r = run_scenario("attempt_get", env=env, hide_ninja=True)
    _assert_fast_toolchain_error(r, "'softmax'", "ninja", "PATH", "Fix:")


def _fake_cuda_plan_error(tmp_path: Path, cuda_home: Path) -> dict:
    """make_plan + ensure_entry for a CUDA target, on a probed system whose torch is CUDA 13.0."""
    env = child_env(
        JITOPS_CACHE_DIR=str(tmp_path / "c"), CUDA_HOME=str(cuda_home), PATH="/usr/bin:/bin"
    )
    return run_scenario("get_with_fake_cuda", env=env)


@pytest.mark.timeout(60)
def test_missing_nvcc(tmp_path: Path) -> None:
    r = _fake_cuda_plan_error(tmp_path, tmp_path / "no-cuda")
    _assert_fast_toolchain_error(r, "'softmax'", "nvcc", "CUDA_HOME", "Fix:")


@pytest.mark.timeout(60)
def test_nvcc_major_differs_from_torch(tmp_path: Path) -> None:
    home = tmp_path / "cuda-12"
    (home / "bin").mkdir(parents=True)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    nvcc.chmod(0o755)
    (home / "include").mkdir()
    # a whole (fake) toolkit, not a wrapper
    (home / "include" / "cuda_runtime_api.h").write_text("")
    r = _fake_cuda_plan_error(tmp_path, home)
    _assert_fast_toolchain_error(r, "'softmax'", "CUDA 12.4", "13.0", "CUDA_HOME", "Fix:")


@pytest.mark.compile
@pytest.mark.timeout(200)
def test_oom_killed_compiler(tmp_path: Path) -> None:
    """cc1plus dies of SIGKILL (what the OOM killer sends); g++ itself reports it; jitops says so."""
    wrapper = tmp_path / "oom-killer.sh"
    wrapper.write_text('#!/bin/sh\ncase "$1" in *cc1plus) kill -9 $$ ;; esac\nexec "$@"\n')
    wrapper.chmod(0o755)
    env = child_env(
        JITOPS_CACHE_DIR=str(tmp_path / "c"), CXXFLAGS=f"-wrapper {wrapper}", MAX_JOBS="2"
    )
    r = run_scenario("attempt_get", env=env, timeout=190)
    assert r["type"] == "BuildError" and "JitopsError" in r["mro"], r
    assert "out-of-memory" in r["msg"] and "MAX_JOBS=1" in r["msg"] and "'softmax'" in r["msg"], r[
        "msg"
    ]
    assert "full log:" in r["msg"]


@pytest.mark.timeout(120)
def test_lock_wait_progress_and_timeout(tmp_path: Path) -> None:
    """A second process waits on a 20 s build: progress lines name the holder (pid, host, age);
    JITOPS_LOCK_TIMEOUT=1.5 ends the wait with LockTimeout."""
    reply = run_scenario(
        "scenarios_fs.lock_wait",
        env=child_env(JITOPS_BUILDER="fake", JITOPS_CACHE_DIR=str(tmp_path / "c")),
    )
    r = reply["value"]
    holder = reply["holder"]
    assert r["type"] == "LockTimeout" and "JitopsError" in r["mro"] and "TimeoutError" in r["mro"]
    assert 1.4 <= r["seconds"] < 4
    assert (
        f"pid {holder}" in r["msg"] and "JITOPS_LOCK_TIMEOUT" in r["msg"] and "fakeadd" in r["msg"]
    )
    progress = [ln for ln in r["lines"] if ln.startswith("waiting for the build of fakeadd")]
    assert progress and all(
        f"pid {holder} on {os.uname().nodename}" in ln and "building for" in ln for ln in progress
    )


@pytest.mark.timeout(60)
def test_bad_lock_timeout_value(tmp_path: Path) -> None:
    r = run_scenario(
        "attempt_get",
        env=child_env(
            JITOPS_BUILDER="fake", JITOPS_CACHE_DIR=str(tmp_path / "c"), JITOPS_LOCK_TIMEOUT="soon"
        ),
        name="fakeadd",
        register_fakes=True,
    )
    assert r["type"] == "ConfigError" and "JitopsError" in r["mro"] and "Fix:" in r["msg"]


@pytest.mark.timeout(60)
def test_no_file_locking_warns_once_and_builds(tmp_path: Path) -> None:
    """flock failing with ENOLCK (as on NFS without lockd; simulated, the kernel here has locks):
    one warning for two builds, both correct through atomic publishing."""
    r = run_scenario(
        "scenarios_inert.no_file_locking",
        env=child_env(JITOPS_BUILDER="fake", JITOPS_CACHE_DIR=str(tmp_path / "c")),
    )
    assert r["works"] == [True, True] and len(r["warned"]) == 1


@pytest.mark.timeout(60)
def test_compile_error_is_one_screen_with_a_fix(tmp_path: Path) -> None:
    src = tmp_path / "lib"
    src.mkdir()
    (src / "broken.cpp").write_text("int ok = 1;\nint broken = ;\n")
    library = {
        "name": "broken",
        "root": str(src),
        "cpu_sources": ["broken.cpp"],
        "schemas": ["broken(Tensor x) -> Tensor"],
    }
    r = run_scenario(
        "attempt_get",
        env=child_env(JITOPS_CACHE_DIR=str(tmp_path / "c")),
        timeout=60,
        name="broken",
        library=library,
    )
    assert r["type"] == "BuildError" and "JitopsError" in r["mro"] and "RuntimeError" in r["mro"]
    lines = r["msg"].splitlines()
    assert len(lines) <= 40 and "'broken'" in lines[0]
    assert any("broken.cpp:2" in ln for ln in lines) and any("int broken = ;" in ln for ln in lines)
    assert "Fix:" in r["msg"] and "full log:" in r["msg"]


def test_error_classes_inherit_jitops_and_builtin() -> None:
    import jitops

    for name in jitops.__all__:
        obj = getattr(jitops, name)
        if (
            isinstance(obj, type)
            and issubclass(obj, BaseException)
            and obj is not jitops.JitopsError
        ):
            assert issubclass(obj, jitops.JitopsError), name
            assert (
                len(
                    [
                        b
                        for b in obj.__mro__
                        if b.__module__ == "builtins"
                        and b not in (object, BaseException, Exception)
                    ]
                )
                >= 1
            ), name
    assert sys.version_info >= (3, 10)
    assert os.sep == "/"
