"""The bundle tier: verified entries shipped in installed wheels (``jitops bundle build``).

A bundle is a package whose folder holds a cache's layout (``v1/entries/<library>/<target>/<key>/``) and
that names itself in the ``jitops.bundles`` entry-point group (``name = "jitops_bundle_x:ROOT"``): its folder,
found with ``importlib.util.find_spec``, is the root; the package is never imported. The installed bundles are
found once per process, and only when the local cache has missed (the warm path never reads entry points; the
user's stamps remember what a full read found for the same import path and distributions: ``Stamps.discovery``);
a broken one is skipped with a warning. Each is read as a :class:`BundleCache`: the cache's own ``lookup``/``verify`` (self-digested manifest, key recomputed, size, sha256, no links, no
group/world-writable path), owned by this user or root (a bundle pip-installed by root into an image), and
never written: no stamp is recorded for it (``Cache.verify`` stamps only a writable manifest, and a bundle's
caches carry no ``Stamps``), nothing is made, touched or set aside in it.

Signatures: an entry may hold a ``signature`` file beside its manifest (``<signer fingerprint> <base64 Ed25519
signature over the manifest's bytes>``, what ``jitops bundle build --sign`` writes). The check is
injected (``installed(check)``: this stage is below ``remote``, whose trusted keys it uses) and runs inside
``Cache.verify`` (``vouch``), before the library is hashed: a signed entry must verify against a trusted key; an
unsigned one is refused when JITOPS_REQUIRE_SIGNED=1 (what the injected check decides).

Imports: base.fsutil, cache, manifest, stamps (where the entry points found are remembered).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from ..base import fsutil
from .cache import Cache
from .manifest import EntryProblem
from .stamps import Stamps

log = logging.getLogger("jitops")

GROUP = "jitops.bundles"
ROOT_UID = 0
SIGNATURE = "signature"  # beside a bundle entry's manifest
MAX_SIGNATURE = 1024  # bytes: a fingerprint and one Ed25519 signature need ~140

Signature = tuple[str, str]  # (signer's fingerprint, base64 signature)
# manifest bytes, its signature: raises EntryProblem to refuse
Check = Callable[[bytes, Signature | None], None]

_lock = threading.Lock()
_found: list[BundleCache] | None = None


class BundleCache(Cache):
    """An installed bundle's folder as a read-only cache: verified like the cache, never written."""

    owners = (ROOT_UID,)

    def __init__(self, root: Path, name: str, check: Check) -> None:
        # every check hashes the library; nothing is recorded anywhere
        super().__init__(root, stamps=None)
        self.name = name  # "<distribution> <entry point name>", for reasons and listings
        self.check = check  # the signature policy (remote.archive_trust's, injected by build.entry)

    def vouch(self, entry: Path, manifest: bytes) -> None:
        self.check(manifest, read_signature(entry / SIGNATURE, self.owners))

    def ensure_base(
        self,
    ) -> None:  # every write path starts here (publish, staging, locks): refuse them all
        raise PermissionError(f"the bundle {self.name} at {self.root} is read-only")

    def record_use(
        self, entry: Path
    ) -> None:  # the loader's last-use touch: a bundle is never written
        return None


def _root_of(module: str, installed_at: str) -> Path:
    """The folder of the package the entry point names (``pkg:ROOT``), found without importing it: a bundle's
    Python code never runs (its entries are data, checked before anything of them is loaded). ``installed_at``:
    where its distribution put that package (the folder found must be that one, not another earlier on the path)."""
    if "." in module or not module.isidentifier():
        raise ValueError(
            f"{module!r} is not a top-level package name (a bundle is `jitops_bundle_NAME:ROOT`)"
        )
    spec = importlib.util.find_spec(module)  # a top-level name: finds, imports nothing
    if spec is None:
        raise ModuleNotFoundError(f"no package {module!r} on the path")
    folders = list(spec.submodule_search_locations or ())
    if len(folders) != 1 or not Path(folders[0]).is_absolute() or not Path(folders[0]).is_dir():
        raise ValueError(
            f"{module!r} is not a package in one folder (a module, a zip or a namespace package)"
        )
    if installed_at and os.path.realpath(folders[0]) != os.path.realpath(installed_at):
        raise ValueError(
            f"{module!r} on the import path is {folders[0]}, not the folder its distribution installed "
            f"({installed_at}): another folder of that name comes first on the path"
        )
    return Path(folders[0])


# what importlib.metadata reads a path folder's distributions from
_METADATA = (
    ".dist-info",
    ".egg-info",
    ".egg",
)


def _path_key() -> list[Any] | None:
    """What the installed distributions depend on: the finders that supply them, and each import path folder with
    the names of its distributions' metadata (one listdir each); a path entry that is a file (a zip), its size and
    mtime. None when it cannot be taken (an entry that is not a str, a deleted working directory): no memo then."""
    key: list[Any] = [
        sorted(type(f).__qualname__ for f in sys.meta_path if hasattr(f, "find_distributions"))
    ]
    for p in sys.path:
        if not isinstance(p, str):
            return None
        folder = os.path.abspath(p or ".")
        try:
            key.append([folder, *sorted(n for n in os.listdir(folder) if n.endswith(_METADATA))])
        except NotADirectoryError:
            st = os.stat(folder)
            key.append([folder, "file", st.st_size, st.st_mtime_ns])
        except FileNotFoundError:
            key.append([folder])
    return key


def _entry_points(memo: Stamps | None) -> list[list[str]]:
    """(distribution, entry point name, module, value, where the distribution put the module) of each
    ``jitops.bundles`` entry point: remembered for this import path and its distributions (``memo``), else read
    from every installed distribution (~4 ms) and remembered."""
    key = None
    if memo is not None:
        try:
            key = _path_key()
        except (
            OSError,
            ValueError,
        ) as e:  # e.g. the working directory was deleted: read, remember nothing
            log.debug("the import path's distributions could not be listed: %s", e)
    found = memo.discovery(key) if memo is not None and key is not None else None
    if found is None:
        found = []
        for ep in metadata.entry_points(group=GROUP):
            dist, where = _origin(ep)
            found.append([dist, ep.name, ep.module, ep.value, where])
        if memo is not None and key is not None:
            memo.record_discovery(key, found)
    return found


def _origin(ep: metadata.EntryPoint) -> tuple[str, str]:
    """(the distribution's name, where it installed the entry point's package); unknown parts empty."""
    try:
        return (
            (ep.dist.name, str(ep.dist.locate_file(ep.module)))
            if ep.dist is not None
            else ("unknown distribution", "")
        )
    except Exception:  # noqa: BLE001 - another kind of distribution may not locate files: no check of where
        return "unknown distribution", ""


def read_signature(path: Path, owners: tuple[int, ...] = ()) -> Signature | None:
    """The signature file at ``path``: None when there is none; EntryProblem when it is a link, not a regular file
    (checked on the open descriptor too), owned by another user, writable by others, too large or not two words."""
    if not os.path.lexists(path):
        return None
    if (reason := fsutil.insecure_reason(path, want_dir=False, owners=owners)) is not None:
        raise EntryProblem(reason)
    try:  # checked again on the descriptor it is read from
        raw = fsutil.read_bounded(path, MAX_SIGNATURE, owners=owners)
    except OSError as e:
        raise EntryProblem(f"cannot read {path}: {e.strerror}") from e
    words = raw.decode("ascii", "replace").split()
    if len(words) != 2:
        raise EntryProblem(
            f"{path} is not a signature (expected the signer's fingerprint and a base64 signature)"
        )
    return words[0], words[1]


def signature_text(signature: Signature) -> bytes:
    """What :func:`read_signature` reads back as ``signature``."""
    return f"{signature[0]} {signature[1]}\n".encode("ascii")


def installed(check: Check, memo: Stamps | None = None) -> list[BundleCache]:
    """The installed bundles, read once per process (sorted by name: a stable order of lookup), each with
    ``check`` as its signature check (the first call's: later ones get the bundles as they were read). ``memo``:
    the user's stamps, which remember the entry points found for the same import path and distributions."""
    global _found
    with _lock:
        if _found is None:
            found: dict[Path, BundleCache] = {}
            for dist, name, module, value, installed_at in _entry_points(memo):
                try:
                    root = _root_of(module, installed_at)
                except Exception as e:  # noqa: BLE001 - a broken bundle must not break jitops
                    log.warning(
                        "ignoring jitops bundle entry point %r (%s) from %s: %s: %s",
                        name,
                        value,
                        dist,
                        type(e).__name__,
                        e,
                    )
                    continue
                found.setdefault(root, BundleCache(root, f"{dist} ({name})", check))
            _found = sorted(found.values(), key=lambda b: b.name)
        return list(_found)


def found() -> list[BundleCache]:
    """The bundles this process has read so far (none before its first local miss): for listings."""
    return list(_found or ())


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
