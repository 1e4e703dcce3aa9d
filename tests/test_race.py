"""Cold races: many processes and threads want one op that is not built yet.

Exactly one of them builds it; every one gets a working op and all load the
same file (same sha256). Workers are real processes (forked from one warm
interpreter, plus a round of fresh interpreters), released at one instant.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.helpers import child_env, last_json, run_scenario, scenario_argv

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]


def _check_round(replies: list[dict], n: int) -> None:
    assert len(replies) == n, "every worker reported"
    bad = [r for r in replies if not r["ok"] or r["exit"] != 0]
    assert not bad, bad[:3]
    values = [r["value"] for r in replies]
    assert all(v["works"] for v in values)
    assert sum(v["built"] for v in values) == 1, "exactly one build per round"
    assert len({v["sha256"] for v in values}) == 1, "every process loaded the same library"
    assert len({v["entry"] for v in values}) == 1


@pytest.mark.slow
@pytest.mark.parametrize("n", [8, 16, 32])
def test_cold_race_processes(tmp_path: Path, n: int) -> None:
    rounds = 4
    rounds = run_scenario(
        "scenarios_race.race_rounds",
        base=str(tmp_path),
        rounds=rounds,
        n=n,
        env=child_env(JITOPS_BUILDER="fake", JITOPS_FAKE_BUILD_SECONDS="0.3"),
    )
    assert len(rounds) == 4
    for replies in rounds:
        _check_round(replies, n)
    for r in range(4):
        entries = list((tmp_path / f"round{r}" / "v1" / "entries" / "fakeadd").glob("*/*"))
        assert len(entries) == 1, entries


def test_cold_race_fresh_interpreters(tmp_path: Path) -> None:
    """4 independent interpreters (no fork), started together through a gate file."""
    import subprocess

    gate = tmp_path / "go"
    env = child_env(
        JITOPS_BUILDER="fake", JITOPS_FAKE_BUILD_SECONDS="0.5", JITOPS_CACHE_DIR=str(tmp_path / "c")
    )
    argv = scenario_argv("scenarios_race.get_after_gate", gate=str(gate))
    procs = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    time.sleep(1.0)
    gate.touch()
    replies = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        replies.append({"ok": True, "exit": 0, "value": last_json(stdout)})
    _check_round(replies, 4)


@pytest.mark.compile
@pytest.mark.slow
def test_cold_race_real_compiler(tmp_path: Path) -> None:
    """The real compiler: 4 processes race for softmax in an empty cache; one build."""
    replies = run_scenario(
        "scenarios_race.race_in",
        cache=str(tmp_path / "c"),
        n=4,
        name="softmax",
        worker_timeout=280,
        timeout=290,
    )
    _check_round(replies, 4)


def test_threads_one_build_same_object(tmp_path: Path) -> None:
    r = run_scenario(
        "scenarios_race.threads_one_build",
        n=16,
        env=child_env(
            JITOPS_BUILDER="fake",
            JITOPS_FAKE_BUILD_SECONDS="0.3",
            JITOPS_CACHE_DIR=str(tmp_path / "c"),
        ),
    )
    assert r == {"n": 16, "errors": [], "ids": 1, "builds": 1, "works": True, "alive": 0}


def test_forked_children_after_load(tmp_path: Path, session_cache: Path) -> None:
    """DataLoader-style workers forked from a process that loaded ops get and call them."""
    replies = run_scenario(
        "scenarios_race.forked_after_load",
        timeout=280,
        env=child_env(JITOPS_BUILDER=None, JITOPS_CACHE_DIR=str(session_cache)),
    )
    assert [r["ok"] and r["exit"] == 0 and r["value"]["works"] for r in replies] == [True] * 3, (
        replies
    )
    # softmax and fakeadd come from the parent's memo; fakemul is new to every process (maybe
    # cached).
    assert [r["value"]["subprocesses"] for r in replies[:2]] == [0, 0]


def test_fork_while_a_thread_builds(tmp_path: Path) -> None:
    """A child forked while a parent thread holds the build lock gets the op, no deadlock."""
    r = run_scenario(
        "scenarios_race.fork_while_a_thread_builds",
        env=child_env(
            JITOPS_BUILDER="fake",
            JITOPS_FAKE_BUILD_SECONDS="2",
            JITOPS_CACHE_DIR=str(tmp_path / "c"),
        ),
    )
    assert r["building"], "the fork was not taken during the build"
    assert r["ok"] and r["exit"] == 0 and r["value"]["works"], r
