"""Obstructed cache paths: the wrong kind of thing where the cache layout puts a folder or a file.

A folder where a lock file belongs (left by a tool or a mistaken ``mkdir -p``),
a file or a link where a folder belongs. On the way of a build, :func:`heal`
clears what holds nothing (a link, an empty folder, an empty file: removing
it loses no data) and raises :class:`CacheError` naming the path and ``jitops
cache repair`` for anything else. ``store.repair`` lists and clears every
obstruction (``jitops doctor``, ``jitops cache repair``) with :func:`kind_found`.

Only paths inside the cache's own ``v1`` tree are ever touched; the root is
the user's. May import: ``errors``. Below ``store.cache``,
which heals its folders through it.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import CacheError

log = logging.getLogger("jitops")

REPAIR = "jitops cache repair"


@dataclass(frozen=True)
class Obstruction:
    path: Path
    found: str  # "a directory", "a symbolic link", ...
    what: str  # what belongs there: "a build lock file"

    def __str__(self) -> str:
        return f"{self.path} is {self.found} where jitops keeps {self.what}"


def kind_found(path: Path, want_dir: bool) -> str | None:
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
    found = kind_found(path, want_dir)
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
    raise CacheError(
        f"{Obstruction(path, found, what)}, and it holds data jitops will not delete on its own. "
        f"Fix: run `{REPAIR}` (it moves it out of the way), or remove {path} yourself"
    )
