"""Sources written for ``torch.utils.cpp_extension``, built and loaded through jitops's cache.

Three styles run unchanged:

* ``#include <torch/extension.h>`` with ``functions=[...]`` (``load_inline``);
* a ``PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)`` block;
* ``TORCH_LIBRARY(myns, m)`` with a fixed namespace (``is_python_module=False``).

``functions=`` generates, after the user's source, dispatcher registrations in
the build's own namespace (``TORCH_LIBRARY_FRAGMENT(JITOPS_NS, m)``, schema
inferred from the C++ signature; see ``<jitops/dropin.h>``): those functions
are real ``torch.ops`` ops and trace under ``torch.compile``. A signature the
dispatcher cannot take (``int``, ``std::vector<int>``, ``py::object``...) is
bound with pybind11 instead, as torch does.

``TORCH_EXTENSION_NAME`` is the build's namespace, unique per cache key, so an
edited pybind11 module loads next to the old one in the same process. A fixed
``TORCH_LIBRARY`` namespace cannot be registered twice in one process: a
different build of one that is loaded already is refused before anything is
built or loaded (loading it would abort the process).

Imports: patterns, record, errors, headers, spec; loader, ops, plan and recall lazily (plan, recall and settings for annotations).
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import threading
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base.record import record
from ..errors import BuildError, InvalidNameError, KernelSourceError
from ..spec.headers import EXTENSION_H, spells_python_api
from ..spec import OpSpec
from ..base.patterns import lazy

if TYPE_CHECKING:
    from ..loading.recall import Request
    from ..plan import LoadedLibrary
    from ..base.settings import Settings

# TORCH_EXTENSION_NAME is the build's namespace (-DJITOPS_NS, one per key); -U first: no
# redefinition warning. key.TORCH_STYLE_FLAG marks the build as torch's (torch's flags only, never
# the stand-in; key.py, tubuild.py).
NAME_FLAGS = ("-UTORCH_EXTENSION_NAME", "-DTORCH_EXTENSION_NAME=JITOPS_NS")
LDFLAGS = ("-ltorch_python",)  # pybind11's type casters for at::Tensor live there
CPP_HEADER = "#include <torch/extension.h>"
CUDA_HEADERS = ("#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>")
# After the prepended headers: the user's first line is line 1 again, so a compiler error names the
# line of the user's string (torch's own load_inline is one line off). pch.header_prefix
# reads past it.
LINE_ONE = "#line 1"

_FIXED_NS = lazy(r"\bTORCH_LIBRARY(?:_FRAGMENT)?\s*\(\s*([A-Za-z_]\w*)\s*,", needs="TORCH_LIBRARY")
_PYBIND = lazy(r"\bPYBIND11_MODULE\s*\(\s*([A-Za-z_]\w*)\s*,", needs="PYBIND11_MODULE")
_IDENT = lazy(r"[A-Za-z_]\w*", re.ASCII)
_QUOTED_INCLUDE = lazy(r'^\s*#\s*include\s*"', re.MULTILINE)

_lock = threading.Lock()
# how to edit without restarting, in the fixed-namespace guard's message (loader.check_fixed)
FIXED_FIX = (
    "register with JITOPS_LIBRARY(m) / JITOPS_LIBRARY_IMPL(CPU, m) from <jitops/op.h> (jitops gives each "
    "build its own namespace), or use load_inline(..., functions=[...])"
)
_results: dict[tuple[str, bool], Any] = {}  # (key, is_python_module) -> what load returned


@record
class Loaded:
    """What a torch-style load returns (``value``) and the build behind it (``library``)."""

    value: Any
    library: LoadedLibrary


def spec_name(name: object) -> str:
    """The cache name of a library torch would accept (a Python identifier, e.g. ``my_ext_C``)."""
    if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
        raise InvalidNameError(
            f"invalid library name {str(name)[:80]!r}: torch's loaders take a Python identifier "
            "(ASCII letters, digits and '_', not starting with a digit)"
        )
    low = name.lower().lstrip("_")[:64]
    return low if low[:1].isalpha() else f"x{low}"[:64]


def function_table(functions: object) -> dict[str, str]:
    """``functions=`` as torch takes it (a name, a list of names, or {name: docstring})."""
    if functions is None:
        return {}
    if isinstance(functions, str):
        functions = [functions]
    if isinstance(functions, Sequence):
        table = {f: f for f in functions}
    elif isinstance(functions, Mapping):
        table = dict(functions)
    else:
        raise KernelSourceError(
            f"functions must be a list of names or a {{name: docstring}} dict, got {type(functions).__name__}"
        )
    for f, doc in table.items():
        if not isinstance(f, str) or not _IDENT.fullmatch(f) or not isinstance(doc, str):
            raise KernelSourceError(
                f"functions: {f!r} is not the name of a C++ function (with a docstring string). "
                "Fix: list plain function names, e.g. functions=['my_add']"
            )
    return table


def check_named(functions: Mapping[str, str], texts: Sequence[str], include_paths: bool) -> None:
    """Before compiling: each name in ``functions=`` is spelled in the sources (or may come from a header of the
    user's: a quoted #include, or extra_include_paths); else torch's build fails in its generated bindings."""
    if not functions or include_paths or any(_QUOTED_INCLUDE.search(t) for t in texts):
        return
    words = {w for t in texts for w in _IDENT.findall(t)}
    missing = [f for f in functions if f not in words]
    if missing:
        raise KernelSourceError(
            f"functions={list(functions)!r}: {', '.join(map(repr, missing))} is not defined in cpp_sources or "
            "cuda_sources (the name appears nowhere in them), so there is nothing to bind. Fix: define the "
            "function, or correct its name in functions="
        )


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def bindings(functions: Mapping[str, str], wrap_errors: bool, ops: bool = True) -> str:
    """The code appended after the user's source for ``functions=`` (the user's includes stay first).

    With pybind11 (``<torch/extension.h>``), each function is bound exactly as torch binds it: a pybind11
    function holding the GIL, with its docstring (``module.f``). ``ops``: each whose signature the dispatcher
    takes is also an op (``module.ops.f``, traceable; called without the GIL, as every op), unless the user's
    code spells Python's or pybind11's API (a body that releases or needs the GIL must not run as an op)."""
    if not functions:
        return ""
    wrap = "true" if wrap_errors else "false"
    lines = [
        "",
        "// ---- generated by jitops for functions=: pybind11 bindings as torch's; dispatcher ops beside",
        "#include <jitops/dropin.h>",
    ]
    if ops:
        lines += ["TORCH_LIBRARY_FRAGMENT(JITOPS_NS, m) {"]
        lines += [f"  jitops::dropin::def<&{f}>(m, {_c_string(f)});" for f in functions]
        lines += ["}"]
    lines += ["#if defined(PYBIND11_MODULE)", "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
    lines += [
        f"  jitops::dropin::bind<&{f}, {wrap}>(m, {_c_string(f)}, {_c_string(d)});"
        for f, d in functions.items()
    ]
    lines += ["}", "#else"]
    lines += [
        f"static_assert({'jitops::dropin::is_op<&' + f + '>' if ops else 'false'}, \"jitops: {f}'s signature "
        "cannot be a dispatcher op (use at::Tensor, int64_t, double, bool), and without pybind11 it cannot be "
        'bound either. Fix: change the signature, or #include <torch/extension.h>");'
        for f in functions
    ]
    return "\n".join([*lines, "#endif", ""])


def inline_files(
    name: str,
    cpp_sources: Sequence[str],
    cuda_sources: Sequence[str],
    functions: Mapping[str, str],
    *,
    implicit_headers: bool,
    wrap_errors: bool,
) -> dict[str, str]:
    """The generated translation units of a torch-style ``load_inline``, as torch writes them."""
    cpp = ([CPP_HEADER, LINE_ONE] if implicit_headers else []) + list(cpp_sources)
    ops = not any(spells_python_api(t) for t in (*cpp_sources, *cuda_sources))
    files = {f"{name}.cpp": "\n".join(cpp) + bindings(functions, wrap_errors, ops)}
    if cuda_sources:
        files[f"{name}_cuda.cu"] = "\n".join(
            ([*CUDA_HEADERS, LINE_ONE] if implicit_headers else []) + list(cuda_sources)
        )
    return files


def fixed_namespaces(texts: Sequence[str]) -> list[str]:
    """Namespaces the sources define with TORCH_LIBRARY / TORCH_LIBRARY_FRAGMENT (not JITOPS_NS)."""
    found = {m.group(1) for t in texts for m in _FIXED_NS.finditer(t)}
    return sorted(found - {"JITOPS_NS"})


def _python_module(
    lib: LoadedLibrary, path: Path, pybind_names: Sequence[str], display: str, binding: bool
) -> types.ModuleType:
    """The module the library defines (pybind11), or a new one; with the library's ops as attributes.

    ``binding``: functions= with <torch/extension.h>, which torch binds with pybind11 (jitops too when the
    file is compiled with the real header; with its lean stand-in there is no pybind11 module)."""
    import torch

    from ..loading.recall import pybind_module

    # As torch imports the module named after the extension: TORCH_EXTENSION_NAME's block (built as
    # the namespace) first, then PYBIND11_MODULE(my_ext, m) written with that name, then any other;
    # torch never calls the others.
    literal = sorted(
        {n for n in pybind_names if n != "TORCH_EXTENSION_NAME"}, key=lambda n: (n != display, n)
    )
    names = [lib.namespace, *literal]
    # already loaded: the same handle; only asks which init function it exports
    handle = ctypes.CDLL(str(path))
    found = next((n for n in names if hasattr(handle, f"PyInit_{n}")), None)
    if found is not None:
        module = pybind_module(found, path)
    elif literal:
        raise KernelSourceError(
            f"library {display!r}: PYBIND11_MODULE({literal[0]}, m) is in the source but "
            f"the built library exports no PyInit_{literal[0]}. Fix: write PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)"
        )
    else:
        module = types.ModuleType(display)
        module.__file__ = str(path)
    ops = getattr(torch.ops, lib.namespace)
    module.ops = ops  # type: ignore[attr-defined]  # the raw ops: torch.compile traces them (fullgraph too)
    for op in lib.ops:
        if not hasattr(module, op):
            overload = getattr(ops, op).default
            # With pybind11 (torch's own load_inline), torch.compile meets these functions as
            # pybind11 bindings: a graph break, then an eager call. A function reading data_ptr()
            # cannot run on fake tensors, so the op would fail under torch.compile where torch's
            # binding works; the attribute keeps torch's behaviour.
            setattr(
                module,
                op,
                _eager_in_compile(overload) if found is not None or binding else overload,
            )
    return module


def _eager_in_compile(overload: Any) -> Any:
    """``overload`` as torch's pybind11 binding behaves under torch.compile: a graph break and an eager call.

    Without importing torch._dynamo (1.2 s: a warm load must not pay it): dynamo breaks the graph at a
    function marked ``_torchdynamo_disable`` (what torch.compiler.disable marks), and never compiles a frame
    of this code, skipped through torch's C API; where that API is missing, torch.compiler.disable itself."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return overload(*args, **kwargs)

    call.__name__ = call.__qualname__ = overload._schema.name.split("::")[-1]
    call.__doc__ = f"{overload._schema} (the op itself: module.ops)"
    call.op = overload  # type: ignore[attr-defined]
    call._torchdynamo_disable = True  # type: ignore[attr-defined]
    if _skip_frames(call.__code__):
        return call
    import torch

    return torch.compiler.disable(call)


def _skip_frames(code: types.CodeType) -> bool:
    """Tell torch.compile never to compile frames of ``code`` (one code object for every ``call``)."""
    try:
        from torch._C._dynamo import eval_frame as ef

        ef.set_code_exec_strategy(
            code, ef._FrameExecStrategy(ef._FrameAction.SKIP, ef._FrameAction.DEFAULT)
        )
        return True
    except (ImportError, AttributeError, TypeError, RuntimeError):
        return False


def load(
    spec: OpSpec,
    texts: Sequence[str],
    *,
    display: str,
    functions: Mapping[str, str],
    is_python_module: bool,
    device: str | None,
    settings: Settings,
    request: Request | None = None,
) -> Loaded:
    """Build (once per key) and load a torch-style library; a module, or the library's path. ``request``: the
    drop-in call's (``loading.recall``), remembered when the answer is a plain pybind11 module."""
    from ..loading import recall
    from ..loading.loader import FIXED_LOCK, check_fixed, claim_fixed, load_library
    from ..plan import make_plan, runnable_here

    namespaces = fixed_namespaces(texts)
    # One fixed-namespace library at a time: two edits loaded by two threads must not both pass the
    # check.
    with FIXED_LOCK if namespaces else contextlib.nullcontext():
        plan = runnable_here(make_plan(spec, device, None, settings=settings), None, settings)
        if namespaces:  # the key this source would have, checked before anything is built or loaded
            check_fixed(spec.name, plan.key, namespaces, "TORCH_LIBRARY", FIXED_FIX)
        try:
            # that plan: its key computed once
            lib = load_library(spec, device, settings=settings, plan=plan)
        except BuildError as e:
            raise e.with_traceback(None) from None  # the compiler's story, not jitops's frames
        claim_fixed(namespaces, lib.key)
    path = lib.library_path
    with _lock:
        hit = _results.get((lib.key, is_python_module))
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        if is_python_module:
            binding = bool(functions) and any(EXTENSION_H.search(t) for t in texts)
            module = recall.MODULES.get(lib.namespace) or _python_module(
                lib,
                path,
                [m.group(1) for t in texts for m in _PYBIND.finditer(t)],
                display,
                binding,
            )
            # a plain pybind11 module
            if module.__spec__ is not None and not lib.ops and not namespaces:
                recall.MODULES.setdefault(lib.namespace, module)
                if request is not None:
                    recall.remember(request, plan, lib, module)
            result = Loaded(module, lib)
        else:
            result = Loaded(str(path), lib)  # as torch: the library is loaded; its path comes back
        _results[(lib.key, is_python_module)] = result
        return result
