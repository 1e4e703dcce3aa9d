"""The drop-in's warm load without a plan: a call remembered with every fact its plan was made from.

A torch-style ``load`` plans on every call (the probe, the compiler's identity, the sha256 of each source, the
key, the entry's check), and the modules that do it cost ~10 ms to import: inside a program that has imported
``torch.utils.cpp_extension`` already, torch's own warm ``load`` took ~9-10 ms in all, jitops's ~16-20 ms. So after
a planned load of a verified CPU entry that is a plain pybind11 module, the call is remembered in the user's state
dir (``<state>/verified/<request digest>.hit``, read and written as ``stamps`` are: this user's files, no links)
with what its plan read:

* the request's digest: the front door (``jitops.load`` / ``load_inline``) and every argument as given, the
  working folder (relative paths are its), every setting, every fact of the probe (torch, Python, the ISA, the
  build variables a key holds), the Python executable, and jitops's version and folder;
* the stat identity (device, inode, size, mtime and ctime in ns) of every source and header the key digested
  (the sources' folder, the include dirs, jitops's headers) and of every folder under those (adding, removing or
  renaming a file changes its folder's times); each of those roots that does not exist, as absent (creating an
  include path changes the key through the headers it holds);
* the sha256 the key was made from of the sources and headers, up to ``HASHED_BYTES`` in all: a write through a
  shared mapping changes bytes before it changes the ctime (until the page is written back), so a recall hashes
  them again after every stat held;
* the compiler: ``$CXX`` (or ``c++``) found on ``PATH``, its canonical binary and that binary's identity, and the
  identity of each program its driver runs (``toolchain.program_files``), with the ``PATH`` lookup of ``as`` / ``ld``;
* every other file the build read (the manifest's ``inputs``), by the identity it had when the
  entry's last proof sealed them all (``Stamps.inputs_stamp``, none left out): a call is remembered
  only once those are proven;
* the entry: the sha256 of its manifest's bytes and the identity of its library, which a stamp had vouched for
  (hashed in full by an earlier check), and the module's name.

A later call computes the digest, finds the record and checks each identity with one ``stat``, then the small
sources' bytes (a few KB each): no library hash, no subprocess, neither the planner nor the drop-in's build code
imported. Any difference, or anything odd in the record, and the call plans as before. A record is written only
when every identity is settled (``stamps.SETTLED`` seconds old: a write in the same timestamp tick as the record
changes no time) and each file's identity is the one the plan took before it read the file. Any other write
changes a file's ctime, which no call can set back, so nothing the key covers changes unseen: the recalled entry
is the one the plan would pick and verify, and loading it is what the planned path does for such a library.
Libraries with ops, schemas or a fixed namespace, CUDA builds and ``verbose=True`` always plan.

Imports: _version, fsutil, record, spec, stamps, target (probe); key, manifest, cache, inputs and toolchain lazily
(when a call is remembered);
settings and plan for annotations.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import stat
import sys
import threading
import time
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ..base import fsutil
from ..base.record import record
from ..store.stamps import SETTLED, Stamps, identity, manifest_digest
from ..target import System, cxx_command, probe

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..base.settings import Settings
    from ..plan import LoadedLibrary, Plan

log = logging.getLogger("jitops")
# this jitops's folder (its headers, its code)
_JITOPS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SUFFIX = ".hit"
FORMAT = 3
MAX_BYTES = 1 << 20  # a record naming more files than fit is not written: such a request plans
MAX_FOLDERS = 2000
# sources hashed on each recall, in all: a write through a shared mapping can change bytes before it
# changes the ctime; beyond this, a file is proven by its stat identity alone
HASHED_BYTES = 1 << 20
KEEP = 256  # records kept before the oldest half are dropped
# namespace (one per build) -> its pybind11 module, imported once per process (cpp_ext_style's too)
MODULES: dict[str, types.ModuleType] = {}
_lock = threading.Lock()


# a fork taken while another thread loaded a module must not deadlock the child
def _reset_after_fork() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


@record
class Request:
    """One drop-in call as a recall sees it: its digest, the probe's facts, the user's stamps."""

    digest: str
    system: System
    stamps: Stamps  # written unless offline (JITOPS_OFFLINE)


def _facts(value: Any) -> list[list[str]]:
    return [[f.name, repr(getattr(value, f.name))] for f in dataclasses.fields(value)]


def request(func: str, args: Mapping[str, Any], settings: Settings) -> Request | None:
    """The request of the call ``func(**args)`` (every argument as given), made from ``os.getcwd()`` (relative
    source paths are its), or None where it cannot be written down."""
    system = probe(cuda=False)  # what make_plan reads for a CPU plan
    body = {
        "v": FORMAT,
        "func": func,
        "args": dict(args),
        "settings": _facts(settings),
        "system": _facts(system),
        "python": [sys.executable, sys.version],
        "jitops": [__version__, _JITOPS],
    }
    try:
        body["cwd"] = os.getcwd()
        blob = json.dumps(body, sort_keys=True, default=repr)
    except (OSError, TypeError, ValueError):
        return None
    return Request(
        hashlib.sha256(blob.encode()).hexdigest(),
        system,
        Stamps(settings.state_root, write=not settings.offline),
    )


def _compiler(system: System) -> tuple[str, str] | None:
    """(command, canonical binary) of the C++ compiler, found as ``toolchain.find_cxx`` finds it."""
    command = cxx_command(system)
    return None if command is None else (command, os.path.realpath(command))


def _same(path: str, ident: list[int]) -> bool:
    try:
        return list(identity(os.stat(path))) == ident
    except OSError:
        return False


def _absent(path: str) -> bool:
    """Nothing at ``path`` (a link to nothing included): what a missing include path must stay."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    return False


def _holds(path: str, digest: str) -> bool:
    """``path`` holds the bytes of sha256 ``digest`` (one bounded read: a hashed file fits the budget)."""
    try:
        with open(path, "rb", buffering=0) as f:
            return hashlib.sha256(f.read(HASHED_BYTES + 1)).hexdigest() == digest
    except OSError:
        return False


def _pairs(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in value
    )


def _well_formed(data: dict[str, Any], digest: str) -> bool:
    paths, absent, digests = data.get("paths"), data.get("absent"), data.get("digests")
    lookups = data.get("lookups")
    if (
        data.get("v") != FORMAT
        or data.get("request") != digest
        or not isinstance(paths, list)
        or not isinstance(absent, list)
        or not isinstance(digests, list)
        or not isinstance(lookups, list)
    ):
        return False
    if not (
        _pairs(paths)
        and _pairs(digests)
        and _pairs(lookups)
        and all(isinstance(d, str) for _, d in (*digests, *lookups))
        and all(isinstance(a, str) for a in absent)
    ):
        return False
    ids = [data.get("library"), data.get("compiler_identity"), *(p[1] for p in paths)]
    return all(
        isinstance(data.get(k), str)
        for k in (
            "key",
            "namespace",
            "module",
            "manifest_path",
            "manifest",
            "library_path",
            "command",
            "compiler",
        )
    ) and all(
        isinstance(i, list) and len(i) == 5 and all(fsutil.is_number(v, int) for v in i)
        for i in ids
    )


def recall(req: Request) -> types.ModuleType | None:
    """The module ``req`` was last answered with, loaded, when every fact it was proven from still holds; else None."""
    data = req.stamps.recalled(req.digest[:32] + SUFFIX, MAX_BYTES)
    if data is None or not _well_formed(data, req.digest):
        return None
    if _compiler(req.system) != (data["command"], data["compiler"]) or not _same(
        data["compiler"], data["compiler_identity"]
    ):
        return None
    if not all(_same(path, ident) for path, ident in data["paths"]) or not all(
        map(_absent, data["absent"])
    ):
        return None
    # the assembler and linker the compiler finds on PATH are the ones it found then
    if any(shutil.which(name) != path for name, path in data["lookups"]):
        return None
    # after every stat held: the bytes of the small sources, which a shared mapping can change
    # unseen
    if not all(_holds(path, digest) for path, digest in data["digests"]):
        return None
    try:
        with open(data["manifest_path"], "rb") as f:
            if manifest_digest(f.read(MAX_BYTES)) != data["manifest"]:
                return None
    except OSError:
        return None
    if not _same(data["library_path"], data["library"]):
        return None
    with _lock:
        module = MODULES.get(data["namespace"])
        if module is None:
            import torch

            if req.stamps.write:  # not offline
                try:
                    # a last use, once per process as the loader's (LRU)
                    fsutil.mark_used(Path(data["manifest_path"]))
                except OSError as e:
                    log.debug("could not record the use of %s: %s", data["manifest_path"], e)

            # as the loader loads a library without schemas or ops
            torch.ops.load_library(data["library_path"])
            module = MODULES[data["namespace"]] = pybind_module(
                data["module"], Path(data["library_path"])
            )
            module.ops = getattr(torch.ops, data["namespace"])  # type: ignore[attr-defined]  # as cpp_ext_style's
        return module


def pybind_module(name: str, path: Path) -> types.ModuleType:
    """The pybind11 module ``PyInit_<name>`` of the library at ``path`` (loaded already), imported as torch imports it."""
    mod_spec = importlib.util.spec_from_file_location(name, path)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def _settled(st: os.stat_result, now: int) -> bool:
    return st.st_ctime_ns <= now - int(SETTLED * 1e9)


def remember(req: Request, plan: Plan, lib: LoadedLibrary, module: types.ModuleType) -> None:
    """Remember ``req``'s answer: ``module``, the pybind11 module of ``lib`` (loaded from ``plan``'s entry), when it
    may be recalled: best effort."""
    if (
        not req.stamps.write
        or plan.target.device != "cpu"
        or plan.compiler is None
        or lib.key != plan.key
        or lib.ops
        or plan.spec.schemas
        or plan.spec.python
        or lib.built
    ):
        return
    try:
        body = _proof(req, plan, lib, module.__name__)
    except (OSError, ValueError) as e:
        log.debug("could not remember the drop-in request for %s: %s", plan.spec.name, e)
        return
    if body is not None and len(json.dumps(body)) < MAX_BYTES:
        req.stamps.remember(req.digest[:32] + SUFFIX, body, KEEP)


def _proof(req: Request, plan: Plan, lib: LoadedLibrary, module: str) -> dict[str, Any] | None:
    """The record of ``req``, or None where something is unsettled or no longer what the plan read."""
    from ..key import INCLUDE_DIR, source_files
    from ..store import inputs
    from ..store.cache import Cache
    from ..store.manifest import MANIFEST, Manifest
    from ..target import toolchain

    now = time.time_ns()
    paths: list[list[Any]] = []
    absent: list[str] = []
    roots = [plan.spec.root, *plan.spec.include_dirs, INCLUDE_DIR]
    for root in roots:  # the folders first: a file added after this walk changes one of them
        try:
            st = os.stat(root)
        except (FileNotFoundError, NotADirectoryError):
            # not there (yet): its creation changes the key through the headers it holds, so it must
            # stay absent
            absent.append(os.fspath(root))
            continue
        if not stat.S_ISDIR(st.st_mode):  # a file where a folder is named: it, as it is
            if not _settled(st, now):
                return None
            paths.append([os.fspath(root), list(identity(st))])
            continue
        # every folder under it (the root first): more than files_under enters, never less
        for folder, _, _ in os.walk(root):
            if len(paths) >= MAX_FOLDERS:
                return None  # sources in a big tree (a home folder): such a request plans
            st = os.stat(folder)
            if not _settled(st, now):
                return None
            paths.append([folder, list(identity(st))])
    labelled = source_files(plan.spec, ours=True)  # what the plan digested
    taken = dict(plan.stamps)  # (inode, ctime, mtime, size) before the plan read each file
    if sorted(label for label, _ in labelled) != sorted(taken):
        return None
    digested = dict(plan.digests)  # the bytes the key was made from
    digests: list[list[str]] = []
    budget = HASHED_BYTES
    for label, p in labelled:
        st = os.stat(p)
        if (st.st_ino, st.st_ctime_ns, st.st_mtime_ns, st.st_size) != tuple(
            taken[label]
        ) or not _settled(st, now):
            return None
        paths.append([str(p), list(identity(st))])
        if st.st_size <= budget and label in digested:
            budget -= st.st_size
            digests.append([str(p), digested[label]])
    tool = plan.compiler
    assert tool is not None
    compiler = _compiler(req.system)
    if compiler != (tool.command, tool.path):
        return None
    # what the compiler's driver runs, and how each was found on PATH (a link or PATH changed:
    # plans)
    ran = toolchain.program_files(tool.path, tool.run)
    if ran is None:
        return None
    lookups = [[name, path] for path, name in ran if name]
    for path, _ in ran:
        st = os.stat(path)
        if not _settled(st, now):
            return None
        paths.append([path, list(identity(st))])
    # every other file the build read, as the entry's last proof by bytes found it (its seal)
    read = lib.manifest.inputs
    if read is None:
        return None
    seal, found = inputs.seal_of(read, plan.spec.root)
    if seal is None or (seal, ()) != req.stamps.inputs_stamp(os.fsdecode(lib.entry)):
        return None
    for _, where, held in found:
        if held is None or not _settled(held, now):
            return None
        paths.append([where, list(identity(held))])
    cst = os.stat(tool.path)
    raw = Cache.manifest_bytes(lib.entry)
    lst = os.stat(lib.library_path)
    if (
        not _settled(cst, now)
        or Manifest.parse(raw) != lib.manifest
        or not req.stamps.vouches(lib.entry, raw, lib.manifest.sha256, lst)
    ):
        # a library no stamp vouches for (a fresh build, not yet hashed by a later process): not yet
        return None
    return {
        "v": FORMAT,
        "request": req.digest,
        "key": lib.key,
        "namespace": lib.namespace,
        "module": module,
        "manifest_path": os.fsdecode(lib.entry / MANIFEST),
        "manifest": manifest_digest(raw),
        "library_path": os.fsdecode(lib.library_path),
        "library": list(identity(lst)),
        "command": tool.command,
        "compiler": tool.path,
        "compiler_identity": list(identity(cst)),
        "paths": paths,
        "absent": absent,
        "digests": digests,
        "lookups": lookups,
    }
