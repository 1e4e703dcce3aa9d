"""Which C++ compilers jitops builds with, and the flags each needs.

GCC and clang are supported. Two facts differ between them:

- OpenMP. torch runs ``at::parallel_for`` on GNU OpenMP (libgomp). With GCC,
  ``-fopenmp`` links libgomp. clang's ``-fopenmp`` links LLVM's libomp, a second
  runtime that is usually not even installed (``cannot find -lomp``), and clang
  has no ``omp.h`` of its own without it. For clang, jitops asks for
  ``-fopenmp=libgomp`` and finds ``omp.h`` in the GCC installation clang
  already uses (``clang++ -print-file-name=libgomp.so``, remembered like the
  compiler's identity, so the warm path runs nothing).
- The driver. ``clang++`` is a symlink to LLVM's ``clang``; run under the
  resolved name it is the C driver. The key holds the canonical path and the
  driver name; builds run the command the user named (``Tool.run``).

Compilers known to be too old for torch's headers are refused with a
ToolchainError before any build.

GCC's garbage collector starts at a heap sized for small machines and runs
many times over torch's headers; with room to spare it is given a larger
start (``gc_words``). That changes how fast a file compiles, never the object
it makes, so those words are in no key.

Imports: errors, patterns, target, toolchain. ``compiler_ingredient`` (the compiler's part of a key) lives here, with
the identity it reads; key imports it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import toolchain
from ..errors import ToolchainError
from . import OPENMP_FLAGS, System
from ..base.patterns import lazy

# torch's headers need C++17 and compile with -std=c++17 or later: older compilers fail deep inside
# them.
MINIMUM = {"gcc": (9, 0), "clang": (10, 0)}


def compiler_ingredient(tool: toolchain.Tool) -> dict[str, Any]:
    """The compiler's part of the key: canonical binary, identity, driver name (``clang++`` and
    ``clang`` are one binary, two drivers), its OpenMP flags (see ``openmp_flags``) and the digests
    of what its driver really runs (``toolchain.programs``)."""
    return {
        "path": tool.path,
        "version": tool.version,
        "driver": os.path.basename(tool.run),
        "openmp": list(tool.openmp),
        "programs": dict(tool.programs),
    }


_CLANG = lazy(r"clang version (\d+)\.(\d+)(?:\.(\d+))?", needs="clang version")
_GCC = lazy(
    r"^\S*(?:g\+\+|gcc|c\+\+|cc)\S* \(.*\) (\d+)\.(\d+)(?:\.(\d+))?", needs=("g++", "c++", "cc")
)


# a pure function, asked twice per plan (check_supported, openmp_flags)
@functools.lru_cache(maxsize=16)
def kind_of(version: str) -> tuple[str, tuple[int, ...]]:
    """("gcc" | "clang" | "unknown", version numbers) from a ``--version`` line."""
    m = _CLANG.search(version)
    if m:
        return "clang", tuple(int(g) for g in m.groups() if g is not None)
    # "g++ (Debian 12.2.0-14) 12.2.0", "c++ (GCC) 11.4.1 20231218", "x86_64-linux-gnu-g++-12 (Debian
    # ...) 12.2.0"
    m = _GCC.match(version)
    if m:
        return "gcc", tuple(int(g) for g in m.groups() if g is not None)
    return "unknown", ()


_TRIPLE = lazy(r"^[A-Za-z0-9_]+(-[A-Za-z0-9_.]+)+$")  # what `-dumpmachine` prints: x86_64-linux-gnu


# GCC collects garbage first at this heap size (KiB), then each time the heap doubled
GC_HEAP_KIB = 1 << 20


def gc_words(version: str, jobs: int, ram: int | None = None) -> tuple[str, ...]:
    """GCC's garbage-collector settings for a build of ``jobs`` parallel compiles: a first
    collection at 1 GiB of heap, where a quarter of the machine's memory (``ram`` bytes) per compile
    holds it; else, and for other compilers, none (their defaults)."""
    if kind_of(version)[0] != "gcc":
        return ()
    if ram is None:
        try:
            ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return ()
    if ram // (4 * max(1, jobs)) < GC_HEAP_KIB * 1024:
        return ()
    return ("--param", "ggc-min-expand=100", "--param", f"ggc-min-heapsize={GC_HEAP_KIB}")


def own_dirs(tool: toolchain.Tool, cache_dir: Path | None) -> list[str]:
    """The compiler's own folder, whose files (intrinsics headers, start files) its identity pins: GCC's
    ``<libdir>/gcc/<triple>/<version>`` (where ``libgcc.a`` is), clang's resource folder. Asked once,
    remembered as the identity is; [] when the compiler does not say."""
    kind = kind_of(tool.version)[0]
    if kind == "gcc":
        libgcc = toolchain.ask(tool.path, ("-print-libgcc-file-name",), cache_dir)
        return [os.path.dirname(libgcc)] if os.path.isabs(libgcc) else []
    if kind == "clang":
        resource = toolchain.ask(tool.path, ("-print-resource-dir",), cache_dir)
        return [resource] if os.path.isabs(resource) else []
    return []


def check_supported(
    tool: toolchain.Tool, op: str, cache_dir: Path | None = None, *, record: bool = True
) -> None:
    """ToolchainError for a compiler known not to build torch extensions, or a program that is not a compiler
    (``CXX=/bin/true``): one that neither GCC nor clang identifies must answer ``-dumpmachine`` with a target
    triple (asked once and remembered like the identity)."""
    kind, numbers = kind_of(tool.version)
    if kind == "unknown" and not _TRIPLE.match(
        toolchain.ask(tool.run, ("-dumpmachine",), cache_dir, record=record)
    ):
        raise ToolchainError(
            f"cannot build op {op!r}: {tool.run} ({tool.version[:120]!r}) does not behave like a C++ compiler "
            f"(`{tool.run} -dumpmachine` named no target). Fix: set CXX to a C++ compiler such as g++ or clang++, "
            "or unset CXX to use the system c++"
        )
    floor = MINIMUM.get(kind)
    if floor is not None and numbers and numbers[:2] < floor:
        have = ".".join(map(str, numbers))
        raise ToolchainError(
            f"cannot build op {op!r}: {tool.run} is {kind} {have} ({tool.version}); torch's headers need "
            f"{kind} >= {'.'.join(map(str, floor))} (C++17). Fix: install a newer compiler and set CXX to it, "
            "or unset CXX to use the system c++"
        )


def openmp_flags(
    tool: toolchain.Tool, cache_dir: Path | None, *, record: bool = True
) -> tuple[str, ...]:
    """Flags that build with torch's OpenMP runtime (GNU libgomp) for this compiler."""
    kind, _ = kind_of(tool.version)
    if kind != "clang":
        return OPENMP_FLAGS
    answer = toolchain.ask(tool.run, ("-print-file-name=libgomp.so",), cache_dir, record=record)
    include = (
        os.path.join(os.path.dirname(os.path.normpath(answer)), "include")
        if os.path.isabs(answer)
        else ""
    )
    if not include or not os.path.isfile(os.path.join(include, "omp.h")):
        raise ToolchainError(
            f"cannot build with {tool.run} ({tool.version}): torch runs its kernels on GNU OpenMP (libgomp), and "
            f"clang finds no GCC installation with libgomp.so and omp.h (it answered {answer!r}). "
            "Fix: install GCC's C++ compiler beside clang (e.g. `apt-get install g++`), or unset CXX"
        )
    # --idirafter: GCC's include dir holds only omp.h that clang lacks; clang's own intrinsics
    #  headers come first.
    return ("-fopenmp=libgomp", "-idirafter", include)


def cxx(system: System, op: str, cache_dir: Path | None, *, record: bool = True) -> toolchain.Tool:
    """The C++ compiler for ``op``: found, identified, checked, with its OpenMP flags."""
    tool = toolchain.tool("cxx", toolchain.find_cxx(system, op), cache_dir, record=record)
    check_supported(tool, op, cache_dir, record=record)
    omp = openmp_flags(tool, cache_dir, record=record) if system.openmp else ()
    return dataclasses.replace(tool, openmp=omp)


def ingredient(tool: toolchain.Tool) -> dict[str, Any]:
    """The compiler's part of the key: canonical binary, identity, driver name and OpenMP flags."""
    return compiler_ingredient(tool)


def build_flags(flags: Sequence[str], compiler: dict[str, Any] | None) -> tuple[str, ...]:
    """``flags`` with the generic OpenMP flag replaced by the compiler's own (from its ingredient)."""
    omp = (compiler or {}).get("openmp") or []
    if not omp or list(omp) == list(OPENMP_FLAGS):
        return tuple(flags)
    out: list[str] = []
    for f in flags:
        out.extend(omp if f in OPENMP_FLAGS else (f,))
    return tuple(out)
