"""Managing a cache root: list, verify, prune (LRU) and clear (export and import: store.archive).

Prune bounds everything the cache holds that it can rebuild: entries, per-file
objects and precompiled headers (store.parts), as one least-recently-used list
ordered by last use, whatever the kind (unusable ones first: damaged entries,
dangling object records). A PCH saves seconds per edit while it is in use and
costs hundreds of MB when it is not, so it is judged by its use like the rest.

Used by ``jitops cache ...``; imports no torch. Verification and removal are
the cache's own (``Cache.verify``, ``Cache.discard``). Nothing here removes an entry
whose key lock is held (a build or re-check is under way): the lock is tried
without blocking and busy entries are skipped. Removal renames an entry out
of ``entries/`` first, so no reader ever sees half of one. Every walk is by
lstat (``Cache.iter_entries``, ``fsutil.children``): a link where the layout
keeps a folder is never entered; ``clear`` unlinks one that stands for an
owned folder (``logs/``, ``objects/``...), never what it points at.

Imports: cache, fsutil, key, manifest, obstruct, parts (filelock lazily).
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from . import parts as cache_parts, obstruct
from ..base import fsutil
from .cache import Cache
from .parts import Part
from ..key import KEY_CHARS
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
    for p in fsutil.children(path):
        with contextlib.suppress(OSError):
            total += os.lstat(p).st_size
    return total


def entries(cache: Cache) -> list[EntryInfo]:
    """Every entry under the root, oldest last use first."""
    out = []
    for path in cache.iter_entries():
        m = cache.read_manifest(path)
        out.append(
            EntryInfo(
                path,
                path.parent.parent.name,
                path.parent.name,
                m.key if m else path.name,
                entry_size(path),
                cache.last_use(path),
                m,
            )
        )
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


def verify(
    cache: Cache, library: str | None = None, *, remove: bool = False
) -> list[tuple[EntryInfo, str | None, bool]]:
    """Re-check every entry (of ``library``) completely: (entry, its problem or None, removed?).
    ``remove``: a damaged entry is removed unless a build holds its key lock."""
    out = []
    for e in entries(cache):
        if library is not None and e.library != library:
            continue
        problem = check(cache, e)
        removed = False
        if problem is not None and remove:
            with unless_building(cache, e.library, e.key) as free:
                if free:
                    remove_entry(cache, e.path)
                    removed = True
        out.append((e, problem, removed))
    return out


# ------------------------------------------------------------------ removal


@contextlib.contextmanager
def unless_building(cache: Cache, library: str, key: str) -> Iterator[bool]:
    """Hold the entry's key lock if it is free (yield True); yield False if a build holds it."""
    import filelock

    path = cache.lock_path(library, key)
    # a link there: unlinked, never written through
    obstruct.heal(path.parent, want_dir=True, what="the locks folder")
    if not cache.walkable(path.parent):
        yield True  # no lock was ever taken here
        return
    obstruct.heal(path, want_dir=False, what="a build lock file")  # a stray folder there
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
    parts_removed: list[Part] = field(default_factory=list)  # objects and PCHs
    parts_busy: list[Part] = field(default_factory=list)  # PCHs being built or just used


def _try_remove(cache: Cache, info: EntryInfo, result: Removal) -> bool:
    with unless_building(cache, info.library, info.key) as free:
        if not free:
            result.busy.append(info)
            return False
        remove_entry(cache, info.path)
    result.removed.append(info)
    return True


def _try_remove_part(cache: Cache, part: Part, now: float, result: Removal) -> bool:
    if part.kind == "pch":
        # a build that found it may not have opened it yet
        if now - part.last_use < cache_parts.GRACE:
            result.parts_busy.append(part)
            return False
        with unless_building(cache, "pch", part.name) as free:  # pch.start holds it while building
            if not free:
                result.parts_busy.append(part)
                return False
            cache_parts.remove(cache, part)
    else:
        cache_parts.remove(cache, part)  # no lock: a vanished object is a miss (objcache)
    result.parts_removed.append(part)
    return True


def prune(
    cache: Cache,
    *,
    max_size: int | None = None,
    older_than: float | None = None,
    now: float | None = None,
    parts_only: bool = False,
) -> Removal:
    """Evict least-recently-used entries, objects and PCHs first until all fit ``max_size`` bytes.

    ``older_than`` (seconds) also evicts everything unused for that long.
    Unusable things go first (damaged entries, dangling object records). Entries and
    PCHs being built are skipped, and so are PCHs used in the last ``cache_parts.GRACE`` seconds
    (``parts_only``, the automatic cap: objects too, so a build never evicts what it just stored).
    """
    now = time.time() if now is None else now
    items: list[EntryInfo | Part] = [
        *([] if parts_only else entries(cache)),
        *cache_parts.all_parts(cache, now),
    ]
    items.sort(key=lambda x: (not _unusable(x), x.last_use))
    total = sum(x.size for x in items)
    result = Removal()
    for x in items:
        stale = _unusable(x) or (older_than is not None and now - x.last_use > older_than)
        too_big = max_size is not None and total > max_size
        if not (stale or too_big):
            continue
        if parts_only and not _unusable(x) and now - x.last_use < cache_parts.GRACE:
            # the automatic cap (after a build) keeps what was just built or used: never this edit's
            # objects
            continue
        gone = (
            _try_remove(cache, x, result)
            if isinstance(x, EntryInfo)
            else _try_remove_part(cache, x, now, result)
        )
        total -= x.size if gone else 0
    if not parts_only:
        cache.sweep_staging()
    result.kept_bytes = total
    return result


def parts_size(cache: Cache) -> int:
    """Bytes of ``objects/`` and ``pch/`` by lstat, one level into each PCH folder: no record is read."""
    total = 0
    for folder in (cache.objects, cache.pch):
        if not cache.walkable(folder):
            continue
        for p in fsutil.children(folder):
            with contextlib.suppress(OSError):
                total += os.lstat(p).st_size
                if fsutil.is_real_dir(p):
                    total += entry_size(p)
    return total


def kind_sizes(
    cache: Cache, infos: list[EntryInfo], parts: list[Part]
) -> list[tuple[str, int, int]]:
    """(kind, items, bytes) of each folder the cache keeps, for ``jitops cache ls``: entries, objects, PCHs
    (with their ``.seen``/``.failed``/``.h`` marks), then staging, logs, trash, inline sources, toolchain records, locks."""
    use = cache_parts.usage(parts)
    pch_bytes = sum(p.size for p in parts if p.kind == "pch")
    out = [
        ("entries", len(infos), sum(e.size for e in infos)),
        ("objects", *use["object"]),
        ("pch", use["pch"][0], pch_bytes),
    ]
    for name in ("staging", "logs", "trash", "inline", "toolchains", "locks"):
        folder = cache.folders[name]
        items = fsutil.children(folder) if cache.walkable(folder) else []
        out.append(
            (
                name,
                len(items),
                sum(
                    cache_parts.tree_size(p) if fsutil.is_real_dir(p) else _lsize(p) for p in items
                ),
            )
        )
    return out


def _lsize(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def cap_parts(cache: Cache, max_size: int) -> Removal | None:
    """After a build: bound PCHs and per-file objects to ``max_size`` bytes (JITOPS_PCH_MAX_SIZE), least recently
    used first; entries are never touched. One stat per file, and a full prune only above the cap; None below it."""
    if max_size <= 0 or parts_size(cache) <= max_size:
        return None
    return prune(cache, max_size=max_size, parts_only=True)


def _unusable(x: EntryInfo | Part) -> bool:
    return x.manifest is None if isinstance(x, EntryInfo) else x.unusable


def clear(cache: Cache, library: str | None = None) -> Removal:
    """Remove what jitops owns under the root: entries (not those being built), logs, toolchain
    records, trash, dead staging dirs and the remote tier's counters. Anything else is left alone.
    ``library``: only that library's entries (every target), nothing else."""
    result = Removal()
    for info in entries(cache):
        if library is None or info.library == library:
            _try_remove(cache, info, result)
    if library is not None:
        result.kept_bytes = sum(e.size for e in result.busy)
        return result
    # v1 itself a link: nothing through it (`jitops cache repair` unlinks it)
    if cache.walkable(cache.base):
        for p in (*cache.owned_dirs, *cache.owned_files):
            fsutil.remove_path(p)  # a link is unlinked as itself
    cache.sweep_staging()
    result.kept_bytes = sum(e.size for e in result.busy)
    return result
