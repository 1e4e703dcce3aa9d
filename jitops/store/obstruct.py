"""Obstructed cache paths: the wrong kind of thing where the cache layout puts a folder or a file.

A folder where a lock file belongs (left by a tool or a mistaken ``mkdir -p``),
a file or a link where a folder belongs. On the way of a build, :func:`heal`
clears what holds nothing (a link, an empty folder, an empty file: removing
it loses no data) and raises :class:`CacheError` naming the path and ``jitops
cache repair`` for anything else. :func:`scan` lists every obstruction for
``jitops doctor``; :func:`repair` clears them (the user asked for it).

Only paths inside the cache's own ``v1`` tree are ever touched; the root is
the user's. May import: :mod:`jitops.fsutil`, :mod:`jitops.errors`, the
standard library (the cache object is passed in, for its paths).
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..base import fsutil
from ..errors import CacheError

if TYPE_CHECKING:
    from .cache import Cache

log = logging.getLogger("jitops")

REPAIR = "jitops cache repair"


@dataclass(frozen=True)
class Obstruction:
    path: Path
    found: str  # "a directory", "a symbolic link", ...
    what: str  # what belongs there: "a build lock file"

    def __str__(self) -> str:
        return f"{self.path} is {self.found} where jitops keeps {self.what}"


def _found(path: Path, want_dir: bool) -> str | None:
    """What is wrongly at ``path`` (None when it is absent or of the right kind)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if want_dir and not stat.S_ISDIR(st.st_mode):
        return "a file" if stat.S_ISREG(st.st_mode) else "a special file"
    if not want_dir and not stat.S_ISREG(st.st_mode):
        return "a directory" if stat.S_ISDIR(st.st_mode) else "a special file"
    if want_dir and st.st_uid == os.geteuid() and not st.st_mode & stat.S_IWUSR:
        return "a read-only folder"
    return None


def _holds_nothing(path: Path, found: str) -> bool:
    if found == "a symbolic link":
        return True
    try:
        if found == "a directory":
            return not os.listdir(path)
        if found == "a file":
            return os.lstat(path).st_size == 0
    except OSError:
        return False
    return False


def heal(path: Path, *, want_dir: bool, what: str) -> None:
    """Clear an obstruction at ``path`` that holds nothing; CacheError for one that holds data.

    A read-only folder is left alone here (a read-only cache may be deliberate;
    the caller's write then fails and says so).
    """
    found = _found(path, want_dir)
    if found is None or found == "a read-only folder":
        return
    if _holds_nothing(path, found):
        try:
            os.rmdir(path) if found == "a directory" else os.unlink(path)
            log.warning("removed %s that stood where jitops keeps %s (%s)", found, what, path)
            return
        except FileNotFoundError:
            return  # another process cleared it first
        except OSError:
            pass
    raise CacheError(f"{Obstruction(path, found, what)}, and it holds data jitops will not delete on its own. "
                     f"Fix: run `{REPAIR}` (it moves it out of the way), or remove {path} yourself")


def scan(cache: Cache) -> list[Obstruction]:
    """Every obstructed path of the layout under ``cache``'s ``v1`` tree."""
    out: list[Obstruction] = []

    def check(path: Path, want_dir: bool, what: str) -> bool:
        found = _found(path, want_dir)
        if found == "a read-only folder" and not writable:  # a cache made read-only as a whole is deliberate
            found = None
        if found is not None:
            out.append(Obstruction(path, found, what))
        return found in (None, "a read-only folder") and os.path.isdir(path) == want_dir

    writable = _found(cache.base, True) is None
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
