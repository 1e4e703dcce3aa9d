"""Small filesystem helpers with explicit modes (umask-independent) and checks.

Imports: nothing of jitops.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600
LIB_MODE = 0o700


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


def atomic_write(path: Path, data: bytes, mode: int = FILE_MODE) -> None:
    """Write ``data`` to ``path`` through a private temporary file and a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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


def insecure_reason(path: Path, *, want_dir: bool) -> str | None:
    """Why ``path`` must not be trusted, or None.

    Refused: a symlink, the wrong kind of file, an owner other than this
    user, and group- or world-writable modes.
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
    if st.st_uid != os.geteuid():
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is group- or world-writable (mode {stat.S_IMODE(st.st_mode):o})"
    return None
