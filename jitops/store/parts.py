"""The rebuildable caches beside the entries, for ``jitops cache ls`` and ``prune``: per-file objects and PCHs.

A *part* is what is evicted as one: an object (``objects/<sha256>.o`` with every
``<key>.json`` record naming it), or a precompiled header (``pch/<key>/`` with
its ``<key>.seen``, ``<key>.failed`` and ``<key>.h`` files). Records whose object is gone and
objects no record names are parts of their own, marked unusable (evicted
first), once older than ``GRACE`` (a record is written just after its object).

Last use: an object's is the newest mtime of its files (``objcache.lookup``
touches the record it hits); a PCH's is the newest mtime or atime of its
files (atime: the compiler reading the ``.gch``, at the mount's atime
resolution; the manifest's mtime when ``pch.find`` records its hits).

Removal never breaks a build: an object that vanishes is a miss (objcache
copies and re-hashes it first); an object unlinked while being copied is read
to its end (Linux keeps an open file). A PCH is removed only with its key lock
held (``pch.start`` holds it while building: taken here without waiting, busy
ones kept) and only when unused for ``GRACE`` seconds, since a build that found
it may not yet have opened it; its folder is renamed out of ``pch/`` first.

Every listing is by lstat (``fsutil.children``): a link is never entered.

Imports: fsutil; cache (the Cache is passed in).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..base import fsutil

if TYPE_CHECKING:
    from .cache import Cache

# seconds: a PCH used this recently, or a fresh half of an object pair, is never evicted
GRACE = 600.0


@dataclass
class Part:
    kind: str  # "object" | "pch"
    name: str  # the object's sha256 or the PCH's key (as the file names spell it)
    paths: list[Path] = field(default_factory=list)  # removed in this order
    size: int = 0
    last_use: float = 0.0
    unusable: bool = False  # a dangling record or an object no record names

    @property
    def label(self) -> str:
        return f"{'PCH' if self.kind == 'pch' else 'object'} {self.name[:12]}"


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def tree_size(path: Path) -> int:
    total = 0
    if not fsutil.is_real_dir(path):
        return 0
    with contextlib.suppress(OSError):
        for dirpath, _, files in os.walk(path):  # never follows a link inside
            for f in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def _add(part: Part, path: Path, atime: bool = False, size: int | None = None) -> None:
    st = _stat(path)
    if st is None:
        return
    part.paths.append(path)
    part.size += st.st_size if size is None else size
    part.last_use = max(part.last_use, st.st_mtime, st.st_atime if atime else 0.0)


def _listdir(cache: Cache, folder: Path) -> list[str]:
    # never through a link (`jitops cache repair` clears it)
    if not cache.walkable(folder):
        return []
    return [p.name for p in fsutil.children(folder)]


def objects(cache: Cache, now: float) -> list[Part]:
    """Each object with its records; dangling records and unnamed objects as unusable parts."""
    parts: dict[str, Part] = {}
    records: list[tuple[str, Path, str]] = []  # (record name, path, object digest)
    for fname in _listdir(cache, cache.objects):
        path = cache.objects / fname
        if fname.endswith(".o"):
            parts[fname[:-2]] = Part("object", fname[:-2])
        elif fname.endswith(".json"):
            digest = (fsutil.read_record(path) or {}).get("object")
            records.append(
                (fname[:-5], path, digest if isinstance(digest, str) and digest.isalnum() else "")
            )
    out: list[Part] = []
    for (
        name,
        path,
        digest,
    ) in records:  # records first: removing one turns a later lookup into a miss
        part = parts.get(cache.build_path("objects", digest, ".o").name[:-2]) if digest else None
        if part is None:
            part = Part("object", name)
            out.append(part)
            _add(part, path)
            part.unusable = now - part.last_use > GRACE
        else:
            _add(part, path)
    for digest, part in parts.items():
        had_records = bool(part.paths)
        _add(part, cache.build_path("objects", digest, ".o"))
        part.unusable = not had_records and now - part.last_use > GRACE
        out.append(part)
    return [p for p in out if p.paths]


def pchs(cache: Cache, now: float) -> list[Part]:
    """Each PCH key's folder, ``.seen``, ``.failed`` and ``.h`` files (any of them may be there without the others)."""
    parts: dict[str, Part] = {}
    for fname in _listdir(cache, cache.pch):
        key, _, suffix = fname.partition(".")
        if suffix not in ("", "seen", "h", "failed"):
            continue
        part = parts.setdefault(key, Part("pch", key))
        path = cache.build_path("pch", key, f".{suffix}" if suffix else "")
        if suffix:
            _add(part, path, atime=True)
            continue
        _add(part, path, size=tree_size(path))
        for inner in _listdir(cache, path):
            st = _stat(path / inner)
            if st is not None:
                part.last_use = max(part.last_use, st.st_mtime, st.st_atime)
    for (
        part
    ) in parts.values():  # the folder goes first: a .seen left alone would only rebuild it sooner
        part.paths.sort(key=lambda p: p.suffix != "")
    return list(parts.values())


def all_parts(cache: Cache, now: float) -> list[Part]:
    return objects(cache, now) + pchs(cache, now)


def usage(parts: Iterable[Part]) -> dict[str, tuple[int, int]]:
    """{kind: (count, bytes)}, for ``jitops cache ls``."""
    out = {"object": (0, 0), "pch": (0, 0)}
    for p in parts:
        if p.kind == "pch" and not any(q.suffix == "" for q in p.paths):
            continue  # only a mark that the prefix was seen: no PCH (yet)
        n, size = out[p.kind]
        out[p.kind] = (n + 1, size + p.size)
    return out


def remove(cache: Cache, part: Part) -> None:
    """Delete a part's files (the PCH folder renamed out of the way first). Raises OSError."""
    for path in part.paths:
        if fsutil.is_real_dir(path):  # a link is unlinked as itself
            cache.discard(path)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
