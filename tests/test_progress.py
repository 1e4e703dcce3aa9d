"""Build progress: a ticking line in a terminal (a real pty), display updates in Jupyter, nothing otherwise.

These use the fake builder (a real ``cc`` build stretched to ~1.6 s), so no
kernel is compiled.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO, child_env, scenario_argv

pytestmark = pytest.mark.process


# The child: tests/scenarios_inert.py:build_progress_demo, on the source folder.
def _build(source: Path) -> list[str]:
    return scenario_argv("scenarios_inert.build_progress_demo", root=str(source))


def _env(cache: Path, progress: str | None = None) -> dict[str, str]:
    return child_env(
        JITOPS_CACHE_DIR=str(cache),
        JITOPS_BUILDER="fake",
        JITOPS_FAKE_BUILD_SECONDS="1.6",
        JITOPS_PROGRESS=progress,
    )


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    root.mkdir()
    (root / "k.cpp").write_text("// progress test\n")
    return root


def _run_with_stderr_on_a_pty(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        args, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: every writer closed the pty
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    out = proc.stdout.read().decode() if proc.stdout else ""
    return proc.wait(timeout=60), out, b"".join(chunks).decode()


@pytest.mark.timeout(120)
def test_terminal_shows_a_ticking_line_then_the_result(tmp_path: Path, source: Path) -> None:
    rc, out, tty = _run_with_stderr_on_a_pty(_build(source), _env(tmp_path / "c1"))
    assert rc == 0, tty
    result = json.loads(out.strip().splitlines()[-1])
    assert result["built"] is True
    what = f"progress_demo for {result['target']}"
    ticks = re.findall(rf"\r\x1b\[Kjitops: building {what} \.\.\. (\d+\.\d)s", tty)
    assert len(ticks) >= 3, repr(tty)  # 1.6 s at one tick per 0.5 s, plus the first line
    assert [float(t) for t in ticks] == sorted(float(t) for t in ticks)
    assert re.search(rf"\r\x1b\[Kjitops: built {what} \.\.\. (\d+\.\d)s\r?\n$", tty), repr(tty)

    # A cache hit shows nothing; JITOPS_PROGRESS=0 silences a build even on a terminal.
    rc, out, tty = _run_with_stderr_on_a_pty(_build(source), _env(tmp_path / "c1"))
    assert rc == 0 and json.loads(out.strip().splitlines()[-1])["built"] is False and tty == ""
    rc, out, tty = _run_with_stderr_on_a_pty(_build(source), _env(tmp_path / "c2", progress="0"))
    assert rc == 0 and json.loads(out.strip().splitlines()[-1])["built"] is True and tty == ""


@pytest.mark.timeout(120)
def test_not_interactive_prints_nothing(tmp_path: Path, source: Path) -> None:
    proc = subprocess.run(
        _build(source),
        cwd=REPO,
        env=_env(tmp_path / "c"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["built"] is True
    assert proc.stderr == ""


@pytest.mark.timeout(240)
def test_jupyter_cell_shows_a_live_updating_display(
    tmp_path: Path, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbformat
    from nbclient import NotebookClient

    for k, v in _env(tmp_path / "c").items():
        monkeypatch.setenv(k, v)  # the kernel inherits this environment
    # A cell must be code: it calls the scenario function and prints its reply.
    code = (
        f"import json\nfrom tests.scenarios_inert import build_progress_demo\n"
        f"print(json.dumps(build_progress_demo({str(source)!r})), flush=True)\n"
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    messages: list[tuple[str, dict[str, Any]]] = []

    class Recording(NotebookClient):
        def process_message(self, msg: dict[str, Any], cell: Any, cell_index: int) -> Any:
            messages.append((msg["msg_type"], msg["content"]))
            return super().process_message(msg, cell, cell_index)

    Recording(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    ).execute()
    shown = [
        c["data"]["text/plain"] for t, c in messages if t in ("display_data", "update_display_data")
    ]
    # one display, updated in place
    assert [t for t, _ in messages if t == "display_data"] == ["display_data"]
    assert len(shown) >= 4, shown
    assert all(s.startswith("jitops: building progress_demo for ") for s in shown[:-1]), shown
    assert re.fullmatch(r"jitops: built progress_demo for \S+ \.\.\. \d+\.\ds", shown[-1]), shown
    outputs = nb.cells[0].outputs
    assert (
        outputs[0]["output_type"] == "display_data"
        and outputs[0]["data"]["text/plain"] == shown[-1]
    )
    assert json.loads(outputs[-1]["text"])["built"] is True
    assert not any(o.get("name") == "stderr" for o in outputs), outputs


def test_warm_display_in_a_terminal_shows_each_library_and_a_failure_whole(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``jitops warm``'s display when forced to a terminal: a live line while libraries build,
    cleared before each result line; a failure's first line on its result line and the rest of its
    message after it, on stderr."""
    import time
    from types import SimpleNamespace

    from jitops.base.progress import WarmDisplay

    def outcome(name: str, status: str, message: str) -> Any:
        task = SimpleNamespace(what=f"{name} for cpu", spec=SimpleNamespace(name=name))
        return SimpleNamespace(task=task, status=status, message=message, target="cpu", seconds=1.0)

    built = outcome("softmax", "built", "")
    failed = outcome("add", "failed", "add.cpp:3: error: expected ';'\n   3 | return y\n")
    live = re.compile(r"jitops warm \[0/2\] softmax for cpu \d+s, add for cpu \d+s")
    drawn = ""
    with WarmDisplay(2, forced=True) as display:
        display.start(built.task)
        display.start(failed.task)
        deadline = time.monotonic() + 30  # the live line is drawn every 0.5 s
        while not live.search(drawn) and time.monotonic() < deadline:
            time.sleep(0.1)
            drawn += capsys.readouterr().err
        display.finish(built)
        display.finish(failed)
    out, err = capsys.readouterr()
    assert live.search(drawn), drawn
    assert out.splitlines() == [
        "[1/2] built   softmax for cpu (1.0s)",
        "[2/2] failed  add for cpu (1.0s): add.cpp:3: error: expected ';'",
    ]
    assert "   3 | return y" in err and err.endswith("\r\033[K")
