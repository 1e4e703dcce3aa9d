"""What makes a stable-ABI build cheap: a shared PCH of its header prefix and a link stub for the C shim's library.

**PCH.** The stable headers (``torch/csrc/stable/{library,tensor,ops}.h``) are ~60 % of a stable kernel's
compile with g++ (1.2 s -> 0.6 s here). Their PCH is keyed like pch.py's (compiler, exact flags less
``-DJITOPS_NS`` and the library's own folder, the header prefix's text) plus torch's version and include
folder: a stable entry's key holds no torch version, its PCH must (torch's headers are system headers,
outside the PCH's manifest). So every stable kernel with the same compiler, flags and prefix shares one,
across libraries and edits. It is built by :mod:`pch_bg` after the first build that lacked it has
returned (never on the user's wait: a detached, low-priority child), verified before each use by
:func:`pch.find`, and gcc itself ignores one it cannot use (``-Winvalid-pch``: one note, never a wrong
result). The PCH is used only when all of a library's files have the same prefix, and never when a
prefix header is also in the library's own folders (the compile would read that one, not the PCH's).
A file whose first line includes a local header (``#include "kernel.h"``) has that header's leading
system includes as its prefix (pch.local_prefix).

**Link stub.** The library must name the C shim's library (``libtorch_cpu.so``) as NEEDED so its
``aoti_torch_*`` symbols resolve at load time, but linking against the real 430 MB library costs the
linker ~0.25-0.45 s of reading its symbol table, on every build. A shared link leaves undefined symbols
undefined either way (no ``-z defs``), so the real library contributes only its SONAME: a stub with
the same SONAME (read from the real library's ELF header) and no symbols gives the same NEEDED entry
and the same undefined symbols. It is made once per process (through the build's supervised runner)
and written into each build's private folder, linked with ``--no-as-needed``. Link flags that forbid
undefined symbols (``-z defs``, ``--no-undefined``), no SONAME, or a failed stub: the real library, as
before; a link with the stub that still reports an undefined reference is run again against it. A process's
first stub (~50 ms: a compiler driver and the linker) is begun by :func:`start_stub` as soon as the miss is
known (``entry.before_first_build``), in a thread beside the imports, lock and staging that come before the
compile; :func:`link_stub` takes it (or makes one itself, as before, if it failed).

Imports: pch, pch_bg (the Cache, the job and its runner are passed in).
"""

from __future__ import annotations

import logging
import os
import shlex
import struct
import subprocess
import tempfile
import threading
from pathlib import Path
from collections.abc import Iterable, Sequence
from typing import Any

from . import pch, pch_bg

log = logging.getLogger("jitops")

_soname: dict[
    tuple[str, int, int], str | None
] = {}  # (path, size, mtime_ns) -> its SONAME, this process


def prefix_of(sources: tuple[Path, ...], dirs: Sequence[Path | str] = ()) -> list[str]:
    """The header prefix all C++ sources share, else []: each one's leading ``#include <...>``
    lines, or those its first include, a local header found in its folder or ``dirs``, starts
    with."""

    def one(s: Path) -> tuple[str, ...]:
        text = Path(s).read_text(errors="replace")
        return tuple(pch.header_prefix(text) or pch.local_prefix(text, Path(s).parent, dirs))

    prefixes = {one(s) for s in sources}
    return (
        list(prefixes.pop())
        if len(prefixes) == 1 and all(str(s).endswith(pch.CXX_SUFFIXES) for s in sources)
        else []
    )


# Link words that also change how the one compile-and-link command compiles (-fopenmp defines
# _OPENMP, -pthread _REENTRANT, -m*/-O*/-std* the target and language): the PCH is built with them,
# or gcc would refuse it.
_COMPILING_LDFLAGS = ("-f", "-m", "-O", "-D", "-U", "-std", "-g")
_COMPILING_LDWORDS = frozenset({"-pthread", "-p", "-pg", "--coverage"})


def pch_flags(job: Any, include: str, torch_id: str) -> list[str]:
    """The compiler words of the PCH (shell-quoted): the build's, less -DJITOPS_NS and the library's folder, with
    the link flags that change the compile."""
    dirs = [
        w
        for d in job.include_dirs
        if job.root is None or Path(d) != Path(job.root)
        for w in ("-I", str(d))
    ]
    linking = [
        w for w in job.ldflags if w.startswith(_COMPILING_LDFLAGS) or w in _COMPILING_LDWORDS
    ]
    return [
        shlex.quote(w) for w in ("-fPIC", *job.cflags, *dirs, "-isystem", include, *linking)
    ] + [f"# torch {torch_id}"]


def shadowed(job: Any, prefix: list[str]) -> str | None:
    """A header of ``prefix`` that the library's own folders also hold (the compile would read that one,
    the shared PCH the other), or None."""
    names = [line.split("<", 1)[-1].split(">", 1)[0] for line in prefix if "<" in line]
    for d in job.include_dirs:
        for name in names:
            if os.path.lexists(os.path.join(d, name)):
                return os.path.join(d, name)
    return None


def use_pch(
    job: Any, include: str, torch_id: str
) -> tuple[list[str], str, dict[str, dict[str, Any]], dict[str, str]]:
    """(words for the compile, state, {key: pch_bg.spawn's keywords} to build after the build, what the
    PCH read: store.inputs's record, which the compile's own dependency file does not repeat)."""
    if not job.pch or job.cache is None:
        return [], "off", {}, {}
    prefix = prefix_of(job.sources, job.include_dirs)
    if not prefix:
        return [], "no prefix", {}, {}
    if shadowed(job, prefix) is not None:
        return [], "shadowed", {}, {}
    flags = pch_flags(job, include, torch_id)
    key = pch.key_of(job.identity, job.pch, " ".join(flags), prefix)
    found = pch.find(job.cache, key, job.pch)
    # pch_words are quoted for ninja's shell; the stable builder runs an argv list
    if found is not None:
        return shlex.split(" ".join(found.words)), "hit", {}, dict(found.deps)
    if not job.pch_build:
        return [], "none", {}, {}
    # its prefix did not compile as a PCH lately: not tried after every build
    if pch.refused(job.cache, key):
        return [], "refused", {}, {}
    # JITOPS_PCH_BACKGROUND=0: no detached child; the stable path builds none then
    if not job.pch_background:
        return [], "off (background)", {}, {}
    if pch_bg.busy(job.cache, key):
        return [], "busy", {}, {}
    # The torch marker is a comment in the key's text only: it never reaches the compiler.
    words = [w for w in flags if not w.startswith("# torch ")]
    return (
        [],
        "background",
        {
            key: {
                "kind": job.pch,
                "cxx": job.cxx,
                "flags": words,
                "prefix": prefix,
                "root": job.root or job.build_dir,
                "pinned": list(job.pinned),
            }
        },
        {},
    )


def after(
    job: Any,
    later: dict[str, dict[str, Any]],
    since: pch_bg.Sample | None,
    infos: Iterable[dict[str, Any]] = (),
) -> str:
    """Once the build (begun at ``since``, a ``pch_bg.cpu_waited``) succeeded: start the PCH it
    lacked, detached; its state, as :func:`pch_bg.start` gives it and writes into ``infos``."""
    return pch_bg.start(job.cache, later, job.env, job.pch_max_size, since, job.pch_pressure, infos)


def soname(path: str) -> str | None:
    """The DT_SONAME of an ELF64 little-endian shared library (headers only), or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    memo = (path, st.st_size, st.st_mtime_ns)
    if memo in _soname:
        return _soname[memo]
    found = None
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:6] == b"\x7fELF\x02\x01":
                (shoff,) = struct.unpack_from("<Q", head, 0x28)
                shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
                f.seek(shoff)
                table = f.read(shentsize * shnum)
                sections = [
                    struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)
                ]
                for s in sections:
                    if s[1] == 6:  # SHT_DYNAMIC; its sh_link names the string table
                        strtab = sections[s[6]]
                        f.seek(s[4])
                        dyn = f.read(min(s[5], 1 << 20))
                        for i in range(0, len(dyn) - 15, 16):
                            tag, val = struct.unpack_from("<qQ", dyn, i)
                            if tag == 14:  # DT_SONAME
                                f.seek(strtab[4] + val)
                                found = f.read(256).split(b"\0", 1)[0].decode() or None
                        break
    except (OSError, struct.error, IndexError, UnicodeDecodeError):
        found = None
    _soname[memo] = found
    return found


# link flags that need the real library's symbols
_NO_UNDEFINED = (
    "defs",
    "no-undefined",
    "unresolved-symbols",
)
_stubs: dict[
    tuple[str, str], bytes
] = {}  # (compiler, SONAME) -> the stub's bytes, made once per process
_early: dict[
    tuple[str, str], tuple[threading.Thread, list[bytes]]
] = {}  # begun by start_stub, not yet taken


def _stub_command(cxx: str, name: str, out: Path) -> list[str]:
    return [
        cxx,
        "-shared",
        "-nostdlib",
        f"-Wl,-soname,{name}",
        "-x",
        "c++",
        os.devnull,
        "-o",
        str(out),
    ]


def start_stub(cxx: str, real: str, env: dict[str, str]) -> None:
    """Begin making the stub of ``real`` for ``cxx`` in a thread (once per process), for :func:`link_stub`.

    Its compiler runs on nothing (``/dev/null``) in a private temporary folder, bounded by a timeout, outside the
    supervisor: there is no user input to wait on, and it ends in milliseconds whatever happens to this process."""
    name = soname(real)
    if name is None or (cxx, name) in _stubs or (cxx, name) in _early:
        return
    made: list[bytes] = []

    def make() -> None:
        with tempfile.TemporaryDirectory(prefix="jitops-stub-") as tmp:
            part = Path(tmp) / "stub.so"
            try:
                done = subprocess.run(
                    _stub_command(cxx, name, part),
                    cwd=tmp,
                    env={**env, "TMPDIR": tmp},
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=60,
                )
                if done.returncode == 0 and soname(str(part)) == name:
                    made.append(part.read_bytes())
            except (OSError, subprocess.SubprocessError) as e:
                log.debug("could not begin a link stub for %s: %s", name, e)

    thread = threading.Thread(target=make, name="jitops-link-stub", daemon=True)
    _early[(cxx, name)] = (thread, made)
    thread.start()


def link_stub(job: Any, real: str, run: Any) -> Path | None:
    """A stub of ``real`` (same SONAME, no symbols) in the build's own folder, to link against; None: link against
    ``real`` (no SONAME, link flags that forbid undefined symbols, or the stub could not be made).

    Made per process by the build's supervised ``run`` (one ``g++ -shared`` of nothing, ~30 ms) and written into
    each build's private folder: nothing in the cache to verify, share, prune or lose mid-build."""
    name = soname(real)
    if name is None or any(m in w for w in job.ldflags for m in _NO_UNDEFINED):
        return None
    part = job.build_dir / "shim-stub.so"
    made = _stubs.get((job.cxx, name))
    # by start_stub: taken once it is done
    begun = _early.pop((job.cxx, name), None) if made is None else None
    # (pop, not a lookup first: builds run in parallel threads under jitops.warm)
    if begun is not None:
        begun[0].join(60)
        if begun[1]:
            made = _stubs[(job.cxx, name)] = begun[1][0]
    try:
        if made is None:
            rc, _ = run(_stub_command(job.cxx, name, part), cwd=job.build_dir, env=job.env)
            if rc != 0 or soname(str(part)) != name:
                log.info(
                    "note: could not make a link stub for %s; linking against the library itself",
                    name,
                )
                return None
            _stubs[(job.cxx, name)] = part.read_bytes()
        else:
            part.write_bytes(made)
        return part
    except OSError as e:
        log.info(
            "note: could not make a link stub for %s (%s); linking against the library itself",
            name,
            e,
        )
        return None
