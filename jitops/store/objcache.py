"""Objects cached per translation unit, so an edit to one file of a library recompiles that file only.

A TU's key covers what its compile reads besides the headers: the compiler's
and torch's identity, the exact flags (the library's folder written as
``<root>``: load_inline writes every edit to a new folder), and the source's
sha256. The files it reads are known only after a compile, from the
compiler's dependency file, so the record under that key lists them with
their sha256 as an entry's ``inputs`` does (store.inputs: system headers
included, those under folders the key pins left out, a file inside the
library's folder relative to it): a lookup re-hashes them, and any difference
(or a missing file) is a miss. A hit hands its list on, for the entry.

Objects are stored by their own sha256 and verified (size, digest, owner,
mode) before use; anything wrong is a miss, never an error. The record is
written after the object, both atomically, so a racing writer or a killed
one leaves either nothing usable or a complete pair. A hit touches its record
(its last use, for ``jitops cache prune``, which may delete either half at any
time: a record without its object is a miss).

Imports: fsutil, inputs (the Cache is passed in).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..base import fsutil
from . import inputs

if TYPE_CHECKING:
    from .cache import Cache

log = logging.getLogger("jitops")

FORMAT = 2  # 2: deps list every file read (system headers too), as an entry's inputs


def tu_key(identity: str, command: str, source_digest: str, root: Path) -> str:
    """The key of one compile: ``identity`` (compiler, torch, ...), its command's flags, the source's digest."""
    text = json.dumps([FORMAT, identity, command.replace(str(root), inputs.ROOT), source_digest])
    return hashlib.sha256(text.encode()).hexdigest()


def lookup(cache: Cache, key: str, root: Path, into: Path) -> dict[str, str] | None:
    """Copy the verified object for ``key`` to ``into`` and return what its compile read ({label:
    sha256}, all still holding those bytes); None (a miss) if there is none usable."""
    try:
        path = cache.build_path("objects", key, ".json")
        # bounded, never a link nor a FIFO; a link at objects/ is no cache
        record = fsutil.read_record(path) if fsutil.may_hold(cache.objects) else None
        if record is None or record.get("format") != FORMAT or record.get("key") != key:
            return None
        deps = record["deps"]
        if not isinstance(deps, dict) or inputs.first_change(deps, root) is not None:
            return None
        obj = cache.build_path("objects", record["object"], ".o")
        if (
            fsutil.insecure_reason(obj, want_dir=False) is not None
            or os.lstat(obj).st_size != record["size"]
        ):
            return None
        shutil.copyfile(obj, into)
        if fsutil.sha256_file(into) != record["object"]:  # the copy is what gets linked: check that
            into.unlink()
            return None
        with contextlib.suppress(OSError):
            fsutil.mark_used(path)  # the object's last use, for `jitops cache prune`
        return dict(deps)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def store(cache: Cache, key: str, obj: Path, deps: Mapping[str, str]) -> None:
    """Record a fresh object and what its compile read (``deps``: {label: sha256}, store.inputs); best
    effort: a cache that cannot be written only costs the next compile."""
    try:
        digest = fsutil.sha256_file(obj)
        if not fsutil.may_hold(cache.objects):  # never written through a link
            log.debug(
                "not caching the object %s: %s is not a folder of the cache", obj, cache.objects
            )
            return
        fsutil.makedirs(cache.objects)
        target = cache.build_path("objects", digest, ".o")
        if not os.path.exists(target):
            fsutil.atomic_write(target, obj.read_bytes())
        record = {
            "format": FORMAT,
            "key": key,
            "deps": dict(deps),
            "object": digest,
            "size": obj.stat().st_size,
        }
        fsutil.atomic_write(
            cache.build_path("objects", key, ".json"), json.dumps(record, sort_keys=True).encode()
        )
    except OSError as e:
        log.debug("could not cache the object %s: %s", obj, e)
