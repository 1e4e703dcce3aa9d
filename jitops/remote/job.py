"""The job's own store as a tier: torchrun's TCPStore, or the default process group's store.

Imports ``jitops.base.settings``, ``.c10d_store``, ``.digest``, ``.store``, ``.tier``;
``.signing`` only with ``JITOPS_DISTRIBUTED=signed``; ``torch.distributed`` only
when a job is found (``DistributedSettings.in_job``, checked by the caller).

Which store: with torchrun's ``MASTER_ADDR``/``MASTER_PORT`` and ``WORLD_SIZE``
> 1, a TCPStore *client* of that address (every rank, whether or not it has
called ``init_process_group``, so all ranks see one key space); else, when the
default process group is initialized, its store. There is no public accessor
for that store: ``torch.distributed.distributed_c10d._get_default_store`` is
private, used only in that second case and looked up with ``getattr``, so a
torch without it means "no job store" rather than an error.

Unlike a configured remote tier, the job's store does not fail open once
connected (``Tier(fail_open=False)``): its failure is the job's, and is raised.
Failing to *connect* warns once and builds locally; the connect is tried again
on a later miss, at most every ``RETRY`` seconds (rank 0 may host the store
through ``init_process_group`` after this rank first looked). A connected
tier's counters are logged and summed for ``jitops cache stats`` at exit.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import warnings
from typing import Any

from ..base.settings import DistributedSettings, Settings
from .c10d_store import C10dStore
from .digest import DigestSigner, JobTrust
from .store import StoreError
from .tier import Tier

RETRY = 30.0  # seconds between connect attempts after one failed
_tier: Tier | None = None
_failed_at: float | None = None  # when this process last failed to connect (monotonic), else None
_lock = threading.Lock()


def _reset_after_fork() -> None:
    global _tier, _lock, _failed_at
    _tier, _lock, _failed_at = None, threading.Lock(), None


os.register_at_fork(after_in_child=_reset_after_fork)


def default_store() -> Any:
    """The initialized default process group's store, or None (never imports torch.distributed)."""
    dist = sys.modules.get("torch.distributed")
    if (
        dist is None
        or not dist.is_available()
        or not dist.is_initialized()
        or dist.get_world_size() < 2
    ):
        return None
    getter = getattr(dist.distributed_c10d, "_get_default_store", None)
    return getter() if getter is not None else None


def job_tier(settings: Settings) -> Tier | None:
    """This process's job-store tier, or None outside a job (made on first use)."""
    global _tier, _failed_at
    d = settings.distributed
    if d is None:
        return None
    with _lock:
        if (
            _tier is not None
            and _tier.settings == d.tier
            and (
                _tier.store is not None
                or _failed_at is None
                or time.monotonic() - _failed_at < RETRY
            )
        ):
            # connected, or a failed connect too recent to try again (builds locally meanwhile)
            return _tier
        tier = make_tier(d, warn=_failed_at is None)
        if tier is None:
            return None
        if tier.store is None:
            _failed_at = time.monotonic()
        else:
            _failed_at = None
            atexit.register(tier.at_exit)
        _tier = tier
        return tier


def _trust(d: DistributedSettings) -> tuple[JobTrust, Any]:
    if not d.signed:
        return JobTrust(), DigestSigner()
    from .signing import load_signer, load_trust

    signer, why = load_signer(d.tier)
    if signer is None:
        warnings.warn(
            f"jitops: JITOPS_DISTRIBUTED=signed, but {why}; this rank only reads the job's store",
            RuntimeWarning,
            stacklevel=4,
        )
    return JobTrust(signed=True, keyed=load_trust(d.tier)), signer


def make_tier(d: DistributedSettings, warn: bool = True) -> Tier | None:
    """A new tier for the job's store; a store-less one (builds locally) if it cannot connect."""
    trust, signer = _trust(d)
    if d.master_addr and d.master_port and d.world_size > 1:
        try:
            store = C10dStore.connect(
                d.master_addr, d.master_port, d.tier.connect_timeout, d.tier.op_timeout
            )
        except StoreError as e:
            if warn:
                warnings.warn(
                    f"jitops: {e}. This rank builds without the job's store. Fix: check MASTER_ADDR/"
                    f"MASTER_PORT, or set JITOPS_DISTRIBUTED=0 (retried every {RETRY:g} s)",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return Tier(d.tier, None, trust, signer)
        return Tier(d.tier, store, trust, signer, fail_open=False)
    found = default_store()
    if found is None:
        return None
    return Tier(d.tier, C10dStore(found, d.tier.url), trust, signer, fail_open=False)
