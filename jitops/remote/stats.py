"""Counters of the remote tier: kept per process, logged at exit, summed into the cache for ``cache stats``.

Imports only the stdlib and ``jitops.base.fsutil``. The totals file's path comes
from the caller (``Cache.remote_stats``: ``jitops.store.cache`` builds every cache path).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ..base import fsutil

log = logging.getLogger("jitops")


@dataclass
class Counters:
    hits: int = 0
    misses: int = 0
    rejected: int = 0
    uploads: int = 0
    errors: int = 0
    timeouts: int = 0
    bytes_down: int = 0
    bytes_up: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        asked = self.hits + self.misses
        rate = f"{100.0 * self.hits / asked:.0f}%" if asked else "n/a"
        return (
            f"{self.hits} hits, {self.misses} misses (hit rate {rate}), {self.rejected} rejected, "
            f"{self.uploads} uploads, {self.errors} errors ({self.timeouts} timeouts), "
            f"{self.bytes_down} B down, {self.bytes_up} B up, {self.seconds:.2f}s in the store"
        )

    def any(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self))


def read_totals(path: Path) -> Counters:
    """The totals at ``path``; a missing or damaged file (not a JSON object, a wrong type, ``1e999``) counts as
    none (``fsutil.read_record``), a damaged field as 0."""
    data = fsutil.read_record(path) or {}
    totals = Counters()
    for f in fields(Counters):
        kind = type(getattr(totals, f.name))
        value = data.get(f.name, 0)
        if fsutil.is_number(value, kind) and value >= 0:
            setattr(totals, f.name, kind(value))
    return totals


def add_to_totals(path: Path, c: Counters) -> None:
    """Add this process's counters to the totals at ``path`` (best effort, under a file lock beside it)."""
    if not c.any() or not fsutil.is_real_dir(path.parent):  # never through a link at v1
        return
    with contextlib.suppress(OSError):
        fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, fsutil.FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            total = read_totals(path)
            for f in fields(Counters):
                setattr(total, f.name, getattr(total, f.name) + getattr(c, f.name))
            total.seconds = round(total.seconds, 3)
            fsutil.atomic_write(path, json.dumps(asdict(total), sort_keys=True).encode())
        finally:
            os.close(fd)
