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
import time
from pathlib import Path

import pytest

from jitops.loading import loader
from jitops.build import selfcheck
from jitops import registry
from jitops.errors import OfflineMiss, ToolchainError
from jitops.base.settings import Settings
from jitops.target import probe
from tests.helpers import REPO, child_env, last_json, run_scenario, scenario_argv

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs the system g++")


def crashing_cxx(folder: Path) -> Path:
    wrapper = folder / "crashing-g++"
    wrapper.write_text('#!/bin/sh\nexec g++ "$@" -Wl,--no-eh-frame-hdr\n')
    wrapper.chmod(0o755)
    return wrapper


def _compiler(**over: object) -> dict:
    base = {
        "path": "/usr/bin/x86_64-linux-gnu-g++-12",
        "version": "g++ (Debian 12.2.0-14) 12.2.0",
        "driver": "g++",
        "openmp": ["-fopenmp"],
    }
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
        "torch": selfcheck.identity(
            dataclasses.replace(system, torch_version="9.9.9"), _compiler()
        ),
    }
    assert base not in others.values() and len(set(others.values())) == len(others)
    # what does not shape the probe's binary does not re-run it
    assert (
        selfcheck.identity(probe({"MAX_JOBS": "3", "TORCH_CUDA_ARCH_LIST": "9.0"}), _compiler())
        == base
    )


def test_fake_builder_and_offline_never_run_the_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
    assert (
        selfcheck.doctor(plan.system, tmp_path / "t", Settings.from_env(), offline=True)[0]
        == "info"
    )


def _probe_result(ok: bool = True) -> selfcheck.Result:
    return selfcheck.Result(
        ok,
        "a C++ error arrived as RuntimeError" if ok else "the process was killed by SIGABRT",
        0.1,
        "g++ (test)",
    )


def test_the_self_check_runs_beside_the_build_and_gates_publish_and_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe runs while the build runs (not before it); the build may publish, and ensure_entry return an
    entry to load, only after the verdict; a refusal publishes nothing. A remote hit runs no probe."""
    import threading

    import jitops.build.publish
    import jitops.remote
    from jitops.build import entry

    events: list[str] = []
    verdict = {"ok": True}
    probe_may_finish = threading.Event()

    def slow_probe(*a: object, **k: object) -> selfcheck.Result:
        events.append("probe started")
        assert probe_may_finish.wait(30)
        events.append("verdict")
        return _probe_result(verdict["ok"])

    def build(plan: object, cache: object, jobs: object, settings: object) -> str:
        events.append("build started")
        probe_may_finish.set()  # the probe finishes only once the build is running: they overlap
        cache.publish_entry(tmp_path / "staged", plan.address)  # type: ignore[attr-defined]
        return "manifest"

    published: list[object] = []
    monkeypatch.setattr(selfcheck, "run_probe", slow_probe)
    monkeypatch.setattr(jitops.build.publish, "build_and_publish", build)
    monkeypatch.setattr(
        selfcheck.Cache,
        "publish_entry",
        lambda self, staged, address, root=None: published.append(events[:]) or ("hit", True),
    )
    for ok in (True, False):
        selfcheck._passed.clear()
        events.clear()
        probe_may_finish.clear()
        verdict["ok"] = ok
        local = Settings.from_env(
            {
                "JITOPS_CACHE_DIR": str(tmp_path / f"c{ok}"),
                "JITOPS_STATE_DIR": str(tmp_path / f"s{ok}"),
            }
        )
        plan = loader.make_plan(registry.lookup("softmax"), "cpu", settings=local)
        if plan.compiler is None:
            pytest.skip("needs a C++ compiler on PATH (only its identity is asked)")
        if ok:
            got = entry.ensure_entry(plan, settings=local)
            assert got.built and got.manifest == "manifest"  # type: ignore[comparison-overlap]
            # published after the verdict; the probe and the build overlap (the probe ends only once
            # the build has started), in either order of starting: which thread appends first is the
            # scheduler's choice
            assert published[-1][-1] == "verdict" and sorted(published[-1][:2]) == [
                "build started",
                "probe started",
            ]
        else:
            before = len(published)
            with pytest.raises(ToolchainError, match="fails the toolchain self-check.*SIGABRT"):
                entry.ensure_entry(plan, settings=local)
            assert len(published) == before  # refused: nothing published, so nothing to load
        assert events[:2] in (
            ["probe started", "build started"],
            ["build started", "probe started"],
        )

    class Tier:  # stands in for the remote tier: a hit, or a miss that builds locally
        def __init__(self, hit: bool) -> None:
            self.hit = hit

        def obtain(
            self,
            plan: object,
            cache: object,
            build: object,
            wait_limit: object = None,
            built_here: object = None,
        ) -> tuple[object, bool]:  # Tier.obtain's parameters
            return ("remote manifest", False) if self.hit else (build(), True)  # type: ignore[operator]

    remote = Settings.from_env(
        {
            "JITOPS_CACHE_DIR": str(tmp_path / "c"),
            "JITOPS_REMOTE_CACHE": f"file://{tmp_path}/r",
            "JITOPS_STATE_DIR": str(tmp_path / "s-remote"),
        }
    )
    for hit in (True, False):
        selfcheck._passed.clear()
        events.clear()
        verdict["ok"] = True
        monkeypatch.setattr(jitops.remote, "active_tier", lambda settings, hit=hit: Tier(hit))
        got = entry.ensure_entry(plan, settings=remote)
        if hit:
            assert got.manifest == "remote manifest" and events == []  # type: ignore[comparison-overlap]
        else:
            assert got.manifest == "manifest" and "verdict" in events  # type: ignore[comparison-overlap]


def _counting_probe(monkeypatch: pytest.MonkeyPatch, ok: bool = True) -> list[int]:
    runs: list[int] = []

    def counted(*a: object, **k: object) -> selfcheck.Result:
        runs.append(1)
        return _probe_result(ok)

    monkeypatch.setattr(selfcheck, "run_probe", counted)
    selfcheck._passed.clear()
    return runs


def test_a_verdict_is_remembered_across_cache_roots_and_doctor_reuses_it_unless_recheck(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jitops import cli

    runs = _counting_probe(monkeypatch)
    state = tmp_path / "state"
    monkeypatch.setenv("JITOPS_STATE_DIR", str(state))
    # two cache roots, one verdict: a fresh process (memo cleared) probes nothing
    for root in (
        "a",
        "b",
    ):
        selfcheck._passed.clear()
        monkeypatch.setenv("JITOPS_CACHE_DIR", str(tmp_path / root))
        plan = loader.make_plan(registry.lookup("softmax"), "cpu")
        if plan.compiler is None:
            pytest.skip("needs a C++ compiler on PATH (only its identity is asked)")
        selfcheck.ensure_sound(plan, Settings.from_env())
    assert len(runs) == 1
    record = json.loads(next((state / "selfcheck").glob("*.json")).read_text())
    assert record["ok"] is True and record["identity"] == selfcheck.identity(
        plan.system, plan.ingredients["compiler"]
    )
    assert oct((state / "selfcheck").stat().st_mode & 0o777) == oct(0o700)

    selfcheck._passed.clear()
    assert cli.main(["doctor"]) in (0, 1) and len(runs) == 1  # reused
    assert cli.main(["doctor", "--recheck"]) in (0, 1) and len(runs) == 2  # asked to run it again


def test_a_damaged_or_untrusted_verdict_is_rerun_never_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _counting_probe(monkeypatch)
    state = tmp_path / "state"
    system = probe({})
    compiler = _compiler(path=shutil.which("sh") or "/bin/sh")
    ident = selfcheck.identity(system, compiler)
    record = state / "selfcheck" / f"{ident}.json"
    good = selfcheck.check(system, compiler, "g++", state)
    assert good.ok and len(runs) == 1 and record.is_file()
    valid = record.read_text()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(valid)

    def damage(how: str) -> None:
        record.unlink(missing_ok=True)
        body = json.loads(valid)
        if how == "garbage":
            record.write_text("{not json")
        elif how == "not an object":
            record.write_text("[true]")
        elif how == "other identity":
            record.write_text(json.dumps({**body, "identity": "0" * 32}))
        elif how == "ok as a string":
            record.write_text(json.dumps({**body, "ok": "yes"}))
        elif how == "from the future":
            record.write_text(json.dumps({**body, "when": body["when"] + 86400}))
        elif how == "too old":
            record.write_text(json.dumps({**body, "when": body["when"] - 31 * 86400}))
        elif how == "symlink":
            record.symlink_to(elsewhere)
        elif how == "group-writable":
            record.write_text(valid)
            record.chmod(0o620)
        elif how == "another owner":
            record.write_text(valid)
            os.chown(record, 65534, 65534)
        elif how == "a fifo":
            os.mkfifo(record)
        elif how == "huge":
            record.write_text(valid[:-1] + ', "pad": "' + "x" * 20000 + '"}')

    cases = [
        "garbage",
        "not an object",
        "other identity",
        "ok as a string",
        "from the future",
        "too old",
        "symlink",
        "group-writable",
        "a fifo",
        "huge",
    ] + (["another owner"] if os.geteuid() == 0 else [])
    for n, how in enumerate(cases, start=2):
        damage(how)
        selfcheck._passed.clear()
        again = selfcheck.check(system, compiler, "g++", state)
        assert again.ok and not again.cached and len(runs) == n, how
        # replaced
        assert not record.is_symlink() and json.loads(record.read_text())["identity"] == ident, how
        assert elsewhere.read_text() == valid  # a link's target is never written
    # an untrusted folder: not read, not written; the probe runs every time
    (state / "selfcheck").chmod(0o777)
    for _ in range(2):
        selfcheck._passed.clear()
        assert not selfcheck.check(system, compiler, "g++", state).cached
    assert len(runs) == len(cases) + 3
    assert oct((state / "selfcheck").stat().st_mode & 0o777) == oct(0o777)


def test_a_failure_is_reused_only_by_those_who_waited_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jitops.store import verdicts

    runs = _counting_probe(monkeypatch, ok=False)
    system, compiler, state = probe({}), _compiler(path="/bin/sh"), tmp_path / "state"
    ident = selfcheck.identity(system, compiler)
    t = time.time()
    first = selfcheck.check(system, compiler, "g++", state)
    assert not first.ok and len(runs) == 1
    data = verdicts.read(state, ident, since=t - 1)  # a process that was waiting when it was found
    assert data is not None and data["ok"] is False and "SIGABRT" in data["detail"]
    assert (
        verdicts.read(state, ident, since=time.time() + 1) is None
        and verdicts.read(state, ident) is None
    )
    # a later process checks again
    assert not selfcheck.check(system, compiler, "g++", state).ok and len(runs) == 2


def test_a_waiter_waits_a_bounded_time_and_an_unusable_state_dir_only_costs_a_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from jitops.store import verdicts

    runs = _counting_probe(monkeypatch)
    system, compiler, state = probe({}), _compiler(path="/bin/sh"), tmp_path / "state"
    ident = selfcheck.identity(system, compiler)
    got: list[selfcheck.Result] = []
    with verdicts.probing(state, ident, 10):  # another prober holds the lock and never finishes
        waiter = threading.Thread(
            target=lambda: got.append(selfcheck.check(system, compiler, "g++", state, wait=0.5))
        )
        t = time.monotonic()
        waiter.start()
        waiter.join(30)
        assert not waiter.is_alive() and time.monotonic() - t < 20
    # gave up waiting, probed itself
    assert got and got[0].ok and not got[0].cached and len(runs) == 1

    blocked = tmp_path / "state-file"
    blocked.write_text("not a folder")
    for _ in range(2):
        selfcheck._passed.clear()
        assert selfcheck.check(system, compiler, "g++", blocked).ok
    assert len(runs) == 3 and blocked.read_text() == "not a folder"


def test_the_state_dir_is_a_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import platformdirs

    assert (
        Settings.from_env({"JITOPS_STATE_DIR": str(tmp_path / "s")}).state_root() == tmp_path / "s"
    )
    monkeypatch.chdir(tmp_path)
    assert Settings.from_env({"JITOPS_STATE_DIR": "rel"}).state_root() == tmp_path / "rel"
    assert Settings.from_env({}).state_root() == Path(
        platformdirs.user_state_dir("jitops", appauthor=False)
    )
    # the test session's own (conftest), never the home's
    assert Settings.from_env().state_root() != Path(
        platformdirs.user_state_dir("jitops", appauthor=False)
    )
    assert any(v.startswith("JITOPS_STATE_DIR=") for v in Settings.from_env().shown())


# ------------------------------------------------------------------ real compiler


@pytest.mark.compile
@needs_gxx
def test_sound_toolchain_passes_once_and_is_remembered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = probe({})
    compiler = _compiler(path=os.path.realpath(shutil.which("g++")), driver="g++")
    state = tmp_path / "state"
    first = selfcheck.check(system, compiler, shutil.which("g++"), state)
    assert first.ok and not first.cached, first.detail
    records = list((state / "selfcheck").glob("*.json"))
    assert len(records) == 1 and json.loads(records[0].read_text())["ok"] is True
    print(f"self-check cost: {first.seconds:.1f} s")

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("the probe ran again")

    monkeypatch.setattr(selfcheck, "run_probe", boom)
    selfcheck._passed.clear()  # as a fresh process: only the record on disk remains
    second = selfcheck.check(system, compiler, shutil.which("g++"), state)
    assert second.ok and second.cached


@pytest.mark.process
@pytest.mark.timeout(480)
@needs_gxx
def test_crashing_toolchain_fails_doctor_and_get_refuses_and_publishes_nothing(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    env = child_env(
        CXX=str(crashing_cxx(tmp_path)),
        JITOPS_CACHE_DIR=str(cache),
        JITOPS_BUILDER=None,
        JITOPS_OFFLINE=None,
        JITOPS_STATE_DIR=str(tmp_path / "state"),
    )
    doctor = subprocess.run(
        [sys.executable, "-m", "jitops", "doctor"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    line = next(ln for ln in doctor.stdout.splitlines() if "self-check" in ln)
    assert line.startswith("FAIL") and "crashing-g++" in line and "SIGABRT" in line, doctor.stdout
    assert "unset CXX" in doctor.stdout and "torch.__config__.show()" in doctor.stdout

    out = run_scenario("scenarios_inert.get_or_refusal", name="add", env=env, timeout=240)
    assert "REFUSED" in out and "crashing-g++" in out and "crash the process" in out, out
    assert "unset CXX" in out and "torch.__config__.show()" in out
    # the build ran beside the probe, but the refusal came before its publish: no entry, no staging
    # dir left
    assert not list((cache / "v1" / "entries").glob("**/manifest.json"))
    assert not (cache / "v1" / "staging").exists() or not os.listdir(cache / "v1" / "staging")
    out = run_scenario(
        "scenarios_inert.get_or_refusal",
        name="add",
        env={**env, "JITOPS_OFFLINE": "1"},
        timeout=240,
    )
    assert "OfflineMiss" in json.dumps(out), out  # nothing a later process could load


def counting_cxx(folder: Path, log: Path) -> Path:
    """g++, which appends a line to ``log`` each time it is asked to build the self-check's probe."""
    wrapper = folder / "counting-g++"
    wrapper.write_text(
        f'#!/bin/sh\ncase "$*" in *probe.cpp*) echo "$$" >> {log} ;; esac\nexec g++ "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


@pytest.mark.process
@pytest.mark.timeout(480)
@needs_gxx
def test_eight_processes_on_a_cold_machine_run_the_self_check_once(tmp_path: Path) -> None:
    """Eight real processes (two cache roots, one state dir, all cold) race to their first build: one probe is
    built; the others wait for its verdict and reuse it."""
    log, ready = tmp_path / "probes.log", tmp_path / "ready"
    ready.mkdir()
    cxx = counting_cxx(tmp_path, log)
    procs = [
        subprocess.Popen(
            scenario_argv("scenarios_selfcheck.selfcheck_race", ready_dir=str(ready), count=8),
            env=child_env(
                CXX=str(cxx),
                JITOPS_CACHE_DIR=str(tmp_path / f"cache{i % 2}"),
                JITOPS_STATE_DIR=str(tmp_path / "state"),
                JITOPS_BUILDER=None,
                JITOPS_OFFLINE=None,
            ),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(8)
    ]
    try:
        outs = [p.communicate(timeout=420) for p in procs]
    finally:
        for p in procs:
            p.kill()
    replies = [last_json(out) for out, _ in outs]
    assert all(r.get("ok") is True for r in replies), (replies, [err[-2000:] for _, err in outs])
    probes = log.read_text().splitlines() if log.exists() else []
    assert len(probes) == 1, f"{len(probes)} probe builds: {probes}"
    assert sum(1 for r in replies if r["cached"]) == 7, replies
