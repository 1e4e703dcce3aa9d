"""Build supervisors started ahead of their commands (runner's spares).

After a command or a build on the main thread, the next supervisors are started at once and wait
for their commands on stdin, so the next build does not wait for a Python start-up. These tests
run real supervisors (and real ``sh`` commands under them) in fresh processes: a spare runs the next
command in the folder and environment asked for, a dead spare is replaced, a worker thread takes
one but starts none, a forked child never uses its parent's, and spares die with their process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO, child_env, last_json, run_scenario, scenario_argv

pytestmark = [pytest.mark.process, pytest.mark.timeout(120)]

SHOW = ["sh", "-c", 'echo "$PPID $X $(pwd)"; exit "$CODE"']


def _started(log: list[str]) -> Any:
    """An audit hook that lists each supervisor this process starts."""

    def hook(event: str, args: Any) -> None:
        if event == "subprocess.Popen" and "_supervise.py" in str(args[1]):
            log.append(str(args[1]))

    return hook


def spare_runs_the_next_command(folder: str) -> dict[str, Any]:
    """Scenario: three commands in a row; the spares' pids, what each printed and its exit code."""
    from jitops.build import runner

    started: list[str] = []
    sys.addaudithook(_started(started))
    env = dict(os.environ, X="one", CODE="0")
    first = runner.run_supervised(SHOW, cwd=Path(folder), env=env)
    spares = [p.pid for _, p in runner._spares]
    before = len(started)
    second = runner.run_supervised(SHOW, cwd=Path(folder) / "sub", env=dict(env, X="two", CODE="3"))
    started_by_second = len(started) - before  # the spare made after it, and nothing else
    for _, proc in runner._spares:  # spares that died before their command: a new one runs it
        proc.kill()
        proc.wait()
    third = runner.run_supervised(SHOW, cwd=Path(folder), env=dict(env, X="three"))
    return {
        "spares": spares,
        "outputs": [first, second, third],
        "started_by_second": started_by_second,
    }


def a_thread_takes_a_spare() -> dict[str, Any]:
    """Scenario: the main thread runs a command (its spares start); a worker thread then runs two;
    which supervisors ran them, and which spares are left and alive afterwards."""
    import threading

    from jitops.build import runner

    env = dict(os.environ, X="t", CODE="0")
    runner.run_supervised(["true"], cwd=Path("/"), env=env)
    made = [p.pid for _, p in runner._spares]
    outs: list[Any] = []
    worker = threading.Thread(
        target=lambda: outs.extend(
            runner.run_supervised(SHOW, cwd=Path("/"), env=env) for _ in range(2)
        )
    )
    worker.start()
    worker.join(60)
    left = [p.pid for _, p in runner._spares]
    return {
        "made": made,
        "ran_under": [int(out.split()[0]) for _, out in outs],
        "left": left,
        "alive": [p.poll() is None for _, p in runner._spares],
    }


def forked_child_has_no_spare() -> dict[str, Any]:
    """Scenario: after a command, fork; whether the child sees a spare, and whether the parent's
    spares still run a command."""
    from jitops.build import runner

    runner.run_supervised(["true"], cwd=Path("/"), env=dict(os.environ))
    assert runner._spares
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its parent's spares are not its own
        os.write(w, b"none" if not runner._spares else b"some")
        os._exit(0)
    os.close(w)
    seen = os.read(r, 16).decode()
    os.waitpid(pid, 0)
    rc, out = runner.run_supervised(SHOW, cwd=Path("/"), env=dict(os.environ, X="p", CODE="0"))
    return {"child_saw": seen, "rc": rc, "out": out}


def spare_then_wait() -> None:
    """Scenario: one command, print the spares' pids, then wait to be killed."""
    import json

    from jitops.build import runner

    runner.run_supervised(["true"], cwd=Path("/"), env=dict(os.environ))
    print(json.dumps({"spares": [p.pid for _, p in runner._spares]}), flush=True)
    time.sleep(100)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_the_spare_runs_the_next_command_where_and_as_asked(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    got = run_scenario("test_supervisor.spare_runs_the_next_command", folder=str(tmp_path))
    (rc1, out1), (rc2, out2), (rc3, out3) = got["outputs"]
    assert len(got["spares"]) == 2
    assert (rc1, out1.split()[1:]) == (0, ["one", str(tmp_path)])
    # the second command ran under a spare (its parent), in its own folder and environment
    ppid, *rest = out2.split()
    assert rc2 == 3 and int(ppid) in got["spares"] and rest == ["two", str(tmp_path / "sub")]
    assert got["started_by_second"] == 1
    assert (rc3, out3.split()[1:]) == (0, ["three", str(tmp_path)])


def test_a_worker_thread_takes_the_main_threads_spares_and_makes_none() -> None:
    """Spares are started by the main thread only (the kernel would signal one whose starting
    thread ended) and taken by any thread: a build's parallel compiles get them."""
    got = run_scenario("test_supervisor.a_thread_takes_a_spare")
    assert len(got["made"]) == 2 and got["left"] == [] and got["alive"] == []
    assert sorted(got["ran_under"]) == sorted(got["made"])


def test_a_forked_child_never_uses_its_parents_spare() -> None:
    got = run_scenario("test_supervisor.forked_child_has_no_spare")
    assert got["child_saw"] == "none"
    assert got["rc"] == 0 and got["out"].split()[1:] == ["p", "/"]


def test_a_spare_dies_with_the_process_that_started_it() -> None:
    child = subprocess.Popen(
        scenario_argv("test_supervisor.spare_then_wait"),
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        spares = last_json(child.stdout.readline())["spares"]
        assert spares and not any(_gone(p) for p in spares)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        deadline = time.monotonic() + 10
        while not all(_gone(p) for p in spares) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_gone(p) for p in spares), f"spares {spares} outlived their parent"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
