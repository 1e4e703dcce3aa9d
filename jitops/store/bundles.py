"""The bundle tier (issue 31): verified entries shipped in installed wheels (``jitops bundle build``).

A bundle is a package whose folder holds a cache's layout (``v1/entries/<library>/<target>/<key>/``) and
that names that folder in the ``jitops.bundles`` entry-point group (``name = "jitops_bundle_x:ROOT"``). The
installed bundles are found once per process, and only when the local cache has missed (the warm path never
reads entry points); a broken one is skipped with a warning. Each is read as a :class:`BundleCache`: the
cache's own ``lookup``/``verify`` (self-digested manifest, key recomputed, size, sha256, no links, no
group/world-writable path), owned by this user or root (a bundle pip-installed by root into an image), and
never written: no stamp is recorded for it (``Cache.verify`` stamps only a writable manifest, and a bundle's
caches carry no ``Stamps``), nothing is made, touched or set aside in it.

Imports: cache.
"""

from __future__ import annotations

import logging
import os
import threading
from importlib import metadata
from pathlib import Path

from .cache import Cache

log = logging.getLogger("jitops")

GROUP = "jitops.bundles"
ROOT_UID = 0

_lock = threading.Lock()
_found: list[BundleCache] | None = None


class BundleCache(Cache):
    """An installed bundle's folder as a read-only cache: verified like the cache, never written."""

    owners = (ROOT_UID,)

    def __init__(self, root: Path, name: str) -> None:
        super().__init__(root, stamps=None)  # every check hashes the library; nothing is recorded anywhere
        self.name = name  # "<distribution> <entry point name>", for reasons and listings

    def ensure_base(self) -> None:  # every write path starts here (publish, staging, locks): refuse them all
        raise PermissionError(f"the bundle {self.name} at {self.root} is read-only")

    def record_use(self, entry: Path) -> None:  # the loader's last-use touch: a bundle is never written
        return None


def _root_of(ep: metadata.EntryPoint) -> Path:
    value = ep.load()
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"expected the bundle's folder (a str or path), got {type(value).__name__}")
    root = Path(os.fspath(value))
    if not root.is_absolute() or not root.is_dir():
        raise ValueError(f"{root} is not an absolute path to a folder")
    return root


def installed() -> list[BundleCache]:
    """The installed bundles, read once per process (sorted by name: a stable order of lookup)."""
    global _found
    with _lock:
        if _found is None:
            found: dict[Path, BundleCache] = {}
            for ep in metadata.entry_points(group=GROUP):
                dist = ep.dist.name if ep.dist is not None else "unknown distribution"
                try:
                    root = _root_of(ep)
                except Exception as e:  # noqa: BLE001 - a broken bundle must not break jitops
                    log.warning("ignoring jitops bundle entry point %r (%s) from %s: %s: %s", ep.name, ep.value,
                                dist, type(e).__name__, e)
                    continue
                found.setdefault(root, BundleCache(root, f"{dist} ({ep.name})"))
            _found = sorted(found.values(), key=lambda b: b.name)
        return list(_found)


def forget() -> None:
    """Read the entry points again on next use (tests; a process that installed a bundle after its first miss)."""
    global _found
    with _lock:
        _found = None


def _reset_after_fork() -> None:
    global _lock  # a fork taken while another thread held the lock must not deadlock the child
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def holding(path: Path) -> BundleCache | None:
    """The bundle read in this process whose folder holds ``path``, if any (no bundle read: None at once)."""
    found = _found
    if not found:
        return None
    return next((b for b in found if path.is_relative_to(b.root)), None)
