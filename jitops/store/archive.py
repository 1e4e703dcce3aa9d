"""Portable archives of a cache: ``jitops cache export`` and ``import``.

An archive holds entries and toolchain records under the cache's own layout
(``v1/entries/...``). ``export`` signs each entry's manifest (a pax header on its
member) when given a signer; ``import`` takes members through ``archive_reader``
(limits, signature before library) and checks every entry like a build before
publishing it, noting its origin first when asked to.

Imports: _version, admin (entries, check), archive_reader, cache, errors, fsutil, key, manifest.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import json
import os
import platform
import secrets
import shutil
import sys
import sysconfig
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import archive_reader as reader
from ..base import fsutil
from .._version import __version__
from .cache import MAX_MANIFEST_BYTES, Cache
from .admin import EntryInfo, check, entries
from ..errors import CacheError
from ..key import KEY_CHARS, compute_key
from .manifest import MANIFEST, Address, EntryProblem, Manifest, StaleInputs

# An entry's signature for an archive: (signer, signature) over its manifest bytes, or None to leave
# it unsigned.
Sign = Callable[[EntryInfo, bytes], "reader.Signature | None"]
# Called with each entry about to be published (its manifest and raw manifest bytes, its signature
# if any).
Note = Callable[[Manifest, bytes, "reader.Signature | None"], None]


# ------------------------------------------------------------------ export / import


def _add_file(
    tar: tarfile.TarFile,
    path: Path | bytes,
    arcname: str,
    mode: int,
    mtime: float,
    pax: dict[str, str] | None = None,
) -> None:
    info = tarfile.TarInfo(arcname)
    info.pax_headers = pax or {}
    info.mode = mode
    info.mtime = int(mtime)
    if isinstance(path, bytes):  # a record already read (bounded)
        info.size = len(path)
        tar.addfile(info, io.BytesIO(path))
        return
    # never a link, a FIFO or a device put there since it was checked
    with fsutil.open_regular(path) as f:
        info.size = os.fstat(f.fileno()).st_size
        tar.addfile(info, f)


def export(
    cache: Cache,
    dest: Path,
    libraries: set[str] | None = None,
    *,
    keys: set[str] | None = None,
    with_records: bool = True,
    sign: Sign | None = None,
) -> tuple[list[EntryInfo], list[tuple[EntryInfo, str]]]:
    """Write a portable archive (tar.gz) of every sound entry and the toolchain records.

    ``keys`` limits it to those entries, ``with_records=False`` leaves the toolchain
    records out (the remote tier ships one entry per archive this way). ``sign`` signs
    an entry's manifest (its member carries the signature); each manifest precedes its library.
    Returns (exported, skipped with why). Written atomically.
    """
    exported, skipped = [], []
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        with tarfile.open(tmp, "w:gz", format=tarfile.PAX_FORMAT) as tar:
            for info in entries(cache):
                if (libraries is not None and info.library not in libraries) or (
                    keys is not None and info.key not in keys
                ):
                    continue
                problem = check(cache, info)
                if problem is not None:
                    skipped.append((info, problem))
                    continue
                assert info.manifest is not None
                rel = cache.archive_name(info.path)
                try:  # the bytes signed are the bytes archived
                    raw = cache.manifest_bytes(info.path)
                except OSError as e:
                    skipped.append((info, f"cannot read {info.path / MANIFEST}: {e.strerror}"))
                    continue
                signed = sign(info, raw) if sign is not None else None
                pax = {reader.SIGNER: signed[0], reader.SIGNATURE: signed[1]} if signed else None
                _add_file(
                    tar,
                    raw,
                    f"{rel}/{MANIFEST}",
                    fsutil.FILE_MODE,
                    info.manifest.built_at,
                    pax,
                )
                lib = info.manifest.library_file
                _add_file(
                    tar, info.path / lib, f"{rel}/{lib}", fsutil.LIB_MODE, info.manifest.built_at
                )
                exported.append(info)
            if with_records and cache.toolchains.is_dir():
                for rec in sorted(cache.toolchains.glob("*.json")):
                    name = cache.archive_name(rec)
                    if reader.TOOL_MEMBER.fullmatch(name):
                        try:  # a link or a special file there: not a record
                            data = fsutil.read_bounded(rec)
                        except OSError:
                            continue
                        _add_file(tar, data, name, fsutil.FILE_MODE, time.time())
        os.replace(tmp, dest)
    except OSError as e:  # the archive's folder, not its private temporary name
        if isinstance(e, CacheError):
            raise
        raise CacheError(
            f"cannot write the archive {dest}: {e.strerror or e}. Fix: name a file in an existing, "
            "writable folder"
        ) from e
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return exported, skipped


@dataclass
class ImportResult:
    imported: list[Manifest] = field(default_factory=list)
    present: list[Manifest] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (entry, why)
    # imported, but not for this machine
    foreign: list[tuple[Manifest, str]] = field(default_factory=list)
    # imported without a signature: trusted by the user alone
    unsigned: list[Manifest] = field(default_factory=list)
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
    diffs = [
        f"{k} {ingredients.get(k)!r} (here {v!r})"
        for k, v in here.items()
        if ingredients.get(k) != v
    ]
    return "built for " + ", ".join(diffs) if diffs else None


def _validate_staged(entry: Path, lib: str, target: str, keydir: str) -> tuple[Manifest, bytes]:
    """The staged entry's manifest and its bytes, once checked like a build's; EntryProblem if refused."""
    try:
        raw = fsutil.read_bounded(entry / MANIFEST, MAX_MANIFEST_BYTES)
        m = Manifest.parse(raw)
    except OSError as e:  # its strerror only: the path is a private staging folder
        raise EntryProblem(f"no valid manifest ({MANIFEST}: {e.strerror or 'unreadable'})") from e
    except (ValueError, TypeError, UnicodeDecodeError) as e:
        raise EntryProblem(f"no valid manifest ({e})") from e
    if (m.library, m.target, m.key[:KEY_CHARS]) != (lib, target, keydir):
        raise EntryProblem(
            f"its manifest describes {m.library}/{m.target}/{m.key[:12]}, not its path"
        )
    if compute_key(m.ingredients) != m.key:
        raise EntryProblem("its manifest's ingredients do not hash to its key")
    names = sorted(p.name for p in entry.iterdir())
    if names != sorted([MANIFEST, m.library_file]):
        raise EntryProblem(f"it holds {names}, expected {MANIFEST} and {m.library_file}")
    lib_path = Cache.library_path(entry, m)
    if lib_path.stat().st_size != m.size or fsutil.sha256_file(lib_path) != m.sha256:
        raise EntryProblem(f"{m.library_file} does not match its manifest's size and sha256")
    return m, raw


def import_archive(
    cache: Cache,
    src: Path,
    check: Callable[[Path, Manifest], None] | None = None,
    *,
    with_records: bool = True,
    want: reader.Ident | None = None,
    verify: reader.Verify | None = None,
    note: Note | None = None,
) -> ImportResult:
    """Add the entries of an archive written by :func:`export`, each checked like a build.

    Members are taken by ``archive_reader.read`` (``want``: that entry only; ``verify(manifest bytes,
    signature or None)`` judges each manifest before its library is taken). An archive with any member
    outside the layout, a link, a special file, or over the limits is refused whole (CacheError naming the
    archive and the cause), before anything is published. An entry with a bad manifest or digest is rejected
    alone, and so is one that ``verify`` or ``check(staged entry dir, manifest)`` refuses by raising
    EntryProblem. Entries already present are left as they are. ``note`` is called before an entry is published.
    """
    staging: Path | None = None
    try:
        staging = cache.new_staging("import", secrets.token_hex(16))
        staged, records = reader.read(
            src, staging, want=want, with_records=with_records and want is None, verify=verify
        )
        result = ImportResult()
        _publish_staged(cache, staged, result, check, verify, note)
        for name, path in records:
            result.records += _import_record(cache, name, path)
        return result
    except OSError as e:  # publishing: the cache, not the archive (CacheError is one too)
        if isinstance(e, CacheError):
            raise
        raise CacheError(
            f"cannot import the archive {src} into {cache.root}: {e.strerror or e}; nothing more was "
            "imported. Fix: check that the cache is writable (`jitops doctor`)"
        ) from e
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def import_entry(
    cache: Cache,
    archive: bytes,
    address: Address,
    verify: reader.Verify,
    note: Note | None,
    root: Path | None = None,
) -> Manifest:
    """Publish the entry at ``address`` from a one-entry ``archive`` (the remote tier's); EntryProblem if refused.

    Only that entry's members are read out, its library only after ``verify`` accepts its manifest,
    and only if every file its build read holds the same bytes here (``root``: the library's folder
    here); StaleInputs, naming those files, where one does not.
    """
    lib, target, key = address.library, address.target, address.key
    stale: list[StaleInputs] = []

    def check(entry: Path, m: Manifest) -> None:
        if (m.key, m.library, m.target) != (key, lib, target):
            raise EntryProblem(
                f"it holds the entry of {m.library}/{m.target} key {m.key[:12]}, "
                f"not {lib}/{target} key {key[:12]} (stored under another key)"
            )
        if (why := cache.stale(entry, m, root)) is not None:
            stale.append(
                StaleInputs(
                    f"it was built from other inputs than this machine holds ({why})",
                    tuple(m.inputs or ()),
                )
            )
            raise stale[-1]

    staging = cache.new_staging(lib, key)
    try:
        path = staging / "entry.tar.gz"
        path.write_bytes(archive)
        try:
            result = import_archive(
                cache,
                path,
                check,
                with_records=False,
                want=(lib, target, key[:KEY_CHARS]),
                verify=verify,
                note=note,
            )
        except CacheError as e:
            raise EntryProblem(str(e)) from e
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if stale and not (result.imported or result.present):
        raise stale[-1]
    if result.rejected or not (result.imported or result.present):
        raise EntryProblem(
            "; ".join(why for _, why in result.rejected)
            or f"its archive holds nothing of {lib}/{target} key {key[:12]} (stored under another key)"
        )
    return cache.verify(cache.path_of(address), key, lib, target)


def _publish_staged(
    cache: Cache,
    staged: dict[reader.Ident, reader.Staged],
    result: ImportResult,
    check: Callable[[Path, Manifest], None] | None,
    verify: reader.Verify | None,
    note: Note | None,
) -> None:
    for (lib, target, keydir), st in sorted(staged.items()):
        where, entry = f"{lib}/{target}/{keydir[:12]}", st.dir
        try:
            if st.problem is not None:
                raise EntryProblem(st.problem)
            manifest, raw = _validate_staged(entry, lib, target, keydir)
            # again on the manifest that stays (a later duplicate may have replaced one)
            if verify is not None:
                verify(raw, st.signature)
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
        if note is not None:  # before it is in place: nothing may find it without its origin
            note(manifest, raw, st.signature)
        if cache.publish(entry, lib, target, manifest.key):
            result.imported.append(manifest)
            if st.signature is None:
                result.unsigned.append(manifest)
            why = foreign_reason(manifest.ingredients)
            if why is not None:
                result.foreign.append((manifest, why))
        else:
            result.present.append(manifest)


def _import_record(cache: Cache, name: str, path: Path) -> int:
    data = fsutil.read_record(path)
    identity = (
        data is not None
        and set(data) == {"path", "version"}
        and all(isinstance(v, str) for v in data.values())
    )
    # what a driver runs: used only where every program's stat identity holds here (toolchain)
    programs = (
        data is not None
        and name.endswith("-programs.json")
        and set(data) == {"format", "command", "programs"}
        and isinstance(data["programs"], list)
    )
    if not (identity or programs):
        return 0
    dest = cache.toolchains / name
    if dest.exists():
        return 0
    fsutil.makedirs(cache.toolchains)
    fsutil.atomic_write(dest, json.dumps(data).encode())
    return 1
