"""The on-disk cache: the only module that knows its paths and layout.

Layout under the root (``Settings.cache_root()``: ``$JITOPS_CACHE_DIR``, else
platformdirs' user cache dir for ``jitops``)::

    v1/entries/<library>/<target>/<key>/   manifest.json + lib<library>.so
    v1/staging/<library>-<key>.<host>.<pid>.<random>/   one private build
    v1/locks/<library>-<key>.lock          per-key OS lock (+ .holder info)
    v1/logs/                               logs of failed builds
    v1/toolchains/                         remembered compiler identities
    v1/inline/<name>-<digest>/             load_inline's sources, by content
    v1/objects/, v1/pch/                   per-file objects and precompiled headers (objcache.py, pch.py)
    v1/trash/                              entries set aside as damaged
    v1/remote-stats.json                   the remote tier's counters (+ .lock)
    v1/origins/<library>/<target>/<key>    where a tier got an entry it may not re-sign (the job's store)

A tier is two calls: ``lookup(address, root) -> Hit | Miss(reason)`` (verified, and every file
its build read still as recorded: ``stale``, store.inputs) and
``publish_entry(staged, address)`` (a finished staging dir -> what is in place now, ours or a
racing winner's). A remote hit is imported into local staging and published here, so only verified
local entries are loaded. Loading needs manifest, key, size and sha256 to agree, and refuses
symlinks, other owners and group/world-writable paths. Every walk of the tree (``iter_entries``,
``sweep_staging``, ``walkable``) is by lstat: a link where a folder belongs is never entered.

A passed check is stamped (``stamps``, the user's state dir): later ones skip the sha256 while the library keeps its stat.
Imports: errors (CacheError), fsutil, key (KEY_CHARS, compute_key), inputs (proving what a build read), manifest (entry data types); obstruct lazily (builds); stamps for annotations.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..base import fsutil
from ..errors import CacheError
from ..key import KEY_CHARS, compute_key
from . import inputs
from .manifest import MANIFEST, Address, EntryProblem, Hit, Manifest, Miss

if TYPE_CHECKING:
    from .stamps import Stamps

log = logging.getLogger("jitops")

LAYOUT = "v1"
MAX_MANIFEST_BYTES = 4 << 20
STAGING_MAX_AGE = 3600.0  # seconds; older staging dirs are swept


def _safe_host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:64] or "host"


class Cache:
    """Paths and operations on one cache root."""

    owners: tuple[
        int, ...
    ] = ()  # trusted owners besides this user (store.bundles: root, for a root-installed bundle)
    # obstruct.scan
    FOLDERS = (
        "entries",
        "staging",
        "locks",
        "logs",
        "toolchains",
        "trash",
        "inline",
        "objects",
        "pch",
    )

    def __init__(self, root: Path, stamps: Stamps | None = None) -> None:
        self.root = Path(root)
        # verified stamps (the user's state dir); None: every check hashes the library
        self.stamps = stamps
        self.base = self.root / LAYOUT
        self.folders = {name: self.base / name for name in self.FOLDERS}
        (
            self.entries,
            self.staging,
            self.locks,
            self.logs,
            self.toolchains,
            self.trash,
            _,
            self.objects,
            self.pch,
        ) = self.folders.values()
        # the remote tier's counters (`jitops cache stats`)
        self.remote_stats = self.base / "remote-stats.json"
        # entries installed from the job's store (never re-signed by push)
        self.origins = self.base / "origins"
        # `cache clear`
        self.owned_dirs = (
            self.logs,
            self.toolchains,
            self.trash,
            self.origins,
            self.objects,
            self.pch,
        )
        # files `cache clear` removes: the remote tier's counters
        self.owned_files = (self.remote_stats,)

    def entry_dir(self, library: str, target: str, key: str) -> Path:
        return self.entries / library / target / key[:KEY_CHARS]

    def path_of(self, address: Address) -> Path:
        return self.entry_dir(address.library, address.target, address.key)

    def origin_path(
        self, address: Address
    ) -> Path:  # the job tier's note that it installed this entry
        return self.origins / address.library / address.target / address.key[:KEY_CHARS]

    def library_dir(
        self, library: str
    ) -> Path:  # every target's entries of ``library`` (<target>/<key> below)
        return self.entries / library

    def target_dir(self, library: str, target: str) -> Path:
        return self.entries / library / target

    @staticmethod
    def library_path(entry: Path, manifest: Manifest) -> Path:  # an entry's shared library
        return entry / manifest.library_file

    def inline_dir(self, name: str, digest: str) -> Path:
        return self.folders["inline"] / f"{name}-{digest}"

    def build_path(self, folder: str, digest: str, suffix: str = "") -> Path:
        """objects/: ``<key>.json`` (a file's record), ``<sha256>.o``; pch/: ``<key>/``, ``.seen``, ``.failed``, ``.h`` (pch.py, pch_marks)."""
        return self.folders[folder] / f"{digest[:KEY_CHARS]}{suffix}"

    def log_file(self, library: str, target: str) -> Path:
        return self.logs / f"{library}-{target}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"

    def archive_name(
        self, path: Path
    ) -> str:  # a path under the root as an archive member (v1/...)
        return path.relative_to(self.root).as_posix()

    def lock_path(self, library: str, key: str) -> Path:
        return self.locks / f"{library}-{key[:KEY_CHARS]}.lock"

    def walkable(self, folder: Path) -> bool:
        """Every folder from ``v1`` down to ``folder`` (one under it) is a real folder: none is a link."""
        parts = folder.relative_to(self.base).parts
        return all(
            fsutil.is_real_dir(self.base.joinpath(*parts[:i])) for i in range(len(parts) + 1)
        )

    def root_problem(self) -> str | None:
        """Why this root must not be used for loading, or None."""
        for p in (self.root, self.base):
            reason = fsutil.insecure_reason(p, want_dir=True, owners=self.owners)
            if reason is not None:
                return reason
        return None

    def verify(self, entry: Path, key: str, library: str, target: str) -> Manifest:
        """Return the manifest of a loadable entry, or raise EntryProblem."""
        mpath = entry / MANIFEST
        for p in (entry.parent.parent.parent, entry.parent.parent, entry.parent, entry, mpath):
            if (
                reason := fsutil.insecure_reason(p, want_dir=p is not mpath, owners=self.owners)
            ) is not None:
                raise EntryProblem(reason)
        try:
            raw = self.manifest_bytes(entry)
        except OSError as e:
            if e.errno == errno.EFBIG:
                raise EntryProblem(f"{mpath} is implausibly large") from e
            raise EntryProblem(f"cannot read {mpath}: {e.strerror}") from e
        try:
            m = Manifest.parse(raw)
        except (ValueError, TypeError, UnicodeDecodeError) as e:
            raise EntryProblem(f"{mpath} is not a valid manifest ({e})") from e
        if m.key != key or m.library != library or m.target != target:
            raise EntryProblem(
                f"{mpath} describes another build (key {m.key[:12]}, {m.library}/{m.target})"
            )
        if compute_key(m.ingredients) != key:
            raise EntryProblem(f"{mpath}: its ingredients do not hash to its key")
        # a bundle's signature (store.bundles): checked before the library is hashed
        self.vouch(entry, raw)
        lib = entry / m.library_file
        if (reason := fsutil.insecure_reason(lib, want_dir=False, owners=self.owners)) is not None:
            raise EntryProblem(reason)
        st = os.lstat(lib)
        if st.st_size != m.size:
            raise EntryProblem(f"{lib} has {st.st_size} bytes, the manifest says {m.size}")
        # else: this very file passed it
        if self.stamps is None or not self.stamps.vouches(entry, raw, m.sha256, st):
            if fsutil.sha256_file(lib) != m.sha256:
                raise EntryProblem(f"{lib} does not match its manifest's sha256")
            # a read-only cache promises zero writes
            if self.stamps is not None and fsutil.writable(mpath):
                self.stamps.record(entry, raw, m.sha256, st, lib)
        return m

    def vouch(
        self, entry: Path, manifest: bytes
    ) -> None:  # the cache's own entries need no one else's word
        return None

    @staticmethod
    def manifest_bytes(entry: Path) -> bytes:
        """The bytes of ``entry``'s manifest, read bounded and never blocking: OSError for a link, a FIFO
        or a device where it belongs, or one larger than any manifest."""
        return fsutil.read_bounded(entry / MANIFEST, MAX_MANIFEST_BYTES)

    def read_manifest(self, entry: Path) -> Manifest | None:
        """The manifest, unverified (for listing and explaining), or None (also where it is no regular file)."""
        try:
            return Manifest.parse(self.manifest_bytes(entry))
        except (OSError, ValueError, TypeError):
            return None

    def lookup(self, address: Address, root: Path | None = None) -> Hit | Miss:
        """The verified entry at ``address`` whose recorded inputs all hold (``root``: the library's folder
        here, see :meth:`stale`), or a Miss saying why not (None: nothing there; never a PermissionError)."""
        entry = self.path_of(address)
        if not os.path.lexists(entry):
            return Miss()
        problem = self.root_problem()
        if problem is not None:
            return Miss(f"cache root refused: {problem}")
        try:
            m = self.verify(entry, address.key, address.library, address.target)
        except EntryProblem as e:
            return Miss(str(e))
        why = self.stale(entry, m, root)
        return Hit(entry, m) if why is None else Miss(why)

    def stale(
        self, entry: Path, manifest: Manifest, root: Path | None, *, only_root: bool = False
    ) -> str | None:
        """Why a verified entry was built from other inputs than this machine holds now, or None: each
        file its build read still holds the recorded bytes (store.inputs; ``root``: where its
        ``<root>/`` files are here). ``only_root``: the library's own files only (no compiler here:
        nothing else could be built anyway; an entry without a record then passes)."""
        if manifest.inputs is None:
            if only_root:
                return None
            return (
                f"{entry} does not record what its compiler read (built by an earlier jitops), "
                "so it cannot be proven current"
            )
        where = os.fsdecode(entry)
        vouched = self.stamps.inputs_stamp(where) if self.stamps is not None else None
        why, stamp = inputs.prove(manifest.inputs, root, vouched, only_root=only_root)
        # remembered as a library stamp is: never from a read-only cache (nor offline: Stamps.write)
        if stamp is not None and self.stamps is not None and fsutil.writable(entry / MANIFEST):
            self.stamps.record_inputs_stamp(where, stamp)
        return None if why is None else f"stale: {why}"

    def publish_entry(
        self, staged: Path, address: Address, root: Path | None = None
    ) -> tuple[Hit | Miss, bool]:
        """Rename a finished staging dir into place; (what is in place now, verified: ours or a racing winner's, ours?)."""
        ours = self.publish(staged, address.library, address.target, address.key)
        return self.lookup(address, root), ours

    def ensure_base(self) -> None:
        from . import obstruct  # a build's way only (warm hits skip it)

        fsutil.makedirs(self.base)
        # key.py's walks skip a tagged folder
        if not os.path.lexists(tag := self.base / fsutil.CACHEDIR_TAG):
            fsutil.atomic_write(tag, fsutil.CACHEDIR_SIGNATURE, durable=False)
        for d in (self.staging, self.locks, self.entries):
            # a stray file or link
            obstruct.heal(d, want_dir=True, what=f"the {d.name} folder")
            fsutil.makedirs(d)
        # what holds data stays: objects and logs are only a cache, and api.user (load_inline's
        # sources) refuses to write there by name; their writers check fsutil.may_hold
        for d in (self.objects, self.logs, self.folders["inline"]):
            try:
                obstruct.heal(d, want_dir=True, what=f"the {d.name} folder")
            except CacheError as e:
                log.warning("%s; builds go on without it", str(e).partition(". Fix:")[0])

    def new_staging(self, library: str, key: str) -> Path:
        self.ensure_base()
        d = (
            self.staging
            / f"{library}-{key[:KEY_CHARS]}.{_safe_host()}.{os.getpid()}.{os.urandom(4).hex()}"
        )
        try:
            os.mkdir(d, fsutil.DIR_MODE)
            os.chmod(d, fsutil.DIR_MODE)
        except OSError as e:
            raise _cache_error(
                e, f"cannot make a private build folder for {library} in {self.staging}"
            ) from e
        return d

    def publish(self, staged_entry: Path, library: str, target: str, key: str) -> bool:
        """Rename a finished entry into place. False if another process won."""
        final = self.entry_dir(library, target, key)
        for d in (self.entries, final.parent.parent, final.parent):
            # never through a link or a file
            if os.path.islink(d) or (os.path.lexists(d) and not os.path.isdir(d)):
                self.set_aside(d, "a symbolic link or a file where the cache keeps a folder")
        fsutil.makedirs(final.parent)
        try:
            os.rename(staged_entry, final)
        except OSError as e:
            if os.path.lexists(final):
                return False
            raise _cache_error(
                e, f"cannot publish {library}/{target} key {key[:12]} at {final}"
            ) from e
        fsutil.fsync_dir(final.parent)
        return True

    def discard(self, entry: Path) -> None:
        """Rename an entry (or whatever is in the way) into trash/, so no reader sees half of it,
        then delete it; beside trash/ when trash/ itself is the thing in the way. Raises OSError."""
        in_trash = (
            entry != self.trash
            and not os.path.islink(self.trash)
            and not os.path.isfile(self.trash)
        )
        if in_trash:
            fsutil.makedirs(self.trash)
        dest = (
            self.trash if in_trash else self.base
        ) / f".{entry.name}.{time.time():.0f}.{os.getpid()}.{os.urandom(3).hex()}"
        os.rename(entry, dest)  # a link is renamed as itself
        fsutil.remove_path(dest)

    def set_aside(self, entry: Path, why: str) -> None:
        """Move a damaged entry out of the way (never loaded, never deleted blindly)."""
        try:
            self.discard(entry)
            log.warning("set aside damaged cache entry %s (%s); it will be rebuilt", entry, why)
        except FileNotFoundError:
            pass  # another process already moved it
        except OSError as e:
            log.warning("cannot set aside damaged cache entry %s (%s): %s", entry, why, e)

    def sweep_staging(self, max_age: float = STAGING_MAX_AGE) -> int:
        """Remove staging dirs of dead builds (this host) or older than ``max_age``."""
        removed = 0
        now = time.time()
        host = _safe_host()
        # a link there is never entered (the next build heals it)
        if not self.walkable(self.staging):
            return 0
        for path in fsutil.children(self.staging):
            parts = path.name.rsplit(".", 3)
            try:
                age = now - os.lstat(path).st_mtime
            except OSError:
                continue
            dead = False
            if len(parts) == 4 and parts[1] == host and parts[2].isdigit():
                dead = not _pid_alive(int(parts[2]))
            if (dead and age > 2.0) or age > max_age:
                fsutil.remove_path(path)  # a link: unlinked, never followed
                removed += 1
        return removed

    def record_use(self, entry: Path) -> None:
        """Mark ``entry`` as used now (the manifest's mtime): best effort, one syscall, errors ignored; skipped where
        the cache is read-only (the manifest lacks its owner write bit, as after ``chmod -R a-w``, even for root)."""
        try:
            fsutil.mark_used(entry / MANIFEST)
        except OSError as e:
            log.debug("could not record the use of %s: %s", entry, e)

    def last_use(self, entry: Path) -> float:
        """When ``entry`` was last loaded, published or imported (0 if unknown)."""
        try:
            return os.lstat(entry / MANIFEST).st_mtime
        except OSError:
            return 0.0

    def iter_entries(self) -> list[Path]:
        """Every entry folder, by lstat: a link anywhere in ``entries/`` is never entered (nor listed)."""
        if not self.walkable(self.entries):
            return []
        libs = fsutil.children(self.entries, dirs_only=True)
        tgts = [t for lib in libs for t in fsutil.children(lib, dirs_only=True)]
        return [e for t in tgts for e in fsutil.children(t, dirs_only=True)]


def _cache_error(
    e: OSError, what: str
) -> CacheError:  # strerror, never the paths (a private staging name)
    err = CacheError(f"{what}: {e.strerror or type(e).__name__}")
    err.errno = e.errno  # ENOSPC stays ENOSPC for the caller
    return err


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0) if pid > 0 else None
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return pid > 0
