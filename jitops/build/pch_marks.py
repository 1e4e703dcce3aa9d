"""What the cache remembers about a header prefix besides its PCH: seen, refused, being built.

* ``<key>.seen``: a build has compiled a file with this prefix (tubuild builds a PCH from the second on);
* ``<key>.failed``: the compiler refused to precompile the prefix (exit status 1 with no sign of a passing cause:
  a killed compiler, a full disk, no memory, an internal compiler error). No background child is started for it
  again for :data:`RETRY_AFTER` (it was retried after every build). The key covers compiler, flags and the
  prefix's text, not the headers the prefix reads (one outside the library may be fixed), so the mark expires;
  ``jitops cache clear`` or deleting the file resets it;
* the key's lock, held while a PCH is built (:func:`building`).

Marks live in ``v1/pch`` beside the PCH folders (``Cache.build_path``), never written through a link there.

Imports: fsutil; errors and store.lock lazily (the Cache is passed in).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..base import fsutil

if TYPE_CHECKING:
    from ..store.cache import Cache

RETRY_AFTER = 24 * 3600.0  # seconds before a refused prefix is tried again
STATUS = "pch.rc"  # the PCH compile's exit status, written beside its log by pch.start's command
_PASSING = re.compile(
    r"Killed signal|No space left|Cannot allocate memory|out of memory|internal compiler error|"
    r"Disk quota|Resource temporarily unavailable",
    re.IGNORECASE,
)


def seen_before(cache: Cache, key: str) -> bool:
    """Whether a build has compiled a file with this prefix before; records this one (best effort)."""
    mark = cache.build_path("pch", key, ".seen")
    # a link at v1/pch (`jitops cache repair`): no PCH, nothing written through it
    if not fsutil.may_hold(cache.pch):
        return False
    if os.path.isfile(mark):
        return True
    with contextlib.suppress(OSError):
        fsutil.makedirs(mark.parent)
        fsutil.atomic_write(mark, b"")
    return False


def refused(cache: Cache, key: str) -> bool:
    """Whether the compiler refused this prefix's PCH within :data:`RETRY_AFTER`."""
    try:
        return time.time() - os.stat(cache.build_path("pch", key, ".failed")).st_mtime < RETRY_AFTER
    except OSError:
        return False


def mark_refused(cache: Cache, key: str, out: Path) -> bool:
    """After a PCH compile in ``out`` made nothing: mark the prefix refused if the compiler refused it (exit status
    1, no passing cause in its log). Whether it was marked."""
    try:
        status = (out / STATUS).read_text().strip()
        text = (out / "pch.log").read_text(errors="replace")
    except OSError:
        return False
    # never through a link at v1/pch
    if status != "1" or _PASSING.search(text) or not fsutil.may_hold(cache.pch):
        return False
    mark = cache.build_path("pch", key, ".failed")
    try:
        fsutil.makedirs(mark.parent)
        fsutil.atomic_write(mark, b"")
    except OSError:
        return False
    return True


def building(cache: Cache, key: str) -> bool:
    """Whether another process holds the PCH's lock now (builds it: pch_bg's child or a build beside)."""
    from ..errors import LockTimeout
    from ..store.lock import key_lock

    try:
        with key_lock(cache.lock_path("pch", key), "a precompiled header", 0):
            return False
    except LockTimeout:
        return True
