"""The jitops command as real subprocesses, with the real softmax build from the session cache.

Warm then offline on a read-only cache (as an unprivileged user, audited), export/import
between caches, explain, doctor and the PyTorch fallback without a compiler.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

import jitops.build.entry as jentry
import jitops.plan as jplan
import jitops.registry as jregistry
from jitops.cli import main
from tests.cli_helpers import no_compiler_env, run_child
from tests.helpers import NOBODY, REPO, child_env, processes, run_as_nobody, run_scenario


@pytest.fixture(scope="session")
def softmax_entry(session_cache: Path) -> jentry.Entry:
    """The real softmax CPU entry in the session cache (built at most once per session)."""
    return jentry.ensure_entry(jplan.make_plan(jregistry.registry().lookup("softmax"), "cpu"))


@pytest.fixture(scope="module")
def warm_all(session_cache: Path) -> str:
    """Output of a real `jitops warm --all` child on the session cache (run once per module)."""
    proc = run_child(child_env(), args=("warm", "--all", "--device", "cpu"), timeout=600)
    return _ok(proc)


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A temporary dir an unprivileged child can reach (pytest's tmp_path is 0700 root)."""
    base = Path(tempfile.mkdtemp(prefix="jitops-cli-"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _ok(proc) -> str:  # type: ignore[no-untyped-def]
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    return proc.stdout


def test_console_script_is_main() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"jitops": "jitops.cli:main"}


def _read_only_copy(src_root: Path, dest_root: Path, uid: int) -> None:
    for part in ("entries", "toolchains"):
        # the session cache is live (another xdist worker may be writing): not its half-written
        # temporary files
        shutil.copytree(
            src_root / "v1" / part, dest_root / "v1" / part, ignore=shutil.ignore_patterns("*.tmp")
        )
    for dirpath, dirnames, filenames in os.walk(dest_root):
        for p in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.chown(p, uid, uid)
            os.chmod(p, os.stat(p).st_mode & ~0o222)  # chmod -R a-w


@pytest.mark.compile
@pytest.mark.process
@pytest.mark.timeout(900)
def test_warm_all_then_offline_read_only_cache_builds_nothing_and_writes_nothing(
    session_cache: Path, world_dir: Path, warm_all: str
) -> None:
    assert "0 failed" in warm_all and "softmax for cpu-" in warm_all
    assert f"cache {session_cache})" in warm_all, f"warm used another cache\n{warm_all}"
    root = world_dir / "cache"
    _read_only_copy(session_cache, root, NOBODY)
    home = world_dir / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    env = child_env(JITOPS_CACHE_DIR=str(root), JITOPS_OFFLINE="1", HOME=str(home))
    # As uid NOBODY (helpers.run_as_nobody), which re-exposes the root-only interpreter and checkout
    # paths in a private mount namespace before dropping root.
    report = run_as_nobody(world_dir / "views", "scenarios_cli.offline_read_only", env, timeout=240)
    assert report["uid"] == NOBODY  # permission bits bind this child (root's would not)
    assert report["ops"] and all(o["built"] is False and o["ok"] for o in report["ops"].values()), (
        report
    )
    assert report["ops"]["softmax"]["checked"] and report["ops"]["log_softmax"]["checked"]
    assert report["rcs"] == [0, 0, 0]
    assert report["miss"] and "jitops warm" in report["miss"]
    assert report["writes"] == [] and report["spawns"] == [] and not report["cpp_extension"], report


@pytest.mark.compile
@pytest.mark.process
@pytest.mark.timeout(600)
def test_second_warm_builds_nothing_within_two_seconds(warm_all: str) -> None:
    report = run_scenario("scenarios_cli.second_warm")
    print(
        f"second `jitops warm --all`: import torch {report['torch_s']:.2f}s + warm {report['warm_s']:.3f}s"
    )
    assert report["rc"] == 0 and "0 built" in report["out"] and "softmax for cpu-" in report["out"]
    assert report["spawns"] == []  # no compiler, no ninja, not even `c++ --version`
    assert report["warm_s"] <= 2.0


@pytest.mark.compile
@pytest.mark.process
@pytest.mark.timeout(600)
def test_export_then_import_into_empty_cache_gives_hits_in_a_fresh_process(
    softmax_entry: jentry.Entry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "softmax.tar.gz"
    # Every softmax entry the session cache holds (this test's; another test's with other flags,
    # too)
    assert main(["cache", "export", str(archive), "softmax"]) == 0
    exported = re.search(r"exported (\d+) entries", capsys.readouterr().out)
    assert exported is not None
    fresh = tmp_path / "fresh"
    env = child_env(JITOPS_CACHE_DIR=str(fresh))
    out = _ok(run_child(env, args=("cache", "import", str(archive))))
    assert f"import: {exported.group(1)} imported, 0 already present, 0 rejected" in out, out
    report = run_scenario("scenarios_cli.load_softmax", env=env)
    assert report["built"] is False and report["ok"] and report["spawns"] == []
    assert report["entry"].startswith(str(fresh))
    # The one write of a hit: its last use, recorded on the manifest's mtime. Offline: none.
    assert report["writes"] == [["os.utime", os.path.join(report["entry"], "manifest.json")]]
    env["JITOPS_OFFLINE"] = "1"
    report = run_scenario("scenarios_cli.load_softmax", env=env)
    assert (
        report["built"] is False
        and report["ok"]
        and report["writes"] == []
        and report["spawns"] == []
    )


@pytest.mark.compile
@pytest.mark.process
@pytest.mark.timeout(600)
def test_explain_names_the_changed_ingredient(
    softmax_entry: jentry.Entry, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["explain", "softmax", "--device", "cpu"]) == 0
    assert "cached: loads" in capsys.readouterr().out
    monkeypatch.setenv("CXXFLAGS", "-DJITOPS_EXPLAIN_ME=1")
    assert main(["explain", "softmax", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "would build" in out and str(softmax_entry.path) in out
    assert (
        'env.CXXFLAGS: (absent) -> "-DJITOPS_EXPLAIN_ME=1"' in out
        and "cflags: +-DJITOPS_EXPLAIN_ME=1" in out
    )
    out = _ok(run_child(child_env(CXXFLAGS="-O1"), args=("explain", "softmax", "--device", "cpu")))
    assert "env.CXXFLAGS" in out and "torch_version" not in out


@pytest.mark.process
@pytest.mark.timeout(300)
def test_doctor_fails_with_the_fix_when_the_compiler_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = run_child(
        no_compiler_env(tmp_path, JITOPS_CACHE_DIR=str(tmp_path / "c")), args=("doctor",)
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if "compiler" in ln)
    assert line.startswith("FAIL") and "no C++ compiler" in line
    assert "fix: install one" in proc.stdout and "a build would fail" in proc.stderr
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    assert main(["doctor"]) == 1
    assert "CXX=" in capsys.readouterr().out
    monkeypatch.delenv("CXX")
    assert main(["doctor"]) == 0, capsys.readouterr().out


@pytest.mark.process
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["argument", "env"])
def test_fallback_works_with_compilers_stripped_from_path(tmp_path: Path, how: str) -> None:
    env = no_compiler_env(
        tmp_path,
        JITOPS_CACHE_DIR=str(tmp_path / "c"),
        JITOPS_FALLBACK="1" if how == "env" else None,
    )
    report = run_scenario("scenarios_cli.fallback", env=env)
    if how == "argument":  # without opting in, the clear error, fast
        assert (
            report["refused"].startswith("ToolchainError")
            and "no C++ compiler" in report["refused"]
        )
        assert report["refuse_s"] < 2.0
    else:
        assert report["refused"] is None
    assert report["ok"] and report["fallback"]
    assert report["warned"] == ["log_softmax", "softmax"]  # one warning per op


@pytest.mark.process
@pytest.mark.timeout(300)
def test_offline_miss_names_warm_writes_nothing_and_falls_back_on_request(tmp_path: Path) -> None:
    root = tmp_path / "never-created"
    report = run_scenario(
        "scenarios_cli.fallback",
        record_writes=True,
        env=child_env(JITOPS_CACHE_DIR=str(root), JITOPS_OFFLINE="1"),
    )
    assert report["refused"].startswith("OfflineMiss") and "jitops warm" in report["refused"]
    assert report["ok"] and report["warned"] == ["log_softmax", "softmax"]
    assert report["writes"] == [] and not root.exists()


@pytest.mark.process
@pytest.mark.timeout(300)
def test_fingerprint_ignores_the_compiler_but_not_the_flags(tmp_path: Path) -> None:
    cache = str(tmp_path / "c")
    here = _ok(
        run_child(
            child_env(JITOPS_CACHE_DIR=cache), args=("cache", "fingerprint", "--device", "cpu")
        )
    )
    bare = _ok(
        run_child(
            no_compiler_env(tmp_path, JITOPS_CACHE_DIR=cache),
            args=("cache", "fingerprint", "--device", "cpu"),
        )
    )
    flags = _ok(
        run_child(
            child_env(JITOPS_CACHE_DIR=cache, CXXFLAGS="-O1"),
            args=("cache", "fingerprint", "--device", "cpu"),
        )
    )
    assert len(here.strip()) == 32 and here == bare and flags != here


def test_cpu_fingerprint_ignores_cuda_only_variables_but_not_cxxflags(tmp_path: Path) -> None:
    """A CPU key holds no CUDA-only variable: setting the arch list or CUDA_HOME rebuilds no CPU op."""
    cache = str(tmp_path / "c")
    args = ("cache", "fingerprint", "--device", "cpu")
    unset = {
        "CUDA_HOME": None,
        "TORCH_CUDA_ARCH_LIST": None,
        "NVCC_APPEND_FLAGS": None,
        "CXXFLAGS": None,
    }
    bare = _ok(run_child(child_env(JITOPS_CACHE_DIR=cache, **unset), args=args))
    for var, value in (
        ("CUDA_HOME", "/usr/local/cuda"),
        ("TORCH_CUDA_ARCH_LIST", "9.0"),
        ("NVCC_APPEND_FLAGS", "-G"),
    ):
        assert (
            _ok(run_child(child_env(JITOPS_CACHE_DIR=cache, **{**unset, var: value}), args=args))
            == bare
        ), var
    flags = _ok(
        run_child(child_env(JITOPS_CACHE_DIR=cache, **{**unset, "CXXFLAGS": "-O1"}), args=args)
    )
    assert len(bare.strip()) == 32 and flags != bare


def _processes_using(root: Path) -> list[str]:
    """Command lines of live processes working inside ``root`` (supervisor, ninja, compilers)."""
    return [p.argv[:160] for p in processes() if p.cwd.startswith(str(root))]


@pytest.mark.compile
@pytest.mark.process
@pytest.mark.timeout(300)
def test_ctrl_c_during_warm_stops_its_compilers_and_publishes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    proc = subprocess.Popen(
        [sys.executable, "-m", "jitops", "warm", "--all", "--device", "cpu"],
        cwd=REPO,
        text=True,
        env=child_env(JITOPS_CACHE_DIR=str(root)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not any("cc1plus" in c or "c++" in c for c in _processes_using(root)):
            assert time.monotonic() < deadline and proc.poll() is None, "no compiler started"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted" in err
    deadline = time.monotonic() + 10
    while _processes_using(root) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_using(root) == []
    assert not list((root / "v1" / "entries").glob("*/*/*"))


def test_doctor_passes_an_empty_cache_root_and_fails_it_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cache folder nothing was built in yet (no v1) is a fresh cache, not a refused one (it failed doctor
    whenever no test had built into the session cache before it); offline it holds nothing to load."""
    from jitops.cli.diagnose import _cache

    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    check = _cache(root, offline=False, strict=False)
    assert check.status == "ok" and "(empty)" in check.detail, check
    assert _cache(root, offline=True, strict=False).status == "fail"
    (root / "v1").symlink_to(tmp_path)  # a link where v1 belongs is still refused
    assert _cache(root, offline=False, strict=False).status == "fail"
