"""The remote cache tier (issue 15): a second, shared, signed cache behind the local one.

Nothing here is imported unless ``Settings.remote`` is set (``JITOPS_REMOTE_CACHE``;
``jitops.entry`` checks before importing) or a ``jitops cache`` remote command
runs. Modules, lowest first; each imports only those above it, plus
``jitops`` modules named in its docstring, the stdlib and its one optional
dependency:

- ``config``   the settings type (read by ``jitops.settings``) and the key pair's dir
- ``stats``, ``envelope``  counters; the signed wire format of one entry
- ``store``    the small store interface (blobs, leases, failure records) + errors
- ``signing``  Ed25519 keys, fingerprints, trust (``cryptography``)
- ``redis_store`` / ``fs_store`` / ``object_store``  backends (``redis`` / the filesystem / ``fsspec``)
- ``backends`` URL -> store
- ``lease``    a held lease and its renewal thread
- ``tier``     the flow: fetch, verify, publish; lease, build, upload; fail open
- ``session``  the process's one tier (made on first use)
- ``commands`` what ``jitops cache keygen/push/pull/ls --remote/stats`` and doctor do

This file imports ``jitops.settings``, and the session when the tier is on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..settings import Settings

if TYPE_CHECKING:
    from .tier import Tier


def active_tier(settings: Settings | None = None) -> Tier | None:
    """The process's remote tier, or None when ``JITOPS_REMOTE_CACHE`` is unset (nothing is imported then)."""
    settings = Settings.from_env() if settings is None else settings
    if settings.remote is None:
        return None
    from .session import tier_for

    return tier_for(settings.remote)
