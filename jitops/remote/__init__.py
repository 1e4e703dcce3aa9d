"""The remote cache tier (issue 15): a second, shared, signed cache behind the local one.

Nothing here is imported unless ``JITOPS_REMOTE_CACHE`` is set (or a ``jitops
cache`` remote command runs). Modules, lowest first; each imports only those
above it, plus the stdlib and its one optional dependency:

- ``config``   the settings, read from the environment (stdlib only)
- ``stats``, ``envelope``  counters; the signed wire format of one entry
- ``store``    the small store interface (blobs, leases, failure records) + errors
- ``signing``  Ed25519 keys, fingerprints, trust (``cryptography``)
- ``redis_store`` / ``fs_store``  backends (``redis`` / the filesystem, ``fsspec`` for other URLs)
- ``backends`` URL -> store
- ``lease``    a held lease and its renewal thread
- ``tier``     the flow: fetch, verify, publish; lease, build, upload; fail open
- ``session``  the process's one tier (made on first use)
- ``commands`` what ``jitops cache keygen/push/pull/ls --remote/stats`` and doctor do

This file imports only ``.config`` (stdlib), and the tier when the URL is set.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .tier import Tier


def active_tier(environ: Mapping[str, str] | None = None) -> Tier | None:
    """The process's remote tier, or None when ``JITOPS_REMOTE_CACHE`` is unset (nothing is imported then)."""
    from .config import remote_settings

    settings = remote_settings(environ)
    if settings is None:
        return None
    from .session import tier_for

    return tier_for(settings)
