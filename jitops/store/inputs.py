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

Proof is cheap where it can be: this user's stamp of an entry holds the seal of its inputs (each
file's path, stat identity (device, inode, size, mtime, ctime) and digest, hashed together) as the
last proof by bytes (or the build itself) found them, less the few changed moments before, which are
hashed each time until they settle; an equal seal proves the others with one ``stat`` each; anything
else hashes them all.

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
            if word:  # make's escapes of "$" and "#", as gcc and nvcc write them
                out.append(word.replace("$$", "$").replace("\\#", "#"))
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


def holding(labels: Iterable[str], root: Path | None) -> str:
    """A digest of what this machine holds at the files ``labels`` name (each one's sha256, or that
    it is missing or not a regular file): equal on two machines exactly when those files hold the
    same bytes on both. Names the remote tier's entry for one set of inputs."""
    h = hashlib.sha256()
    for lab in sorted(set(labels)):
        path = path_of(lab, root)
        try:
            held = digest(path) if path is not None else "-"
        except OSError:
            held = "-"
        h.update(f"{lab}\0{held}\n".encode())
    return h.hexdigest()


def identity(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def first_change(inputs: Mapping[str, str], root: Path | None) -> str | None:
    """None when every recorded file still holds its recorded bytes; else the first that does not, and how."""
    return prove(inputs, root)[0]


# A stamp of an entry's inputs: the seal of those settled when it was taken, and the paths left out
# (changed moments before, so a write in the same tick could keep their identity: hashed each time).
Stamp = tuple[str, tuple[str, ...]]


def _line(path: str, st: os.stat_result, want: str) -> str:
    return (
        f"{path}\0{st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}\0{want}\n"
    )


def seal_of(
    inputs: Mapping[str, str],
    root: Path | None,
    *,
    only_root: bool = False,
    leave: Iterable[str] = (),
) -> tuple[str | None, list[tuple[str, str, os.stat_result | None]]]:
    """(the sha256 of every recorded file's path, stat identity and recorded digest, less the paths
    in ``leave``, or None where one cannot be found; each file's label, path and stat, None where it
    is gone). Equal seals: every file is the very one a proof by bytes found holding its digest,
    unwritten since (its ctime would differ)."""
    left = set(leave)
    lines: list[str] = []
    found: list[tuple[str, str, os.stat_result | None]] = []
    whole = True
    for lab, want in sorted(inputs.items()):
        if only_root and not lab.startswith(ROOT + "/"):
            continue
        path = path_of(lab, root)
        if path is None:
            return None, found
        try:
            st: os.stat_result | None = os.stat(path)
        except OSError:
            st, whole = None, False
        found.append((lab, path, st))
        if st is not None and path not in left:
            lines.append(_line(path, st, want))
    seal = hashlib.sha256("".join(lines).encode()).hexdigest()
    return (seal if whole else None), found


def _stamp(
    inputs: Mapping[str, str], found: list[tuple[str, str, os.stat_result | None]]
) -> Stamp | None:
    """The stamp of files just proven: the settled ones sealed, the others left out."""
    settled = time.time_ns() - int(SETTLED * 1e9)
    lines, left = [], []
    for lab, path, st in found:
        if st is None:
            return None
        if st.st_ctime_ns > settled:
            left.append(path)
        else:
            lines.append(_line(path, st, inputs[lab]))
    return hashlib.sha256("".join(lines).encode()).hexdigest(), tuple(left)


def prove(
    inputs: Mapping[str, str],
    root: Path | None,
    vouched: Stamp | None = None,
    *,
    only_root: bool = False,
) -> tuple[str | None, Stamp | None]:
    """(None, or the first recorded file that no longer holds its bytes and how; a new stamp to
    remember, or None when the one ``vouched`` still says all). With a ``vouched`` stamp
    (``Stamps.inputs_stamp``, the last proof by bytes) whose seal the files still make, only the
    files it left out are hashed; anything else hashes every file. ``only_root``: the library's own
    files only (a machine without a compiler, where nothing else could be built anyway)."""
    left = vouched[1] if vouched is not None else ()
    seal, found = seal_of(inputs, root, only_root=only_root, leave=left)
    labels = [lab for lab in sorted(inputs) if not only_root or lab.startswith(ROOT + "/")]
    if len(found) < len(labels):
        lab = labels[len(found)]
        return f"{lab} was read by the build, but this library has no folder to find it in", None
    sealed = seal is not None and vouched is not None and seal == vouched[0]
    for lab, path, st in found:
        if sealed and path not in left:
            continue
        if st is None:
            return f"{path} was read by the build and is gone", None
        try:
            same = digest(path) == inputs[lab]
        except OSError as e:
            return f"{path} was read by the build and cannot be read now ({e})", None
        if not same:
            return f"{path} changed since the build", None
    if sealed and not left:
        return None, None
    return None, _stamp(inputs, found)


def after_build(
    inputs: Mapping[str, str], root: Path | None, since_ns: int
) -> tuple[str | None, Stamp | None]:
    """(a recorded file written at or after ``since_ns``, when the build began, or None; else the
    stamp of the files as the build left them). No file changed since the build began, so the
    digests just taken are of these very files: the next proof needs their stat only."""
    _, found = seal_of(inputs, root)
    for _, path, st in found:
        if st is None or st.st_ctime_ns >= since_ns:
            return path, None
    return None, _stamp(inputs, found)


# Where a system's own files live: what a notebook's in-process memo does not watch (a new process,
# or ``jitops.load``, proves them).
SYSTEM = ("/usr/", "/lib/", "/lib64/", "/bin/", "/sbin/", "/etc/")


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
