"""Builds killed at random moments never block or break a later get().

Real signals on real processes: SIGKILL, SIGTERM and SIGINT (KeyboardInterrupt)
land at random moments of the build and the publish; afterwards no compiler
is left running, and the next ``get()`` in the same cache succeeds with no
cleanup, within the build time + 5 s.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import child_env, run_scenario

pytestmark = pytest.mark.process


@pytest.mark.slow
@pytest.mark.timeout(540)
def test_kill_fuzz_fake_builder(tmp_path: Path) -> None:
    """200 SIGKILL + 30 SIGTERM + 30 SIGINT; every following get() succeeds.

    Half the signals come at a random moment of a full get(); a quarter as soon as the
    compile has started, a quarter once the entry is published. So each phase is hit
    however loaded the machine is (a random moment alone hits "published" less often
    when builds run slower than the calibration). The publish steps themselves are
    hit on purpose by test_sigkill_at_each_publish_step."""
    res = run_scenario(
        "scenarios_kill.kill_fuzz",
        root=str(tmp_path),
        seed=20261121,
        kills=200,
        terms=30,
        ints=30,
        env=child_env(JITOPS_BUILDER="fake"),
        timeout=520,
    )
    rows = res["rows"]
    assert len(rows) == 260
    failed = [r for r in rows if not r["ok"]]
    assert not failed, "\n".join(repr(r) for r in failed[:3])
    assert [r for r in rows if r["orphans"]] == []
    assert max(r["after_s"] for r in rows) <= res["full"] + 5
    assert sum(r["sig"] == 9 for r in rows) >= 200
    # SIGINT/SIGTERM victims end promptly (KeyboardInterrupt unwinds, SIGTERM terminates).
    assert max(r["exited_in"] for r in rows if r["sig"] != 9) < 2.0
    phases = {
        p: sum(r["phase"] == p for r in rows)
        for p in ("before-build", "building", "publishing", "published")
    }
    print("kill phases:", phases, "full get", res["full"])
    assert phases["building"] >= 60 and phases["published"] >= 60, phases


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", ["SIGINT", "SIGKILL", "SIGTERM"])
def test_signal_during_long_build(tmp_path: Path, sig: str) -> None:
    """A 30 s build: Ctrl-C returns within 2 s with BuildInterrupted; no signal leaves a compiler running."""
    r = run_scenario(
        "scenarios_kill.signal_during_long_build",
        cache=str(tmp_path / "c"),
        sig=sig,
        env=child_env(JITOPS_BUILDER="fake"),
    )
    assert r["running"], "the build was running when the signal came"
    assert r["orphans"] == []
    assert r["after"]["ok"] and r["after"]["value"]["works"] and r["after"]["value"]["built"]
    assert r["after_s"] < 5
    if sig == "SIGINT":
        assert r["exited_in"] < 2.0
        assert r["victim"]["type"] == "BuildInterrupted", r["victim"]
        assert {"KeyboardInterrupt", "JitopsError"} <= set(r["victim"]["mro"])
        assert "fakeadd" in r["victim"]["msg"]
    else:
        assert r["victim"]["type"] == "died"


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_kills_during_real_builds(tmp_path: Path) -> None:
    """Real compiler: SIGKILL, SIGINT, SIGKILL, SIGKILL mid-build in one cache, then a clean get().

    After each signal no compiler is left within 2 s, and the next get() starts
    compiling at once (no stale lock). The last one completes within its build
    time + 5 s. The killed compilers' temp files (gcc's cc*.s) stay in the
    cache's staging dirs: the process's own $TMPDIR receives none.
    """
    systmp = tmp_path / "systmp"
    systmp.mkdir()
    r = run_scenario(
        "scenarios_kill.kills_during_real_builds",
        cache=str(tmp_path / "c"),
        seed=7,
        sigs=["SIGKILL", "SIGINT", "SIGKILL", "SIGKILL"],
        env=child_env(JITOPS_BUILDER=None, TMPDIR=str(systmp)),
        timeout=390,
    )
    assert not [p.name for p in systmp.iterdir() if p.name.startswith("cc")], (
        "compiler temp files leaked into $TMPDIR"
    )
    for row in r["rows"]:
        assert row["compiling"], row
        assert row["orphans"] == [], row
        assert row["started_in"] < 10, row  # no stale lock held the next get() back
    sigint = [row for row in r["rows"] if row["sig"] == 2]
    assert sigint and sigint[0]["victim"] == "BuildInterrupted" and sigint[0]["exited_in"] < 2.0
    assert r["final"]["ok"] and r["final"]["value"]["works"] and r["final"]["value"]["built"], r[
        "final"
    ]
    assert r["final_s"] <= r["build_seconds"] + 5
    print("real kills:", r["rows"], "final get", r["final_s"], "build", r["build_seconds"])


@pytest.mark.timeout(120)
def test_sigkill_at_each_publish_step(tmp_path: Path) -> None:
    """Random kills rarely land inside the millisecond-long publish, so kill there on purpose:
    a worker SIGKILLs itself at each step (audit hook), then the next get() must succeed."""
    rows = run_scenario(
        "scenarios_kill.sigkill_at_each_publish_step",
        root=str(tmp_path),
        env=child_env(JITOPS_BUILDER="fake"),
    )
    assert len(rows) == 5
    for r in rows:
        assert r["victim"] == "died", r  # the kill happened at that step
        assert r["after"]["ok"] and r["after"]["value"]["works"], r
    assert [r["phase"] for r in rows] == [
        "building",
        "building",
        "building",
        "publishing",
        "published",
    ]
    assert [r["after"]["value"]["built"] for r in rows] == [True, True, True, True, False]
