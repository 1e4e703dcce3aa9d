"""The process's one remote tier: made on first use (connect, ping, load keys), reset in a forked child.

Imports ``.config``, ``.store``, ``.tier``; ``jitops.errors``, ``.backends`` and ``.signing`` when the tier is made.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import warnings

from .config import RemoteSettings
from .store import StoreError
from .tier import Tier

_tier: Tier | None = None
_tier_lock = threading.Lock()


def _reset_after_fork() -> None:
    global _tier, _tier_lock
    # a child opens its own connections and keeps its own counters
    _tier, _tier_lock = (
        None,
        threading.Lock(),
    )


os.register_at_fork(after_in_child=_reset_after_fork)


def tier_for(settings: RemoteSettings) -> Tier:
    """This process's tier for ``settings`` (made on first use: connect, ping, load keys)."""
    global _tier
    with _tier_lock:
        if _tier is not None and _tier.settings == settings:
            return _tier
        _tier = make_tier(settings)
        atexit.register(_tier.at_exit)
        return _tier


def make_tier(settings: RemoteSettings) -> Tier:
    from .backends import open_store

    try:
        from .signing import load_signer, load_trust
    except (
        ImportError
    ) as e:  # the optional extra is missing: a named error, never a raw ModuleNotFoundError
        from ..errors import ConfigError

        raise ConfigError(
            f"JITOPS_REMOTE_CACHE={settings.url} needs the `cryptography` package to check "
            f"signatures ({e}). Fix: pip install 'jitops[remote]' (or [redis] / [s3]), "
            "or unset JITOPS_REMOTE_CACHE"
        ) from None

    trust = load_trust(settings)
    signer = None
    if settings.mode != "read":
        signer, why = load_signer(settings)
        if signer is None and settings.mode == "write":
            warnings.warn(
                f"jitops: JITOPS_REMOTE_CACHE_MODE=write, but {why}; this process only reads from "
                f"{settings.url}",
                RuntimeWarning,
                stacklevel=3,
            )
    tier = Tier(settings, None, trust, signer)
    t0 = time.monotonic()
    try:
        store = open_store(settings)
        store.ping()
    except StoreError as e:
        tier.stats.seconds += time.monotonic() - t0
        tier.switch_off(e)
        return tier
    tier.stats.seconds += time.monotonic() - t0
    tier.store = store
    return tier
