"""Listing and clearing every obstructed path of a cache (``jitops doctor``, ``jitops cache repair``).

:mod:`jitops.store.obstruct` judges one path and heals what holds nothing on a build's way; this
module walks the whole layout for the user who asked: :func:`scan` lists, :func:`repair` clears
(through the cache's trash). Only the cache's own ``v1`` tree.

Imports: cache, fsutil, obstruct.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..base import fsutil
from .cache import Cache
from .obstruct import REPAIR, Obstruction, kind_found

__all__ = ["REPAIR", "Obstruction", "repair", "scan"]


def scan(cache: Cache) -> list[Obstruction]:
    """Every obstructed path of the layout under ``cache``'s ``v1`` tree."""
    out: list[Obstruction] = []

    def check(path: Path, want_dir: bool, what: str) -> bool:
        found = kind_found(path, want_dir)
        # a cache made read-only as a whole is deliberate
        if found == "a read-only folder" and not writable:
            found = None
        if found is not None:
            out.append(Obstruction(path, found, what))
        return found in (None, "a read-only folder") and os.path.isdir(path) == want_dir

    writable = kind_found(cache.base, True) is None
    if not check(cache.base, True, "its cache tree"):
        return out
    for name, folder in cache.folders.items():
        check(folder, True, f"the {name} folder")
    for p in _children(cache.locks):
        if p.suffix in (".lock", ".holder"):
            check(p, False, "a build lock file" if p.suffix == ".lock" else "a lock holder record")
    for p in _children(cache.toolchains):
        if p.suffix == ".json":
            check(p, False, "a toolchain record")
    for lib in _children(cache.entries):
        if check(lib, True, "an op library's entries"):
            for tgt in _children(lib):
                if check(tgt, True, "a target's entries"):
                    for entry in _children(tgt):
                        if check(entry, True, "a cache entry"):
                            check(entry / "manifest.json", False, "an entry's manifest")
    return out


def _children(folder: Path) -> list[Path]:  # by lstat: a link is listed as itself, never entered
    return [p for p in fsutil.children(folder) if not p.name.startswith(".")]


def repair(cache: Cache) -> list[tuple[Obstruction, str]]:
    """Clear every obstruction :func:`scan` finds; (obstruction, what was done) for each."""
    done = []
    for ob in scan(cache):
        try:
            done.append((ob, _clear(cache, ob)))
        except OSError as e:
            done.append((ob, f"could not clear it ({e.strerror or e})"))
    return done


def _clear(cache: Cache, ob: Obstruction) -> str:
    if ob.found == "a symbolic link":
        os.unlink(ob.path)
        return "removed the link"
    if ob.found == "a read-only folder":
        os.chmod(ob.path, fsutil.DIR_MODE)
        return "made it writable (mode 700)"
    cache.discard(ob.path)  # through trash/ (or beside it, when trash/ is what is in the way)
    return "removed it"
