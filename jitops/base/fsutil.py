"""Small filesystem helpers with explicit modes (umask-independent) and checks.

Imports: nothing of jitops.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import stat
from pathlib import Path
from typing import Any, BinaryIO

DIR_MODE = 0o700
FILE_MODE = 0o600
LIB_MODE = 0o700
# a cache folder's tag (https://bford.info/cachedir/): backup tools skip it, and so do the key's
# walks of a user's source folder, which may hold the cache itself (JITOPS_CACHE_DIR=./cache beside
# the kernel)
CACHEDIR_TAG = "CACHEDIR.TAG"
CACHEDIR_SIGNATURE = (
    b"Signature: 8a477f597d28d172789f06886806bc55\n# jitops's cache: rebuilt on demand.\n"
)


def makedirs(path: Path) -> None:
    """Create ``path`` and missing parents as 0700, whatever the umask."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(d, DIR_MODE)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int = FILE_MODE, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` through a private temporary file and a rename (``durable=False``: no fsync,
    for a record whose loss or emptiness after a crash only costs work again)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def writable(path: Path) -> bool:
    """``path`` has its owner write bit and this process may write it (not a read-only mount, not ``chmod a-w``)."""
    try:
        return bool(os.lstat(path).st_mode & 0o200) and os.access(path, os.W_OK)
    except OSError:
        return False


def mark_used(path: Path) -> None:
    """Set ``path``'s mtime to now (a last use, for LRU pruning): best effort, errors raised as OSError;
    skipped where the file lacks its owner write bit (a cache made read-only with ``chmod -R a-w``, even for root)."""
    if os.lstat(path).st_mode & 0o200 and os.access(path, os.W_OK):
        os.utime(path, follow_symlinks=False)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def insecure_reason(path: Path, *, want_dir: bool, owners: tuple[int, ...] = ()) -> str | None:
    """Why ``path`` must not be trusted, or None.

    Refused: a symlink, the wrong kind of file, an owner other than this
    user (or one of ``owners``: root for a package installed by root), and group- or world-writable modes.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as e:
        return f"{path} cannot be examined ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if want_dir and not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if not want_dir and not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if st.st_uid != os.geteuid() and st.st_uid not in owners:
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is group- or world-writable (mode {stat.S_IMODE(st.st_mode):o})"
    return None


# ---- walking a tree jitops owns: never through a link (SECURITY.md)
def is_real_dir(path: Path) -> bool:
    """``path`` itself is a folder (a link to one is not)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def may_hold(folder: Path) -> bool:
    """``folder`` may be made or written in without going through a link: it and its parent are each a real
    folder or absent (for what jitops keeps in ``v1/<folder>``; the root above is the user's)."""
    return all(is_real_dir(p) or not os.path.lexists(p) for p in (folder.parent, folder))


def children(folder: Path, *, dirs_only: bool = False) -> list[Path]:
    """What a real folder holds (sorted; only real sub-folders with ``dirs_only``); nothing when ``folder``
    is a link, a file or unreadable. A link inside is listed as itself, never entered."""
    if not is_real_dir(folder):
        return []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [folder / n for n in names if not dirs_only or is_real_dir(folder / n)]


def remove_path(path: Path) -> None:
    """Remove ``path`` as what it is: a link or a file is unlinked (never what it points at), a real folder
    is deleted with everything in it (``shutil.rmtree`` never follows a link inside). Gone already: fine."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


# ---- records: small JSON files jitops wrote into the cache or the config dir
MAX_RECORD_BYTES = 1 << 20


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} out of range")
    return value


def _no_constant(text: str) -> float:
    raise ValueError(f"{text} is not a number a record holds")


def open_regular(path: Path, *, owners: tuple[int, ...] | None = None) -> BinaryIO:
    """The regular file at ``path`` open for reading, opened without following a link and without blocking
    (a FIFO, a device), checked on its descriptor. ``owners``: it must also be this user's (or one of
    ``owners``) and not group- or world-writable. OSError when it is missing, unreadable or any check fails."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if owners is not None and (
            st.st_uid not in (os.geteuid(), *owners) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        ):
            raise OSError(
                errno.EPERM, "not this user's file, or writable by group or others", str(path)
            )
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(
    path: Path, max_bytes: int = MAX_RECORD_BYTES, *, owners: tuple[int, ...] | None = None
) -> bytes:
    """The bytes of the file :func:`open_regular` opens at ``path``, at most ``max_bytes``: the one way jitops
    reads a record or a manifest, so that a link, a FIFO or ``/dev/zero`` in its place never hangs nor
    fills memory. OSError also when the file is longer."""
    with open_regular(path, owners=owners) as f:
        raw = f.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes", str(path))
    return raw


def read_record(
    path: Path, max_bytes: int = MAX_RECORD_BYTES, *, private: bool = False
) -> dict[str, Any] | None:
    """The JSON object in the file at ``path`` (read by :func:`read_bounded`), or None when it is missing,
    unreadable or damaged: too large, not a regular file, not UTF-8, not JSON, not an object, nested too
    deep, or holding a number that is not finite (``1e999``, ``NaN``). Callers check each field's type
    before use."""
    try:
        raw = read_bounded(path, max_bytes, owners=() if private else None)
    except OSError:
        return None
    try:
        data = json.loads(raw.decode("utf-8"), parse_float=_finite, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    return data if isinstance(data, dict) else None


def read_private_record(path: Path, max_bytes: int = MAX_RECORD_BYTES) -> dict[str, Any] | None:
    """As :func:`read_record`, for a record only this user may have written (the user's state dir): None also
    when the file, checked on the descriptor it is read from, is not this user's or is group- or world-writable."""
    return read_record(path, max_bytes, private=True)


def is_number(value: object, kind: type = float) -> bool:
    """``value`` is a JSON number of ``kind`` (int: an int; float: an int or a finite float), never a bool."""
    if isinstance(value, bool):
        return False
    if kind is int:
        return isinstance(value, int)
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def files_under(root: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """Files under ``root`` with one of ``suffixes``, sorted; links to folders not followed, a cache folder
    (one holding jitops's :data:`CACHEDIR_TAG`, the root itself aside) skipped: what a build writes there is no source."""
    out: list[Path] = []
    for folder, dirs, files in os.walk(root):
        if CACHEDIR_TAG in files and Path(folder) != root and _ours(Path(folder, CACHEDIR_TAG)):
            # jitops's own tag only: cargo's target/ (tagged too) can hold generated headers
            dirs.clear()
            continue
        out.extend(
            p for p in (Path(folder, f) for f in files) if p.suffix in suffixes and p.is_file()
        )
    return sorted(out)


def _ours(tag: Path) -> bool:
    try:
        with open(tag, "rb") as f:
            return f.read(len(CACHEDIR_SIGNATURE) + 1) == CACHEDIR_SIGNATURE
    except OSError:
        return False


def changed_since(files: list[str], began: float) -> str | None:
    """The first of ``files`` written (mtime or ctime, 2 s of a coarse clock's tick counted by the caller) or gone
    since ``began`` (wall clock), else None: what a build read may not be what it compiled."""
    for f in files:
        try:
            st = os.stat(f)
        except OSError:
            return f
        if max(st.st_mtime, st.st_ctime) >= began:
            return f
    return None
