"""User build arguments, checked once, as one frozen value; and the OpSpec they make.

``load``, ``load_inline`` and ``register_kernel_dir`` keep cpp_extension-style
keywords (``extra_cflags``, ...); each turns them into a :class:`BuildOptions`
right away, and only that value travels on.

Imports: errors, patterns, record, spec, checks (what a flag word may hold; ``shell_words``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..base.record import record
from ..errors import ArgumentError, KernelSourceError
from .checks import LINE_BREAK, NVCC_UNSAFE, shell_words
from . import OpSpec
from ..base.patterns import chars

_NINJA_UNSAFE = chars("|\n\r")  # no escape for these in a ninja path (ninja.check_expressible)
MAX_TREE_FILES = 2000  # a source folder bigger than this is not a kernel folder

StrOrSeq = str | Sequence[str]


def _as_list(value: StrOrSeq | None, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    items = list(value)
    if not all(isinstance(v, str) for v in items):
        raise TypeError(f"{what} must be a string or a sequence of strings, got {value!r}")
    return items


def _check_tree_size(root: Path, name: str) -> None:
    count = 0
    for _dirpath, _dirnames, filenames in os.walk(root):
        count += len(filenames)
        if count > MAX_TREE_FILES:
            raise KernelSourceError(
                f"library {name!r}: the folder {root} holding its sources has more than {MAX_TREE_FILES} files "
                "under it, and the cache key covers every source and header there. Fix: put the kernel sources "
                "(and their headers) in a folder of their own"
            )


@record
class BuildOptions:
    """The build arguments ``load``, ``load_inline`` and ``register_kernel_dir`` share, checked once."""

    cflags: tuple[str, ...] = ()
    cuda_cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    include_paths: tuple[str, ...] = ()
    schemas: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        *,
        extra_cflags: StrOrSeq | None = None,
        extra_cuda_cflags: StrOrSeq | None = None,
        extra_ldflags: StrOrSeq | None = None,
        extra_include_paths: StrOrSeq | None = None,
        schemas: StrOrSeq | None = None,
    ) -> BuildOptions:
        flags = {
            arg: tuple(_as_list(value, arg))
            for arg, value in (
                ("extra_cflags", extra_cflags),
                ("extra_cuda_cflags", extra_cuda_cflags),
                ("extra_ldflags", extra_ldflags),
            )
        }
        for arg, items in flags.items():
            for item in items:
                _check_flag(arg, item)
        return cls(
            flags["extra_cflags"],
            flags["extra_cuda_cflags"],
            flags["extra_ldflags"],
            tuple(_as_list(extra_include_paths, "extra_include_paths")),
            tuple(_as_list(schemas, "schemas")),
        )


def _check_flag(arg: str, item: str) -> None:
    """ArgumentError for a flag string the key (which splits it into words as a shell would) cannot take.

    Items stay as given: ``key.build_flags`` splits them, once."""
    try:
        words = shell_words(item)
    except ValueError as e:
        raise ArgumentError(
            f"{arg} item {item[:200]!r} cannot be split into words as a shell would ({str(e).lower()}). Fix: balance "
            "its quotes: '-DNAME=\"a b\"' is one flag (NAME is a b), '-O0 -Wall' two"
        ) from None
    for w in words:
        if LINE_BREAK.search(w):
            raise ArgumentError(
                f"{arg} item {item[:200]!r} holds a line break inside quotes, which no compiler flag "
                "needs and a build file cannot carry. Fix: remove it"
            )
        if arg == "extra_cuda_cflags" and NVCC_UNSAFE.search(w):
            raise ArgumentError(
                f"extra_cuda_cflags holds the flag {w[:200]!r}: nvcc passes its flags on to a shell (-D values in "
                "double quotes, -Xcompiler values bare), where $, `, ;, &, |, <, > or a line break would act. "
                "Fix: leave those characters out of CUDA flags (define such values in a header instead)"
            )


def _spec(
    name: str,
    root: Path,
    sources: Sequence[str],
    options: BuildOptions,
    *,
    exports: Sequence[str] = (),
    origin: str,
) -> OpSpec:
    # As torch: a path that is not a folder is passed on (the compiler ignores it) and holds nothing
    # the key needs; one created later changes the key through the headers it then holds
    # (key.source_files).
    includes = [Path(os.path.abspath(p)) for p in options.include_paths]
    for path in (*(root / s for s in sources), *includes):
        if _NINJA_UNSAFE.search(str(path)):
            raise KernelSourceError(
                f"library {name!r}: the path {str(path)!r} holds {'|' if '|' in str(path) else 'a line break'}, "
                "which a ninja build file cannot express, so jitops cannot build from it. "
                "Fix: rename that file or folder (or copy the sources to a folder whose path has neither)"
            )
    for inc in includes:
        if inc.is_dir():
            _check_tree_size(inc, name)
    return OpSpec(
        name=name,
        root=root,
        cpu_sources=tuple(s for s in sources if not s.endswith(".cu")),
        cuda_sources=tuple(s for s in sources if s.endswith(".cu")),
        schemas=options.schemas,
        exports=tuple(exports),
        cflags=options.cflags,
        cuda_cflags=options.cuda_cflags,
        ldflags=options.ldflags,
        include_dirs=tuple(includes),
        origin=origin,
    )
