"""Running one build. No policy here: the loader decides what and where.

The real builder asks ``torch.utils.cpp_extension`` to write the ninja file
(so flags, include paths and libraries are torch's own) and runs ninja itself
under :mod:`jitops._supervise`, in a fresh process group that dies with its
parent. ``cpp_extension.load`` cannot do that: it runs ninja in-process, in a
shared directory whose lock file outlives a killed build.

``JITOPS_BUILDER=fake`` (a test seam) swaps in a builder that compiles a tiny
C library with ``cc`` in milliseconds. It is a real, loadable library; tests
pair it with specs whose kernels are registered from Python.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import torchcompat
from .errors import BuildError, BuildInterrupted, ConfigError, ToolchainError

log = logging.getLogger("jitops")

SUPERVISOR = Path(__file__).with_name("_supervise.py")
_ERROR_RE = re.compile(r"^(?P<file>[^:\s][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)?\s*(?:fatal )?error\b[:\s]?(?P<msg>.*)$")
_NVCC_ERROR_RE = re.compile(r"^(?P<file>[^(\s][^(]*)\((?P<line>\d+)\): error:?\s*(?P<msg>.*)$")
# What GCC, clang, collect2 and the kernel's messages say when the OOM killer
# took a compiler or linker (both end as SIGKILL), or when memory ran out.
_OOM_MARKERS = ("Killed signal terminated program", "internal compiler error: Killed", "virtual memory exhausted",
                "out of memory allocating", "cannot allocate memory", "unable to execute command: Killed",
                "terminated with signal 9")
NO_SPACE_MARKER = "No space left on device"
MAX_ERROR_LINES = 40
MAX_LINE_CHARS = 200  # template errors can run to thousands of characters


@dataclass(frozen=True)
class BuildJob:
    """Everything one build needs, already decided."""

    library: str
    target: str
    device: str
    namespace: str
    sources: tuple[Path, ...]
    include_dirs: tuple[Path, ...]
    cflags: tuple[str, ...]
    cuda_cflags: tuple[str, ...]
    ldflags: tuple[str, ...]
    cxx: str
    ninja: str
    nvcc: str | None
    build_dir: Path
    env: dict[str, str] = field(repr=False)
    jobs: int = 1

    @property
    def library_file(self) -> str:
        return f"lib{self.library}.so"


@dataclass(frozen=True)
class BuildResult:
    library: Path
    log: str
    seconds: float


def default_jobs(environ: dict[str, str] | None = None) -> int:
    """MAX_JOBS, else cores capped by available memory (one compile ~1.5 GB)."""
    env = os.environ if environ is None else environ
    if env.get("MAX_JOBS", "").isdigit() and int(env["MAX_JOBS"]) > 0:
        return int(env["MAX_JOBS"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open("/proc/meminfo") as f:
            avail_kb = next(int(ln.split()[1]) for ln in f if ln.startswith("MemAvailable:"))
        by_mem = max(1, int(avail_kb / (1.5 * 1024 * 1024)))
    except (OSError, StopIteration, ValueError):
        by_mem = cores
    return max(1, min(cores, by_mem))


# ---------------------------------------------------------------- running


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
    argv = [sys.executable, "-I", "-S", str(SUPERVISOR), str(os.getpid()), *cmd]
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
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


# ---------------------------------------------------------------- errors


def error_sites(log_text: str, limit: int = 3) -> list[tuple[str, int, int | None, str]]:
    """(file, line, column or None, message) of the first compiler errors, one per line of source."""
    found: list[tuple[str, int, int | None, str]] = []
    for line in log_text.splitlines():
        m = _ERROR_RE.match(line.strip()) or _NVCC_ERROR_RE.match(line.strip())
        if not m:
            continue
        file, lineno = m.group("file"), int(m.group("line"))
        if any(f == file and n == lineno for f, n, _, _ in found):
            continue
        col = m.groupdict().get("col")
        found.append((file, lineno, int(col) if col else None, m.group("msg").strip()))
        if len(found) >= limit:
            break
    return found


def _excerpt(path: str, line: int, col: int | None = None, context: int = 2) -> list[str]:
    """A few numbered source lines around ``line``, marked with '>' (and a caret under ``col``)."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return []
    if not 1 <= line <= len(lines):
        return []
    lo, hi = max(1, line - context), min(len(lines), line + context)
    out = []
    for n in range(lo, hi + 1):
        text = lines[n - 1].expandtabs(8)[:MAX_LINE_CHARS]  # gcc counts display columns, tabs to 8
        out.append(f"  {'>' if n == line else ' '} {n:5d} | {text}".rstrip())
        if n == line and col is not None and 1 <= col <= len(text) + 1:
            out.append(f"          | {' ' * (col - 1)}^")
    return out


def format_build_error(job: BuildJob, rc: int, log_text: str, log_path: Path | None) -> str:
    """One screen: what failed, the first error(s) with file:line and source, where the log is."""
    head = f"building op library {job.library!r} for {job.target} failed"
    lines = [head]
    oom = any(m in log_text for m in _OOM_MARKERS) or rc in (-9, 137)
    if oom:
        lines.append(
            "  the compiler was killed, most likely by the out-of-memory killer. "
            f"Fix: lower parallel compiles with MAX_JOBS=1 (this build used -j{job.jobs}) or free memory."
        )
    errors = [] if oom else error_sites(log_text, limit=2)
    for file, line, col, msg in errors:
        if len(msg) > MAX_LINE_CHARS:
            msg = msg[: MAX_LINE_CHARS - 3] + "..."
        lines.append(f"{file}:{line}{f':{col}' if col else ''}: error: {msg}")
        lines.extend(_excerpt(file, line, col))
    if not errors:
        tail = [ln for ln in log_text.splitlines() if ln.strip()][-12:]
        lines.append(f"  (exit code {rc}; no compiler error line found; last output:)")
        lines.extend("  " + ln[:MAX_LINE_CHARS] for ln in tail)
    else:
        first = errors[0][0]
        if os.path.abspath(first).startswith(str(Path(__file__).parent) + os.sep):
            lines.append("Fix: this error is in jitops's own kernel source: please report it with the full log")
        else:
            lines.append(f"Fix: correct the first error above ({os.path.basename(first)}:{errors[0][1]}) and run again")
    if log_path is not None:
        lines.append(f"full log: {log_path}")
    if len(lines) > MAX_ERROR_LINES:
        lines = lines[: MAX_ERROR_LINES - 1] + [lines[-1]]
    return "\n".join(lines)


# ---------------------------------------------------------------- builders


def _ninja_escape_path(p: str) -> str:
    return p.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


_CUDA_HOME_LOCK = threading.Lock()


@contextlib.contextmanager
def _cuda_home(ce: Any, nvcc: str | None) -> Iterator[None]:
    """Point cpp_extension's CUDA include and library dirs at the toolkit of the chosen nvcc.

    cpp_extension guesses CUDA_HOME once, at import; a wrapper script on
    PATH (``/usr/local/bin/nvcc``) makes it guess ``/usr/local``. jitops chose
    (and keyed) one nvcc, so its toolkit is the one to build against.
    """
    if nvcc is None:
        yield
        return
    with _CUDA_HOME_LOCK:  # parallel warm builds write ninja files from several threads
        saved = ce.CUDA_HOME
        ce.CUDA_HOME = os.path.dirname(os.path.dirname(nvcc))
        try:
            yield
        finally:
            ce.CUDA_HOME = saved


def cuda_library_includes() -> tuple[str, ...]:
    """Header dirs of the CUDA libraries torch's wheel installs (``site-packages/nvidia/*/include``).

    <ATen/cuda/CUDAContext.h> includes cusparse.h and cublas_v2.h, which a
    minimal toolkit (nvcc + cudart) lacks; the pip packages torch links
    against carry them. They are searched after the toolkit's include dir,
    so the toolkit's own headers win where both have one.
    """
    import importlib.util

    found = importlib.util.find_spec("nvidia")
    locations = list(found.submodule_search_locations or []) if found is not None else []
    return tuple(sorted(str(p) for loc in locations for p in Path(loc).glob("*/include") if p.is_dir()))


def write_ninja_file(job: BuildJob) -> Path:
    """Have cpp_extension write build.ninja, then pin the exact compilers."""
    import torch.utils.cpp_extension as ce

    with_cuda = job.device == "cuda"
    path = job.build_dir / "build.ninja"
    libs = [f for d in cuda_library_includes() for f in ("-isystem", d)] if with_cuda else []
    cflags = [*job.cflags, f"-DJITOPS_NS={job.namespace}"] + (["-DJITOPS_WITH_CUDA", *libs] if with_cuda else [])
    # The -gencode flags in cuda_cflags make cpp_extension add no arch flags of its own.
    cuda_cflags = [*job.cuda_cflags, f"-DJITOPS_NS={job.namespace}", "-DJITOPS_WITH_CUDA", *libs] if with_cuda else []
    with _cuda_home(ce, job.nvcc if with_cuda else None):
        ldflags = torchcompat.prepare_ldflags(ce, job.ldflags, with_cuda)  # signatures differ across torch
        if "-ltorch_python" in ldflags:
            ldflags.remove("-ltorch_python")  # the ops use no Python C-API
        torchcompat.write_ninja_file(ce, str(path), job.library, [str(s) for s in job.sources], cflags, cuda_cflags,
                                     ldflags, [str(d) for d in job.include_dirs], with_cuda)
    text = path.read_text()
    out = []
    cflags_line = ""
    for line in text.splitlines():
        if line.startswith("cxx = "):
            line = "cxx = " + _ninja_escape_path(job.cxx)
        elif line.startswith("nvcc = ") and job.nvcc:
            line = "nvcc = " + _ninja_escape_path(job.nvcc)
        elif line.startswith("cflags = "):
            cflags_line = line
        out.append(line)
        if line.startswith("build ") and ": compile " in line and cflags_line:
            src = line.rsplit(" ", 1)[-1]
            if os.path.basename(src).startswith("register"):
                out.append("  " + registration_cflags(cflags_line))
    path.write_text("\n".join(out) + "\n")
    return path


def registration_cflags(cflags_line: str) -> str:
    """Flags for ``register*.cpp``: files that only hold dispatcher registration.

    <torch/library.h> is the slowest header to parse and its templates are the
    slowest to optimise; nothing in these files is hot and nothing needs the
    ISA. -O1 without the ISA flags takes ~2 s off every cold build here.
    """
    words = cflags_line.split(" ")
    kept = [w for w in words if not (w.startswith("-mavx") or w in ("-mfma", "-mf16c") or w.startswith("-DCPU_CAPABILITY"))]
    return " ".join("-O1" if w == "-O3" else w for w in kept)


def real_build(job: BuildJob, on_line: Callable[[str], None] | None = None) -> tuple[int, str, Path]:
    write_ninja_file(job)
    rc, out = run_supervised([job.ninja, "-v", "-j", str(job.jobs)], cwd=job.build_dir, env=job.env, on_line=on_line)
    return rc, out, job.build_dir / f"{job.library}.so"


_FAKE_C = """\
/* jitops fake build of {library} for {target} */
__attribute__((visibility("default"))) const char jitops_fake_namespace[] = "{namespace}";
__attribute__((visibility("default"))) int jitops_fake_loaded = 0;
__attribute__((constructor)) static void jitops_fake_init(void) {{ jitops_fake_loaded = 1; }}
"""


def fake_build(job: BuildJob, on_line: Callable[[str], None] | None = None) -> tuple[int, str, Path]:
    """Test seam: a tiny but real shared library, built by ``cc`` in ~50 ms.

    ``JITOPS_FAKE_BUILD_SECONDS`` stretches it (the compiler runs that long
    under the supervisor) to widen windows for kill and race tests.
    """
    src = job.build_dir / "fake.c"
    src.write_text(_FAKE_C.format(library=job.library, target=job.target, namespace=job.namespace))
    out = job.build_dir / f"{job.library}.so"
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise ToolchainError("the fake builder needs `cc` on PATH")
    delay = float(job.env.get("JITOPS_FAKE_BUILD_SECONDS", "0") or 0)
    code = (
        "import subprocess,sys,time;"
        f"time.sleep({delay!r});"
        f"sys.exit(subprocess.call([{cc!r},'-shared','-fPIC','-O0','-o',{str(out)!r},{str(src)!r}]))"
    )
    rc, text = run_supervised([sys.executable, "-I", "-S", "-c", code], cwd=job.build_dir, env=job.env, on_line=on_line)
    return rc, text, out


BUILDERS: dict[str, Callable[..., tuple[int, str, Path]]] = {"real": real_build, "fake": fake_build}


def build(job: BuildJob, log_dir: Path | None, on_line: Callable[[str], None] | None = None) -> BuildResult:
    """Run the build; return the library path, or raise BuildError."""
    which = job.env.get("JITOPS_BUILDER", "real")
    builder = BUILDERS.get(which)
    if builder is None:
        raise ConfigError(
            f"cannot build {job.library!r}: JITOPS_BUILDER={which!r} is not a builder. Fix: set it to one of "
            f"{sorted(BUILDERS)} or unset it"
        )
    start = time.monotonic()
    try:
        rc, out, lib = builder(job, on_line)
    except KeyboardInterrupt as e:
        raise BuildInterrupted(
            f"build of {job.library!r} for {job.target} interrupted; the compiler was stopped and nothing was cached"
        ) from e
    seconds = time.monotonic() - start
    if rc != 0 or not lib.is_file():
        log_path = _keep_log(log_dir, job, out)
        raise BuildError(format_build_error(job, rc, out, log_path), op=job.library, target=job.target,
                         log=out, log_path=log_path)
    return BuildResult(lib, out, seconds)


def _keep_log(log_dir: Path | None, job: BuildJob, text: str) -> Path | None:
    from . import fsutil

    candidates = [d for d in (log_dir, job.build_dir.parent.parent / "logs" if log_dir is None else None) if d]
    for d in candidates:
        try:
            fsutil.makedirs(d)
            path = d / f"{job.library}-{job.target}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
            fsutil.atomic_write(path, text.encode())
            return path
        except OSError:
            continue
    return None
