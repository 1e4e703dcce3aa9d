"""The build supervisor started ahead of its command (runner's spare).

After a command of the main thread's, the next supervisor is started at once and waits for its
command on stdin, so the next build does not wait for a Python start-up. These tests run real
supervisors (and real ``sh`` commands under them) in fresh processes: the spare runs the next
command in the folder and environment asked for, a dead spare is replaced, a forked child never
uses its parent's, and a spare dies with the process that started it.
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
    """Scenario: three commands in a row; the spare's pid, what each printed and its exit code."""
    from jitops.build import runner

    started: list[str] = []
    sys.addaudithook(_started(started))
    env = dict(os.environ, X="one", CODE="0")
    first = runner.run_supervised(SHOW, cwd=Path(folder), env=env)
    assert runner._spare is not None
    spare = runner._spare[1].pid
    before = len(started)
    second = runner.run_supervised(SHOW, cwd=Path(folder) / "sub", env=dict(env, X="two", CODE="3"))
    started_by_second = len(started) - before  # the spare made after it, and nothing else
    assert runner._spare is not None
    runner._spare[1].kill()  # a spare that died before its command: a new one runs it
    runner._spare[1].wait()
    third = runner.run_supervised(SHOW, cwd=Path(folder), env=dict(env, X="three"))
    return {
        "spare": spare,
        "outputs": [first, second, third],
        "started_by_second": started_by_second,
    }


def forked_child_has_no_spare() -> dict[str, Any]:
    """Scenario: after a command, fork; whether the child sees a spare, and whether the parent's
    spare still runs a command."""
    from jitops.build import runner

    runner.run_supervised(["true"], cwd=Path("/"), env=dict(os.environ))
    assert runner._spare is not None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its parent's spare is not its own
        os.write(w, b"none" if runner._spare is None else b"some")
        os._exit(0)
    os.close(w)
    seen = os.read(r, 16).decode()
    os.waitpid(pid, 0)
    rc, out = runner.run_supervised(SHOW, cwd=Path("/"), env=dict(os.environ, X="p", CODE="0"))
    return {"child_saw": seen, "rc": rc, "out": out}


def spare_then_wait() -> None:
    """Scenario: one command, print the spare's pid, then wait to be killed."""
    import json

    from jitops.build import runner

    runner.run_supervised(["true"], cwd=Path("/"), env=dict(os.environ))
    assert runner._spare is not None
    print(json.dumps({"spare": runner._spare[1].pid}), flush=True)
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
    assert (rc1, out1.split()[1:]) == (0, ["one", str(tmp_path)])
    # the second command ran under the spare (its parent), in its own folder and environment
    assert (rc2, out2.split()) == (3, [str(got["spare"]), "two", str(tmp_path / "sub")])
    assert got["started_by_second"] == 1
    assert (rc3, out3.split()[1:]) == (0, ["three", str(tmp_path)])


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
        spare = last_json(child.stdout.readline())["spare"]
        assert not _gone(spare)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        deadline = time.monotonic() + 10
        while not _gone(spare) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(spare), f"spare {spare} outlived its parent"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
