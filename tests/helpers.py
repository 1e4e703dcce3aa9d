"""Helpers for tests that run scenarios (functions of tests/scenarios*.py) in fresh Python processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
NOBODY = 65534  # the unprivileged uid that permission tests drop to

# Device parametrization: the cuda case carries the cuda marker (skipped without a GPU).
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]


def stop_background_pchs(pch_bg: Any, timeout: float) -> bool:
    """Stop the background PCH builds this process started and wait up to `timeout` s for them to
    end; whether none is left. SIGTERM kills the compile and publishes nothing: waiting for them
    instead would raise them from idle priority to finish PCHs no test will use."""
    for pid in pch_bg.running():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    return bool(pch_bg.wait(timeout))


def child_env(**overrides: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    for k, v in overrides.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def scenario_argv(scenario: str, /, *, python: str | None = None, **kwargs: Any) -> list[str]:
    """The command line that runs scenario function ``scenario(**kwargs)`` (see tests/scenario_main.py).

    With ``python`` (another interpreter, e.g. a venv with jitops installed from a wheel) the runner
    is started as a script, so the checkout is not on its path; ``scenario`` then names a module of
    tests/ that imports only what that interpreter has."""
    if python is not None:
        return [python, str(REPO / "tests" / "scenario_main.py"), scenario, json.dumps(kwargs)]
    return [sys.executable, "-m", "tests.scenario_main", scenario, json.dumps(kwargs)]


def run_scenario_proc(
    scenario: str,
    /,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    check: bool = True,
    **kwargs: Any,
) -> subprocess.CompletedProcess[str]:
    """Run ``scenario(**kwargs)`` in a fresh interpreter; the finished process (raise if it failed and ``check``)."""
    proc = subprocess.run(
        scenario_argv(scenario, **kwargs),
        env=env or child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"scenario {scenario} exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc


def run_scenario(
    scenario: str, /, *, env: dict[str, str] | None = None, timeout: float = 300, **kwargs: Any
) -> Any:
    """Run ``scenario(**kwargs)`` in a fresh interpreter (``fn`` of tests/scenarios.py, or ``module.fn`` of
    tests/<module>.py); its JSON reply."""
    return last_json(run_scenario_proc(scenario, env=env, timeout=timeout, **kwargs).stdout)


def last_json(stdout: str) -> Any:
    """The last line of a child's stdout, parsed as JSON (children report that way)."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    assert lines, "child printed nothing"
    return json.loads(lines[-1])


def tattletale_library(folder: Path, marker: Path, mode: int = 0o600) -> Path:
    """A real shared library whose constructor creates ``marker`` if it is ever loaded.

    Tests plant it where jitops must refuse to load; the marker proves whether its code ran.
    """
    src = folder / "tattle.c"
    src.write_text(
        "#include <fcntl.h>\n#include <unistd.h>\n"
        "__attribute__((constructor)) static void tattle(void) {"
        f' int fd = open("{marker}", O_CREAT | O_WRONLY, 0{mode:o}); if (fd >= 0) close(fd); }}\n'
    )
    lib = folder / "libtattle.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def run_as_nobody(
    views: Path, scenario: str, env: dict[str, str], /, *, timeout: float = 280, **kwargs: Any
) -> Any:
    """Run ``scenario(**kwargs)`` as uid NOBODY in a private mount namespace (see tests/scenarios_nobody.py,
    which makes ``views`` hold the bind mounts it needs); its JSON reply. Raise with its output if it fails."""
    views.mkdir(mode=0o755, parents=True, exist_ok=True)
    argv = scenario_argv(
        "scenarios_nobody.as_nobody", base=str(views), scenario=scenario, kwargs=kwargs
    )
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"child exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return last_json(proc.stdout)


@dataclass(frozen=True)
class Proc:
    """One live process, as /proc shows it (``cwd`` and ``argv`` are "" where unreadable)."""

    pid: int
    comm: str
    state: str
    ppid: int
    pgid: int
    cwd: str
    argv: str  # NULs as spaces


def processes() -> list[Proc]:
    """Every process /proc lists now, zombies left out: the one /proc walker the tests share."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] == "Z":  # exited, waiting to be reaped by its parent
            continue
        try:
            cwd = os.readlink(f"/proc/{d}/cwd")
            argv = (
                Path(f"/proc/{d}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
            )
        except OSError:
            cwd = argv = ""
        out.append(Proc(int(d), comm, fields[0], int(fields[1]), int(fields[2]), cwd, argv))
    return out


@contextlib.contextmanager
def environ(**values: str | None) -> Iterator[None]:
    """Set (or, with None, remove) environment variables for the block, then restore them."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
