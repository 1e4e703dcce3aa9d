"""The PCH never lands on the user's wait (issue 29 item 1) and PCHs + objects are bounded (item 4).

Small plain-C++ libraries (``#include <vector>``, ``<string>``: a compile takes ~0.2 s, their PCH ~1 s) through
``build.build`` with the real g++, behind a wrapper that sleeps before any PCH compile (``-x c++-header``): a
slow PCH step. The build must return before that PCH exists; a build meanwhile compiles without it; the next
one uses it; the process that asked may exit at once; the child is bounded and leaves nothing behind.
"""

from __future__ import annotations

import ctypes
import json
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from jitops.store import cache, admin as cache_admin, parts as cache_parts
from jitops.build import pch_bg, pch_marks
from jitops.target import toolchain
from jitops.build import runner as build
from jitops.base.settings import Settings
from tests.helpers import REPO, child_env, run_scenario, scenario_argv, stop_background_pchs

pytestmark = pytest.mark.timeout(300)

SRC = (
    "#include <vector>\n#include <string>\n"
    'extern "C" __attribute__((visibility("default"))) int f() {{ std::vector<int> v{{{n}}}; '
    'return v[0] + (int)std::string("ab").size(); }}\n'
)


def _slow_cxx(tmp_path: Path, delay: float) -> Path:
    """g++, but a PCH compile first sleeps ``delay`` seconds (the slow step the user must not wait for)."""
    script = tmp_path / "cxx"
    script.write_text(
        '#!/bin/sh\ncase "$*" in *c++-header*) sleep ' + str(delay) + ' ;; esac\nexec g++ "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _gated_cxx(tmp_path: Path) -> tuple[Path, Path]:
    """g++, but a PCH compile waits (at most 2 min) until the file ``gate`` exists: a build that waited for its PCH
    would hang until the test opens it."""
    gate, script = tmp_path / "gate", tmp_path / "cxx"
    script.write_text(
        f'#!/bin/sh\ncase "$*" in *c++-header*) i=0; while [ ! -e {gate} ] && [ $i -lt 1200 ]; '
        'do sleep 0.1; i=$((i+1)); done ;; esac\nexec g++ "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, gate


def _job(
    tmp_path: Path,
    cxx: Path,
    store: cache.Cache,
    n: int,
    background: bool = True,
    library: str = "bg",
    pressure: float = 1.0,
) -> build.BuildJob:
    root = tmp_path / ("lib" if library == "bg" else library)
    root.mkdir(exist_ok=True)
    (root / "f.cpp").write_text(SRC.format(n=n))
    build_dir = tmp_path / f"build{library}{n}"
    build_dir.mkdir()
    return build.BuildJob(
        library=library,
        target="cpu-test",
        device="cpu",
        namespace=f"jitops_{library}_{n:016d}",
        sources=(root / "f.cpp",),
        include_dirs=(root,),
        cflags=("-O1",),
        cuda_cflags=(),
        ldflags=(),
        cxx=str(cxx),
        ninja=toolchain.find_ninja("bg"),
        nvcc=None,
        build_dir=build_dir,
        env=dict(os.environ),
        jobs=2,
        cache=store,
        root=root,
        identity=json.dumps({"compiler": "gcc"}),
        pch="gcc",
        pch_build=True,
        pch_background=background,
        pch_max_size=1 << 30,
        pch_pressure=pressure,
    )


def _state(tmp_path: Path, cxx: Path, store: cache.Cache, n: int) -> str:
    result = build.build(_job(tmp_path, cxx, store, n), None)
    assert ctypes.CDLL(str(result.library)).f() == n + 2
    return str(result.timings["files"]["f.cpp"]["pch"])


def _published(store: cache.Cache) -> list[Path]:
    return [p for p in store.pch.iterdir() if p.is_dir()] if store.pch.is_dir() else []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _assert_idle_priority(pid: int) -> None:
    """The child and its compile take only CPU time nothing else wants (pch_bg.yield_cpu)."""
    deadline = time.monotonic() + 60
    while not pch_bg._below(pid) and time.monotonic() < deadline:  # its compile has started
        time.sleep(0.05)
    tree = [pid, *pch_bg._below(pid)]
    assert len(tree) >= 2, tree
    for p in tree:
        assert os.getpriority(os.PRIO_PROCESS, p) == pch_bg.NICE == 19
        assert os.sched_getscheduler(p) == os.SCHED_IDLE
        group = Path(f"/proc/{p}/autogroup")
        if group.exists():  # where Linux groups by session, the session's nice counts, not its own
            assert group.read_text().split()[-1] == "19", group.read_text()


@pytest.fixture(autouse=True)
def _no_child_left() -> Any:
    """Each test starts with no background child of this process and leaves none: under a loaded
    machine (CI's workers) they run on idle CPU time only and could outlive their test. Those that
    tests of other files left running in this process are stopped: no test here uses their PCHs."""
    assert stop_background_pchs(pch_bg, 60)
    yield
    assert pch_bg.wait(120)


def yield_and_report(lead: bool) -> dict[str, object]:
    """Scenario (a fresh process): yield the CPU, as a session leader or not; what it got."""
    if lead:
        os.setsid()
    pch_bg.yield_cpu()
    # empty where the session is in the kernel's default group (e.g. pid 1's session in a container)
    words = Path("/proc/self/autogroup").read_text().split()
    return {
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "idle": os.sched_getscheduler(0) == os.SCHED_IDLE,
        "group": words[-1] if words else None,
    }


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no autogroups here")
def test_yielding_never_lowers_a_session_it_does_not_lead() -> None:
    """A process that is not its session's leader (here: a plain child of the test's session) lowers
    its own priority only: the autogroup is the whole session, the user's processes included."""
    before = Path("/proc/self/autogroup").read_text()
    got = run_scenario("test_pch_background.yield_and_report", lead=False, timeout=120)
    assert got.get("nice") == 19 and got.get("idle") is True, got
    assert Path("/proc/self/autogroup").read_text() == before
    # a session leader (as spawn's child is) lowers its own session, which holds nothing else
    led = run_scenario("test_pch_background.yield_and_report", lead=True, timeout=120)
    assert led.get("group") == "19" and Path("/proc/self/autogroup").read_text() == before


def test_a_spawned_child_is_lowered_before_it_runs_its_own_code() -> None:
    """The parent puts a new background child on idle CPU time right after starting it: its own
    start-up (Python, jitops's imports) never competes with the build that spawned it."""
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == os.nice(0)  # as this process
        pch_bg._lower(child.pid)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == pch_bg.NICE == 19
        assert os.sched_getscheduler(child.pid) == os.SCHED_IDLE
        group = Path(f"/proc/{child.pid}/autogroup")
        if group.exists():  # its own session's group, nothing else in it
            assert group.read_text().split()[-1] == "19", group.read_text()
    finally:
        child.kill()
        child.wait()


def test_settings_turn_background_pchs_off_and_set_the_cap() -> None:
    assert Settings().pch_background is True and Settings().pch_max_size == 1 << 30
    s = Settings.from_env({"JITOPS_PCH_BACKGROUND": "0", "JITOPS_PCH_MAX_SIZE": "2G"})
    assert (s.pch_background, s.pch_max_size) == (False, 2 << 30)
    assert Settings.from_env({"JITOPS_PCH_MAX_SIZE": "0"}).pch_max_size == 0
    with pytest.raises(ValueError, match="JITOPS_PCH_MAX_SIZE='lots'.*Fix"):
        Settings.from_env({"JITOPS_PCH_MAX_SIZE": "lots"})
    assert Settings.from_env({}).pch_pressure == 0.25
    assert Settings.from_env({"JITOPS_PCH_PRESSURE": "0"}).pch_pressure == 0.0
    assert Settings.from_env({"JITOPS_PCH_PRESSURE": "1"}).pch_pressure == 1.0
    for bad in ("1.5", "-0.1", "nan", "most"):
        with pytest.raises(ValueError, match="JITOPS_PCH_PRESSURE=.*fraction from 0 to 1.*Fix"):
            Settings.from_env({"JITOPS_PCH_PRESSURE": bad})


def _busy_loops(n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` CPU-bound programs (bounded), each in a session of its own, as another user's are."""
    argv = scenario_argv("scenarios_pch.spin", seconds=120)
    loops = [
        subprocess.Popen(argv, cwd=REPO, env=child_env(), start_new_session=True) for _ in range(n)
    ]
    time.sleep(0.5)  # started: their imports are CPU work too
    return loops


def _stop(loops: list[subprocess.Popen[bytes]]) -> None:
    for p in loops:
        p.kill()
        p.wait()


def test_contention_reads_the_cpus_pressure_and_none_where_there_is_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    since = pch_bg.cpu_waited()
    if since is None:
        pytest.skip("this system keeps no CPU pressure (/proc/pressure/cpu)")
    loops = _busy_loops((os.cpu_count() or 1) + 1)  # one more than the cores: some always wait
    try:
        time.sleep(1.0)
        share = pch_bg.contention(since)
    finally:
        _stop(loops)
    assert share is not None and share > 0.5, share
    monkeypatch.setattr(pch_bg, "PRESSURE", str(tmp_path / "none"))
    assert pch_bg.cpu_waited() is None and pch_bg.contention(since) is None
    (tmp_path / "junk").write_text("some avg10=0.00\n")
    monkeypatch.setattr(pch_bg, "PRESSURE", str(tmp_path / "junk"))
    assert pch_bg.cpu_waited() is None


@pytest.mark.compile
def test_a_build_on_contended_cpus_defers_its_pch_and_the_next_build_decides_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A child started while other programs keep every core busy would never run, and, runnable,
    would slow the user's next compiles: the build says ``deferred`` and starts none."""
    if pch_bg.cpu_waited() is None:
        pytest.skip("this system keeps no CPU pressure (/proc/pressure/cpu)")
    store, cxx = cache.Cache(tmp_path / "cache"), _slow_cxx(tmp_path, 0)
    assert _state(tmp_path, cxx, store, 1) == "first use"
    loops = _busy_loops((os.cpu_count() or 1) + 1)
    try:
        with caplog.at_level("INFO", logger="jitops"):
            result = build.build(_job(tmp_path, cxx, store, 2, pressure=0.25), None)
        assert ctypes.CDLL(str(result.library)).f() == 4
        assert result.timings["files"]["f.cpp"]["pch"] == "deferred"
        assert pch_bg.running() == [] and _published(store) == []
        assert "not started: programs waited for a CPU" in caplog.text
    finally:
        _stop(loops)
    # nothing remembers the deferral: the next build decides again (here: always start)
    assert _state(tmp_path, cxx, store, 3) == "background" and len(pch_bg.running()) == 1
    assert pch_bg.wait(120) and len(_published(store)) == 1


@pytest.mark.compile
def test_first_edit_returns_before_the_pch_then_the_next_edit_uses_it(tmp_path: Path) -> None:
    store, (cxx, gate) = cache.Cache(tmp_path / "cache"), _gated_cxx(tmp_path)
    assert _state(tmp_path, cxx, store, 1) == "first use"
    # the first edit: compiled without, PCH after
    assert _state(tmp_path, cxx, store, 2) == "background"
    assert _published(store) == []  # it returned while its PCH's compile waits at the gate
    (pid,) = pch_bg.running()
    _assert_idle_priority(pid)
    assert _state(tmp_path, cxx, store, 3) == "busy"  # an edit meanwhile compiles without it
    assert _published(store) == [] and _alive(pid)
    gate.touch()
    assert pch_bg.wait(120) and not _alive(pid)
    (folder,) = _published(store)
    assert (folder / "prefix.h.gch").is_file() and (folder / "manifest.json").is_file()
    assert _state(tmp_path, cxx, store, 4) == "hit"
    info = build.build(_job(tmp_path, cxx, store, 5), None).timings["files"]["f.cpp"]
    # the build's summary line shows the size of the PCH it used
    assert info["pch"] == "hit" and info["pch_bytes"] == (folder / "prefix.h.gch").stat().st_size
    log = (store.logs / f"pch-{folder.name[:12]}.log").read_text()
    assert "published" in log
    assert not list(store.staging.iterdir())  # no half PCH left anywhere


@pytest.mark.process
def test_the_process_exits_without_waiting_and_the_child_is_bounded(tmp_path: Path) -> None:
    """A process that built exits at once; its detached child finishes on its own (here: killed at its bound),
    publishes nothing half made, and leaves no process behind."""
    store, cxx = cache.Cache(tmp_path / "cache"), _slow_cxx(tmp_path, 120)
    build.build(_job(tmp_path, cxx, store, 1), None)  # first use
    report = run_scenario(
        "test_pch_background.build_then_exit",
        tmp=str(tmp_path),
        cxx=str(cxx),
        root=str(store.root),
        timeout=120,
    )
    assert report["state"] == "background" and len(report["pids"]) == 1, report
    pid = report["pids"][0]
    # the process that built has exited; its PCH child still runs (bounded to 20 s here)
    assert _alive(pid)
    deadline = time.monotonic() + 60
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    # bounded: killed its compile after 20 s (not the 120 s step), cleaned up, exited
    assert not _alive(pid)
    assert _published(store) == [] and not list(store.staging.iterdir())
    stray = subprocess.run(["pgrep", "-f", str(cxx)], capture_output=True, text=True).stdout.split()
    assert stray == [], stray  # no compiler (nor the sleep of the wrapper's shell) left running
    assert "stopped, nothing published" in next(store.logs.glob("pch-*.log")).read_text()


def build_then_exit(tmp: str, cxx: str, root: str) -> dict[str, object]:
    """Scenario (a fresh process): the first edit with a PCH child bounded to 20 s; returns without waiting."""
    pch_bg.LIMIT = 20.0
    r = build.build(_job(Path(tmp), Path(cxx), cache.Cache(Path(root)), 2), None)
    return {"state": r.timings["files"]["f.cpp"]["pch"], "pids": pch_bg.running()}


@pytest.mark.compile
def test_jitops_pch_background_0_builds_it_beside_as_before(tmp_path: Path) -> None:
    store, cxx = cache.Cache(tmp_path / "cache"), _slow_cxx(tmp_path, 0)
    build.build(_job(tmp_path, cxx, store, 1, background=False), None)
    result = build.build(_job(tmp_path, cxx, store, 2, background=False), None)
    assert result.timings["files"]["f.cpp"]["pch"] == "built" and len(_published(store)) == 1
    assert pch_bg.running() == []


def _age(paths: list[Path], seconds: float) -> None:
    t = time.time() - seconds
    for p in paths:
        os.utime(p, (t, t), follow_symlinks=False)
        if p.is_dir():
            for q in p.iterdir():
                os.utime(q, (t, t), follow_symlinks=False)


@pytest.mark.compile
def test_the_default_cap_prunes_least_recently_used_pchs_and_objects(tmp_path: Path) -> None:
    """Two PCHs and their objects; a cap between their sizes keeps the one used last, never an entry."""
    store, cxx = cache.Cache(tmp_path / "cache"), _slow_cxx(tmp_path, 0)
    for n in (1, 2):  # first use, then the PCH (built beside: deterministic)
        build.build(_job(tmp_path, cxx, store, n, background=False), None)
    (old,) = _published(store)
    (tmp_path / "lib" / "f.cpp").unlink()
    other = SRC.replace("#include <string>\n", "#include <string>\n#include <map>\n")
    for n in (3, 4):  # another prefix: a second PCH
        job = _job(tmp_path, cxx, store, n, background=False)
        (tmp_path / "lib" / "f.cpp").write_text(other.format(n=n))
        build.build(job, None)
    new = next(p for p in _published(store) if p != old)
    # the first PCH, every object: an hour idle
    _age([*store.pch.glob(old.name + "*"), *store.objects.iterdir()], 3600)
    # idle longer than prune's grace, used after the rest
    _age([*store.pch.glob(new.name + "*")], 1200)
    size_new = cache_parts.tree_size(new)
    total = cache_admin.parts_size(store)
    assert total > size_new + cache_parts.tree_size(old) > 0
    # under the cap: one stat per file, nothing removed
    assert cache_admin.cap_parts(store, total + 1) is None
    removed = cache_admin.cap_parts(store, size_new + 4096)
    assert removed is not None and _published(store) == [new]
    assert cache_admin.parts_size(store) <= size_new + 4096
    assert {p.kind for p in removed.parts_removed} == {"pch", "object"} and removed.removed == []


@pytest.mark.compile
def test_the_cap_never_evicts_what_a_build_just_stored(tmp_path: Path) -> None:
    """Kept parts (used within the grace) over the cap: the automatic cap leaves this edit's objects alone."""
    store, cxx = cache.Cache(tmp_path / "cache"), _slow_cxx(tmp_path, 0)
    for n in (1, 2):
        build.build(_job(tmp_path, cxx, store, n, background=False), None)
    objects = sorted(store.objects.iterdir())
    assert objects and _published(store)
    removed = cache_admin.cap_parts(store, 1)  # far over the cap, everything fresh
    assert removed is not None and removed.parts_removed == [], removed.parts_removed
    assert sorted(store.objects.iterdir()) == objects


@pytest.mark.compile
def test_cache_ls_shows_each_kinds_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from jitops import cli

    store, cxx = cache.Cache(tmp_path / "cache"), _slow_cxx(tmp_path, 0)
    for n in (1, 2):
        build.build(_job(tmp_path, cxx, store, n, background=False), None)
    (store.logs / "x.log").parent.mkdir(parents=True, exist_ok=True)
    (store.logs / "x.log").write_bytes(b"x" * 5000)
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(store.root))
    assert cli.main(["cache", "ls"]) == 0
    out = capsys.readouterr().out
    kinds = {
        ln.split()[0]: ln
        for ln in out.splitlines()
        if ln.startswith(("entries ", "objects ", "pch ", "staging ", "logs "))
    }
    assert set(kinds) == {"entries", "objects", "pch", "staging", "logs"}, out
    assert "4.9 KiB" in kinds["logs"] and " 1 " in kinds["pch"]


@pytest.mark.compile
def test_one_pch_per_prefix_and_flags_is_shared_by_every_library(tmp_path: Path) -> None:
    """Another library (its own name, folder and namespace) with the same header prefix and flags uses the PCH
    the first one made, on its very first build: the key leaves out the library's name and folder."""
    store, cxx = cache.Cache(tmp_path / "cache"), _slow_cxx(tmp_path, 0)
    for n in (1, 2):
        build.build(_job(tmp_path, cxx, store, n, background=False), None)
    assert len(_published(store)) == 1
    result = build.build(_job(tmp_path, cxx, store, 7, library="other"), None)
    assert ctypes.CDLL(str(result.library)).f() == 9
    assert result.timings["files"]["f.cpp"]["pch"] == "hit" and len(_published(store)) == 1


def test_a_child_never_remakes_a_cache_that_is_gone(tmp_path: Path) -> None:
    """The parent's private temporary cache is removed at its exit; the detached child (whose argv names that
    path, so another user could make it first) does nothing there and creates nothing."""
    gone = tmp_path / "jitops-cache-gone"
    spec = {
        "cache": str(gone),
        "key": "k" * 64,
        "limit": 5,
        "max_size": 0,
        "kind": "gcc",
        "cxx": "g++",
        "flags": ["-O2"],
        "prefix": ["#include <cstddef>"],
        "root": str(tmp_path),
    }
    # a child: it renices itself
    done = run_scenario("scenarios_pch.background_child", spec=spec, timeout=120)
    assert done["code"] == 0 and any("gone or unsafe" in line for line in done["log"]), done
    assert not gone.exists()


@pytest.mark.compile
def test_a_prefix_that_does_not_compile_as_a_pch_is_not_retried_after_every_build(
    tmp_path: Path,
) -> None:
    """A compiler that fails every PCH compile (the files themselves compile): the child's failure leaves a mark,
    the next builds compile without a PCH and start no child until the mark is a day old."""
    script = tmp_path / "cxx"
    script.write_text(
        '#!/bin/sh\ncase "$*" in *c++-header*) echo "error: no PCH here" >&2; exit 1 ;; esac\n'
        'exec g++ "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    store = cache.Cache(tmp_path / "cache")
    assert _state(tmp_path, script, store, 1) == "first use"
    assert _state(tmp_path, script, store, 2) == "background"
    assert pch_bg.wait(120) and _published(store) == []
    (mark,) = store.pch.glob("*.failed")
    assert _state(tmp_path, script, store, 3) == "refused" and pch_bg.running() == []
    old = time.time() - pch_marks.RETRY_AFTER - 60  # a day later it is tried again
    os.utime(mark, (old, old))
    assert _state(tmp_path, script, store, 4) == "background"
    assert pch_bg.wait(120) and mark.stat().st_mtime > old  # failed again: the mark renewed
    # the mark is the key's part
    assert {p.kind for p in cache_parts.pchs(store, time.time())} == {"pch"}


@pytest.mark.parametrize(
    ("status", "log", "marked"),
    [
        # the compiler refused it
        (
            "1",
            "prefix.h:1:10: fatal error: mine.h: No such file or directory\n",
            True,
        ),
        # the OOM killer: may pass later
        (
            "1",
            "g++: fatal error: Killed signal terminated program cc1plus\n",
            False,
        ),
        ("1", "fatal error: cannot write PCH file: No space left on device\n", False),
        ("4", "internal compiler error: Segmentation fault\n", False),
        ("0", "", False),
    ],
)
def test_only_the_compilers_refusal_marks_a_prefix(
    tmp_path: Path, status: str, log: str, marked: bool
) -> None:
    """In a cache that has no v1/pch yet (a stable or builtin build's); a killed compiler, a full disk or an ICE is
    no reason to go without a PCH for a day."""
    store = cache.Cache(tmp_path / "cache")
    out = tmp_path / "out"
    out.mkdir()
    (out / pch_marks.STATUS).write_text(status + "\n")
    (out / "pch.log").write_text(log)
    assert pch_marks.mark_refused(store, "k" * 64, out) is marked
    assert pch_marks.refused(store, "k" * 64) is marked
    link = cache.Cache(tmp_path / "linked")  # never written through a link at v1/pch
    link.base.mkdir(parents=True)
    link.pch.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert (
        pch_marks.mark_refused(link, "k" * 64, out) is False
        and not (tmp_path / "elsewhere").exists()
    )
