"""An entry's provenance: the note written beside it when it was not built here.

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


def note(
    cache: Cache,
    address: Address,
    kind: str,
    source: str,
    manifest: bytes,
    signer: str | None = None,
) -> None:
    """Record that the entry with these ``manifest`` bytes at ``address`` came from ``source`` (a
    ``kind``), and whose signature (a key fingerprint) was checked when it came in, if any."""
    assert kind in KINDS, kind
    path = cache.origin_path(address)
    fsutil.makedirs(path.parent)
    body = {"kind": kind, "from": source, "manifest": hashlib.sha256(manifest).hexdigest()}
    if signer is not None:
        body["signer"] = signer
    fsutil.atomic_write(path, json.dumps(body).encode())


def installed_from(cache: Cache, address: Address) -> tuple[str, str] | None:
    """(kind, source) of a foreign entry at ``address``; None when it was built here (or the note is stale).

    A note that cannot be read or names no known kind is ("unknown", why): never taken for a build here.
    """
    found = origin_of(cache, address)
    return None if found is None else found[:2]


def origin_of(cache: Cache, address: Address) -> tuple[str, str, str | None] | None:
    """:func:`installed_from` with the signer whose signature was checked on the way in (None:
    unsigned, or a note written before signers were noted)."""
    try:
        raw = fsutil.read_bounded(cache.origin_path(address))  # never a link nor a FIFO
    except FileNotFoundError:
        return None
    except OSError as e:
        return "unknown", f"its origin note cannot be read ({e.strerror})", None
    try:
        rec = json.loads(raw)
    except ValueError:
        return "unknown", "its origin note is damaged", None
    if not isinstance(rec, dict):
        return "unknown", "its origin note is damaged", None
    if rec.get("manifest") != _digest(cache, address):
        return None
    kind = rec.get("kind", "job-store")  # older notes came from the job's store only
    if kind not in KINDS:
        return "unknown", f"its origin note names {kind!r}", None
    signer = rec.get("signer")
    return kind, str(rec.get("from")), signer if isinstance(signer, str) else None
