"""User kernels written against PyTorch's stable C ABI, built in about a second, loaded as dispatcher ops.

A source that spells ``STABLE_TORCH_LIBRARY`` (or a call with ``abi="stable"``) is compiled with
``-DTORCH_TARGET_VERSION`` and torch's include root only, no Python or pybind11 headers, in one
compiler command (compile and link), and linked against nothing of torch but the library that holds
the stable C shim (through a stub of it with its SONAME), with the PCH of the stable headers shared by
every stable kernel once one exists (both: stable_fast). It registers in the build's own namespace, as jitops's
other user kernels do, so an edit loads next to the old build::

    #include <torch/csrc/stable/library.h>
    #include <torch/csrc/stable/tensor.h>
    #include <torch/csrc/stable/ops.h>
    torch::stable::Tensor scale(torch::stable::Tensor x, double s) { ... }
    STABLE_TORCH_LIBRARY(JITOPS_NS, m) { m.def("scale(Tensor x, float s) -> Tensor"); }
    STABLE_TORCH_LIBRARY_IMPL(JITOPS_NS, CPU, m) { m.impl("scale", TORCH_BOX(&scale)); }

Sources written for torch's loader build unchanged: a fixed namespace (``STABLE_TORCH_LIBRARY(myns, m)``,
loaded once per process: loading.loader.check_fixed), ``-DTORCH_STABLE_ONLY`` and the user's ``-DTORCH_TARGET_VERSION``.
The library's ops are what it registered, listed by the loader after loading, never read from the source.

The key holds the target version instead of torch's exact version (``key.STABLE_ABI_FLAG``), so
an entry built under one torch serves every later one; a load checks that the running torch is at
least the target. Such a library imports only the C shim's symbols (``aoti_torch_*``, ``torch_*``).

CUDA kernels (``.cu`` sources, ``STABLE_TORCH_LIBRARY_IMPL(JITOPS_NS, CUDA, m)``, the device guard
and stream of ``torch/csrc/stable/accelerator.h``) are compiled by nvcc for the plan's archs, as
jitops's other CUDA builds, with the library's macros and jitops's own nvcc words
(key.STABLE_NVCC_FLAGS: a stable key holds no torch version that would pin torch's), and linked with
cudart; ``libtorch_cuda`` only as needed (the shim's ``USE_CUDA`` functions are there). The key
holds CUDA's major version, not torch's.

The toolchain self-check (selfcheck.py) is not started for these builds: its probe is an op built
against torch's C++ headers (seconds), checking C++ exceptions thrown through torch's C++ API; a
stable kernel's errors cross as ``std::runtime_error`` (``STD_TORCH_CHECK``), which
tests/test_stable_abi.py checks arrives as ``RuntimeError``. A remembered verdict still applies to
the compiler as a whole.

A library of several files compiles each file apart (its own dependency file), up to the build's
job count at once, then links. Each C++ object comes from the object cache when nothing it read
changed (store.objcache: tubuild's keys, with torch's version as the stable PCH's; its record of
every file the compile read re-hashed), so an edit compiles the edited files only. Only files
spelling ``JITOPS_NS`` get the namespace macro (tubuild's rule): the namespace is the key's, so
those compile again on every edit, the others not.

Imports: checks, errors, key, patterns, spec, torchcompat, user_spec; fsutil, inputs, ninja
(`_Aliases`, `cuda_lib_dir`), objcache, pch_bg (`cpu_waited`), stable_fast, tubuild
(`PCH_ERROR`, `names_namespace`) and torch lazily. api.user and build.runner call it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..spec import checks
from .job import LINK_DEPFILE
from ..errors import ArgumentError, BuildError, ConfigError, KernelSourceError, TargetError
from ..key import STABLE_ABI_FLAG, flag_words
from ..spec import flag_version, stable_target, version_flag
from ..spec import OpSpec
from ..base.torchcompat import parse
from ..spec.user_spec import BuildOptions, StrOrSeq, _as_list, _spec
from ..base.patterns import lazy

if TYPE_CHECKING:
    from .pch_bg import Sample

ABIS = ("stable",)  # what abi= accepts besides None (detect from the source)
_STABLE = lazy(r"\bSTABLE_TORCH_LIBRARY(?:_IMPL|_FRAGMENT)?\s*\(", needs="STABLE_TORCH_LIBRARY")
_NAMESPACE = lazy(
    r"\bSTABLE_TORCH_LIBRARY(?:_FRAGMENT)?\s*\(\s*(\w+)\s*,", needs="STABLE_TORCH_LIBRARY"
)
_INCLUDE = lazy(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', needs="include")
# Headers of torch's C++ API (ATen, c10, torch/extension.h...), Python's and pybind11's: not in the
# stable set. Prefix tests, not a regex: every warm load of a stable library checks its includes,
# and a fresh process would compile it.
_FULL_API = ("ATen/", "c10/", "caffe2/", "pybind11/", "jitops/")
_STABLE_SET = (
    "torch/csrc/stable/",
    "torch/headeronly/",
    "torch/csrc/inductor/aoti_torch/c/",
    "torch/csrc/inductor/aoti_torch/generated/",
)
_ERROR_MARK = (
    "should not be included when either TORCH_STABLE_ONLY or TORCH_TARGET_VERSION is defined"
)
SHIM_LIBRARY = "torch_cpu"  # holds the stable C shim (aoti_torch_*, torch_*)
DEPFILE = "deps.d"  # the one-command build's dependency file, in its build dir


def is_stable(texts: Sequence[str]) -> bool:
    """Whether sources register through torch's stable ABI (``STABLE_TORCH_LIBRARY*``)."""
    return any(_STABLE.search(t) for t in texts)


def wanted(func: str, abi: object, texts: Sequence[str] | None) -> bool:
    """Whether a load takes the stable path: ``abi="stable"``, or ``abi=None`` and the sources say so."""
    if abi is not None and abi not in ABIS:
        raise ArgumentError(
            f"{func}: abi={checks.shown(abi)} is not an ABI jitops builds for. Fix: abi='stable' "
            "(torch's stable C ABI: torch/csrc/stable), or leave it out"
        )
    return abi == "stable" or (abi is None and texts is not None and is_stable(texts))


def target_of(flags: Sequence[str], torch_version: str) -> tuple[str, tuple[int, int]]:
    """The target flag and (major, minor): the user's ``-DTORCH_TARGET_VERSION``, else the oldest
    torch jitops supports (never above the running one), so an entry built now serves every later
    torch. ``flags`` are the words the compiler gets (``-D NAME`` as two words counts as
    ``-DNAME``); any other word naming the ABI's macros (``-U``, two values) is refused: the
    compiler would build for a version the key and the load check do not know."""
    marks = _abi_macro_words(flags)
    if not marks:
        version = stable_target(torch_version)
        return version_flag(version), version
    chosen = flag_version(marks[0])
    for f in marks:
        if chosen is None or f != marks[0]:
            also = f" after {checks.shown(marks[0])}" if f != marks[0] else ""
            raise ArgumentError(
                f"extra_cflags holds {checks.shown(f)}{also}: the stable ABI's target is one -DTORCH_TARGET_VERSION=<number> word, as "
                "torch/headeronly/version.h encodes it, and its macros are never undefined. Fix: "
                "-DTORCH_TARGET_VERSION=0x020d000000000000 for torch 2.13 (major << 56 | minor << 48)"
            )
    assert chosen is not None  # the loop raised otherwise
    return marks[0], chosen


def _abi_macro_words(words: Sequence[str]) -> list[str]:
    """The compiler words that name the stable ABI's macros (define, undefine, in any spelling), less
    ``-DTORCH_STABLE_ONLY``: it only refuses torch's C++ API headers, as the target does too, and torch's
    own stable extensions pass it."""
    return [
        w
        for w in _joined_macros(words)
        if ("TORCH_TARGET_VERSION" in w or "TORCH_STABLE_ONLY" in w)
        and w != "-DTORCH_STABLE_ONLY"
        and not w.startswith("-DTORCH_STABLE_ONLY=")
    ]


def _joined_macros(words: Sequence[str]) -> list[str]:
    """``words`` with each ``-D NAME`` / ``-U NAME`` pair as the one word the compiler reads it
    as."""
    out: list[str] = []
    it = iter(words)
    for w in it:
        nxt = next(it, None) if w in ("-D", "-U") else None
        out.append(w + nxt if nxt is not None else w)
    return out


def check_torch(name: str, target: tuple[int, int], torch_version: str) -> None:
    """TargetError when the running torch is older than the stable ABI version the library targets."""
    here = parse(torch_version)
    if here is not None and here < target:
        raise TargetError(
            f"library {name!r} targets torch's stable ABI {target[0]}.{target[1]} (TORCH_TARGET_VERSION), but this "
            f"process runs torch {torch_version}, which lacks what that version added. Fix: upgrade torch to "
            f">= {target[0]}.{target[1]}, or build for this one with "
            f"extra_cflags=['{version_flag(here)}']"
        )


def full_api(header: str) -> bool:
    """Whether ``#include <header>`` is of torch's full C++ API, Python or pybind11 (outside the stable set)."""
    return (
        header.startswith(_FULL_API)
        or header == "Python.h"
        or (header.startswith("torch/") and not header.startswith(_STABLE_SET))
    )


def check_sources(name: str, files: Sequence[tuple[str, str]]) -> None:
    """Before compiling: each include is in the stable set, and the library defines ops."""
    for label, text in files:
        for n, line in enumerate(text.splitlines(), 1):
            m = _INCLUDE.match(line)
            if m and full_api(m.group(1)):
                raise KernelSourceError(
                    f"library {name!r} is built against torch's stable ABI, but {label}:{n} includes <{m.group(1)}>, "
                    "a header of torch's C++ API, which TORCH_TARGET_VERSION refuses. Fix: include only "
                    "torch/csrc/stable/{library,tensor,ops}.h and torch/headeronly/... (torch::stable::Tensor, "
                    "torch::stable::empty_like, STD_TORCH_CHECK), or load it without abi='stable' and without "
                    "STABLE_TORCH_LIBRARY to build against the full C++ API"
                )
    if not any(_NAMESPACE.search(t) for _, t in files):
        raise KernelSourceError(
            f"library {name!r} is built against torch's stable ABI but defines no op. Fix: "
            'STABLE_TORCH_LIBRARY(JITOPS_NS, m) { m.def("my_op(Tensor x) -> Tensor"); } and '
            'STABLE_TORCH_LIBRARY_IMPL(JITOPS_NS, CPU, m) { m.impl("my_op", TORCH_BOX(&my_op)); }'
        )


def _torch_dirs() -> tuple[str, str]:
    import torch

    root = os.path.dirname(torch.__file__)
    return os.path.join(root, "include"), os.path.join(root, "lib")


def command(
    job: Any, out: Path, pch_words: Sequence[str] = (), stub: Path | None = None
) -> list[str]:
    """One compiler command: compile and link, torch's include root only, the C shim's library only (or its
    link stub: stable_fast), with the PCH's words when one is used. Each compile writes its dependency
    file and the linker its own (what the build read: store.inputs)."""
    return [
        job.cxx,
        "-shared",
        "-fPIC",
        *compile_words(job, pch_words),
        *map(str, job.sources),
        "-MD",
        "-MF",
        str(job.build_dir / DEPFILE),
        "-o",
        str(out),
        *link_words(job, out, stub),
    ]


def compile_words(job: Any, pch_words: Sequence[str] = (), namespace: bool = True) -> list[str]:
    """The flags of a compile: the library's, its namespace (``namespace``), its include dirs,
    torch's include root."""
    include, _ = _torch_dirs()
    marks = set(_abi_macro_words(job.cflags))
    # CXXFLAGS too: the spec's one target word, nothing else naming the ABI's macros
    if len(marks) != 1:
        raise ConfigError(
            f"library {job.library!r}: the compiler flags name the stable ABI's macros as "
            f"{sorted(marks)}; only the library's own -DTORCH_TARGET_VERSION (and -DTORCH_STABLE_ONLY) "
            "may. Fix: remove the "
            "others from CXXFLAGS / CFLAGS, and give a target through extra_cflags"
        )
    dirs = [w for d in job.include_dirs for w in ("-I", str(d))]
    return [
        *job.cflags,
        *([f"-DJITOPS_NS={job.namespace}"] if namespace else []),
        *dirs,
        "-isystem",
        include,
        *pch_words,
    ]


def link_words(job: Any, out: Path, stub: Path | None) -> list[str]:
    """The link's flags after its inputs: the library's, then the C shim's library (or its stub)."""
    _, lib = _torch_dirs()
    shim = (
        ["-Wl,--no-as-needed", str(stub), "-Wl,--as-needed"]
        if stub is not None
        else [f"-L{lib}", "-Wl,--as-needed", f"-l{SHIM_LIBRARY}"]
    )
    depfile = job.build_dir / LINK_DEPFILE.format(out=out.name)
    return [*job.ldflags, *shim, *cuda_link_words(job, lib), f"-Wl,--dependency-file={depfile}"]


def cuda_link_words(job: Any, torch_lib: str) -> list[str]:
    """A CUDA build's libraries after the shim: the toolkit's cudart (what nvcc's launch code
    calls), and torch's CUDA library only as needed (the shim's ``USE_CUDA`` functions live there; a
    kernel calling none of them does not depend on it). Nothing for a CPU build."""
    if job.device != "cuda" or not job.nvcc:
        return []
    from .ninja import cuda_lib_dir

    toolkit = os.path.dirname(os.path.dirname(str(job.nvcc)))
    words = [f"-L{cuda_lib_dir(toolkit)}", "-lcudart"]
    if os.path.exists(os.path.join(torch_lib, "libtorch_cuda.so")):
        words += [f"-L{torch_lib}", "-ltorch_cuda"]
    return words


def commands(
    job: Any, out: Path, pch_words: Sequence[str] = (), stub: Path | None = None
) -> list[list[str]]:
    """The build as commands, none taken from the object cache: one (compile and link) for one C++
    source; else one compile per source (nvcc for a ``.cu``), each with its own dependency file (one
    command would keep only the last source's), then the link."""
    if len(job.sources) <= 1 and job.device != "cuda":
        return [command(job, out, pch_words, stub)]
    from .ninja import _Aliases

    alias = _Aliases(job.build_dir)  # one per build: each alias is made once
    objs = objects(job)
    compiles = [compile_command(job, s, o, pch_words, alias)[0] for s, o in zip(job.sources, objs)]
    return [*compiles, link_command(job, objs, out, stub)]


def objects(job: Any) -> list[Path]:
    """The object of each source, in the build dir (numbered: two sources may share a stem)."""
    return [job.build_dir / f"{i}-{Path(s).stem}.o" for i, s in enumerate(job.sources)]


def compile_command(
    job: Any, source: Path, obj: Path, pch_words: Sequence[str], alias: Any
) -> tuple[list[str], list[str] | None]:
    """One source's compile, and the words its object's key covers (None: a ``.cu``, never cached:
    nvcc's command names aliases in the build dir). Only a file that spells ``JITOPS_NS`` (or whose
    library folder has a header that does: tubuild's rule) gets ``-DJITOPS_NS``: the namespace is
    the key's, so any edit changes it, and the other files' objects must not depend on it to be
    reused."""
    if job.device == "cuda" and str(source).endswith(".cu"):
        return nvcc_command(job, source, obj, alias), None
    from .tubuild import names_namespace

    text = Path(source).read_text(errors="replace")
    words = compile_words(job, namespace=names_namespace(job, text, " ".join(job.cflags)))
    cmd = [job.cxx, "-fPIC", *words, *pch_words, "-c", str(source)]
    # torch's version too, as the stable PCH's key: a stable key holds only the target version, and
    # torch's headers (a pinned folder) are not in the object's record of what it read
    keyed = ["stable", f"torch {_torch_id()}", job.cxx, "-fPIC", *words]
    return [*cmd, "-MD", "-MF", f"{obj}.d", "-o", str(obj)], keyed


def link_command(job: Any, objs: Sequence[Path], out: Path, stub: Path | None) -> list[str]:
    """The link of a several-file library: its objects, the shim's library (or its stub)."""
    return [
        job.cxx,
        "-shared",
        "-fPIC",
        *map(str, objs),
        "-o",
        str(out),
        *link_words(job, out, stub),
    ]


def nvcc_command(job: Any, source: Path, obj: Path, alias: Any) -> list[str]:
    """One ``.cu`` compile: the plan's CUDA flags (the target's -gencode words,
    key.STABLE_NVCC_FLAGS, the user's), the library's macros (its -DTORCH_TARGET_VERSION among
    them), its namespace and include dirs, torch's include root. nvcc hands paths to ``sh`` in
    double quotes, so a folder or file whose path ``sh`` would act on is reached through a
    plain-named alias in the build dir (as the ninja builds do)."""
    from ..key import check_nvcc_words
    from .ninja import sh_plain

    include, _ = _torch_dirs()
    macros = [w for w in _joined_macros(job.cflags) if w.startswith(("-D", "-U"))]
    # nvcc hands -D values to sh in double quotes: the check the CUDA flags pass (key.build_flags)
    check_nvcc_words(tuple(macros), f"library {job.library!r}'s C++ flags (nvcc gets its macros)")
    dirs = [w for d in job.include_dirs for w in ("-I", alias.dir(str(d)))]
    # the host compiler: CC as torch's loader takes it (CC is in CUDA keys), else the keyed C++ one
    ccbin = job.env.get("CC") or job.cxx
    if not sh_plain(ccbin):
        raise ConfigError(
            f"library {job.library!r}: nvcc would run the host compiler {checks.shown(ccbin)} "
            "through sh, which would act on characters in its path. Fix: set CC (or CXX) to a "
            "compiler whose path holds none of them (a symlink with a plain name)"
        )
    return [
        str(job.nvcc),
        "-ccbin",
        ccbin,
        *job.cuda_cflags,
        *macros,
        f"-DJITOPS_NS={job.namespace}",
        *dirs,
        "-isystem",
        alias.dir(include),
        "-c",
        alias.file(str(source)),
        "-MD",
        "-MF",
        f"{obj}.d",
        "-o",
        str(obj),
    ]


def build(
    job: Any, run: Callable[..., tuple[int, str]], on_line: Callable[[str], None] | None = None
) -> tuple[int, str, Path, dict[str, Any]]:
    """The builder of stable plans (``runner.BUILDERS["stable"]``, a ``job.BuildJob``): one compiler
    run for one C++ file, a compile per file (cached objects reused, in parallel) and the link for
    several; no ninja; with the shared PCH of its header prefix and the shim's link stub when the
    job has a cache (stable_fast). A failure while using the PCH runs once more without it. Also
    returns its timings."""
    import time

    from . import pch_bg, stable_fast
    from .tubuild import PCH_ERROR  # the compiler's words for a PCH it refused (gcc and clang)

    if not job.sources:
        raise TargetError(
            f"library {job.library!r} has only CUDA sources, so nothing of it builds for "
            f"{job.target}. Fix: device='cuda' (a CUDA build of torch, and nvcc), or add its CPU "
            "kernels in a .cpp source"
        )
    out = job.build_dir / f"{job.library}.so"
    include, lib = _torch_dirs()
    words: list[str]
    later: dict[str, dict[str, Any]]
    pch_read: dict[str, str]
    if job.device == "cuda":  # no shared PCH: nvcc takes none, and its files are few
        words, state, later, pch_read = [], "off (cuda)", {}, {}
    else:
        words, state, later, pch_read = stable_fast.use_pch(job, include, _torch_id())
    stub = stable_fast.link_stub(job, os.path.join(lib, f"lib{SHIM_LIBRARY}.so"), run)
    start = time.monotonic()
    # the CPUs' contention from here decides whether the PCH it lacks starts after it
    since = pch_bg.cpu_waited() if later else None
    if len(job.sources) > 1 or job.device == "cuda":
        return _build_files(
            job, run, on_line, out, (words, state, later, pch_read), stub, (start, since)
        )

    def run_all(cmds: list[list[str]]) -> tuple[int, str, str]:
        """Each command in turn until one fails: (its exit code, the output, the commands run)."""
        rc, logs, ran = 0, [], []
        for cmd in cmds:
            ran.append(" ".join(cmd))
            rc, text = run(cmd, cwd=job.build_dir, env=job.env, on_line=on_line)
            logs.append(text)
            if rc != 0:
                break
        return rc, "".join(logs), "\n".join(ran)

    rc, log, cmd = run_all([command(job, out, words, stub)])
    # never for the user's own errors: those show at once
    if rc != 0 and words and PCH_ERROR.search(log):
        state = "rejected"
        rc, log, cmd = run_all([command(job, out, (), stub)])
    elif words and "-Winvalid-pch" in log:
        state = "rejected"
    # a flag forbade undefined symbols after all
    if rc != 0 and stub is not None and "undefined reference" in log:
        stub = None
        rc, log, cmd = run_all([command(job, out, (), None)])
    seconds = time.monotonic() - start
    if rc == 0 and later:
        state = stable_fast.after(job, later, since)
    timings = {
        "files": {
            os.path.basename(str(s)): {
                "object": "compiled",
                "pch": state,
                "seconds": round(seconds, 3),
            }
            for s in job.sources
        },
        "link_seconds": 0.0,
        "link": "stub" if stub is not None else SHIM_LIBRARY,
        "at": time.time(),
    }
    if rc == 0:
        timings["inputs"] = read_by(job, out, pch_read if state == "hit" else {})
    return rc, cmd + "\n" + log, out, timings


def _build_files(
    job: Any,
    run: Callable[..., tuple[int, str]],
    on_line: Callable[[str], None] | None,
    out: Path,
    pch: tuple[list[str], str, dict[str, dict[str, Any]], dict[str, str]],
    stub: Path | None,
    start_since: tuple[float, Sample | None],
) -> tuple[int, str, Path, dict[str, Any]]:
    """A several-file (or CUDA) build: each C++ object from the object cache (store.objcache, under
    tubuild's keys: identity, the compile's words, the source's digest; its record of every file the
    compile read re-hashed on lookup) or compiled, up to ``job.jobs`` at once; then the link. A
    failed compile stops the build: nothing new starts, those running finish, and the first failing
    file (in source order) sets the exit code. A failure while using the PCH compiles again without
    it; a link the stub cannot satisfy links again against the real library (the objects as they
    are)."""
    import time

    from . import stable_fast
    from .ninja import _Aliases
    from .tubuild import PCH_ERROR

    words, state, later, pch_read = pch
    start, since = start_since
    objs = objects(job)
    alias = _Aliases(job.build_dir)
    files: dict[str, dict[str, Any]] = {}
    read: dict[str, str] = {}  # what the cached objects' compiles read
    rc, log, cmd = _compile_files(
        job, run, on_line, objs, (words, pch_read), alias, files, read, start
    )
    if rc != 0 and words and PCH_ERROR.search(log):  # never for the user's own errors
        state = "rejected"
        rc, log, cmd = _compile_files(job, run, on_line, objs, ([], {}), alias, files, read, start)
    elif words and "-Winvalid-pch" in log:
        state = "rejected"
    for i in files.values():
        i["pch"] = state if i["object"] == "compiled" else i["pch"]
    link_seconds = 0.0
    if rc == 0:
        link = link_command(job, objs, out, stub)
        began = time.monotonic()
        rc, text = run(link, cwd=job.build_dir, env=job.env, on_line=on_line)
        if rc != 0 and stub is not None and "undefined reference" in text:
            stub = None  # a flag forbade undefined symbols after all
            link = link_command(job, objs, out, None)
            rc, text = run(link, cwd=job.build_dir, env=job.env, on_line=on_line)
        link_seconds = time.monotonic() - began
        log, cmd = log + text, cmd + "\n" + " ".join(link)
    if rc == 0 and later:
        stable_fast.after(job, later, since, files.values())
    timings: dict[str, Any] = {
        "files": files,
        "link_seconds": round(link_seconds, 3),
        "link": "stub" if stub is not None else SHIM_LIBRARY,
        "at": time.time(),
    }
    if rc == 0:
        timings["inputs"] = {**read_by(job, out, pch_read if state == "hit" else {}), **read}
    return rc, cmd + "\n" + log, out, timings


def _compile_files(
    job: Any,
    run: Callable[..., tuple[int, str]],
    on_line: Callable[[str], None] | None,
    objs: list[Path],
    pch: tuple[Sequence[str], dict[str, str]],
    alias: Any,
    files: dict[str, dict[str, Any]],
    read: dict[str, str],
    start: float,
) -> tuple[int, str, str]:
    """Each object not in the cache compiled, up to ``job.jobs`` at once: (the first failure's exit
    code in source order or 0, every finished compile's output in source order, the commands run).
    ``files`` gets each file's timing (``started`` / ``ended``: seconds after the build began),
    ``read`` what the cached ones' compiles read. ``pch``: the PCH's words and what it read (each
    object using it records that too: the compile's own dependency file does not list it). Objects
    that compiled are cached once all have finished (a run that finds the sources changed raises
    first: nothing of it is cached)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from ..base import fsutil
    from ..store import inputs, objcache

    cache, root = job.cache, job.root or job.build_dir
    pch_words, pch_read = pch
    todo: list[tuple[str, Path, list[str], str | None]] = []  # label, object, command, key
    for source, obj in zip(job.sources, objs):
        label = os.path.basename(str(source))
        argv, keyed = compile_command(job, source, obj, pch_words, alias)
        key = None
        if cache is not None and keyed is not None:
            key = objcache.tu_key(job.identity, " ".join(keyed), fsutil.sha256_file(source), root)
            got = objcache.lookup(cache, key, root, obj)
            if got is not None:
                read.update(got)
                files[label] = {"object": "cached", "pch": "-", "seconds": 0.0}
                continue
        todo.append((label, obj, argv, key))
    stop, shown = threading.Event(), threading.Lock()

    def one(argv: list[str]) -> tuple[int, str, float, float] | None:
        if stop.is_set():  # a compile failed: start no more
            return None
        began = time.monotonic()
        rc, text = run(argv, cwd=job.build_dir, env=job.env, on_line=None)
        ended = time.monotonic()
        if rc != 0:
            stop.set()
        if on_line is not None:
            with shown:  # each file's output whole, as it finishes (ninja's way)
                for line in text.splitlines(keepends=True):
                    on_line(line)
        return rc, text, began, ended

    with ThreadPoolExecutor(max_workers=max(1, min(job.jobs, len(todo) or 1))) as pool:
        futures = [pool.submit(one, argv) for _, _, argv, _ in todo]
        try:
            results = [f.result() for f in futures]
        except BaseException:  # Ctrl-C, or a run that found the sources changed: no more starts
            stop.set()
            for f in futures:
                f.cancel()
            raise
    rc, logs, ran = 0, [], []
    pinned = (*job.pinned, str(job.build_dir), *([str(cache.pch)] if cache is not None else []))
    for (label, obj, argv, key), result in zip(todo, results):
        if result is None:
            continue
        code, text, began, ended = result
        ran.append(" ".join(argv))
        logs.append(text)
        rc = rc or code
        files[label] = {
            "object": "compiled",
            "pch": "",
            "seconds": round(ended - began, 3),
            "started": round(began - start, 3),
            "ended": round(ended - start, 3),
        }
        if code == 0 and key is not None:
            deps = inputs.record(inputs.read_depfile(Path(f"{obj}.d")), root, pinned, job.build_dir)
            objcache.store(cache, key, obj, {**deps, **pch_read})
    order = {os.path.basename(str(s)): n for n, s in enumerate(job.sources)}
    ordered = sorted(files.items(), key=lambda kv: order.get(kv[0], 0))  # as the sources are listed
    files.clear()
    files.update(ordered)
    return rc, "".join(logs), "\n".join(ran)


def read_by(job: Any, out: Path, pch_read: dict[str, str]) -> dict[str, str]:
    """What the build read (store.inputs): its compiles' dependency files, the PCH's record, the link's."""
    from ..store import inputs

    pinned = (*job.pinned, str(job.build_dir))
    files = [f for d in sorted(job.build_dir.glob("*.d")) for f in inputs.read_depfile(d)]
    return {**inputs.record(files, job.root, pinned, job.build_dir), **pch_read}


def before_build(plan: Any) -> None:
    """The miss path's first step for a stable plan (``entry.before_first_build``): the link stub of the C shim's
    library begins (stable_fast.start_stub) beside the imports, lock and staging that come before the compile."""
    from . import stable_fast
    from ..key import SCRUBBED_ENV_VARS

    # the build's, as publish.build_env
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV_VARS}
    real = os.path.join(_torch_dirs()[1], f"lib{SHIM_LIBRARY}.so")
    # the job's cxx, as publish names it
    stable_fast.start_stub(plan.compiler.run if plan.compiler else "c++", real, env)


def _torch_id() -> str:
    import torch

    return f"{torch.__version__} {getattr(torch.version, 'git_version', '')}"


def translate(name: str, e: BuildError) -> KernelSourceError | None:
    """torch's own #error for a C++ API header reached through another header, as the named error."""
    if _ERROR_MARK not in e.log:
        return None
    chain = [
        ln.strip()
        for ln in e.log.splitlines()
        if ln.lstrip().startswith(("In file included from", "from "))
    ]
    where = (
        chain[-1].removeprefix("In file included from ").removeprefix("from ").rstrip(",:")
        if chain
        else "a header"
    )
    return KernelSourceError(
        f"library {name!r} is built against torch's stable ABI, but a header of torch's C++ API is included "
        f"(through {where}), which TORCH_TARGET_VERSION refuses. Fix: include only torch/csrc/stable/... and "
        f"torch/headeronly/... headers (full log: {e.log_path})"
    )


def refuse_args(name: str, *, schemas: object = None) -> None:
    """ArgumentError for an argument the stable path would otherwise drop without a word:
    ``schemas=`` (the sources' m.def strings hold them)."""
    if schemas:
        raise ArgumentError(
            f"library {name!r} is built against torch's stable ABI, which takes no schemas= "
            "(its schemas are the sources' m.def strings). Fix: drop schemas=, or load it without "
            "abi='stable' and without STABLE_TORCH_LIBRARY"
        )


def check_cuda_flags(name: str, words: Sequence[str], target: str) -> None:
    """ArgumentError for a CUDA flag naming the stable ABI's macros other than the library's own
    target word (``target``, from extra_cflags): nvcc would build for a version the key and the load
    check do not know."""
    for w in _abi_macro_words(words):
        if w != target:
            raise ArgumentError(
                f"library {name!r}: extra_cuda_cflags holds {checks.shown(w)}, but the library "
                f"targets the stable ABI through {checks.shown(target)} (extra_cflags, or the "
                "default), which nvcc gets too. Fix: give -DTORCH_TARGET_VERSION=<number> in "
                "extra_cflags only (or the same word in both)"
            )


def spec(
    name: str,
    root: Path,
    sources: Sequence[str],
    *,
    extra_cflags: StrOrSeq | None,
    extra_ldflags: StrOrSeq | None,
    extra_include_paths: StrOrSeq | None,
    origin: str,
    extra_cuda_cflags: StrOrSeq | None = None,
) -> OpSpec:
    """The checked spec of a stable-ABI library whose sources are ``root/sources`` (read here,
    checked before any compile; ``.cu`` files are its CUDA sources); TargetError if the running
    torch is older than its target."""
    import torch

    texts = [(str(root / s), (root / s).read_text(errors="replace")) for s in sources]
    check_sources(name, texts)
    cflags = _as_list(extra_cflags, "extra_cflags")
    flag, target = target_of(flag_words(tuple(cflags), "extra_cflags"), torch.__version__)
    check_torch(name, target, torch.__version__)
    cuda_cflags = _as_list(extra_cuda_cflags, "extra_cuda_cflags")
    check_cuda_flags(name, flag_words(tuple(cuda_cflags), "extra_cuda_cflags"), flag)
    cflags = [STABLE_ABI_FLAG, flag, *(f for f in cflags if f.strip() != flag)]
    options = BuildOptions.of(
        extra_cflags=cflags,
        extra_cuda_cflags=cuda_cflags,
        extra_ldflags=extra_ldflags,
        extra_include_paths=extra_include_paths,
    )
    # no exports: the loader lists what the built library registered (an op under an #ifdef the
    # build left out is not there)
    return _spec(name, root, sources, options, origin=origin)


def fixed_namespaces(texts: Sequence[str], cflags: Sequence[str]) -> list[str]:
    """The namespaces the sources define ops in (``STABLE_TORCH_LIBRARY`` / ``_FRAGMENT``) other than the build's
    own (``JITOPS_NS``); a name the flags define (``-DLIB_NS=myns``) is read as its value."""
    macros = dict(
        w[2:].split("=", 1)
        for w in flag_words(tuple(cflags), "extra_cflags")
        if w.startswith("-D") and "=" in w
    )
    found = {macros.get(m.group(1), m.group(1)) for t in texts for m in _NAMESPACE.finditer(t)}
    return sorted(found - {"JITOPS_NS"})


def texts_of(sources: StrOrSeq) -> list[str] | None:
    """The text of each source file (None when one cannot be read: the loader names the problem)."""
    try:
        return [Path(p).read_text(errors="replace") for p in _as_list(sources, "sources")]
    except (OSError, TypeError):
        return None
