"""Helpers for the CLI tests: small fake-built specs, stripped PATHs, audited children."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from jitops.spec import OpSpec

from tests.helpers import REPO, child_env

# Audit hook for children: every write under $JITOPS_CACHE_DIR and every process start.
AUDIT = """
import os, sys
_ROOT = os.path.realpath(os.environ["JITOPS_CACHE_DIR"])
WRITES, SPAWNS = [], []
_WRITE_EVENTS = {"os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.utime", "os.chmod", "os.chown",
                 "os.link", "os.symlink", "os.truncate", "shutil.rmtree", "shutil.copyfile", "shutil.move",
                 "os.mkfifo", "os.mknod"}
_SPAWN_EVENTS = {"subprocess.Popen", "os.posix_spawn", "os.exec", "os.system", "os.fork", "os.forkpty", "os.spawn"}

def _under(p):
    if isinstance(p, int) or p is None:
        return False
    return os.path.realpath(os.fsdecode(p)).startswith(_ROOT)

def _hook(event, args):
    if event in _SPAWN_EVENTS:
        SPAWNS.append(event)
    elif event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC))
        if writing and _under(path):
            WRITES.append(("open", os.fsdecode(path)))
    elif event in _WRITE_EVENTS and args and _under(args[0]):
        WRITES.append((event, os.fsdecode(args[0])))

sys.addaudithook(_hook)
"""


def fake_spec(root: Path, name: str) -> OpSpec:
    """A one-source library for the fake builder (its kernels would come from Python)."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "k.cpp").write_text(f"// {name}\n")
    return OpSpec(name=name, root=folder, cpu_sources=("k.cpp",), schemas=(f"{name}(Tensor x) -> Tensor",))


def stripped_path(tmp: Path) -> str:
    """A PATH holding only python: no c++, g++, gcc, cc, nvcc."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("python", "python3"):
        if not (bin_dir / name).exists():
            (bin_dir / name).symlink_to(sys.executable)
    return str(bin_dir)


def no_compiler_env(tmp: Path, **overrides: str | None) -> dict[str, str]:
    return child_env(PATH=stripped_path(tmp), CXX=None, CC=None, CUDA_HOME=None, **overrides)


def run_child(code: str, env: dict[str, str], *, timeout: float = 240,
              args: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (or ``python -m jitops args`` when code is empty) in a fresh interpreter."""
    argv = [sys.executable, "-m", "jitops", *args] if not code else [sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
