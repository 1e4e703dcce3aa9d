"""Managing a cache root: list, verify, prune (LRU) and clear (export and import: cache_archive).

Used by ``jitops cache ...``; imports no torch. Verification and removal are
the cache's own (``Cache.verify``, ``Cache.discard``). Nothing here removes an entry
whose key lock is held (a build or re-check is under way): the lock is tried
without blocking and busy entries are skipped. Removal renames an entry out
of ``entries/`` first, so no reader ever sees half of one.

Imports: cache, fsutil, key, manifest, obstruct (filelock lazily).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from . import fsutil, obstruct
from .cache import Cache
from .key import KEY_CHARS
from .manifest import MANIFEST, EntryProblem, Manifest

@dataclass(frozen=True)
class EntryInfo:
    path: Path
    library: str
    target: str
    key: str
    size: int
    last_use: float
    manifest: Manifest | None  # None: unreadable (a damaged entry)


def entry_size(path: Path) -> int:
    total = 0
    with contextlib.suppress(OSError):
        for p in path.iterdir():
            with contextlib.suppress(OSError):
                total += os.lstat(p).st_size
    return total


def entries(cache: Cache) -> list[EntryInfo]:
    """Every entry under the root, oldest last use first."""
    out = []
    for path in cache.iter_entries():
        m = cache.read_manifest(path)
        out.append(EntryInfo(path, path.parent.parent.name, path.parent.name, m.key if m else path.name,
                             entry_size(path), cache.last_use(path), m))
    return sorted(out, key=lambda e: (e.last_use, str(e.path)))


def check(cache: Cache, info: EntryInfo) -> str | None:
    """Re-check one entry completely (manifest, key, size, sha256). None if sound."""
    if info.manifest is None:
        return f"{info.path / MANIFEST} is missing or not a valid manifest"
    if info.path.name != info.manifest.key[:KEY_CHARS]:
        return f"{info.path} holds the manifest of key {info.manifest.key[:12]}"
    try:
        cache.verify(info.path, info.manifest.key, info.library, info.target)
    except EntryProblem as e:
        return str(e)
    return None


# ------------------------------------------------------------------ removal


@contextlib.contextmanager
def unless_building(cache: Cache, library: str, key: str) -> Iterator[bool]:
    """Hold the entry's key lock if it is free (yield True); yield False if a build holds it."""
    import filelock

    path = cache.lock_path(library, key)
    if not path.parent.is_dir():
        yield True  # no lock was ever taken here
        return
    obstruct.heal(path, want_dir=False, what="a build lock file")  # a stray folder there (issue 20)
    lock = filelock.FileLock(str(path), mode=fsutil.FILE_MODE, thread_local=False)
    try:
        lock.acquire(blocking=False)
    except filelock.Timeout:
        yield False
        return
    except OSError as e:
        if e.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
        yield True  # no file locking on this filesystem: nothing to respect
        return
    try:
        yield True
    finally:
        lock.release()


def remove_entry(cache: Cache, path: Path) -> None:
    cache.discard(path)


@dataclass
class Removal:
    removed: list[EntryInfo] = field(default_factory=list)
    busy: list[EntryInfo] = field(default_factory=list)
    kept_bytes: int = 0


def _try_remove(cache: Cache, info: EntryInfo, result: Removal) -> bool:
    with unless_building(cache, info.library, info.key) as free:
        if not free:
            result.busy.append(info)
            return False
        remove_entry(cache, info.path)
    result.removed.append(info)
    return True


def prune(cache: Cache, *, max_size: int | None = None, older_than: float | None = None,
          now: float | None = None) -> Removal:
    """Evict least-recently-used entries first until the entries fit ``max_size`` bytes.

    ``older_than`` (seconds) also evicts every entry unused for that long.
    Unreadable entries go first. Entries being built are skipped.
    """
    now = time.time() if now is None else now
    infos = sorted(entries(cache), key=lambda e: (e.manifest is not None, e.last_use))
    total = sum(e.size for e in infos)
    result = Removal()
    for info in infos:
        stale = info.manifest is None or (older_than is not None and now - info.last_use > older_than)
        too_big = max_size is not None and total > max_size
        if (stale or too_big) and _try_remove(cache, info, result):
            total -= info.size
    cache.sweep_staging()
    result.kept_bytes = total
    return result


def clear(cache: Cache) -> Removal:
    """Remove what jitops owns under the root: entries (not those being built), logs,
    toolchain records, trash, dead staging dirs and the remote tier's counters. Anything else is left alone."""
    result = Removal()
    for info in entries(cache):
        _try_remove(cache, info, result)
    for d in cache.owned_dirs:
        shutil.rmtree(d, ignore_errors=True)
    for f in cache.owned_files:
        f.unlink(missing_ok=True)
    cache.sweep_staging()
    result.kept_bytes = sum(e.size for e in result.busy)
    return result
