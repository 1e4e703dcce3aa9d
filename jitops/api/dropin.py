"""``jitops.load`` / ``jitops.load_inline``: torch.utils.cpp_extension's loaders, with jitops's cache.

Both take torch's parameters (torch 2.13), in torch's order, plus jitops's own
``schemas`` and ``device`` as keywords. Only the import changes::

    from jitops import load_inline   # was: from torch.utils.cpp_extension import load_inline

Two kinds of source arrive here:

* jitops's own (``#include <jitops/op.h>``, ``JITOPS_LIBRARY``, or ``schemas=``):
  built as written (nothing prepended), returned as a :class:`~jitops.user.UserLibrary`.
* everything else is written for torch (:mod:`jitops.cpp_ext_style`): ``load_inline``
  prepends ``#include <torch/extension.h>`` unless ``no_implicit_headers=True``;
  the result is what torch returns: a module (``is_python_module=True``) or the
  library's path, with the library loaded for ``torch.ops`` (``False``).

What each torch parameter does here:

* ``functions``: dispatcher ops where the signature allows, else pybind11 (see cpp_ext_style).
* ``verbose``: the compiler commands and output, line by line as the build runs (as torch
  streams ninja's), then where the library came from (built, or a cache entry), go to the
  ``jitops.verbose`` logger, shown on stderr when no logging is configured.
* ``with_cuda``: ``True`` builds for CUDA, ``False`` for the CPU. ``None``, as torch: sources
  written for torch build for CUDA when there are CUDA files (``.cu`` / ``.cuh``,
  ``cuda_sources``), a ``TargetError`` naming the cause and the fix where CUDA cannot be
  built; otherwise, and for jitops-style sources, ``device`` decides (jitops's default target).
* ``is_python_module=True`` for a library with no Python module and no op: a
  ``NoPythonModuleError`` (an ``ImportError``, as torch's), naming ``is_python_module=False``.
* ``build_directory`` and ``use_pch=True``: accepted; one logged note per process says
  what jitops does instead (its content-addressed cache; no ``.gch`` written into torch).
* ``keep_intermediates``: torch keeps hipified sources with it (ROCm only); jitops has no hipify step and keeps no intermediates, so either value behaves as torch's does here.
* ``is_standalone=True`` (an executable) and SYCL sources: a clear ``KernelSourceError``;
  jitops builds shared libraries for torch only.

A call answered with a plain pybind11 module is answered by ``loading.recall`` later while its proof holds (no plan).
Imports: checks, errors, patterns, recall, settings, user_spec; lazily: user (not on a recalled call), cpp_ext_style (torch-style
sources), verbose and runner's LIVE (verbose=True), stable (a source naming STABLE_TORCH_LIBRARY, or abi=); plan for annotations.
"""

from __future__ import annotations

import functools
import importlib
import logging
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..spec import checks
from ..errors import BuildError, KernelSourceError, NoPythonModuleError, TargetError
from ..base.settings import Settings
from ..spec.user_spec import BuildOptions, StrOrSeq, _as_list, _spec
from ..base.patterns import lazy
from ..loading import recall

if TYPE_CHECKING:
    from . import cpp_ext_style as cs
    from ..plan import LoadedLibrary

log = logging.getLogger("jitops")
_JITOPS_STYLE = lazy(r"\bJITOPS_LIBRARY(?:_IMPL)?\s*\(", needs="JITOPS_LIBRARY")
_cs = lambda: importlib.import_module(".cpp_ext_style", __package__)  # noqa: E731 - the torch-style path's module, imported by it alone
# registrations: loading is the point
_REGISTERS = lazy(
    r"\bTORCH_LIBRARY\w*\s*\(|\bRegisterOperators\b", needs=("TORCH_LIBRARY", "RegisterOperators")
)
# words of UserLibrary sources; parameters noted
_USER_STYLE, _noted = (
    ("JITOPS_LIBRARY", "STABLE_TORCH_LIBRARY"),
    set[str](),
)


def _note(param: str, message: str) -> None:
    if param not in _noted:
        _noted.add(param)
        log.warning("jitops: %s", message)


def _common(
    build_directory: str | None,
    verbose: bool,
    with_cuda: bool | None,
    with_sycl: bool | None,
    extra_sycl_cflags: StrOrSeq | None,
    is_python_module: bool,
    is_standalone: bool,
    device: str | None,
    sycl_sources: StrOrSeq | None = None,
) -> str | None:
    """Checks and notes shared by load and load_inline; the device to build for."""
    if is_standalone:
        raise KernelSourceError(
            "is_standalone=True asks for an executable; jitops builds shared libraries loaded "
            "into torch only. Fix: use torch.utils.cpp_extension.load(..., is_standalone=True)"
        )
    if with_sycl or _as_list(sycl_sources, "sycl_sources"):
        raise KernelSourceError(
            "jitops does not build SYCL sources (with_sycl / sycl_sources). "
            "Fix: use torch.utils.cpp_extension for SYCL extensions"
        )
    if _as_list(extra_sycl_cflags, "extra_sycl_cflags"):
        _note("extra_sycl_cflags", "extra_sycl_cflags is ignored: jitops builds no SYCL sources")
    if build_directory is not None:
        _note(
            "build_directory",
            f"build_directory={str(build_directory)!r} is not used: jitops builds in a private "
            "staging folder and keeps each build in its content-addressed cache (JITOPS_CACHE_DIR; `jitops info` "
            "shows where), so edits never overwrite a library in use; nothing is written to build_directory",
        )
    return device if with_cuda is None or device is not None else "cuda" if with_cuda else "cpu"


def _check(
    func: str, name: object, device: object, flags: dict[str, object], **lists: object
) -> None:
    """Argument types, as jitops's other front doors check them (ArgumentError names the argument)."""
    if not isinstance(name, str):
        checks.op_name(func, name, "name", "library name")
    checks.device(func, device)
    for arg, value in flags.items():
        checks.flag(func, arg, value)
    for arg, value in lists.items():
        checks.strings(func, arg, value, optional=arg not in ("sources", "cpp_sources"))


def _finish(
    result: Any, lib: LoadedLibrary, verbose: bool, is_python_module: bool, streamed: bool
) -> Any:
    from . import user

    if verbose:
        from .verbose import describe, show

        show(describe(lib, streamed))
    if isinstance(result, user.UserLibrary) and not is_python_module:
        return str(lib.library_path)  # as torch's is_python_module=False: the path
    return result


def _run(verbose: bool, build: Any, implicit_cuda: str = "") -> tuple[Any, bool]:
    """``build()`` and whether it showed output; its output shown live when verbose; ``implicit_cuda``: why
    with_cuda=None meant CUDA."""
    lines: list[
        str
    ] = []  # a warm load imports no build code, and without verbose no verbose module
    live = importlib.import_module("..build.runner", __package__).LIVE if verbose else None
    token = (
        live.set(
            functools.partial(importlib.import_module(".verbose", __package__).show_line, lines)
        )
        if live is not None
        else None
    )
    try:
        return build(), bool(lines)
    except BuildError as e:
        if verbose:
            importlib.import_module(".verbose", __package__).show(
                f"jitops: the build failed (its output is above; kept in {e.log_path})"
            )
        raise e.with_traceback(None) from None
    except TargetError as e:
        if not implicit_cuda:
            raise
        raise TargetError(
            f"{implicit_cuda} and with_cuda=None, so torch's loader builds with CUDA, and so does jitops; "
            f"but {e}. Fix: run where a CUDA build of torch and nvcc are installed, or pass with_cuda=False "
            "to build only the C++ sources, for the CPU (the CUDA sources are then not compiled)"
        ) from None
    finally:
        if live is not None and token is not None:
            live.reset(token)


def _python_module_or_raise(
    loaded: cs.Loaded, texts: list[str], func: str, display: str, is_python_module: bool
) -> Any:
    """What a torch-style load returns; torch's ImportError where it would import a module that is not there."""
    value = loaded.value
    if (
        is_python_module
        and isinstance(value, types.ModuleType)
        and value.__spec__ is None
        and not loaded.library.ops
        and not any(_REGISTERS.search(t) for t in texts)
    ):
        raise NoPythonModuleError(
            f"{func}({display!r}): is_python_module=True, but the library defines no Python module (no "
            "PYBIND11_MODULE) and registers no op, so there is nothing to import (torch's loader raises ImportError: "
            "dynamic module does not define module export function). Fix: add PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) "
            "{ m.def(...); } to the source (with load_inline: functions=[...]), or pass is_python_module=False to "
            "load the library only, for its side effects"
        )
    return value


def _torch_options(
    extra_cflags: StrOrSeq | None,
    extra_cuda_cflags: StrOrSeq | None,
    extra_ldflags: StrOrSeq | None,
    extra_include_paths: StrOrSeq | None,
) -> BuildOptions:
    """Flags and include paths as torch's loader takes them: each stripped of surrounding whitespace."""
    from . import cpp_ext_style as cs

    strip = lambda value, what: [v.strip() for v in _as_list(value, what)]  # noqa: E731
    return BuildOptions.of(
        extra_cflags=[*strip(extra_cflags, "extra_cflags"), *cs.NAME_FLAGS],
        extra_cuda_cflags=[*strip(extra_cuda_cflags, "extra_cuda_cflags"), *cs.NAME_FLAGS],
        extra_ldflags=[*strip(extra_ldflags, "extra_ldflags"), *cs.LDFLAGS],
        extra_include_paths=strip(extra_include_paths, "extra_include_paths"),
    )


def _stable_wanted(func: str, abi: object, texts: list[str] | None) -> bool:
    """stable.wanted; build/stable imported (off the warm path) only for abi= or a source naming STABLE_TORCH_LIBRARY*."""
    return (
        abi is not None or any("STABLE_TORCH_LIBRARY" in t for t in texts or ())
    ) and importlib.import_module("..build.stable", __package__).wanted(func, abi, texts)


def load(
    name: str,
    sources: StrOrSeq,
    extra_cflags: StrOrSeq | None = None,
    extra_cuda_cflags: StrOrSeq | None = None,
    extra_sycl_cflags: StrOrSeq | None = None,
    extra_ldflags: StrOrSeq | None = None,
    extra_include_paths: StrOrSeq | None = None,
    build_directory: str | None = None,
    verbose: bool = False,
    with_cuda: bool | None = None,
    with_sycl: bool | None = None,
    is_python_module: bool = True,
    is_standalone: bool = False,
    keep_intermediates: bool = True,
    *,
    schemas: StrOrSeq | None = None,
    device: str | None = None,
    abi: str | None = None,
) -> Any:
    """Build (once per content) and load a library from source files; torch's ``load``, cached by jitops.

    jitops-style sources return a [`UserLibrary`][jitops.UserLibrary]; sources written for
    torch return a module (``PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)``), or with
    ``is_python_module=False`` the loaded library's path (``TORCH_LIBRARY``). The key covers
    every source and header under the sources' common folder and the include paths.
    """
    args = dict(locals())  # the call's arguments as given: a recalled call's request
    _check(
        "jitops.load",
        name,
        device,
        {"verbose": verbose, "with_cuda": with_cuda, "is_python_module": is_python_module},
        sources=sources,
        extra_cflags=extra_cflags,
        extra_cuda_cflags=extra_cuda_cflags,
        extra_ldflags=extra_ldflags,
        extra_include_paths=extra_include_paths,
        schemas=schemas,
    )
    device = _common(
        build_directory,
        verbose,
        with_cuda,
        with_sycl,
        extra_sycl_cflags,
        is_python_module,
        is_standalone,
        device,
    )
    settings = Settings.from_env()
    cuda_files = [Path(s).name for s in _as_list(sources, "sources") if s.endswith((".cu", ".cuh"))]
    texts = _texts(sources)
    module, req = _recalled("jitops.load", args, settings, device, bool(cuda_files), texts)
    if module is not None:
        return module
    from . import user

    # unreadable: user.load names it
    if (
        texts is None
        or _is_jitops_style(texts, None, schemas)
        or _stable_wanted("jitops.load", abi, texts)
    ):
        lib, streamed = _run(
            verbose,
            lambda: user.load(
                name,
                sources,
                extra_cflags=extra_cflags,
                extra_cuda_cflags=extra_cuda_cflags,
                extra_ldflags=extra_ldflags,
                extra_include_paths=extra_include_paths,
                schemas=schemas,
                device=device,
                abi=abi,
            ),
        )
        return _finish(lib, lib.library, verbose, is_python_module, streamed)
    cs = _cs()
    cache_name = cs.spec_name(name)
    root, rel = user.source_files(cache_name, sources)
    spec = _spec(
        cache_name,
        root,
        rel,
        _torch_options(extra_cflags, extra_cuda_cflags, extra_ldflags, extra_include_paths),
        origin=f"jitops.load (torch style) from {root}",
    )
    implicit = (
        f"jitops.load({name!r}): the sources include CUDA files ({', '.join(cuda_files)})"
        if (with_cuda is None and device is None and cuda_files)
        else ""
    )
    # as torch: with_cuda=None means "if there are CUDA files"
    device = "cuda" if implicit else device
    loaded, streamed = _run(
        verbose,
        lambda: cs.load(
            spec,
            texts,
            display=name,
            functions={},
            is_python_module=is_python_module,
            device=device,
            settings=settings,
            request=req,
        ),
        implicit,
    )
    value = _python_module_or_raise(loaded, texts, "jitops.load", name, is_python_module)
    return _finish(value, loaded.library, verbose, is_python_module, streamed)


def load_inline(
    name: str,
    cpp_sources: StrOrSeq,
    cuda_sources: StrOrSeq | None = None,
    sycl_sources: StrOrSeq | None = None,
    functions: Any = None,
    extra_cflags: StrOrSeq | None = None,
    extra_cuda_cflags: StrOrSeq | None = None,
    extra_sycl_cflags: StrOrSeq | None = None,
    extra_ldflags: StrOrSeq | None = None,
    extra_include_paths: StrOrSeq | None = None,
    build_directory: str | None = None,
    verbose: bool = False,
    with_cuda: bool | None = None,
    with_sycl: bool | None = None,
    is_python_module: bool = True,
    with_pytorch_error_handling: bool = True,
    keep_intermediates: bool = True,
    use_pch: bool = False,
    no_implicit_headers: bool = False,
    gil_not_used: bool = False,
    *,
    schemas: StrOrSeq | None = None,
    device: str | None = None,
    abi: str | None = None,
) -> Any:
    """Build (once per content) and load a library from C++/CUDA strings; torch's ``load_inline``, cached by jitops.

    A list of strings is joined with newlines. jitops-style sources (``JITOPS_LIBRARY``)
    are compiled exactly as written, so compiler line numbers are those of the string;
    torch-style sources get ``#include <torch/extension.h>`` as their first line, as
    torch writes them. ``functions=`` makes each listed function a ``torch.ops`` op (the
    dispatcher infers its schema from the C++ signature; ``module.ops.f``), or binds it with
    pybind11 where the signature needs that; either way ``module.f`` calls it, and meets
    torch.compile as torch's pybind11 binding does (a graph break).
    """
    args = dict(locals())  # the call's arguments as given: a recalled call's request
    _check(
        "jitops.load_inline",
        name,
        device,
        {
            "verbose": verbose,
            "with_cuda": with_cuda,
            "is_python_module": is_python_module,
            "no_implicit_headers": no_implicit_headers,
        },
        cpp_sources=cpp_sources,
        cuda_sources=cuda_sources,
        extra_cflags=extra_cflags,
        extra_cuda_cflags=extra_cuda_cflags,
        extra_ldflags=extra_ldflags,
        extra_include_paths=extra_include_paths,
        schemas=schemas,
    )
    device = _common(
        build_directory,
        verbose,
        with_cuda,
        with_sycl,
        extra_sycl_cflags,
        is_python_module,
        False,
        device,
        sycl_sources,
    )
    if use_pch:
        _note(
            "use_pch",
            "use_pch=True is not used: jitops never writes a precompiled header into the torch "
            "installation, as torch's use_pch does (extension.h.gch, shared and unlocked); precompiled headers "
            "jitops uses are keyed and kept in its own cache",
        )
    if gil_not_used:  # torch 2.15's parameter (free-threaded Python); accepted under every torch
        _note(
            "gil_not_used",
            "gil_not_used=True is not used: the pybind11 module jitops generates for functions= "
            "does not declare itself free of the GIL (it runs as under a GIL-enabled Python)",
        )
    cpp, cuda = _as_list(cpp_sources, "cpp_sources"), _as_list(cuda_sources, "cuda_sources")
    settings = Settings.from_env()
    module, req = _recalled("jitops.load_inline", args, settings, device, bool(cuda), cpp + cuda)
    if module is not None:
        return module
    # and cpp_ext_style only for torch-style sources (functions= is theirs alone)
    from . import (
        user,
    )

    if _is_jitops_style(cpp + cuda, functions, schemas) or (
        functions is None and _stable_wanted("jitops.load_inline", abi, cpp + cuda)
    ):
        lib, streamed = _run(
            verbose,
            lambda: user.load_inline(
                name,
                cpp_sources,
                cuda_sources,
                extra_cflags=extra_cflags,
                extra_cuda_cflags=extra_cuda_cflags,
                extra_ldflags=extra_ldflags,
                extra_include_paths=extra_include_paths,
                schemas=schemas,
                device=device,
                abi=abi,
            ),
        )
        return _finish(lib, lib.library, verbose, is_python_module, streamed)
    cs = _cs()
    table = cs.function_table(functions)
    cs.check_named(table, cpp + cuda, bool(_as_list(extra_include_paths, "extra_include_paths")))
    cache_name = cs.spec_name(name)
    files = cs.inline_files(
        cache_name,
        cpp,
        cuda,
        table,
        implicit_headers=not no_implicit_headers,
        wrap_errors=bool(with_pytorch_error_handling),
    )
    root = user.inline_dir(cache_name, files, settings)
    spec = _spec(
        cache_name,
        root,
        list(files),
        _torch_options(extra_cflags, extra_cuda_cflags, extra_ldflags, extra_include_paths),
        origin="jitops.load_inline (torch style)",
    )
    implicit = (
        f"jitops.load_inline({name!r}): cuda_sources were given"
        if with_cuda is None and device is None and cuda
        else ""
    )
    # as torch: with_cuda=None means "if there are cuda_sources"
    device = "cuda" if implicit else device
    loaded, streamed = _run(
        verbose,
        lambda: cs.load(
            spec,
            list(files.values()),
            display=name,
            functions=table,
            is_python_module=is_python_module,
            device=device,
            settings=settings,
            request=req,
        ),
        implicit,
    )
    value = _python_module_or_raise(
        loaded, list(files.values()), "jitops.load_inline", name, is_python_module
    )
    return _finish(value, loaded.library, verbose, is_python_module, streamed)


def _recalled(
    func: str,
    args: dict[str, Any],
    settings: Settings,
    device: str | None,
    cuda: bool,
    texts: list[str] | None,
) -> tuple[Any, Any]:
    """(the module a remembered call answers, or None: plan) and this call's request (None where none is recalled: verbose,
    no module, CUDA, abi=, schemas= or a source of _USER_STYLE: a UserLibrary is never remembered, a lookup would be waste)."""
    if (
        args["verbose"]
        or not args["is_python_module"]
        or device not in (None, "cpu")
        or (device is None and cuda)
        or args["abi"] is not None
        or args["schemas"]
        or any(m in t for t in texts or () for m in _USER_STYLE)
    ):
        return None, None
    req = recall.request(func, args, settings)
    return (recall.recall(req) if req is not None else None), req


def _texts(sources: StrOrSeq) -> list[str] | None:
    try:
        return [Path(p).read_text(errors="replace") for p in _as_list(sources, "sources")]
    except (OSError, TypeError):
        return None


def _is_jitops_style(texts: list[str], functions: Any, schemas: StrOrSeq | None) -> bool:
    """jitops's own registration (JITOPS_LIBRARY, or schemas=) and nothing torch-only (functions=, pybind11)."""
    if functions is not None or schemas:
        return functions is None
    # cpp_ext_style (a torch-style load's module) only where JITOPS_LIBRARY is spelled
    return any(_JITOPS_STYLE.search(t) for t in texts) and not any(
        _cs()._PYBIND.search(t) for t in texts
    )
