"""Objects cached per translation unit, so an edit to one file of a library recompiles that file only.

A TU's key covers what its compile reads besides the headers: the compiler's
and torch's identity, the exact flags (the library's folder written as
``<root>``: load_inline writes every edit to a new folder), and the source's
sha256. The headers it includes are known only after a compile, from the
compiler's dependency file, so the record under that key lists them with
their sha256: a lookup re-hashes them, and any difference (or a missing
header) is a miss. System headers (``-isystem``: torch, Python) are left out
of dependency files by ``-MMD``; torch's identity in the key stands for them,
as in the entry key. A header inside the library's folder is recorded
relative to it, and re-hashed in the folder of the build asking.

Objects are stored by their own sha256 and verified (size, digest, owner,
mode) before use; anything wrong is a miss, never an error. The record is
written after the object, both atomically, so a racing writer or a killed
one leaves either nothing usable or a complete pair. A hit touches its record
(its last use, for ``jitops cache prune``, which may delete either half at any
time: a record without its object is a miss).

Imports: fsutil (the Cache is passed in).
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

if TYPE_CHECKING:
    from .cache import Cache

log = logging.getLogger("jitops")

FORMAT = 1
ROOT = "<root>"


def _rel(path: str, root: Path) -> str:
    real = os.path.abspath(path)
    base = str(root).rstrip("/") + "/"
    return ROOT + "/" + real[len(base) :] if real.startswith(base) else real


def _abs(label: str, root: Path) -> Path:
    return root / label[len(ROOT) + 1 :] if label.startswith(ROOT + "/") else Path(label)


def tu_key(identity: str, command: str, source_digest: str, root: Path) -> str:
    """The key of one compile: ``identity`` (compiler, torch, ...), its command's flags, the source's digest."""
    text = json.dumps([FORMAT, identity, command.replace(str(root), ROOT), source_digest])
    return hashlib.sha256(text.encode()).hexdigest()


def read_depfile(path: Path) -> list[str]:
    """The files a make-style dependency file (``-MMD -MF``) lists, target excluded."""
    text = path.read_text(errors="replace").replace("\\\n", " ")
    out: list[str] = []
    for rule in text.split("\n"):
        _, sep, deps = rule.partition(": ")
        if not sep:
            continue
        word = ""
        for part in deps.split(" "):  # "\ " escapes a space in a path
            if part.endswith("\\"):
                word += part[:-1] + " "
                continue
            word += part
            if word:
                out.append(word)
            word = ""
    return out


def header_digests(files: list[str], root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """{label: sha256} of the dependency file's headers, except those under ``skip`` (the PCH folder)."""
    out = {}
    for f in files:
        real = os.path.abspath(f)
        if any(real.startswith(s) for s in skip):
            continue
        out[_rel(real, root)] = fsutil.sha256_file(Path(real))
    return out


def headers_unchanged(deps: Mapping[str, str], root: Path) -> bool:
    for label, digest in deps.items():
        try:
            if fsutil.sha256_file(_abs(label, root)) != digest:
                return False
        except OSError:
            return False
    return True


def lookup(cache: Cache, key: str, root: Path, into: Path) -> bool:
    """Copy the verified object for ``key`` to ``into``; False (a miss) if there is none usable."""
    try:
        path = cache.build_path("objects", key, ".json")
        # bounded, never a link nor a FIFO; a link at objects/ is no cache
        record = fsutil.read_record(path) if fsutil.may_hold(cache.objects) else None
        if record is None or record.get("format") != FORMAT or record.get("key") != key:
            return False
        if not headers_unchanged(record["deps"], root):
            return False
        obj = cache.build_path("objects", record["object"], ".o")
        if (
            fsutil.insecure_reason(obj, want_dir=False) is not None
            or os.lstat(obj).st_size != record["size"]
        ):
            return False
        shutil.copyfile(obj, into)
        if fsutil.sha256_file(into) != record["object"]:  # the copy is what gets linked: check that
            into.unlink()
            return False
        with contextlib.suppress(OSError):
            fsutil.mark_used(path)  # the object's last use, for `jitops cache prune`
        return True
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def store(
    cache: Cache,
    key: str,
    obj: Path,
    depfile: Path,
    root: Path,
    skip: tuple[str, ...] = (),
    extra_deps: Mapping[str, str] | None = None,
    source: str = "",
) -> None:
    """Record a fresh object (best effort: a cache that cannot be written only costs the next compile)."""
    try:
        deps = header_digests(
            [f for f in read_depfile(depfile) if os.path.abspath(f) != source], root, skip
        )
        deps.update(extra_deps or {})
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
            "deps": deps,
            "object": digest,
            "size": obj.stat().st_size,
        }
        fsutil.atomic_write(
            cache.build_path("objects", key, ".json"), json.dumps(record, sort_keys=True).encode()
        )
    except OSError as e:
        log.debug("could not cache the object %s: %s", obj, e)
