"""Precompiled headers, owned by jitops: one per header prefix, compiler, flags and torch.

A TU's header prefix is the leading run of ``#include <...>`` lines (blank and comment lines between them allowed)
before anything else: the part that takes ~90 % of a compile to parse and that an edit rarely touches. Its PCH lives
in the cache (``Cache.build_path("pch", key)``), never beside torch or the sources. Its key covers the compiler and
torch identity, the TU's exact flags (less ``-DTORCH_EXTENSION_NAME``, which torch's headers do not read, so
libraries of other names share it, and less the library's own folder) and the prefix's text; its manifest lists the
files the prefix read (``-MD``) with their sha256, as an entry's inputs are (store.inputs: those under folders the key
pins, such as torch's, left out), re-hashed before use (a difference makes it stale: rebuilt). A TU compiled with the
PCH adds this list to its own (its dependency file does not repeat what the PCH read).

Built from a prefix's second build on (a library built once and never edited costs no PCH: neither the time nor ~300
MB of disk for g++'s lean set; the stable headers' PCH, shared by every stable kernel and ~0.5 s to make, after the
first: stable_fast), once, under the key's lock (taken without waiting: if another process holds it, this build goes
without), in a private staging dir, after the build returned, in a detached low-priority child (pch_bg;
JITOPS_PCH_BACKGROUND=0: beside the build's compiles, one more ninja job); its files compile without the PCH, a
later build uses it; manifest last, renamed into place; verified before use: owner, mode, and exactly the files the
compiler reads (the ``.gch``/``.pch`` that ``pch_words`` names, and ``prefix.h``: size and sha256, hashed once per
process). Anything wrong is set aside and built again. GCC uses it through ``-include prefix.h`` with
``prefix.h.gch`` beside it and ``-Winvalid-pch``: a PCH gcc rejects is ignored by gcc itself, which then parses the
text (one note, never a wrong result). A prefix whose PCH does not compile (a header found only through the
library's own folder) leaves a ``<key>.failed`` mark and is not tried again for a day (pch_marks). clang uses
``-include-pch``; a build that fails with a PCH is run again without (tubuild). A PCH never changes an entry's key.

nvcc: no PCH. nvcc 13.0 has no precompiled-header option; its own C++ front end (cudafe++, EDG) parses the whole
``.cu`` with its headers, and the host compiler then gets cudafe++'s fully preprocessed output, headers already
expanded, to which a host PCH cannot apply. A ``.cu`` file still gains from the object cache (an edit to another
file does not recompile it).

Imports: errors, fsutil, lock, objcache, pch_marks (the Cache is passed in).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Sequence
import re
import shlex
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..base import fsutil
from . import pch_marks
from .pch_marks import building, refused, seen_before  # noqa: F401 - where callers have always found them

if TYPE_CHECKING:
    from ..store.cache import Cache

log = logging.getLogger("jitops")

FORMAT = 1
HEADER = "prefix.h"
CXX_SUFFIXES = (".cpp", ".cc", ".cxx", ".C")
_INCLUDE = re.compile(r"\s*#\s*include\s*<[^>]+>\s*(//.*)?$")
# #line: the drop-in's "#line 1" (cpp_ext_style)
_SKIP = re.compile(r"\s*(//.*|#\s*line\s+\d+\s*)?$")
_verified: dict[
    tuple[str, int, int, int], str
] = {}  # (path, size, mtime_ns, inode) -> sha256, this process


_LOCAL = re.compile(r'\s*#\s*include\s*"([^"]+)"\s*(//.*)?$')
# what may come before a local header's first #include without changing what that include means:
# #pragma once, or an include guard (#ifndef G then #define G)
_ONCE = re.compile(r"\s*#\s*pragma\s+once\s*(//.*)?$")
_GUARD = re.compile(r"\s*#\s*(ifndef|define)\s+(\w+)\s*(//.*)?$")


def local_prefix(text: str, here: Path, dirs: Sequence[Path | str]) -> list[str]:
    """The header prefix of a source whose first line is ``#include "x.h"``: x.h's own leading
    ``#include <...>`` lines (after ``#pragma once`` or an include guard), x.h looked up as the
    compiler does (the source's folder, then ``dirs``). Compiling them first changes nothing: the
    source includes them first anyway, and a header read twice is read once (the PCH of any prefix
    relies on that already). [] when the first line is anything else or x.h is not a file."""
    first = next((ln for ln in text.splitlines() if not _SKIP.match(ln)), "")
    m = _LOCAL.match(first)
    if m is None or os.path.isabs(m.group(1)):
        return []
    for d in (here, *dirs):
        header = Path(d) / m.group(1)
        if header.is_file():
            break
    else:
        return []
    out: list[str] = []
    pending, guarded = None, False  # an #ifndef's name until its #define completes the guard
    for line in header.read_text(errors="replace").splitlines():
        g = _GUARD.match(line)
        if _SKIP.match(line) or (not out and pending is None and _ONCE.match(line)):
            continue
        if not out and g and g.group(1) == "ifndef" and pending is None and not guarded:
            pending = g.group(2)
        elif not out and g and g.group(1) == "define" and g.group(2) == pending:
            pending, guarded = None, True
        elif pending is None and _INCLUDE.match(line):
            out.append(line.strip())
        else:
            break
    return out


def header_prefix(text: str) -> list[str]:
    """The leading ``#include <...>`` lines of a source; blank, ``//`` and ``#line N`` lines between them are skipped."""
    out: list[str] = []
    for line in text.splitlines():
        if _INCLUDE.match(line):
            out.append(line.strip())
        elif not _SKIP.match(line):
            break
    return out


def pch_words(kind: str, directory: Path) -> list[str]:
    """The flags that make a compile use the PCH in ``directory``."""
    header = directory / HEADER
    if kind == "clang":
        return ["-include-pch", shlex.quote(f"{header}.pch")]
    return ["-include", shlex.quote(str(header)), "-Winvalid-pch"]


def pch_flags(words: list[str], root: Path) -> list[str]:
    """A TU's flags as its PCH is built with: without -DTORCH_EXTENSION_NAME (per library, unused by torch's headers)
    and the library's own folder (a new one per load_inline edit): the prefix reads only headers its manifest covers."""
    own = f"-I{shlex.quote(str(root))}"
    # Not even -U: gcc refuses a PCH built with -UTORCH_EXTENSION_NAME in a file that defines it
    # (the drop-in's).
    return [
        w
        for w in words
        if not w.startswith("-DTORCH_EXTENSION_NAME=") and w not in (own, "-UTORCH_EXTENSION_NAME")
    ]


def key_of(identity: str, kind: str, flags: str, prefix: list[str]) -> str:
    return hashlib.sha256(json.dumps([FORMAT, identity, kind, flags, prefix]).encode()).hexdigest()


@dataclass
class Use:
    """A PCH ready for a TU: flags to add, how it came (hit / built), headers it read."""

    key: str
    words: list[str]
    state: str
    seconds: float = 0.0
    deps: dict[str, str] = field(default_factory=dict)
    size: int = 0  # bytes of the PCH file (the build's summary line shows them)


def pch_file(kind: str) -> str:
    """The name of the PCH that :func:`pch_words` makes the compiler read (beside ``prefix.h``)."""
    return HEADER + (".pch" if kind == "clang" else ".gch")


def _hash_once(path: Path, want: object) -> None:
    """ValueError unless the regular file ``path`` has the sha256 ``want`` (hashed once per process per version)."""
    if (reason := fsutil.insecure_reason(path, want_dir=False)) is not None:
        raise ValueError(reason)
    st = os.lstat(path)
    memo = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
    if _verified.get(memo) != want:
        if not isinstance(want, str) or fsutil.sha256_file(path) != want:
            raise ValueError(f"{path} does not match its manifest's sha256")
        _verified[memo] = want


def _verify(directory: Path, key: str, kind: str) -> dict[str, object]:
    """The manifest of a usable PCH in ``directory``, or ValueError / OSError saying why not. Checked is exactly what
    the compiler reads: the PCH file :func:`pch_words` names and ``prefix.h`` (gcc parses it when it rejects the
    ``.gch``), each against its sha256."""
    from ..store import inputs

    if (reason := fsutil.insecure_reason(directory, want_dir=True)) is not None:
        raise ValueError(reason)
    m = fsutil.read_record(directory / "manifest.json")
    if m is None or m.get("format") != FORMAT or m.get("key") != key:
        raise ValueError("its manifest is missing, damaged or describes another PCH")
    deps, root = m.get("deps"), m.get("root")
    if not (
        isinstance(deps, dict)
        and all(isinstance(v, str) for v in deps.values())
        and isinstance(root, str)
    ):
        raise ValueError("its manifest's header list is damaged")
    if m.get("file") != pch_file(kind):
        raise ValueError(
            f"its manifest names {str(m.get('file'))[:40]!r}, not the {pch_file(kind)} the compiler reads"
        )
    pch = directory / pch_file(kind)
    if (size := os.lstat(pch).st_size) != m.get("size"):
        raise ValueError(f"{pch} has {size} bytes, its manifest says {m.get('size')}")
    _hash_once(pch, m.get("sha256"))
    _hash_once(directory / HEADER, m.get("header_sha256"))
    if inputs.first_change(deps, Path(root)) is not None:
        raise ValueError("a header it was built from has changed")
    return m


def find(cache: Cache, key: str, kind: str) -> Use | None:
    """The verified PCH of ``key``, or None; one that fails verification is set aside (one note)."""
    final = cache.build_path("pch", key)
    # a link at v1/pch: never used, never entered
    if not fsutil.may_hold(cache.pch) or not os.path.lexists(final):
        return None
    try:
        m = _verify(final, key, kind)
        size, deps = m.get("size"), m["deps"]
        assert isinstance(deps, dict)  # _verify checked the manifest's shape
        use = Use(
            key, pch_words(kind, final), "hit", deps=deps, size=size if isinstance(size, int) else 0
        )
        # its last use, which `cache prune` reads (a PCH used within 10 minutes is kept)
        cache.record_use(final)
        return use
    except (OSError, ValueError) as e:
        _set_aside(cache, final, str(e))
        return None


@dataclass
class Pending:
    """A PCH being built beside a build's compiles: its command (run in ``out``), then ``finish``."""

    key: str
    kind: str
    out: Path
    file: str
    command: str
    root: Path
    hold: contextlib.ExitStack
    staging: Path
    pinned: tuple[str, ...] = ()  # folders whose files are not recorded (BuildJob.pinned)


def start(
    cache: Cache,
    *,
    key: str,
    kind: str,
    cxx: str,
    flags: list[str],
    prefix: list[str],
    root: Path,
    pinned: tuple[str, ...] | list[str] = (),
    speed: tuple[str, ...] | list[str] = (),
) -> Pending | None:
    """Take the PCH's lock (without waiting: None if another process builds it) and prepare its
    build. ``speed``: the build's compiler words that change no output (BuildJob.speed), not in the
    key."""
    from ..errors import LockTimeout
    from ..store.lock import key_lock

    if not fsutil.may_hold(cache.pch):
        return None
    hold = contextlib.ExitStack()
    try:
        hold.enter_context(key_lock(cache.lock_path("pch", key), "a precompiled header", 0))
    except LockTimeout:
        return None
    try:
        if find(cache, key, kind) is not None:  # published while we looked
            hold.close()
            return None
        staging = cache.new_staging("pch", key)
        out = staging / "pch"
        fsutil.makedirs(out)
        text = "\n".join(prefix) + "\n"
        (out / HEADER).write_text(text)
        header = HEADER
        # clang's PCH names its input header by path and needs it later: one outside staging
        if kind == "clang":
            stable = cache.build_path("pch", key, ".h")
            if not stable.is_file() or stable.read_text() != text:
                fsutil.makedirs(stable.parent)
                fsutil.atomic_write(stable, text.encode())
            header = str(stable)
        file = pch_file(kind)
        # clang can instantiate the headers' templates into the PCH; gcc leaves them to every file
        # (~1 s each here).
        more = (
            ["-fpch-instantiate-templates", "-Xclang", "-fno-pch-timestamp"]
            if kind == "clang"
            else []
        )
        words = [
            shlex.quote(cxx),
            *flags,
            *more,
            *map(shlex.quote, speed),
            "-x",
            "c++-header",
            shlex.quote(header),
            "-o",
            f"{file}.part",
            "-MD",
            "-MF",
            "prefix.d",
        ]
        # Never fails the build: a PCH that cannot be made is a note (finish). Renamed when
        # complete.
        command = (
            f"cd {shlex.quote(str(out))} && {{ ({' '.join(words)} && mv {file}.part {file}) > pch.log 2>&1; "
            f"echo $? > {pch_marks.STATUS}; }} || true"
        )
        return Pending(key, kind, out, file, command, root, hold, staging, tuple(pinned))
    except BaseException:
        hold.close()
        raise


def finish(cache: Cache, p: Pending, seconds: float, publish: bool = True) -> Use | None:
    """Publish a PCH built by its command (manifest last, one rename), release its lock; None if none was made."""
    from ..store import inputs

    try:
        pch = p.out / p.file
        if not publish:
            return None
        if not pch.is_file() or not (p.out / "prefix.d").is_file():
            why = (
                (p.out / "pch.log").read_text(errors="replace").strip().splitlines()[-1:]
                if (p.out / "pch.log").is_file()
                else []
            )
            log.info(
                "note: could not precompile the header prefix of PCH %s (%s); its files compile without a PCH",
                p.key[:12],
                why[0] if why else "no output",
            )
            pch_marks.mark_refused(cache, p.key, p.out)
            return None
        ours = (str(p.out) + "/", str(cache.pch) + "/")  # the prefix header itself
        files = [
            f
            for f in inputs.read_depfile(p.out / "prefix.d")
            if f != HEADER and not os.path.abspath(f).startswith(ours)
        ]
        # digests read now would vouch
        if edited := fsutil.changed_since(files, time.time() - seconds - 2.0):
            # for text
            log.info("note: %s changed while PCH %s compiled; not published", edited, p.key[:12])
            return None  # the .gch may not hold; the next build makes it again
        deps = inputs.record(files, p.root, (*ours, *p.pinned), cwd=p.out)
        manifest = {
            "format": FORMAT,
            "key": p.key,
            "file": p.file,
            "size": pch.stat().st_size,
            "sha256": fsutil.sha256_file(pch),
            "header_sha256": fsutil.sha256_file(p.out / HEADER),
            "deps": deps,
            "root": str(p.root),
            "seconds": round(seconds, 3),
        }
        # last
        fsutil.atomic_write(p.out / "manifest.json", json.dumps(manifest, sort_keys=True).encode())
        final = cache.build_path("pch", p.key)
        fsutil.makedirs(final.parent)
        try:
            os.rename(p.out, final)
        except OSError:
            if not os.path.lexists(final):
                raise
        return find(cache, p.key, p.kind)
    except OSError as e:  # its strerror only: never the private staging path
        log.info(
            "note: could not publish precompiled header %s (%s); the files compile without one",
            p.key[:12],
            e.strerror or type(e).__name__,
        )
        return None
    finally:
        shutil.rmtree(p.staging, ignore_errors=True)
        p.hold.close()


def _set_aside(cache: Cache, directory: Path, why: str) -> None:
    log.info("note: precompiled header %s is unusable (%s); it is rebuilt", directory, why)
    with contextlib.suppress(OSError):
        cache.discard(directory)
