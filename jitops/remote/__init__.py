"""The remote cache tier: a second, shared, signed cache behind the local one.

Nothing here is imported unless ``Settings.remote`` is set (``JITOPS_REMOTE_CACHE``),
a torchrun job misses an op (``DistributedSettings.in_job``: the job-store tier; ``jitops.build.entry``
checks both before importing, after a local miss), ``jitops.distributed.warm`` is called, or a
``jitops cache`` remote command runs. Modules, lowest first; each imports only those above it, plus
``jitops`` modules named in its docstring, the stdlib and its one optional
dependency:

- ``config``   the settings type (read by ``jitops.base.settings``) and the key pair's dir
- ``stats``, ``envelope``  counters; the signed wire format of one entry
- ``origin``   an entry's provenance note (imported, pulled, job store); ``cache push`` and
               ``cache export`` sign only entries without one (built here)
- ``store``    the small store interface (blobs, leases, failure records) + errors
- ``signing``  Ed25519 keys, fingerprints, trust (``cryptography``)
- ``redis_store`` / ``fs_store`` / ``object_store``  backends (``redis`` / the filesystem / ``fsspec``)
- ``backends`` URL -> store
- ``lease``    a held lease and its renewal thread
- ``tier``     the flow: fetch, verify, publish; lease, build, upload; fail open (the job's store: raise)
- ``session``  the process's one tier (made on first use)
- ``archive_trust``  the hooks that sign exports and verify and note imports
- ``commands`` what ``jitops cache keygen/push/pull/ls --remote/stats`` and doctor do

- ``c10d_store``, ``digest``, ``job``  the job's own store as a tier

This file imports ``jitops.base.settings``, the session when the tier is on, and
``.job`` only inside a torchrun job (``DistributedSettings.in_job``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..base.settings import Settings

if TYPE_CHECKING:
    from ..store.cache import Cache
    from ..store.manifest import Manifest
    from ..plan import Plan
    from .tier import Tier


def active_tier(settings: Settings | None = None) -> Tier | None:
    """The process's remote tier, or None when ``JITOPS_REMOTE_CACHE`` is unset (nothing is imported then)."""
    settings = Settings.from_env() if settings is None else settings
    if settings.remote is None:
        return None
    from .session import tier_for

    return tier_for(settings.remote)


def obtain(
    plan: Plan, cache: Cache, build: Callable[[], Manifest], settings: Settings, job: bool
) -> tuple[Manifest, bool]:
    """The entry through the tiers: the remote tier first, then the job's store (``job``), then ``build``.

    (manifest, built by this process?). A tier uploads only what this process
    built: an entry fetched from the job's store is never re-signed into the remote tier.
    """
    tiers = [t for t in (active_tier(settings),) if t is not None]
    if job:
        from .job import job_tier

        jt = job_tier(settings)
        if jt is not None:
            tiers.append(jt)
    built = [False]

    def innermost() -> Manifest:
        manifest = build()
        built[0] = True
        return manifest

    step: Callable[[], Manifest] = innermost
    for tier in reversed(tiers):
        step = _through(tier, plan, cache, step, settings.lock_timeout, built)
    return step(), built[0]


def _through(
    tier: Tier,
    plan: Plan,
    cache: Cache,
    inner: Callable[[], Manifest],
    limit: float | None,
    built: list[bool],
) -> Callable[[], Manifest]:
    return lambda: tier.obtain(plan, cache, inner, limit, built_here=lambda: built[0])[0]
