"""The on-disk cache: root, key, layout, manifests, verification, publishing.

Layout under the root (``$JITOPS_CACHE_DIR``, else platformdirs' user cache
dir for ``jitops``)::

    v1/entries/<library>/<target>/<key>/   manifest.json + lib<library>.so
    v1/staging/<library>-<key>.<host>.<pid>.<random>/   one private build
    v1/locks/<library>-<key>.lock          per-key OS lock (+ .holder info)
    v1/logs/                               logs of failed builds
    v1/toolchains/                         remembered compiler identities
    v1/trash/                              entries set aside as damaged

An entry is published by renaming a finished directory into place; the
manifest is written last inside it. Loading requires the manifest, the key,
the size and the sha256 to agree, and refuses anything reached through a
symlink, owned by another user, or group/world-writable.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import fsutil, obstruct
from .spec import HEADER_SUFFIXES, SOURCE_SUFFIXES, OpSpec

log = logging.getLogger("jitops")

LAYOUT = "v1"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 2  # 2: canonical bytes + self-digest, so any changed byte is detected
KEY_CHARS = 32  # 128 bits of sha256 in paths
MAX_MANIFEST_BYTES = 4 << 20
STAGING_MAX_AGE = 3600.0  # seconds; older staging dirs are swept
_INCLUDE_DIR = Path(__file__).parent / "include"


def default_root(environ: Mapping[str, str] | None = None) -> Path:
    """Resolved at call time: ``$JITOPS_CACHE_DIR``, else the user cache dir."""
    env = os.environ if environ is None else environ
    override = env.get("JITOPS_CACHE_DIR")
    if override:
        return Path(os.path.abspath(os.path.expanduser(override)))
    import platformdirs

    return Path(platformdirs.user_cache_dir("jitops", appauthor=False))


# --------------------------------------------------------------------- key


def _files_under(root: Path) -> list[Path]:
    suffixes = SOURCE_SUFFIXES + HEADER_SUFFIXES
    return sorted(p for p in root.rglob("*") if p.suffix in suffixes and p.is_file())


def source_files(spec: OpSpec) -> list[tuple[str, Path]]:
    """(label, path) of every source and header under the op's folder and include dirs."""
    out = [(p.relative_to(spec.root).as_posix(), p) for p in _files_under(spec.root)]
    for i, d in enumerate(spec.include_dirs):
        out.extend((f"<include{i}>/{p.relative_to(d).as_posix()}", p) for p in _files_under(d))
    return out


def source_stamp(spec: OpSpec) -> tuple[tuple[str, int, int], ...]:
    """(label, mtime_ns, size) of :func:`source_files`: a cheap "was anything edited?" check."""
    stamp = []
    for label, p in source_files(spec):
        try:
            st = p.stat()
        except OSError:
            continue
        stamp.append((label, st.st_mtime_ns, st.st_size))
    return tuple(stamp)


def source_digests(spec: OpSpec) -> dict[str, str]:
    """sha256 of every source and header shipped with the op, by relative path.

    Covers the op's folder, its include dirs and jitops's own headers. Paths
    are relative, so the install prefix does not reach the key; mtimes are
    never read.
    """
    out = {label: fsutil.sha256_file(p) for label, p in source_files(spec)}
    for p in _files_under(_INCLUDE_DIR):
        out[f"<jitops>/{p.relative_to(_INCLUDE_DIR).as_posix()}"] = fsutil.sha256_file(p)
    for rel in spec.cpu_sources + spec.cuda_sources:
        if rel not in out:
            raise FileNotFoundError(f"op {spec.name!r}: source {rel!r} not found under {spec.root}")
    return out


def compute_key(ingredients: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of the ingredients (never Python's hash())."""
    blob = json.dumps(ingredients, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def namespace_for(library: str, key: str) -> str:
    """The TORCH_LIBRARY namespace of one build; differs per key so rebuilds coexist."""
    return f"jitops_{library}_{key[:16]}"


# ---------------------------------------------------------------- manifest


@dataclass(frozen=True)
class Manifest:
    key: str
    library: str
    target: str
    namespace: str
    library_file: str
    sha256: str
    size: int
    build_seconds: float
    built_at: float
    ingredients: dict[str, Any]
    build_log: str

    def _body(self) -> dict[str, Any]:
        return {"format": MANIFEST_FORMAT, **self.__dict__}

    def to_json(self) -> bytes:
        """Canonical JSON (sorted keys, no spaces) carrying the sha256 of its own body.

        ``parse`` demands exactly these bytes back, so a flipped or truncated
        byte anywhere in the file, even in a field nothing else checks (the
        build log) or in insignificant whitespace, is detected.
        """
        body = self._body()
        return _canonical({**body, "digest": hashlib.sha256(_canonical(body)).hexdigest()})

    @classmethod
    def parse(cls, raw: bytes) -> Manifest:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
            raise ValueError("unknown manifest format")
        fields = cls.__dataclass_fields__
        missing = [f for f in fields if f not in data]
        if missing:
            raise ValueError(f"manifest lacks {missing}")
        m = cls(**{f: data[f] for f in fields})
        types = {"key": str, "library": str, "target": str, "namespace": str, "library_file": str,
                 "sha256": str, "size": int, "ingredients": dict, "build_log": str}
        for f, t in types.items():
            if not isinstance(getattr(m, f), t):
                raise ValueError(f"manifest field {f!r} has the wrong type")
        if not re.fullmatch(r"lib[a-z0-9_]+\.so", m.library_file):
            raise ValueError(f"manifest names an unexpected library file {m.library_file!r}")
        if raw != m.to_json():
            raise ValueError("manifest bytes do not match their digest (damaged or edited)")
        return m


def _canonical(data: Mapping[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


class EntryProblem(Exception):
    """Why an entry cannot be used; the entry is then a cache miss."""


# ------------------------------------------------------------------- cache


def _safe_host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:64] or "host"


class Cache:
    """Paths and operations on one cache root."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.base = self.root / LAYOUT

    # ---- paths
    def entry_dir(self, library: str, target: str, key: str) -> Path:
        return self.base / "entries" / library / target / key[:KEY_CHARS]

    def lock_path(self, library: str, key: str) -> Path:
        return self.base / "locks" / f"{library}-{key[:KEY_CHARS]}.lock"

    @property
    def toolchains(self) -> Path:
        return self.base / "toolchains"

    @property
    def staging(self) -> Path:
        return self.base / "staging"

    @property
    def logs(self) -> Path:
        return self.base / "logs"

    # ---- checks
    def root_problem(self) -> str | None:
        """Why this root must not be used for loading, or None."""
        for p in (self.root, self.base):
            reason = fsutil.insecure_reason(p, want_dir=True)
            if reason is not None:
                return reason
        return None

    def verify(self, entry: Path, key: str, library: str, target: str) -> Manifest:
        """Return the manifest of a loadable entry, or raise EntryProblem."""
        for p in (entry.parent.parent.parent, entry.parent.parent, entry.parent, entry):
            reason = fsutil.insecure_reason(p, want_dir=True)
            if reason is not None:
                raise EntryProblem(reason)
        mpath = entry / MANIFEST
        reason = fsutil.insecure_reason(mpath, want_dir=False)
        if reason is not None:
            raise EntryProblem(reason)
        try:
            with open(mpath, "rb") as f:
                raw = f.read(MAX_MANIFEST_BYTES + 1)
        except OSError as e:
            raise EntryProblem(f"cannot read {mpath}: {e.strerror}") from e
        if len(raw) > MAX_MANIFEST_BYTES:
            raise EntryProblem(f"{mpath} is implausibly large")
        try:
            m = Manifest.parse(raw)
        except (ValueError, TypeError, UnicodeDecodeError) as e:
            raise EntryProblem(f"{mpath} is not a valid manifest ({e})") from e
        if m.key != key or m.library != library or m.target != target:
            raise EntryProblem(f"{mpath} describes another build (key {m.key[:12]}, {m.library}/{m.target})")
        if compute_key(m.ingredients) != key:
            raise EntryProblem(f"{mpath}: its ingredients do not hash to its key")
        lib = entry / m.library_file
        reason = fsutil.insecure_reason(lib, want_dir=False)
        if reason is not None:
            raise EntryProblem(reason)
        size = os.lstat(lib).st_size
        if size != m.size:
            raise EntryProblem(f"{lib} has {size} bytes, the manifest says {m.size}")
        digest = fsutil.sha256_file(lib)
        if digest != m.sha256:
            raise EntryProblem(f"{lib} does not match its manifest's sha256")
        return m

    def read_manifest(self, entry: Path) -> Manifest | None:
        """The manifest, unverified (for listing and explaining), or None."""
        try:
            return Manifest.parse((entry / MANIFEST).read_bytes())
        except (OSError, ValueError, TypeError):
            return None

    # ---- writing
    def ensure_base(self) -> None:
        for d in (self.base, self.staging, self.base / "locks", self.base / "entries"):
            if d != self.base:
                obstruct.heal(d, want_dir=True, what=f"the {d.name} folder")  # a stray file or link (issue 20)
            fsutil.makedirs(d)

    def new_staging(self, library: str, key: str) -> Path:
        self.ensure_base()
        d = self.staging / f"{library}-{key[:KEY_CHARS]}.{_safe_host()}.{os.getpid()}.{secrets.token_hex(4)}"
        os.mkdir(d, fsutil.DIR_MODE)
        os.chmod(d, fsutil.DIR_MODE)
        return d

    def publish(self, staged_entry: Path, library: str, target: str, key: str) -> bool:
        """Rename a finished entry into place. False if another process won."""
        final = self.entry_dir(library, target, key)
        for d in (self.base / "entries", final.parent.parent, final.parent):
            if os.path.islink(d):  # never publish through a symlink; move the link itself away
                self.set_aside(d, "a symbolic link inside the cache")
            elif os.path.lexists(d) and not os.path.isdir(d):  # a stray file where a folder belongs (issue 20)
                self.set_aside(d, "a file where the cache keeps a folder")
        fsutil.makedirs(final.parent)
        try:
            os.rename(staged_entry, final)
        except OSError as e:
            if os.path.lexists(final):
                return False
            raise e
        fsutil.fsync_dir(final.parent)
        return True

    def set_aside(self, entry: Path, why: str) -> None:
        """Move a damaged entry out of the way (never loaded, never deleted blindly)."""
        trash = self.base / "trash"
        try:
            fsutil.makedirs(trash)
            dest = trash / f"{entry.name}.{int(time.time())}.{os.getpid()}.{secrets.token_hex(3)}"
            os.rename(entry, dest)
            log.warning("set aside damaged cache entry %s (%s); it will be rebuilt", entry, why)
            shutil.rmtree(dest, ignore_errors=True)
        except FileNotFoundError:
            pass  # another process already moved it
        except OSError as e:
            log.warning("cannot set aside damaged cache entry %s (%s): %s", entry, why, e)

    def sweep_staging(self, max_age: float = STAGING_MAX_AGE) -> int:
        """Remove staging dirs of dead builds (this host) or older than ``max_age``."""
        removed = 0
        now = time.time()
        host = _safe_host()
        try:
            names = os.listdir(self.staging)
        except OSError:
            return 0
        for name in names:
            path = self.staging / name
            parts = name.rsplit(".", 3)
            try:
                age = now - os.lstat(path).st_mtime
            except OSError:
                continue
            dead = False
            if len(parts) == 4 and parts[1] == host and parts[2].isdigit():
                dead = not _pid_alive(int(parts[2]))
            if (dead and age > 2.0) or age > max_age:
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
        return removed

    # ---- last use (for LRU pruning)
    def record_use(self, entry: Path) -> None:
        """Mark ``entry`` as used now: the manifest's mtime is its last use.

        Best effort, one syscall, no subprocess. Skipped where the cache is
        read-only (the manifest lacks its owner write bit, as after
        ``chmod -R a-w``, even for root); errors are ignored.
        """
        mpath = entry / MANIFEST
        try:
            st = os.lstat(mpath)
            if st.st_mode & 0o200 and os.access(mpath, os.W_OK):
                os.utime(mpath, follow_symlinks=False)
        except OSError as e:
            log.debug("could not record the use of %s: %s", entry, e)

    def last_use(self, entry: Path) -> float:
        """When ``entry`` was last loaded, published or imported (0 if unknown)."""
        try:
            return os.lstat(entry / MANIFEST).st_mtime
        except OSError:
            return 0.0

    def iter_entries(self) -> list[Path]:
        base = self.base / "entries"
        out = []
        if not os.path.isdir(base):
            return out
        for lib in sorted(base.iterdir()):
            if not lib.is_dir():
                continue
            for tgt in sorted(lib.iterdir()):
                if tgt.is_dir():
                    out.extend(sorted(p for p in tgt.iterdir() if p.is_dir()))
        return out


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
