"""Which cache root to use: the configured one, or a private temporary one when it
cannot take a build (one warning per process; refused under ``strict``).

Imports: cache, errors, fsutil, settings, stamps.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path

from ..base import fsutil
from .cache import Cache
from ..errors import CacheError
from ..base.settings import Settings
from .stamps import Stamps

_lock = threading.Lock()
_private: Path | None = None


def _reset_after_fork() -> None:
    # A fork taken while another thread held the lock must not deadlock the child.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def cache_for_reading(settings: Settings) -> Cache:
    """The cache a plan reads: the private one once this process fell back to it, else the configured root; its
    verified stamps in the user's state dir (resolved only when a library is checked)."""
    return Cache(
        _private or settings.cache_root(),
        stamps=Stamps(settings.state_root, write=not settings.offline),
    )


def writable_cache(cache: Cache, what: str, settings: Settings) -> Cache:
    """The cache itself if it can take a build; else a private temporary one (one warning)."""
    global _private
    try:
        cache.ensure_base()
        problem = cache.root_problem()
        if problem is None:
            probe_file = cache.staging / f".probe.{os.getpid()}.{threading.get_ident()}"
            fsutil.atomic_write(probe_file, b"")
            probe_file.unlink()
            return cache
    except OSError as e:  # CacheError included: an obstruction that holds data
        problem = (
            str(e)
            if isinstance(e, CacheError)
            else f"{cache.root} is not writable ({e.strerror or e})"
        )
    if settings.strict:
        raise CacheError(
            f"cannot build {what}: the jitops cache is unusable ({problem}). Fix: make it writable by this user with mode 0700, "
            "or point JITOPS_CACHE_DIR at a directory you own (JITOPS_STRICT=1 forbids a temporary cache)"
        )
    with _lock:
        if _private is None:
            _private = Path(tempfile.mkdtemp(prefix="jitops-cache-"))
            os.chmod(_private, fsutil.DIR_MODE)
            atexit.register(shutil.rmtree, _private, ignore_errors=True)
            warnings.warn(
                f"jitops: cannot use the cache for {what} ({problem}); building into the private temporary cache "
                f"{_private} for this process. Fix: set JITOPS_CACHE_DIR to a directory you own",
                RuntimeWarning,
                stacklevel=4,
            )
    fallback = Cache(_private)
    fallback.ensure_base()
    return fallback
