"""An entry's origin, noted when a tier installs one it must never vouch for: the job's store (issue 16).

Imports ``jitops.cache`` (the note's path, ``Cache.origin_path``), ``jitops.fsutil``
and ``jitops.manifest``. The job tier trusts an entry by its digest only (anyone
who can write the job's store could have put it there), so ``jitops cache push``
and ``jitops warm --push`` must not sign it into the remote tier. The note holds
the store it came from and the sha256 of the entry's manifest: an entry rebuilt
here since has another manifest, so its stale note no longer applies.
"""

from __future__ import annotations

import hashlib
import json

from .. import fsutil
from ..cache import Cache
from ..manifest import MANIFEST, Address


def _digest(cache: Cache, address: Address) -> str | None:
    try:
        return hashlib.sha256((cache.path_of(address) / MANIFEST).read_bytes()).hexdigest()
    except OSError:
        return None


def note(cache: Cache, address: Address, source: str) -> None:
    """Record that the entry at ``address`` (just installed) came from ``source``, not from a build here."""
    path = cache.origin_path(address)
    fsutil.makedirs(path.parent)
    fsutil.atomic_write(path, json.dumps({"from": source, "manifest": _digest(cache, address)}).encode())


def installed_from(cache: Cache, address: Address) -> str | None:
    """The store the entry at ``address`` was installed from, or None when it was built here (or the note is stale)."""
    try:
        rec = json.loads(cache.origin_path(address).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("manifest") != _digest(cache, address):
        return None
    return str(rec.get("from"))
