"""User build arguments, checked once, as one frozen value; and the OpSpec they make.

``load``, ``load_inline`` and ``register_kernel_dir`` keep cpp_extension-style
keywords (``extra_cflags``, ...); each turns them into a :class:`BuildOptions`
right away, and only that value travels on.

Imports: errors, spec.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from .errors import KernelSourceError
from .spec import OpSpec

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


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """The build arguments ``load``, ``load_inline`` and ``register_kernel_dir`` share, checked once."""

    cflags: tuple[str, ...] = ()
    cuda_cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    include_paths: tuple[str, ...] = ()
    schemas: tuple[str, ...] = ()

    @classmethod
    def of(cls, *, extra_cflags: StrOrSeq | None = None, extra_cuda_cflags: StrOrSeq | None = None,
           extra_ldflags: StrOrSeq | None = None, extra_include_paths: StrOrSeq | None = None,
           schemas: StrOrSeq | None = None) -> BuildOptions:
        return cls(tuple(_as_list(extra_cflags, "extra_cflags")), tuple(_as_list(extra_cuda_cflags, "extra_cuda_cflags")),
                   tuple(_as_list(extra_ldflags, "extra_ldflags")),
                   tuple(_as_list(extra_include_paths, "extra_include_paths")), tuple(_as_list(schemas, "schemas")))


def _spec(name: str, root: Path, sources: Sequence[str], options: BuildOptions, *, exports: Sequence[str] = (),
          origin: str) -> OpSpec:
    # As torch: a path that is not a folder is passed on (the compiler ignores it) and holds nothing the key
    # needs; one created later changes the key through the headers it then holds (key.source_files).
    includes = [Path(os.path.abspath(p)) for p in options.include_paths]
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
