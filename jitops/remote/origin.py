"""An entry's provenance: the note written beside it when it was not built here (issues 16, 28).

Imports ``jitops.store.cache`` (the note's path, ``Cache.origin_path``), ``jitops.store.manifest`` and ``jitops.base.fsutil``.
Whatever installs an entry that this machine did not build writes the note *before*
publishing it: ``cache import`` ("imported", the archive and its signer), a remote fetch
or ``cache pull`` ("pulled", the store), the job's store ("job-store"). Builds publish
without one, so an entry with no note (or a note for another manifest: rebuilt here
since) was built here. ``cache push`` and ``cache export`` sign only those, unless the
user names a foreign entry with ``--resign-foreign``. The note holds the sha256 of the
entry's manifest, so it follows that exact entry.
"""

from __future__ import annotations

import hashlib
import json

from ..base import fsutil
from ..store.cache import Cache
from ..store.manifest import Address

KINDS = ("imported", "pulled", "job-store")


def _digest(cache: Cache, address: Address) -> str | None:
    try:
        return hashlib.sha256(cache.manifest_bytes(cache.path_of(address))).hexdigest()
    except OSError:
        return None


def note(cache: Cache, address: Address, kind: str, source: str, manifest: bytes) -> None:
    """Record that the entry with these ``manifest`` bytes at ``address`` came from ``source`` (a ``kind``)."""
    assert kind in KINDS, kind
    path = cache.origin_path(address)
    fsutil.makedirs(path.parent)
    body = {"kind": kind, "from": source, "manifest": hashlib.sha256(manifest).hexdigest()}
    fsutil.atomic_write(path, json.dumps(body).encode())


def installed_from(cache: Cache, address: Address) -> tuple[str, str] | None:
    """(kind, source) of a foreign entry at ``address``; None when it was built here (or the note is stale).

    A note that cannot be read or names no known kind is ("unknown", why): never taken for a build here.
    """
    try:
        raw = fsutil.read_bounded(cache.origin_path(address))  # never a link nor a FIFO
    except FileNotFoundError:
        return None
    except OSError as e:
        return "unknown", f"its origin note cannot be read ({e.strerror})"
    try:
        rec = json.loads(raw)
    except ValueError:
        return "unknown", "its origin note is damaged"
    if not isinstance(rec, dict):
        return "unknown", "its origin note is damaged"
    if rec.get("manifest") != _digest(cache, address):
        return None
    kind = rec.get("kind", "job-store")  # notes before issue 28 came from the job's store only
    return (
        (kind, str(rec.get("from")))
        if kind in KINDS
        else ("unknown", f"its origin note names {kind!r}")
    )
