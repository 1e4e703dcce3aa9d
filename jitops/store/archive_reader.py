"""Reading an archive as hostile input: what ``cache import`` and the remote tier take out of one.

Every archive reader in jitops goes through :func:`read`:

- only what ``export`` writes is opened: gzip (or a plain tar, e.g. after ``tar -r``); xz, bz2 and
  anything else is refused by its magic bytes before any decompressor runs, and every error of the
  decompressor or of ``tarfile``, anywhere in the stream, is a :class:`CacheError` (:data:`DAMAGE`);
- each member is judged by its header before its data is read: names from the cache's layout only,
  no links or special files, a manifest at most the cache's own ``MAX_MANIFEST_BYTES``;
- the members' sizes together stay under :func:`budget` (``EXPANSION`` bytes per archive byte, plus
  one manifest) and their number under ``MAX_MEMBERS``: a decompression bomb is refused at the header
  of the member that would pass the cap, before that member is decompressed;
- ``want`` takes only that entry's members; the others are skipped (read past, never written);
- an entry's manifest is checked (``verify``: its signature) before its library is taken, and the
  library is taken only when its size is what that manifest says (with ``want``, the remote tier's
  one-entry archives, a library before its manifest is refused; a hand-made tar may order them either way).

What lands in ``staging`` is still unverified: ``store.archive`` checks it like a build before publishing.

Imports: cache (LAYOUT, MAX_MANIFEST_BYTES), errors, fsutil, key (KEY_CHARS), manifest.
"""

from __future__ import annotations

import contextlib
import lzma
import os
import re
import shutil
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..base import fsutil
from .cache import LAYOUT, MAX_MANIFEST_BYTES
from ..errors import CacheError
from ..key import KEY_CHARS
from .manifest import MANIFEST, EntryProblem, Manifest

_LIB = r"[a-z][a-z0-9_]{0,63}"
_TARGET = r"[a-z0-9][a-z0-9-]{0,127}"
_KEY = r"[0-9a-f]{%d}" % KEY_CHARS
ENTRY_MEMBER = re.compile(
    rf"{LAYOUT}/entries/(?P<lib>{_LIB})/(?P<target>{_TARGET})/(?P<key>{_KEY})"
    r"/(?P<file>manifest\.json|lib[a-z0-9_]{1,64}\.so)"
)
# a compiler's identity, and what its driver runs (toolchain.programs)
TOOL_MEMBER = re.compile(rf"{LAYOUT}/toolchains/[0-9a-f]{{32}}(-programs)?\.json")
_DIR_MEMBER = re.compile(rf"{LAYOUT}(/toolchains|/entries(/{_LIB}(/{_TARGET}(/{_KEY})?)?)?)?")
MAX_MEMBER_BYTES = 4 << 30  # one shared library
MAX_RECORD_BYTES = 64 << 10  # one toolchain record
MAX_MEMBERS = 1 << 16
# members may hold this many bytes per byte of the archive (gzip packs a library ~3x)
EXPANSION = 64
SIGNER, SIGNATURE = "JITOPS.signer", "JITOPS.signature"  # pax keys on a signed manifest member
# Whatever reading a damaged archive raises: tarfile, gzip (OSError), zlib, and lzma/bz2 should one
# slip through.
DAMAGE = (OSError, EOFError, tarfile.TarError, zlib.error, lzma.LZMAError)

Ident = tuple[str, str, str]  # (library, target, key folder)
Signature = tuple[str, str]  # (signer, signature)
Verify = Callable[[bytes, "Signature | None"], None]  # raises EntryProblem


def budget(archive_bytes: int) -> int:
    """The most member bytes jitops reads out of an archive of ``archive_bytes`` (the one size limit)."""
    return EXPANSION * archive_bytes + MAX_MANIFEST_BYTES


@dataclass
class Staged:
    """One entry's members as taken out: its folder, the manifest's bytes and signature, why it is refused."""

    dir: Path
    manifest: bytes | None = None
    signature: Signature | None = None
    problem: str | None = None


def _refuse(src: Path, why: str) -> CacheError:
    return CacheError(
        f"refusing the archive {src}: {why}; nothing was imported. "
        "Fix: use an archive written by `jitops cache export` (a .tar.gz)"
    )


def _mode(src: Path) -> Literal["r:gz", "r:"]:
    with open(src, "rb") as f:
        head = f.read(262)
    if head[:2] == b"\x1f\x8b":
        return "r:gz"
    if head.startswith((b"BZh", b"\xfd7zXZ\0")):
        raise _refuse(src, "it is compressed with bz2 or xz, and `jitops cache export` writes gzip")
    return "r:"  # a plain tar (``tar -r`` appends to one), or garbage that tarfile names


def check_member(src: Path, member: tarfile.TarInfo) -> re.Match[str] | None:
    """The entry-file match for a member; None for a directory or a toolchain record. Raises otherwise."""
    name = member.name.rstrip("/") if member.isdir() else member.name
    m = ENTRY_MEMBER.fullmatch(name) if member.isfile() else None
    if name.startswith("/") or ".." in name.split("/") or "\\" in name:
        why = "points outside the cache"
    elif not (member.isfile() or member.isdir()):
        why = "is a link or a special file"
    elif member.isdir() and not _DIR_MEMBER.fullmatch(name):
        why = "is not part of a jitops cache"
    elif member.isfile() and m is None and not TOOL_MEMBER.fullmatch(name):
        why = "is not part of a jitops cache"
    elif member.size > (
        MAX_RECORD_BYTES
        if m is None
        else MAX_MANIFEST_BYTES
        if m.group("file") == MANIFEST
        else MAX_MEMBER_BYTES
    ):
        why = f"is implausibly large ({member.size} bytes)"
    else:
        return m
    raise _refuse(src, f"member {member.name!r} {why}")


def _copy_out(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path, mode: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(dest)  # a later duplicate replaces the earlier copy, as with ``tar -x``
    src = tar.extractfile(member)
    assert src is not None
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f, src:
        shutil.copyfileobj(src, f)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(dest, mode)


def _take_manifest(
    tar: tarfile.TarFile, member: tarfile.TarInfo, entry: Staged, verify: Verify | None
) -> None:
    src = tar.extractfile(member)
    assert src is not None
    # a later manifest replaces the earlier one, and so does its verdict:
    if entry.manifest is not None:
        for stale in entry.dir.iterdir():  # a library taken against the earlier one is not kept
            stale.unlink()
    entry.manifest = src.read(MAX_MANIFEST_BYTES + 1)
    signer, sig = member.pax_headers.get(SIGNER), member.pax_headers.get(SIGNATURE)
    entry.signature = (signer, sig) if signer and sig else None
    entry.problem = None
    try:
        if verify is not None:
            verify(entry.manifest, entry.signature)
    except EntryProblem as e:
        entry.problem = str(e)
    fsutil.atomic_write(entry.dir / MANIFEST, entry.manifest)


def _library_problem(member: tarfile.TarInfo, entry: Staged, strict: bool) -> str | None:
    if entry.problem is not None:
        return entry.problem
    # a hand-made tar (``tar czf``): taken within the budget, judged once complete
    if entry.manifest is None:
        return (
            "its library comes before its manifest (not as `jitops cache export` writes it)"
            if strict
            else None
        )
    try:
        m = Manifest.parse(entry.manifest)
    except (ValueError, TypeError, UnicodeDecodeError) as e:
        return f"no valid manifest ({e})"
    if member.name.rsplit("/", 1)[1] != m.library_file or member.size != m.size:
        return (
            f"{member.name.rsplit('/', 1)[1]} does not match its manifest's size and sha256 ({member.size} bytes, "
            f"its manifest names {m.library_file} of {m.size}); it was not extracted"
        )
    return None


def read(
    src: Path,
    staging: Path,
    *,
    want: Ident | None = None,
    with_records: bool = True,
    verify: Verify | None = None,
) -> tuple[dict[Ident, Staged], list[tuple[str, Path]]]:
    """Take the archive's entries (``want``: that one only) and toolchain records into ``staging``.

    Returns the staged entries and (record name, staged path). Raises CacheError for an archive that is
    damaged, not what ``export`` writes, or over the limits; an entry whose manifest ``verify`` refuses,
    or whose library does not fit its manifest, is staged without its library and with its ``problem``.
    """
    try:
        total, limit = 0, budget(os.stat(src).st_size)
        staged: dict[Ident, Staged] = {}
        records: list[tuple[str, Path]] = []
        with tarfile.open(src, _mode(src)) as tar:
            # each header is judged before its data is read
            for count, member in enumerate(iter(tar.next, None)):
                m = check_member(src, member)
                total += member.size
                if count >= MAX_MEMBERS or total > limit:
                    why = (
                        f"more than {MAX_MEMBERS} members"
                        if count >= MAX_MEMBERS
                        else (
                            f"members of more than {limit} bytes in all ({EXPANSION}x its size): a decompression bomb"
                        )
                    )
                    raise _refuse(src, f"it holds {why}")
                if not member.isfile():
                    continue
                if m is None:
                    if with_records and want is None:
                        records.append(
                            (member.name.rsplit("/", 1)[1], staging / f"record-{len(records)}.json")
                        )
                        _copy_out(tar, member, records[-1][1], fsutil.FILE_MODE)
                    continue
                ident = (m.group("lib"), m.group("target"), m.group("key"))
                if want is not None and ident != want:
                    continue  # another entry: read past, never written
                if ident not in staged:
                    staged[ident] = Staged(staging / f"e{len(staged)}")
                    os.mkdir(staged[ident].dir, fsutil.DIR_MODE)
                entry = staged[ident]
                if m.group("file") == MANIFEST:
                    _take_manifest(tar, member, entry, verify)
                    continue
                entry.problem = _library_problem(member, entry, strict=want is not None)
                if entry.problem is None:
                    _copy_out(tar, member, entry.dir / m.group("file"), fsutil.LIB_MODE)
        return staged, records
    except CacheError:
        raise
    except DAMAGE as e:
        why = (e.strerror if isinstance(e, OSError) and e.strerror else str(e)) or type(e).__name__
        raise CacheError(
            f"cannot import the archive {src}: {why} ({type(e).__name__}); nothing was imported. "
            "Fix: check that the archive is complete (written by `jitops cache export`) and that the "
            "cache is writable (`jitops doctor`)"
        ) from e
