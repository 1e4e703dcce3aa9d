"""Finding the build tools and identifying them without running them twice.

A compiler's identity (resolved path and ``--version``) is part of the cache
key, but the warm path must start no subprocess. So the identity is cached on
disk under the cache root, keyed by the binary's path, size, mtime and inode:
a changed compiler binary gets a new fingerprint and is asked again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from .errors import ToolchainError
from .target import System

log = logging.getLogger("jitops")

_memo: dict[str, tuple[str, str]] = {}  # fingerprint -> (path, version)
_memo_lock = threading.Lock()
_ask_lock = threading.Lock()  # one `--version` at a time, so racing threads ask once


def _reset_after_fork() -> None:
    global _memo_lock, _ask_lock
    _memo_lock = threading.Lock()
    _ask_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


@dataclass(frozen=True)
class Tool:
    name: str
    path: str
    version: str


def _which(cmd: str) -> str | None:
    found = shutil.which(cmd)
    return os.path.realpath(found) if found else None


def find_cxx(system: System, op: str) -> str:
    """The C++ compiler cpp_extension would use (``$CXX``, else ``c++``), resolved."""
    cxx = system.env("CXX") or "c++"
    path = _which(cxx)
    if path is None:
        how = f"CXX={cxx!r} does not name an executable" if system.env("CXX") else "'c++' is not on PATH"
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


def find_nvcc(system: System, op: str) -> str:
    home = system.env("CUDA_HOME")
    # An explicit CUDA_HOME is obeyed: falling back to another toolkit would build against the wrong one.
    candidates = [os.path.join(home, "bin", "nvcc")] if home else [p for p in (_which("nvcc"), "/usr/local/cuda/bin/nvcc") if p]
    for c in candidates:
        if os.access(c, os.X_OK):
            return os.path.realpath(c)
    where = f"CUDA_HOME={home!r} has no bin/nvcc" if home else "nvcc is not on PATH and /usr/local/cuda/bin/nvcc is missing"
    raise ToolchainError(
        f"cannot build op {op!r} for cuda: no nvcc found ({where}). "
        "Fix: install the CUDA toolkit and set CUDA_HOME to it (e.g. CUDA_HOME=/usr/local/cuda)."
    )


def _fingerprint(path: str) -> str:
    st = os.stat(path)
    raw = f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def _ask_version(path: str) -> str:
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolchainError(f"cannot run {path} --version: {e}. Fix: check that the compiler works.") from e
    lines = [ln.strip() for ln in (out.stdout or out.stderr).splitlines() if ln.strip()]
    if out.returncode != 0 or not lines:
        raise ToolchainError(f"{path} --version failed (exit {out.returncode}); is it a working compiler?")
    # nvcc prints its release on the last line; compilers on the first.
    return lines[-1] if "nvcc" in os.path.basename(path) else lines[0]


def identify(path: str, cache_dir: Path | None) -> str:
    """``path --version``, remembered per process and on disk (if writable)."""
    fp = _fingerprint(path)
    with _memo_lock:
        if fp in _memo:
            return _memo[fp][1]
    with _ask_lock:
        return _identify(path, fp, cache_dir)


def _identify(path: str, fp: str, cache_dir: Path | None) -> str:
    with _memo_lock:
        if fp in _memo:  # another thread asked while this one waited
            return _memo[fp][1]
    version = None
    record = cache_dir / f"{fp}.json" if cache_dir is not None else None
    if record is not None:
        try:
            data = json.loads(record.read_text())
            if data.get("path") == path and isinstance(data.get("version"), str):
                version = data["version"]
        except (OSError, ValueError):
            pass
    asked = version is None
    if version is None:
        version = _ask_version(path)
    with _memo_lock:
        _memo[fp] = (path, version)
    # os.path.isdir: an unreachable cache root is "absent", not a PermissionError. Never create a root just for this.
    if asked and cache_dir is not None and os.path.isdir(cache_dir.parent):
        _record(cache_dir, fp, path, version)
    return version


def _record(cache_dir: Path, fp: str, path: str, version: str) -> None:
    from .fsutil import atomic_write, makedirs

    try:
        makedirs(cache_dir)
        atomic_write(cache_dir / f"{fp}.json", json.dumps({"path": path, "version": version}).encode())
    except OSError as e:  # read-only cache: fine, ask again next process
        log.debug("could not record toolchain identity in %s: %s", cache_dir, e)


def persist(cache_dir: Path) -> None:
    """Record every identity asked in this process that ``cache_dir`` lacks.

    A cold cache has no root yet when the plan is made, so the identities are
    written here, once a build has created it.
    """
    with _memo_lock:
        known = dict(_memo)
    for fp, (path, version) in known.items():
        if not os.path.isfile(cache_dir / f"{fp}.json"):
            _record(cache_dir, fp, path, version)


def tool(name: str, path: str, cache_dir: Path | None) -> Tool:
    return Tool(name, path, identify(path, cache_dir))
