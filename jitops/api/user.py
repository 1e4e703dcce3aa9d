"""User kernels in jitops's own style: the cores of ``jitops.load`` / ``load_inline``, kernel folders.

The public ``jitops.load`` / ``load_inline`` (:mod:`jitops.dropin`) take torch's parameters and
send sources written in this style here; sources written for torch go to :mod:`jitops.cpp_ext_style`.

User C++ registers its ops with the macros of ``<jitops/op.h>``::

    #include <jitops/op.h>
    JITOPS_LIBRARY(m) { m.def("squared_relu(Tensor x) -> Tensor"); }
    JITOPS_LIBRARY_IMPL(CPU, m) { m.impl("squared_relu", &squared_relu); }

jitops supplies the namespace (one per cache key), so an edited library is
loaded next to the old one and old handles keep working. A user library goes
through the same loader path as the builtin ops: same cache, key, integrity
checks and lock. Its ops are found after loading, from the dispatcher's
registrations in its namespace, not by reading the C++.

Inline sources are written to a content-addressed folder under the cache
root, so the key covers their bytes and compiler errors point at real files
with the line numbers of the strings the user wrote.

Imports: checks, errors, fsutil, settings, spec, user_spec; loader, ops, registry, roots, stable and (a stable
library's fixed namespace) plan lazily (plan for annotations too).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..spec import checks
from ..base import fsutil
from ..errors import BuildError, CacheError, KernelSourceError
from ..base.settings import Settings
from ..spec import SOURCE_SUFFIXES, OpSpec, validate_name
from ..spec.user_spec import BuildOptions, StrOrSeq, _as_list, _check_tree_size, _spec

if TYPE_CHECKING:
    from ..loading.ops import Op
    from ..plan import LoadedLibrary, Plan

# (cache key, namespace) -> the object load() returned for that build
_memo: dict[tuple[str, str], UserLibrary] = {}
_memo_lock = threading.Lock()


class UserLibrary:
    """One build of a user kernel library; its ops are attributes (``lib.my_relu(x)``).

    ``ops`` maps each op name to its handle and ``library`` describes the
    build (namespace, key, cache entry, whether this process compiled it).
    An op whose name clashes with those two is reached through ``ops``.
    """

    def __init__(self, library: LoadedLibrary, ops: dict[str, Op]) -> None:
        self.__dict__.update(ops)
        self.ops = ops
        self.library = library

    def __repr__(self) -> str:
        lib = self.library
        return f"<jitops library {lib.spec.name} ({lib.target}, key {lib.key[:12]}): {', '.join(self.ops)}>"

    def __getattr__(self, name: str) -> Any:  # only called when normal lookup fails
        # copy/pickle probes, half-built objects
        if name.startswith("_") or name in (
            "ops",
            "library",
        ):
            raise AttributeError(name)
        raise AttributeError(
            f"library {self.library.spec.name!r} defines no op {name!r}; it defines: {', '.join(self.ops)}"
        )


def load_spec(
    spec: OpSpec,
    device: str | None = None,
    settings: Settings | None = None,
    *,
    plan: Plan | None = None,
    namespaces: Sequence[str] = (),
) -> UserLibrary:
    """Load (building if needed) a user library through the loader; the same object while unchanged.
    ``plan``: the caller's, made for these arguments; ``namespaces``: the fixed ones the sources define ops
    in, whose ops (as the library registered them) are handles too (``ns.op`` where a name repeats)."""
    from ..loading.loader import library_ops, load_library
    from ..loading.ops import op_from_library

    try:
        lib = load_library(spec, device, settings=settings, plan=plan)
    except BuildError as e:
        # The compiler's message is the story; jitops's own frames would only bury it.
        raise e.with_traceback(None) from None
    with _memo_lock:
        hit = _memo.get((lib.key, lib.namespace))
        if hit is not None:
            return hit
        ops = {n: op_from_library(lib, n) for n in lib.ops}
        for ns in namespaces:
            assert plan is not None  # a fixed namespace is loaded under its guard, with its plan
            # the library seen from that namespace: its handles name it
            view = dataclasses.replace(lib, namespace=ns, ops=library_ops(plan.cache, lib, ns))
            ops.update(
                {n if n not in ops else f"{ns}.{n}": op_from_library(view, n) for n in view.ops}
            )
        if not ops:
            raise KernelSourceError(
                f"library {spec.name!r} built and loaded, but defined no op in its namespace {lib.namespace}. "
                'Fix: #include <jitops/op.h> and define ops with JITOPS_LIBRARY(m) { m.def("my_op(Tensor x) -> Tensor"); } '
                "(not TORCH_LIBRARY with a fixed namespace), or pass schemas=[...]"
            )
        result = UserLibrary(lib, ops)
        _memo[(lib.key, lib.namespace)] = result
        return result


def _stable(
    spec: OpSpec, texts: Sequence[str], settings: Settings | None = None, device: str | None = None
) -> UserLibrary:
    """Load a stable-ABI library for ``device`` (None: CUDA where its ``.cu`` sources and a GPU are,
    else CPU, as other libraries); one that defines ops in a fixed namespace under the loader's
    guard (a different build of a namespace registered here is refused before building)."""
    from ..build import stable

    namespaces = stable.fixed_namespaces(texts, spec.cflags + spec.cuda_cflags)
    try:
        if not namespaces:
            return load_spec(spec, device, settings)
        from ..loading.loader import FIXED_LOCK, check_fixed, claim_fixed
        from ..plan import make_plan, runnable_here

        settings = Settings.from_env() if settings is None else settings
        with FIXED_LOCK:
            plan = runnable_here(make_plan(spec, device, None, settings=settings), None, settings)
            check_fixed(spec.name, plan.key, namespaces, "STABLE_TORCH_LIBRARY", STABLE_FIX)
            lib = load_spec(spec, device, settings, plan=plan, namespaces=namespaces)
            claim_fixed(namespaces, lib.library.key)
            return lib
    except BuildError as e:  # torch's #error for a C++ API header reached through a header: named
        raise (stable.translate(spec.name, e) or e) from None


# how a stable library edits without restarts (loader.check_fixed's message)
STABLE_FIX = (
    "register with STABLE_TORCH_LIBRARY(JITOPS_NS, m) / STABLE_TORCH_LIBRARY_IMPL(JITOPS_NS, CPU, m) "
    "(jitops gives each build its own namespace; its ops are then lib.my_op)"
)


def load(
    name: str,
    sources: StrOrSeq,
    *,
    extra_cflags: StrOrSeq | None = None,
    extra_cuda_cflags: StrOrSeq | None = None,
    extra_ldflags: StrOrSeq | None = None,
    extra_include_paths: StrOrSeq | None = None,
    schemas: StrOrSeq | None = None,
    device: str | None = None,
    abi: str | None = None,
) -> UserLibrary:
    """Build (once per content) and load a kernel library from source files.

    ``.cu`` files are compiled for CUDA targets only. The key covers every
    source and header under the sources' common folder and the include paths,
    so editing any of them rebuilds on the next call; unchanged, the same
    object comes back without a rebuild.
    """
    checks.library_args(
        "jitops.load",
        name,
        device,
        sources=sources,
        extra_cflags=extra_cflags,
        extra_cuda_cflags=extra_cuda_cflags,
        extra_ldflags=extra_ldflags,
        extra_include_paths=extra_include_paths,
        schemas=schemas,
    )
    # torch's stable C ABI: abi="stable", or STABLE_TORCH_LIBRARY in the sources
    from ..build import (
        stable,
    )

    texts = stable.texts_of(sources)
    stable_abi = stable.wanted("jitops.load", abi, texts)
    root, rel = source_files(name, sources)
    if stable_abi:
        stable.refuse_args(name, schemas=schemas)
        return _stable(
            stable.spec(
                name,
                root,
                rel,
                extra_cflags=extra_cflags,
                extra_cuda_cflags=extra_cuda_cflags,
                extra_ldflags=extra_ldflags,
                extra_include_paths=extra_include_paths,
                origin=f"jitops.load (stable ABI) from {root}",
            ),
            texts or (),
            device=device,
        )
    spec = _spec(
        name,
        root,
        rel,
        BuildOptions.of(
            extra_cflags=extra_cflags,
            extra_cuda_cflags=extra_cuda_cflags,
            extra_ldflags=extra_ldflags,
            extra_include_paths=extra_include_paths,
            schemas=schemas,
        ),
        origin=f"jitops.load from {root}",
    )
    return load_spec(spec, device)


def source_files(name: str, sources: StrOrSeq) -> tuple[Path, list[str]]:
    """Checked source files: their common folder and their paths relative to it."""
    paths = [Path(os.path.abspath(p)) for p in _as_list(sources, "sources")]
    if not paths:
        raise KernelSourceError(
            f"library {name!r}: no sources given. Fix: pass sources=['my_op.cpp']"
        )
    for p in paths:
        if p.suffix not in SOURCE_SUFFIXES:
            raise KernelSourceError(
                f"library {name!r}: {p} is not a source file (expected one of {', '.join(SOURCE_SUFFIXES)})"
            )
        if not p.is_file():
            raise KernelSourceError(
                f"library {name!r}: source file {p} does not exist. Fix: check the path"
            )
    root = Path(os.path.commonpath([str(p.parent) for p in paths]))
    _check_tree_size(root, name)
    return root, [p.relative_to(root).as_posix() for p in paths]


def _join(sources: StrOrSeq | None, what: str) -> str:
    return "\n".join(_as_list(sources, what))


def inline_dir(name: str, files: dict[str, str], settings: Settings | None = None) -> Path:
    """A folder under the cache root holding exactly ``files``, named by their content."""
    from ..store.roots import cache_for_reading, writable_cache

    settings = Settings.from_env() if settings is None else settings
    blob = json.dumps(sorted(files.items()), ensure_ascii=True).encode()
    digest = hashlib.sha256(blob).hexdigest()[:32]
    cache = cache_for_reading(settings)
    try:
        return _write_inline(cache.inline_dir(name, digest), files)
    except OSError:
        # An unusable root: the private temporary cache, with one warning, as get() does.
        cache = writable_cache(cache, f"library {name!r}", settings)
        return _write_inline(cache.inline_dir(name, digest), files)


def _write_inline(folder: Path, files: dict[str, str]) -> Path:
    # a link at inline/: the caller's writable_cache heals it; data there: named, never written
    # through
    if not fsutil.may_hold(folder.parent):
        raise CacheError(
            f"{folder.parent} is not a folder of the cache, so load_inline's sources are not written "
            "there. Fix: run `jitops cache repair` (it moves it out of the way)"
        )
    if fsutil.insecure_reason(folder, want_dir=True) is not None:
        fsutil.makedirs(folder)
        reason = fsutil.insecure_reason(folder, want_dir=True)
        if reason is not None:
            raise PermissionError(reason)
    for fname, text in files.items():
        path = folder / fname
        data = text.encode()
        try:
            if path.read_bytes() == data and fsutil.insecure_reason(path, want_dir=False) is None:
                continue
        except OSError:
            pass
        fsutil.atomic_write(path, data)
    return folder


def load_inline(
    name: str,
    cpp_sources: StrOrSeq,
    cuda_sources: StrOrSeq | None = None,
    *,
    extra_cflags: StrOrSeq | None = None,
    extra_cuda_cflags: StrOrSeq | None = None,
    extra_ldflags: StrOrSeq | None = None,
    extra_include_paths: StrOrSeq | None = None,
    schemas: StrOrSeq | None = None,
    device: str | None = None,
    abi: str | None = None,
) -> UserLibrary:
    """Build (once per content) and load a kernel library from C++/CUDA strings.

    A list of strings is joined with newlines, as torch's ``load_inline``
    does; nothing is prepended, so compiler line numbers are those of the
    string. Sources ``#include <jitops/op.h>`` and register with
    ``JITOPS_LIBRARY`` / ``JITOPS_LIBRARY_IMPL``.
    """
    checks.library_args(
        "jitops.load_inline",
        name,
        device,
        cpp_sources=cpp_sources,
        cuda_sources=cuda_sources,
        extra_cflags=extra_cflags,
        extra_cuda_cflags=extra_cuda_cflags,
        extra_ldflags=extra_ldflags,
        extra_include_paths=extra_include_paths,
        schemas=schemas,
    )
    files = {f"{name}.cpp": _join(cpp_sources, "cpp_sources")}
    cuda = _join(cuda_sources, "cuda_sources")
    # torch's stable C ABI: abi="stable", or STABLE_TORCH_LIBRARY in the sources
    from ..build import (
        stable,
    )

    stable_abi = stable.wanted("jitops.load_inline", abi, [files[f"{name}.cpp"], cuda])
    if stable_abi:
        stable.refuse_args(name, schemas=schemas)
        if cuda and not files[f"{name}.cpp"].strip():
            del files[f"{name}.cpp"]  # a CUDA-only library: the .cu registers its ops
    if cuda:
        files[f"{name}_cuda.cu"] = cuda
    settings = Settings.from_env()  # read once for this call
    root = inline_dir(name, files, settings)
    if stable_abi:
        return _stable(
            stable.spec(
                name,
                root,
                list(files),
                extra_cflags=extra_cflags,
                extra_cuda_cflags=extra_cuda_cflags,
                extra_ldflags=extra_ldflags,
                extra_include_paths=extra_include_paths,
                origin="jitops.load_inline (stable ABI)",
            ),
            list(files.values()),
            settings,
            device,
        )
    spec = _spec(
        name,
        root,
        list(files),
        BuildOptions.of(
            extra_cflags=extra_cflags,
            extra_cuda_cflags=extra_cuda_cflags,
            extra_ldflags=extra_ldflags,
            extra_include_paths=extra_include_paths,
            schemas=schemas,
        ),
        origin="jitops.load_inline",
    )
    return load_spec(spec, device, settings)


def register_kernel_dir(
    path: str | os.PathLike[str],
    *,
    name: str | None = None,
    ops: Sequence[str] | None = None,
    extra_cflags: StrOrSeq | None = None,
    extra_cuda_cflags: StrOrSeq | None = None,
    extra_ldflags: StrOrSeq | None = None,
    extra_include_paths: StrOrSeq | None = None,
    schemas: StrOrSeq | None = None,
    device: str | None = None,
) -> OpSpec:
    """Make the kernel library in folder ``path`` reachable through ``jitops.get``.

    Its sources are the folder's ``.cpp/.cc/.cxx`` files (and ``.cu`` for
    CUDA). The library name defaults to the folder's name. With ``ops``
    (the op names it defines) nothing is built until ``jitops.get``;
    without, it is built now to learn them. Registering the same folder
    again replaces the earlier registration.
    """
    from ..registry import register, registry

    checks.library_args(
        "jitops.register_kernel_dir",
        name,
        device,
        ops=ops,
        extra_cflags=extra_cflags,
        extra_cuda_cflags=extra_cuda_cflags,
        extra_ldflags=extra_ldflags,
        extra_include_paths=extra_include_paths,
        schemas=schemas,
    )
    folder = Path(os.path.abspath(checks.path("jitops.register_kernel_dir", "path", path)))
    if not folder.is_dir():
        raise KernelSourceError(f"kernel folder {folder} does not exist or is not a directory")
    lib_name = name if name is not None else folder.name
    try:
        validate_name(lib_name, "library name")
    except ValueError as e:
        raise KernelSourceError(
            f"{e}. Fix: pass name='my_kernels' to register_kernel_dir"
        ) from None
    _check_tree_size(folder, lib_name)
    sources = sorted(
        p.name for p in folder.iterdir() if p.suffix in SOURCE_SUFFIXES and p.is_file()
    )
    if not sources:
        raise KernelSourceError(
            f"kernel folder {folder} holds no source file ({', '.join(SOURCE_SUFFIXES)})"
        )
    spec = _spec(
        lib_name,
        folder,
        sources,
        BuildOptions.of(
            extra_cflags=extra_cflags,
            extra_cuda_cflags=extra_cuda_cflags,
            extra_ldflags=extra_ldflags,
            extra_include_paths=extra_include_paths,
            schemas=schemas,
        ),
        exports=tuple(ops or ()),
        origin=f"kernel folder {folder}",
    )
    spec = dataclasses.replace(spec, editable=True)
    if not spec.exports:
        spec = dataclasses.replace(spec, exports=tuple(load_spec(spec, device).ops))
    try:
        same_folder = registry().library(lib_name).root == spec.root
    except KeyError:
        same_folder = False
    register(spec, replace=same_folder)
    return spec
