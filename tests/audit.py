"""An audit hook for child scenarios: every write under $JITOPS_CACHE_DIR and every process start.

Imports nothing of jitops or torch, so a scenario can install it before importing them.
"""

from __future__ import annotations

import os
import sys
from typing import Any

_WRITE_EVENTS = {
    "os.mkdir",
    "os.rename",
    "os.remove",
    "os.rmdir",
    "os.utime",
    "os.chmod",
    "os.chown",
    "os.link",
    "os.symlink",
    "os.truncate",
    "shutil.rmtree",
    "shutil.copyfile",
    "shutil.move",
    "os.mkfifo",
    "os.mknod",
}
_SPAWN_EVENTS = {
    "subprocess.Popen",
    "os.posix_spawn",
    "os.exec",
    "os.system",
    "os.fork",
    "os.forkpty",
    "os.spawn",
}


class Audit:
    """What this process has done since :func:`install`: ``writes`` (event, path) under the cache, ``spawns``."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.writes: list[tuple[str, str]] = []
        self.spawns: list[str] = []

    def _under(self, p: Any) -> bool:
        if isinstance(p, int) or p is None:
            return False
        return os.path.realpath(os.fsdecode(p)).startswith(self.root)

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if event in _SPAWN_EVENTS:
            self.spawns.append(event)
        elif event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int)
                and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)
            )
            if writing and self._under(path):
                self.writes.append(("open", os.fsdecode(path)))
        elif event in _WRITE_EVENTS and args and self._under(args[0]):
            self.writes.append((event, os.fsdecode(args[0])))


def install() -> Audit:
    """Start recording (audit hooks cannot be removed: it records until the process ends)."""
    audit = Audit(os.environ["JITOPS_CACHE_DIR"])
    sys.addaudithook(audit.hook)
    return audit


_ANY_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_ANY_EVENTS = {
    "os.mkdir",
    "os.rename",
    "os.remove",
    "os.rmdir",
    "os.chmod",
    "os.chown",
    "os.utime",
    "os.truncate",
    "os.link",
    "os.symlink",
    "shutil.copyfile",
    "shutil.copymode",
    "shutil.copystat",
    "shutil.rmtree",
    "shutil.move",
    "subprocess.Popen",
    "os.posix_spawn",
    "os.fork",
    "os.exec",
    "os.system",
    "os.startfile",
}


def install_anywhere() -> list[tuple[str, str]]:
    """Start recording every write to the filesystem, anywhere, and every process start: (event, path)."""
    writes: list[tuple[str, str]] = []

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            path, mode, flags = args
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _ANY_WRITE
            ):
                writes.append((event, str(path)))
        elif event in _ANY_EVENTS:
            writes.append((event, str(args[0])[:200]))

    sys.addaudithook(hook)
    return writes
