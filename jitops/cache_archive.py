"""Portable archives of a cache: ``jitops cache export`` and ``import``.

An archive holds entries and toolchain records under the cache's own layout
(``v1/entries/...``); its member patterns are derived from that layout. An
import checks every entry like a build before publishing it.

Imports: cache, cache_admin (entries, check), errors, fsutil, key, manifest.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import re
import secrets
import shutil
import sys
import sysconfig
import tarfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import fsutil
from ._version import __version__
from .cache import LAYOUT, Cache
from .cache_admin import EntryInfo, check, entries
from .errors import CacheError
from .key import KEY_CHARS, compute_key
from .manifest import MANIFEST, EntryProblem, Manifest

# Archive members, relative to the root: derived from the cache's layout.
_LIB = r"[a-z][a-z0-9_]{0,63}"
_TARGET = r"[a-z0-9][a-z0-9-]{0,127}"
_KEY = r"[0-9a-f]{%d}" % KEY_CHARS
_ENTRY_MEMBER = re.compile(
    rf"{LAYOUT}/entries/(?P<lib>{_LIB})/(?P<target>{_TARGET})/(?P<key>{_KEY})"
    r"/(?P<file>manifest\.json|lib[a-z0-9_]{1,64}\.so)"
)
_TOOL_MEMBER = re.compile(rf"{LAYOUT}/toolchains/[0-9a-f]{{32}}\.json")
_DIR_MEMBER = re.compile(rf"{LAYOUT}(/toolchains|/entries(/{_LIB}(/{_TARGET}(/{_KEY})?)?)?)?")
MAX_MEMBER_BYTES = 4 << 30
MAX_RECORD_BYTES = 64 << 10


# ------------------------------------------------------------------ export / import


def _add_file(tar: tarfile.TarFile, path: Path, arcname: str, mode: int, mtime: float) -> None:
    info = tarfile.TarInfo(arcname)
    info.size = os.lstat(path).st_size
    info.mode = mode
    info.mtime = int(mtime)
    with open(path, "rb") as f:
        tar.addfile(info, f)


def export(cache: Cache, dest: Path, libraries: set[str] | None = None, *, keys: set[str] | None = None,
           with_records: bool = True) -> tuple[list[EntryInfo], list[tuple[EntryInfo, str]]]:
    """Write a portable archive (tar.gz) of every sound entry and the toolchain records.

    ``keys`` limits it to those entries, ``with_records=False`` leaves the toolchain
    records out (the remote tier ships one entry per archive this way).
    Returns (exported, skipped with why). Written atomically.
    """
    exported, skipped = [], []
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        with tarfile.open(tmp, "w:gz", format=tarfile.PAX_FORMAT) as tar:
            for info in entries(cache):
                if (libraries is not None and info.library not in libraries) or (keys is not None and info.key not in keys):
                    continue
                problem = check(cache, info)
                if problem is not None:
                    skipped.append((info, problem))
                    continue
                assert info.manifest is not None
                rel = cache.archive_name(info.path)
                _add_file(tar, info.path / MANIFEST, f"{rel}/{MANIFEST}", fsutil.FILE_MODE, info.manifest.built_at)
                lib = info.manifest.library_file
                _add_file(tar, info.path / lib, f"{rel}/{lib}", fsutil.LIB_MODE, info.manifest.built_at)
                exported.append(info)
            if with_records and cache.toolchains.is_dir():
                for rec in sorted(cache.toolchains.glob("*.json")):
                    name = cache.archive_name(rec)
                    if _TOOL_MEMBER.fullmatch(name) and rec.is_file() and not rec.is_symlink():
                        _add_file(tar, rec, name, fsutil.FILE_MODE, time.time())
        os.replace(tmp, dest)
    except OSError as e:  # the archive's folder, not its private temporary name (issue 20)
        if isinstance(e, CacheError):
            raise
        raise CacheError(f"cannot write the archive {dest}: {e.strerror or e}. Fix: name a file in an existing, "
                         "writable folder") from e
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return exported, skipped


@dataclass
class ImportResult:
    imported: list[Manifest] = field(default_factory=list)
    present: list[Manifest] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (entry, why)
    foreign: list[tuple[Manifest, str]] = field(default_factory=list)  # imported, but not for this machine
    records: int = 0


def foreign_reason(ingredients: dict[str, object]) -> str | None:
    """Why an entry's build facts differ from this interpreter's (cheap, no torch import).

    Such entries are kept: their keys can never be this machine's, so they are never loaded here.
    """
    here = {
        "platform": sys.platform,
        "machine": platform.machine(),
        "python_abi": str(sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag),
        "jitops_version": __version__,
    }
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        here["torch_version"] = importlib.metadata.version("torch")
    diffs = [f"{k} {ingredients.get(k)!r} (here {v!r})" for k, v in here.items() if ingredients.get(k) != v]
    return "built for " + ", ".join(diffs) if diffs else None


def _check_member(member: tarfile.TarInfo) -> re.Match[str] | None:
    """The entry-file match for a member; None for a directory or a toolchain record. Raises otherwise."""
    name = member.name.rstrip("/") if member.isdir() else member.name
    m = _ENTRY_MEMBER.fullmatch(name) if member.isfile() else None
    if name.startswith("/") or ".." in name.split("/") or "\\" in name:
        why = "points outside the cache"
    elif not (member.isfile() or member.isdir()):
        why = "is a link or a special file"
    elif member.isdir() and not _DIR_MEMBER.fullmatch(name):
        why = "is not part of a jitops cache"
    elif member.isfile() and m is None and not _TOOL_MEMBER.fullmatch(name):
        why = "is not part of a jitops cache"
    elif member.size > (MAX_MEMBER_BYTES if m is not None and m.group("file") != MANIFEST else MAX_RECORD_BYTES):
        why = f"is implausibly large ({member.size} bytes)"
    else:
        return m
    raise CacheError(f"refusing the archive: member {member.name!r} {why}; nothing was imported. "
                     "Fix: use an archive written by `jitops cache export`")


def _copy_out(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path, mode: int) -> None:
    src = tar.extractfile(member)
    assert src is not None
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f, src:
        shutil.copyfileobj(src, f)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(dest, mode)


def _validate_staged(entry: Path, lib: str, target: str, keydir: str) -> Manifest:
    try:
        m = Manifest.parse((entry / MANIFEST).read_bytes())
    except OSError as e:  # its strerror only: the path is a private staging folder (issue 20)
        raise EntryProblem(f"no valid manifest ({MANIFEST}: {e.strerror or 'unreadable'})") from e
    except (ValueError, TypeError, UnicodeDecodeError) as e:
        raise EntryProblem(f"no valid manifest ({e})") from e
    if (m.library, m.target, m.key[:KEY_CHARS]) != (lib, target, keydir):
        raise EntryProblem(f"its manifest describes {m.library}/{m.target}/{m.key[:12]}, not its path")
    if compute_key(m.ingredients) != m.key:
        raise EntryProblem("its manifest's ingredients do not hash to its key")
    names = sorted(p.name for p in entry.iterdir())
    if names != sorted([MANIFEST, m.library_file]):
        raise EntryProblem(f"it holds {names}, expected {MANIFEST} and {m.library_file}")
    lib_path = Cache.library_path(entry, m)
    if lib_path.stat().st_size != m.size or fsutil.sha256_file(lib_path) != m.sha256:
        raise EntryProblem(f"{m.library_file} does not match its manifest's size and sha256")
    return m


def _last_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """Every member checked before anything is written; of duplicates the last wins, as with ``tar -x``.

    Archives with duplicate members are legal (``tar -r`` appends, some CI
    artifact tools write them); the later copy replaces the earlier one (issue 20).
    """
    last: dict[str, tarfile.TarInfo] = {}
    for member in tar.getmembers():
        _check_member(member)
        name = member.name.rstrip("/")
        last.pop(name, None)  # re-insert: the order of last appearance
        last[name] = member
    return [m for m in last.values() if m.isfile()]


def import_archive(cache: Cache, src: Path, check: Callable[[Path, Manifest], None] | None = None, *,
                   with_records: bool = True) -> ImportResult:
    """Add the entries of an archive written by :func:`export`, each checked like a build.

    An archive with any member outside the layout, a link or a special file is
    refused whole, before anything is written. An entry with a bad manifest
    or digest is rejected alone, and so is one that ``check(staged entry dir,
    manifest)`` refuses by raising EntryProblem (the remote tier checks the
    signature and the expected key there). Entries already present are left as
    they are. ``with_records=False`` ignores toolchain records. A damaged archive
    raises CacheError naming the archive and the cause (never an errno or a staging path).
    """
    try:
        return _import(cache, src, check, with_records)
    except CacheError:
        raise
    except (OSError, tarfile.TarError, EOFError, zlib.error) as e:
        why = (e.strerror if isinstance(e, OSError) and e.strerror else str(e)) or type(e).__name__
        raise CacheError(f"cannot import the archive {src} into {cache.root}: {why}; nothing more was imported. "
                         "Fix: check that the archive is complete (written by `jitops cache export`) and that the "
                         "cache is writable (`jitops doctor`)") from e


def _import(cache: Cache, src: Path, check: Callable[[Path, Manifest], None] | None,
            with_records: bool) -> ImportResult:
    result = ImportResult()
    try:
        tar = tarfile.open(src, "r:*")
    except (OSError, tarfile.TarError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise CacheError(f"cannot read the archive {src}: {why}. Fix: pass a file written by `jitops cache export`") from e
    with tar:
        members = _last_members(tar)  # the whole member list is validated before anything is extracted
        cache.ensure_base()
        staging = cache.new_staging("import", secrets.token_hex(16))
        try:
            staged: dict[tuple[str, str, str], Path] = {}
            records: list[tuple[str, Path]] = []
            for member in members:
                m = _ENTRY_MEMBER.fullmatch(member.name)
                if m is None:
                    if not with_records:
                        continue  # the remote tier takes entries only, never toolchain records
                    dest = staging / f"record-{len(records)}.json"
                    _copy_out(tar, member, dest, fsutil.FILE_MODE)
                    records.append((member.name.rsplit("/", 1)[1], dest))
                    continue
                ident = (m.group("lib"), m.group("target"), m.group("key"))
                if ident not in staged:
                    staged[ident] = staging / f"e{len(staged)}"
                    os.mkdir(staged[ident], fsutil.DIR_MODE)
                mode = fsutil.FILE_MODE if m.group("file") == MANIFEST else fsutil.LIB_MODE
                _copy_out(tar, member, staged[ident] / m.group("file"), mode)
            _publish_staged(cache, staged, result, check)
            for name, path in records:
                result.records += _import_record(cache, name, path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return result


def _publish_staged(cache: Cache, staged: dict[tuple[str, str, str], Path], result: ImportResult,
                    check: Callable[[Path, Manifest], None] | None) -> None:
    for (lib, target, keydir), entry in sorted(staged.items()):
        where = f"{lib}/{target}/{keydir[:12]}"
        try:
            manifest = _validate_staged(entry, lib, target, keydir)
            if check is not None:
                check(entry, manifest)
        except EntryProblem as e:
            result.rejected.append((where, str(e)))
            continue
        final = cache.entry_dir(lib, target, manifest.key)
        if final.exists() or final.is_symlink():
            try:
                cache.verify(final, manifest.key, lib, target)
                result.present.append(manifest)
                continue
            except EntryProblem as e:
                cache.set_aside(final, str(e))
        if cache.publish(entry, lib, target, manifest.key):
            result.imported.append(manifest)
            why = foreign_reason(manifest.ingredients)
            if why is not None:
                result.foreign.append((manifest, why))
        else:
            result.present.append(manifest)


def _import_record(cache: Cache, name: str, path: Path) -> int:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return 0
    if not (isinstance(data, dict) and set(data) == {"path", "version"}
            and all(isinstance(v, str) for v in data.values())):
        return 0
    dest = cache.toolchains / name
    if dest.exists():
        return 0
    fsutil.makedirs(cache.toolchains)
    fsutil.atomic_write(dest, json.dumps(data).encode())
    return 1
