"""What a build read, recorded in its entry, and proven before the entry is used.

The key is computed before a build from the files jitops can name (the sources and the headers
beside them). What the compiler and linker really open is known only afterwards, from their
dependency files (``-MD``, system headers included; GNU ld's ``--dependency-file``). A build
records each such file with its sha256 in the manifest's ``inputs``; a lookup proves every one of
them still holds those bytes, and any difference (an edit, a removal, a special file) makes the
entry stale: it is not used, and the next use builds it again.

Labels: a file under the library's own folder is ``<root>/<relative path>``, so an entry built
elsewhere (a bundle, the remote tier) is proven against this machine's copy; any other file is
its absolute path. Files under a folder that an ingredient of the key already pins are not
recorded (``pinned``): torch's install (its version, or the stable ABI's target version),
jitops's own headers (digested in the key), the compiler's own folder (its identity), and what
the build generated (the build folder, the cache's objects, PCHs and stubs).

Proof is cheap where it can be: a file whose stat identity (device, inode, size, mtime, ctime)
matches this user's stamp of it (``Stamps.input_identities``) is taken as proven; anything else is
hashed.

Imports: nothing (the stamps' record of proven files is passed in).
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = "<root>"
# seconds: a file changed more recently than this is proven by its bytes, never by a stamp
SETTLED = 2.0
Identity = tuple[int, int, int, int, int]


def read_depfile(path: Path) -> list[str]:
    """The files a make-style dependency file lists (every rule's prerequisites, targets excluded)."""
    text = path.read_text(errors="replace").replace("\\\n", " ")
    out: list[str] = []
    for rule in text.split("\n"):
        _, sep, deps = rule.partition(": ")
        if not sep:
            continue
        word = ""
        for part in deps.split(" "):  # "\ " escapes a space in a path
            if part.endswith("\\"):
                word += part[:-1] + " "
                continue
            word += part
            if word:
                out.append(word)
            word = ""
    return out


def label_of(path: str, root: Path | None) -> str:
    """``<root>/rel`` for a file under the library's folder (no ``..`` on the way), else the absolute path."""
    if root is not None:
        base = str(root).rstrip("/") + "/"
        if path.startswith(base) and "/../" not in "/" + path[len(base) :]:
            return ROOT + "/" + path[len(base) :]
    return path


def path_of(label: str, root: Path | None) -> str | None:
    """Where the file recorded as ``label`` is on this machine (None: a root-relative label, no root)."""
    if label.startswith(ROOT + "/"):
        return None if root is None else os.path.join(root, label[len(ROOT) + 1 :])
    return label


def digest(path: str) -> str:
    """sha256 of a regular file's bytes; OSError for anything else (a FIFO is never opened blocking)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        h = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
        return h.hexdigest()
    finally:
        os.close(fd)


def record(
    files: Iterable[str], root: Path | None, pinned: Iterable[str], cwd: Path | None = None
) -> dict[str, str]:
    """{label: sha256} of the files a build read, less those under ``pinned`` folders. Relative paths
    are the compiler's, from ``cwd``."""
    skip = tuple(str(p).rstrip("/") + "/" for p in pinned if p)
    out: dict[str, str] = {}
    for f in files:
        path = os.path.abspath(os.path.join(cwd, f) if cwd is not None else f)
        if path.startswith(skip):
            continue
        lab = label_of(path, root)
        if lab not in out:
            out[lab] = digest(path)
    return out


def identity(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


Proven = dict[str, tuple[Identity, str]]  # path -> (stat identity, sha256) it held when hashed


def first_change(inputs: Mapping[str, str], root: Path | None) -> str | None:
    """None when every recorded file still holds its recorded bytes; else the first that does not, and how."""
    return prove(inputs, root)[0]


def prove(
    inputs: Mapping[str, str],
    root: Path | None,
    known: Proven | None = None,
    *,
    only_root: bool = False,
) -> tuple[str | None, Proven, bool]:
    """(None, or the first recorded file that no longer holds its bytes and how; the files proven,
    with their identity; whether any was hashed now). A file whose stat identity ``known`` says held
    these bytes is not hashed again (a stamp: ``Stamps.input_identities``); one changed less than
    :data:`SETTLED` seconds ago is hashed but not returned as proven. ``only_root``: the library's
    own files only (a machine without a compiler, where nothing else could be built anyway)."""
    known = known or {}
    proven: Proven = {}
    fresh = False
    for lab in sorted(inputs):
        if only_root and not lab.startswith(ROOT + "/"):
            continue
        path = path_of(lab, root)
        if path is None:
            why = f"{lab} was read by the build, but this library has no folder to find it in"
            return why, proven, fresh
        try:
            st = os.stat(path)
        except OSError:
            return f"{path} was read by the build and is gone", proven, fresh
        ident = identity(st)
        if known.get(path) == (ident, inputs[lab]):
            proven[path] = (ident, inputs[lab])
            continue
        try:
            same = digest(path) == inputs[lab]
        except OSError as e:
            return f"{path} was read by the build and cannot be read now ({e})", proven, fresh
        if not same:
            return f"{path} changed since the build", proven, fresh
        fresh = True
        if st.st_ctime_ns <= time.time_ns() - int(SETTLED * 1e9):
            proven[path] = (ident, inputs[lab])
    return None, proven, fresh


# Where a system's own files live: what a notebook's in-process memo does not watch (a new process,
# or ``jitops.load``, proves them).
SYSTEM = ("/usr/", "/lib/", "/lib64/", "/bin/", "/sbin/", "/etc/")


def edited_since(inputs: Mapping[str, str], root: Path | None, since_ns: int) -> str | None:
    """A recorded file changed (its ctime) at or after ``since_ns``, or None: the bytes hashed after a
    build may not be the ones the compiler read."""
    for lab in sorted(inputs):
        path = path_of(lab, root)
        try:
            if path is not None and os.stat(path).st_ctime_ns >= since_ns:
                return path
        except OSError:
            return path
    return None


def watched(inputs: Mapping[str, str], root: Path | None) -> tuple[str, ...]:
    """The recorded files a user may edit in place: the library's own and any outside :data:`SYSTEM`."""
    paths = (path_of(lab, root) for lab in sorted(inputs))
    return tuple(p for p in paths if p is not None and not p.startswith(SYSTEM))


def stat_stamp(paths: Iterable[str]) -> tuple[tuple[int, int], ...]:
    """(mtime_ns, size) of each file, (0, -1) where it is gone: a cheap "was any edited?" check."""
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((0, -1))
    return tuple(out)
