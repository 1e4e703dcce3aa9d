"""Finding the build tools and identifying them without running them twice.

A compiler's identity (resolved path and ``--version``) is part of the cache
key, but the warm path must start no subprocess. So the identity is cached on
disk under the cache root, keyed by the binary's path, size, mtime and inode:
a changed compiler binary gets a new fingerprint and is asked again.

Imports: checks (``shown``), errors, record, target; fsutil lazily.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

from ..base.record import record
from ..spec.checks import shown
from ..errors import ToolchainError
from . import System, cxx_command

log = logging.getLogger("jitops")

_memo: dict[str, tuple[str, str]] = {}  # record name (fingerprint[-question]) -> (path, answer)
_memo_lock = threading.Lock()
_ask_lock = threading.Lock()  # one `--version` at a time, so racing threads ask once


def _reset_after_fork() -> None:
    global _memo_lock, _ask_lock
    _memo_lock = threading.Lock()
    _ask_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


@record
class Tool:
    """A build tool. ``path`` is canonical (symlinks resolved) and goes into the key;
    ``command`` is what gets run: the name the user gave, which can select a
    different driver behind the same binary (``clang++`` is a link to ``clang``).
    ``openmp``: the compiler's flags for torch's OpenMP runtime (see compilers.py)."""

    name: str
    path: str
    version: str
    command: str = ""
    openmp: tuple[str, ...] = ()
    # (role, sha256) of the programs a C++ compiler's driver really runs (toolchain.programs)
    programs: tuple[tuple[str, str], ...] = ()

    @property
    def run(self) -> str:
        return self.command or self.path


def _which(cmd: str) -> str | None:
    found = shutil.which(cmd)
    return os.path.realpath(found) if found else None


def find_cxx(system: System, op: str) -> str:
    """The C++ compiler cpp_extension would use (``$CXX``, else ``c++``), as an absolute path.

    Symlinks are kept: ``clang++`` resolves to LLVM's ``clang`` binary, and run
    under that name it is the C driver. The key canonicalises (``tool``).
    """
    cxx = system.env("CXX") or "c++"
    path = cxx_command(system)
    words = cxx.split()
    # CXX="g++ -O2": a compiler and its flags
    if path is None and len(words) > 1 and shutil.which(words[0]):
        import shlex  # this message only (a warm load need not import it)

        raise ToolchainError(
            f"cannot build op {op!r}: CXX={shown(cxx)} holds flags as well as the compiler; jitops runs CXX as one "
            f"program. Fix: set CXX={shlex.quote(words[0])} and put the flags in CXXFLAGS "
            f"(CXXFLAGS={shlex.quote(' '.join(words[1:]))})"
        )
    if path is None:
        how = (
            f"CXX={shown(cxx)} does not name an executable"
            if system.env("CXX")
            else "'c++' is not on PATH"
        )
        raise ToolchainError(
            f"cannot build op {op!r}: no C++ compiler found ({how}). "
            "Fix: install one (e.g. `apt-get install g++`), or set CXX to the compiler's path. "
            "Without a compiler, run with a warmed cache (`jitops warm` on a machine that has one) "
            "or opt in to the PyTorch fallback (JITOPS_FALLBACK=1)."
        )
    return path


def find_ninja(op: str) -> str:
    """ninja from the PyPI ``ninja`` package (a jitops dependency), else from PATH."""
    try:
        import ninja  # type: ignore[import-untyped]

        candidate = os.path.join(ninja.BIN_DIR, "ninja")
        if os.access(candidate, os.X_OK):
            return candidate
    except ImportError:
        pass
    path = _which("ninja")
    if path is None:
        raise ToolchainError(
            f"cannot build op {op!r}: ninja is not installed. "
            "Fix: `pip install ninja` (the PyPI package ships the binary), or put ninja on PATH."
        )
    return path


def cuda_home_of(nvcc: str) -> str:
    """The toolkit root of an nvcc binary: ``<root>/bin/nvcc``."""
    return os.path.dirname(os.path.dirname(nvcc))


def _is_toolkit_nvcc(path: str) -> bool:
    home = cuda_home_of(path)
    return os.access(path, os.X_OK) and os.path.isfile(
        os.path.join(home, "include", "cuda_runtime_api.h")
    )


def find_nvcc(system: System, op: str) -> str:
    """nvcc of a whole CUDA toolkit: ``$CUDA_HOME/bin/nvcc``, else on PATH, else /usr/local/cuda.

    A candidate counts only if its toolkit root (``bin/..``) holds the CUDA
    headers, because the build takes include and library dirs from there. A
    wrapper script such as ``/usr/local/bin/nvcc`` is passed over for the
    toolkit it wraps. ``CUDA_HOME``, when set, is the only candidate.
    """
    home = system.env("CUDA_HOME")
    if home:
        candidates = [os.path.join(home, "bin", "nvcc")]
    else:
        candidates = [p for p in (_which("nvcc"), "/usr/local/cuda/bin/nvcc") if p]
    for c in candidates:
        real = os.path.realpath(c)
        if _is_toolkit_nvcc(real):
            return real
    if home:
        where = f"CUDA_HOME={home!r} has no bin/nvcc with include/cuda_runtime_api.h beside it"
    elif candidates:
        where = f"{', '.join(candidates)} {'is' if len(candidates) == 1 else 'are'} not inside a CUDA toolkit"
    else:
        where = "nvcc is not on PATH and /usr/local/cuda/bin/nvcc is missing"
    raise ToolchainError(
        f"cannot build op {op!r} for cuda: no usable nvcc ({where}). "
        "Fix: install the CUDA toolkit and set CUDA_HOME to it (e.g. CUDA_HOME=/usr/local/cuda)."
    )


def nvcc_release(version: str) -> tuple[int, int] | None:
    """``"Cuda compilation tools, release 13.0, V13.0.88"`` -> ``(13, 0)``; None if it names none."""
    for pattern in (r"release (\d+)\.(\d+)", r"\bV(\d+)\.(\d+)", r"cuda_(\d+)\.(\d+)"):
        m = re.search(pattern, version)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def check_nvcc_matches_torch(nvcc_version: str, torch_cuda: str | None, op: str) -> None:
    """ToolchainError, before any compile, when nvcc's CUDA major differs from torch's."""
    release = nvcc_release(nvcc_version)
    if torch_cuda is None:
        return
    if release is None:
        log.warning(
            "cannot tell the CUDA version of nvcc from %r; not checking it against torch's %s",
            nvcc_version,
            torch_cuda,
        )
        return
    if str(release[0]) != torch_cuda.split(".")[0]:
        raise ToolchainError(
            f"cannot build op {op!r} for cuda: nvcc is CUDA {release[0]}.{release[1]} but torch was built with "
            f"CUDA {torch_cuda}; the major versions must match. Fix: set CUDA_HOME to a CUDA {torch_cuda.split('.')[0]}.x "
            "toolkit, or install the torch build for your toolkit"
        )


def _fingerprint(path: str) -> str:
    """The binary at ``path`` as it is now: any rewrite changes its ctime, a replacement its inode."""
    st = os.stat(path)
    raw = f"{path}\0{st.st_dev}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def _ask_version(path: str) -> str:
    try:
        out = subprocess.run(
            [path, "--version"],
            capture_output=True,
            text=True,
            timeout=20,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolchainError(
            f"cannot run {path} --version: {e}. Fix: check that the compiler works."
        ) from e
    lines = [ln.strip() for ln in (out.stdout or out.stderr).splitlines() if ln.strip()]
    if out.returncode != 0 or not lines:
        raise ToolchainError(
            f"{path} --version failed (exit {out.returncode}), so it is not a working compiler. Fix: "
            "set CXX (or CUDA_HOME, for nvcc) to a working one, or unset CXX to use the system c++"
        )
    # "..., release 13.0, V13.0.88" then "Build cuda_13.0.r13.0/..."
    if "nvcc" in os.path.basename(path):
        return (
            "; ".join(ln for ln in lines if "release" in ln or ln.startswith("Build")) or lines[-1]
        )
    return lines[0]


def identify(
    path: str, cache_dir: Path | None, *, record: bool = True, refresh: bool = False
) -> str:
    """``path --version``, remembered per process and on disk (if writable and ``record``);
    ``refresh``: asked again whatever is remembered (what the driver runs has changed)."""
    return ask(path, ("--version",), cache_dir, record=record, refresh=refresh)


def ask(
    path: str,
    question: tuple[str, ...],
    cache_dir: Path | None,
    *,
    record: bool = True,
    refresh: bool = False,
) -> str:
    """The answer of ``path *question`` (``--version``: its identity line; else stdout's first
    line), remembered like the identity: the warm path never runs the compiler."""
    return _ask(path, question, cache_dir, record, refresh)[0]


def _ask(
    path: str, question: tuple[str, ...], cache_dir: Path | None, record: bool, refresh: bool
) -> tuple[str, bool]:
    """:func:`ask`'s answer, and whether this call ran ``path`` for it (not remembered)."""
    fp = _fingerprint(path)
    name = (
        fp
        if question == ("--version",)
        else f"{fp}-{hashlib.sha256(' '.join(question).encode()).hexdigest()[:12]}"
    )
    with _memo_lock:
        if refresh:
            _memo.pop(name, None)
        elif name in _memo:
            return _memo[name][1], False
    with _ask_lock:
        return _identify(path, name, question, cache_dir, record, refresh)


def _identify(
    path: str,
    name: str,
    question: tuple[str, ...],
    cache_dir: Path | None,
    record: bool,
    refresh: bool = False,
) -> tuple[str, bool]:
    with _memo_lock:
        if name in _memo:  # another thread asked while this one waited
            return _memo[name][1], False
    version = None
    record_file = cache_dir / f"{name}.json" if cache_dir is not None else None
    if record_file is not None and not refresh:
        from ..base.fsutil import read_record

        data = read_record(record_file) or {}  # damaged: asked again and rewritten
        if data.get("path") == path and isinstance(data.get("version"), str):
            version = data["version"]
    asked = version is None
    if version is None:
        version = _ask_version(path) if question == ("--version",) else _ask_other(path, question)
    with _memo_lock:
        _memo[name] = (path, version)
    # os.path.isdir: an unreachable cache root is "absent", not a PermissionError. Never create a
    # root just for this.
    if asked and record and cache_dir is not None and os.path.isdir(cache_dir.parent):
        _record(cache_dir, name, path, version)
    return version, asked


def _run(path: str, args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """``path *args``, bounded, its output captured; ToolchainError when it cannot run."""
    try:
        return subprocess.run(
            [path, *args],
            capture_output=True,
            text=True,
            timeout=20,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolchainError(
            f"cannot run {path} {' '.join(args)}: {e}. Fix: check that the compiler works."
        ) from e


def _ask_other(path: str, question: tuple[str, ...]) -> str:
    out = _run(path, question)
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    return lines[0] if out.returncode == 0 and lines else ""


def _record(cache_dir: Path, name: str, path: str, version: str) -> None:
    from ..base.fsutil import atomic_write, makedirs, may_hold

    # a link at v1 or v1/toolchains: never written through (`jitops cache repair`)
    if not may_hold(cache_dir):
        return
    try:
        makedirs(cache_dir)
        atomic_write(
            cache_dir / f"{name}.json", json.dumps({"path": path, "version": version}).encode()
        )
    except OSError as e:  # read-only cache: fine, ask again next process
        log.debug("could not record toolchain identity in %s: %s", cache_dir, e)


def persist(cache_dir: Path) -> None:
    """Record every identity asked in this process that ``cache_dir`` lacks.

    A cold cache has no root yet when the plan is made, so the identities are
    written here, once a build has created it.
    """
    with _memo_lock:
        known = dict(_memo)
    for name, (path, version) in known.items():
        if not os.path.isfile(cache_dir / f"{name}.json"):
            _record(cache_dir, name, path, version)
    for name, body in list(_asked.items()):
        if not os.path.isfile(cache_dir / f"{name}.json"):
            _write_record(cache_dir / f"{name}.json", body)


def tool(name: str, path: str, cache_dir: Path | None, *, record: bool = True) -> Tool:
    """The tool at ``path``, identified by its canonical path; run as ``path``. A C++ compiler (``cxx``)
    also by the programs its driver really runs (:func:`programs`)."""
    real = os.path.realpath(path)
    if name != "cxx":
        return Tool(name, real, identify(real, cache_dir, record=record), command=path)
    # a program that is no compiler stops here
    version, asked = _ask(real, ("--version",), cache_dir, record, False)
    ran, fresh = programs(real, path, cache_dir, record=record)
    if fresh and not asked:  # something behind the driver changed: so may its remembered identity
        version = identify(real, cache_dir, record=record, refresh=True)
    return Tool(name, real, version, command=path, programs=ran)


# What a driver's ``-###`` shows it would run: its compiler proper (cc1plus; clang's "-cc1" binary)
# and assembler; GCC also names the driver a wrapper started (COLLECT_GCC), clang its folder.
_DRYRUN = ("-###", "-x", "c++", "-c", os.devnull, "-o", os.devnull)
PROGRAMS_FORMAT = 1


def programs(
    real: str, command: str, cache_dir: Path | None, *, record: bool = True
) -> tuple[tuple[tuple[str, str], ...], bool]:
    """(role, sha256) of what the C++ compiler at ``command`` really runs: itself, the compiler
    proper, the assembler, the linker, and the driver or folder a wrapper hands over to. The key holds these
    digests, so a compiler switched behind a wrapper, a link or ``PATH`` is a new key.

    Found once with ``-###`` and ``-print-prog-name=ld`` (two runs, on the miss path), remembered in
    the cache's toolchain records with each program's stat identity; a later process only stats them
    (and looks ``as``/``ld`` up on ``PATH`` again), and asks again when any differs. Also whether
    they were asked now (not remembered)."""
    from ..base.fsutil import read_record

    name = f"{_fingerprint(real)}-programs"
    record_file = cache_dir / f"{name}.json" if cache_dir is not None else None
    data = _asked.get(name)  # this process's answer, re-proven like a record
    if data is None and record_file is not None:
        data = read_record(record_file)
    if data is not None and _programs_hold(data, command):
        _asked[name] = data
        return tuple((r[0], r[3]) for r in data["programs"]), False
    found = _ask_programs(command)
    rows = [
        [role, path, looked_up, digest, _identity(path)] for role, path, looked_up, digest in found
    ]
    body = {"format": PROGRAMS_FORMAT, "command": command, "programs": rows}
    _asked[name] = body
    if record and record_file is not None and os.path.isdir(record_file.parent.parent):
        _write_record(record_file, body)
    return tuple((role, digest) for role, _, _, digest in found), True


def program_files(real: str, command: str) -> list[tuple[str, str]] | None:
    """(path, the bare name it was looked up by on ``PATH`` or "") of each program this process found
    the driver at ``command`` runs (:func:`programs`), while they still hold; else None."""
    data = _asked_or_none(real)
    if data is None or not _programs_hold(data, command):
        return None
    return [(row[1], row[2]) for row in data["programs"]]


def _asked_or_none(real: str) -> dict[str, Any] | None:
    try:
        return _asked.get(f"{_fingerprint(real)}-programs")
    except OSError:
        return None


# record name -> what this process found a driver runs (written by persist once the cache exists)
_asked: dict[str, dict[str, Any]] = {}


def _identity(path: str) -> list[int]:
    st = os.lstat(path)  # a link re-pointed is another link
    target = os.stat(path)
    return [st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, target.st_ino, target.st_ctime_ns]


def _programs_hold(data: dict[str, object], command: str) -> bool:
    rows = data.get("programs")
    if data.get("format") != PROGRAMS_FORMAT or data.get("command") != command:
        return False
    if not isinstance(rows, list) or not rows:
        return False
    for row in rows:
        if not (
            isinstance(row, list) and len(row) == 5 and all(isinstance(w, str) for w in row[:4])
        ):
            return False
        _, path, looked_up, _, ident = row
        try:
            if looked_up and shutil.which(looked_up) != path:
                return False
            if _identity(path) != ident:
                return False
        except OSError:
            return False
    return True


def _ask_programs(command: str) -> list[tuple[str, str, str, str]]:
    """[(role, absolute path, the bare name it was looked up by on PATH or "", sha256)]."""
    from ..base.fsutil import sha256_file

    def run(*args: str) -> str:
        out = _run(command, args)
        return out.stdout + out.stderr

    # the program named itself: a wrapper script's own text decides what it runs, and with which
    # flags
    found: dict[str, tuple[str, str]] = {
        "command": (os.path.realpath(_which(command) or command), "")
    }
    for line in run(*_DRYRUN).splitlines():
        if line.startswith("COLLECT_GCC="):
            found["driver"] = (line.partition("=")[2].strip(), "")
        elif line.startswith("InstalledDir:"):
            found["driver folder"] = (line.partition(":")[2].strip(), "")
        elif line.startswith(" ") and line.strip() and not line.strip().startswith("("):
            word = line.split()[0].strip('"')
            role = "compiler proper" if "compiler proper" not in found else "assembler"
            found.setdefault(role, (word, ""))
    ld = run("-print-prog-name=ld").strip().splitlines()
    if ld:
        found["linker"] = (ld[0].strip(), "")
    out = []
    for role, (word, _) in sorted(found.items()):
        path, looked_up = word, ""
        if not os.path.isabs(word):
            looked_up, path = word, shutil.which(word) or ""
        if not path or not os.path.exists(path):
            continue
        digest = "" if os.path.isdir(path) else sha256_file(Path(os.path.realpath(path)))
        out.append((role, path, looked_up, digest))
    return out


def _write_record(path: Path, body: dict[str, object]) -> None:
    from ..base.fsutil import atomic_write, makedirs, may_hold

    if not may_hold(path.parent):
        return
    try:
        makedirs(path.parent)
        atomic_write(path, json.dumps(body).encode())
    except OSError as e:
        log.debug("could not record what the compiler runs in %s: %s", path.parent, e)
