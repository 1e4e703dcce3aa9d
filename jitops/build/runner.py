"""Running one build. No policy here: the loader decides what and where.

The real builder writes a ninja file with torch's own flags (:mod:`jitops.ninja`)
and runs ninja under :mod:`jitops._supervise`, in a fresh process group that
dies with its parent. ``cpp_extension.load`` cannot do that: it runs ninja in-process, in a
shared directory whose lock file outlives a killed build.

``JITOPS_BUILDER=fake`` (a test seam) swaps in a builder that compiles a tiny
C library with ``cc`` in milliseconds. It is a real, loadable library; tests
pair it with specs whose kernels are registered from Python.

A job that carries a cache (``publish`` gives one to every real build) is built file by file by
:mod:`jitops.build.tubuild`: cached objects, precompiled headers, and timings (``BuildResult.timings``).

Imports: errors, job (BuildJob, BuildResult); build_errors, fsutil, ninja, stable, tubuild lazily, on a build.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import BuildError, BuildInterrupted, ConfigError, SourcesChanged, ToolchainError
from .job import BuildJob, BuildResult

log = logging.getLogger("jitops")

SUPERVISOR = Path(__file__).parent.parent / "base" / "_supervise.py"
NO_SPACE_MARKER = "No space left on device"


def default_jobs(max_jobs: int | None = None) -> int:
    """``max_jobs`` (settings.jobs: MAX_JOBS), else cores capped by available memory (one compile ~1.5 GB)."""
    if max_jobs:
        return max_jobs
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    try:
        with open("/proc/meminfo") as f:
            avail_kb = next(int(ln.split()[1]) for ln in f if ln.startswith("MemAvailable:"))
        by_mem = max(1, int(avail_kb / (1.5 * 1024 * 1024)))
    except (OSError, StopIteration, ValueError):
        by_mem = cores
    return max(1, min(cores, by_mem))


# ---------------------------------------------------------------- running


# Supervisors started ahead of their commands by the main thread: (owner pid, process). A build
# then waits for no Python start-up, which costs most on a busy machine. Only the main thread
# starts them (the kernel signals a supervisor when the thread that started it ends, and the main
# thread lives as long as the process); any thread takes one, so a build's parallel compiles do.
_spares: list[tuple[int, subprocess.Popen[bytes]]] = []
_spares_lock = threading.Lock()
SPARES = 2  # a compile beside the link: what one edit of a several-file library runs


def _start_supervisor() -> subprocess.Popen[bytes]:
    """A supervisor waiting for its command on stdin (see _supervise.py)."""
    return subprocess.Popen(
        [sys.executable, "-I", "-S", str(SUPERVISOR), str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _request(cmd: Sequence[str], cwd: Path, env: dict[str, str]) -> bytes:
    """A command for a supervisor's stdin: cwd, argument count, arguments, environment, each
    NUL-separated."""
    fields = [os.fsencode(cwd), str(len(cmd)).encode(), *map(os.fsencode, cmd)]
    fields += [os.fsencode(f"{k}={v}") for k, v in env.items()]
    return b"\0".join(fields)


def _take_spare() -> subprocess.Popen[bytes] | None:
    """A live spare of this process's, or None."""
    with _spares_lock:
        while _spares:
            owner, proc = _spares.pop()
            if owner == os.getpid() and proc.poll() is None:
                return proc
            _close_pipes(proc)
    return None


def _supervised(cmd: Sequence[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A supervisor running ``cmd``: a spare when there is a live one, else a new one."""
    spare = _take_spare()
    for proc in (spare, None):
        proc = proc or _start_supervisor()
        assert proc.stdin is not None
        try:
            proc.stdin.write(_request(cmd, cwd, env))
            proc.stdin.close()
            return proc
        except OSError:  # the spare died since (a new one is started once)
            kill_group(proc)
            if proc is not spare:
                raise
    raise AssertionError("unreachable")


def _make_spares() -> None:
    """On the main thread, after a command or a build: the next supervisors start while the user
    reads."""
    if threading.current_thread() is not threading.main_thread():
        return
    with _spares_lock:
        missing = SPARES - len(_spares)
        with contextlib.suppress(OSError):
            for _ in range(missing):
                _spares.append((os.getpid(), _start_supervisor()))


def _close_pipes(proc: subprocess.Popen[bytes]) -> None:
    for pipe in (proc.stdin, proc.stdout):
        with contextlib.suppress(OSError):
            if pipe is not None:
                pipe.close()


def _drop_spares() -> None:
    """At exit: the spares get no command and exit. In a forked child, which must not use its
    parent's: only the child's copies of their pipes are closed (the parent's keep them waiting)."""
    with _spares_lock:
        spares = list(_spares)
        _spares.clear()
    for owner, proc in spares:
        _close_pipes(proc)
        if owner == os.getpid():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(2)


def _after_fork_in_child() -> None:
    """A forked child starts with a free lock (a fork while another thread held it would leave it
    held) and none of its parent's spares."""
    global _spares_lock
    _spares_lock = threading.Lock()
    _drop_spares()


atexit.register(_drop_spares)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def run_supervised(
    cmd: Sequence[str],
    *,
    cwd: Path,
    env: dict[str, str],
    on_line: Callable[[str], None] | None = None,
) -> tuple[int, str]:
    """Run ``cmd`` in its own process group under the supervisor.

    Returns (exit code, merged output). On any exception in this process
    (KeyboardInterrupt included) the whole group is killed before it
    propagates, so Ctrl-C returns at once and leaves no compiler behind.
    """
    proc = _supervised(cmd, cwd, env)
    chunks: list[str] = []
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace")
            chunks.append(line)
            if on_line is not None:
                on_line(line)
        rc = proc.wait()
    except BaseException:
        kill_group(proc)
        raise
    proc.stdout.close()
    _make_spares()
    return rc, "".join(chunks)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop a supervised build: SIGTERM lets the supervisor kill every process below it
    (ninja runs each compile in a process group of its own); SIGKILL of its group is the fallback."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=1.5)
    except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    if proc.stdout is not None:
        proc.stdout.close()


class _Checked:
    """``run_supervised`` that asks the job, after each run, whether its sources changed meanwhile, and
    raises SourcesChanged if so: out of the per-file build, so no object or PCH of that run is cached."""

    def __init__(self, job: BuildJob) -> None:
        self.job = job
        self.asked = False

    def __call__(
        self,
        cmd: Sequence[str],
        *,
        cwd: Path,
        env: dict[str, str],
        on_line: Callable[[str], None] | None = None,
    ) -> tuple[int, str]:
        rc, out = run_supervised(cmd, cwd=cwd, env=env, on_line=on_line)
        self.check()
        return rc, out

    def check(self) -> None:
        self.asked = True
        why = self.job.sources_changed() if self.job.sources_changed is not None else None
        if why is not None:
            raise SourcesChanged(
                f"library {self.job.library!r}: {why} while it was compiled; nothing was published"
            )


# What the builders run their commands with (``build`` sets a _Checked for each job).
_RUN: contextvars.ContextVar[Callable[..., tuple[int, str]]] = contextvars.ContextVar(
    "jitops_run", default=run_supervised
)


# ---------------------------------------------------------------- builders


def real_build(
    job: BuildJob, on_line: Callable[[str], None] | None = None
) -> tuple[int, str, Path]:
    from .ninja import unalias, write_ninja_file

    run = _RUN.get()
    if job.cache is not None:
        from .tubuild import build_tus

        rc, out, lib, timings = build_tus(job, run, on_line)
        _TIMINGS[id(job)] = timings
        return rc, out, lib

    _, aliases = write_ninja_file(job)
    rc, out = run(
        [job.ninja, "-v", "-j", str(job.jobs)], cwd=job.build_dir, env=job.env, on_line=on_line
    )
    if rc == 0:
        _TIMINGS[id(job)] = {"inputs": _read_by(job)}
    return rc, unalias(out, aliases), job.build_dir / f"{job.library}.so"


def _read_by(job: BuildJob) -> dict[str, str]:
    """What a plain ninja build's compiles and link read: every dependency file it left."""
    from ..store import inputs

    files = [f for d in sorted(job.build_dir.glob("*.d")) for f in inputs.read_depfile(d)]
    return inputs.record(files, job.root, (*job.pinned, str(job.build_dir)), job.build_dir)


_FAKE_C = """\
/* jitops fake build of {library} for {target} */
__attribute__((visibility("default"))) const char jitops_fake_namespace[] = "{namespace}";
__attribute__((visibility("default"))) int jitops_fake_loaded = 0;
__attribute__((constructor)) static void jitops_fake_init(void) {{ jitops_fake_loaded = 1; }}
"""


def fake_build(
    job: BuildJob, on_line: Callable[[str], None] | None = None
) -> tuple[int, str, Path]:
    """Test seam: a tiny but real shared library, built by ``cc`` in ~50 ms.

    ``job.fake_seconds`` (JITOPS_FAKE_BUILD_SECONDS) stretches it (the compiler runs that long
    under the supervisor) to widen windows for kill and race tests.
    """
    src = job.build_dir / "fake.c"
    src.write_text(_FAKE_C.format(library=job.library, target=job.target, namespace=job.namespace))
    out = job.build_dir / f"{job.library}.so"
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise ToolchainError("the fake builder needs `cc` on PATH")
    delay = job.fake_seconds
    code = (
        "import subprocess,sys,time;"
        f"time.sleep({delay!r});"
        f"sys.exit(subprocess.call([{cc!r},'-shared','-fPIC','-O0','-o',{str(out)!r},{str(src)!r}]))"
    )
    rc, text = _RUN.get()(
        [sys.executable, "-I", "-S", "-c", code], cwd=job.build_dir, env=job.env, on_line=on_line
    )
    _TIMINGS[id(job)] = {"inputs": {}}  # it reads nothing but what it generated
    return rc, text, out


# Where this context's builds also send each line of output as it comes (the drop-in's
# verbose=True), or None.
LIVE: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "jitops_live", default=None
)
# id(job) -> timings of its build, with what it read as "inputs", until build() takes them
_TIMINGS: dict[int, dict[str, Any]] = {}


def stable_build(
    job: BuildJob, on_line: Callable[[str], None] | None = None
) -> tuple[int, str, Path]:
    # torch's stable C ABI: one supervised compile-and-link, no ninja
    from .stable import (
        build as one_command,
    )

    rc, out, lib, timings = one_command(job, _RUN.get(), on_line)
    _TIMINGS[id(job)] = timings
    return rc, out, lib


BUILDERS: dict[str, Callable[..., tuple[int, str, Path]]] = {
    "real": real_build,
    "fake": fake_build,
    "stable": stable_build,
}


def build(
    job: BuildJob, log_path: Path | None, on_line: Callable[[str], None] | None = None
) -> BuildResult:
    """Run the build; return the library path, or raise BuildError (its full log kept at ``log_path``)."""
    builder = BUILDERS.get(job.builder)
    if builder is None:
        raise ConfigError(
            f"cannot build {job.library!r}: JITOPS_BUILDER={job.builder!r} is not a builder. Fix: set it to one of "
            f"{sorted(BUILDERS)} or unset it"
        )
    start = time.monotonic()
    on_line = on_line if on_line is not None else LIVE.get()
    run = _Checked(job)
    token = _RUN.set(run)
    try:
        rc, out, lib = builder(job, on_line)
        _make_spares()  # its commands may all have run on other threads
    except KeyboardInterrupt as e:
        raise BuildInterrupted(
            f"build of {job.library!r} for {job.target} interrupted; the compiler was stopped and nothing was cached"
        ) from e
    finally:
        _RUN.reset(token)
        timings = _TIMINGS.pop(id(job), {})
        read = timings.pop("inputs", None)
        if read is None and job.builder not in ("real", "stable"):
            read = {}  # a test seam's builder: it reads nothing of the user's
    seconds = time.monotonic() - start
    if not run.asked:  # a builder that ran nothing through ``run`` (a test's): ask now
        run.check()
    if rc != 0 or not lib.is_file():
        from .build_errors import format_build_error

        kept = _keep_log(log_path, out)
        raise BuildError(
            format_build_error(job, rc, out, kept),
            op=job.library,
            target=job.target,
            log=out,
            log_path=kept,
        )
    return BuildResult(lib, out, seconds, timings, read)


def _keep_log(path: Path | None, text: str) -> Path | None:
    from ..base import fsutil

    if path is None or not fsutil.may_hold(path.parent):  # never written through a link
        return None
    try:
        fsutil.makedirs(path.parent)
        fsutil.atomic_write(path, text.encode())
        return path
    except OSError:
        return None
