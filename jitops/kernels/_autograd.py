"""Registrations a library's Python side makes from jitops's own code: fake kernels (``register_fake``) and
the twin ops that carry the derivatives of differentiable jitops ops.

A differentiable op ``f`` has a C++ kernel on the Autograd key
(``jitops::differentiable`` in ``jitops/include/jitops/op.h``): without grad
it goes straight to the backend kernel, with grad it calls ``f_autograd``.
This module defines that twin, with ``f``'s schema renamed (so the schema is
still written once, in the spec), and registers its fake kernel and
derivative from Python. The twin's forward (``jitops::twin`` in C++) calls
``f`` below autograd.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

TWIN_SUFFIX = "_autograd"  # jitops::kTwinSuffix in op.h
_LIBS: dict[str, torch.library.Library] = {}  # namespace -> fragment holding its twins (kept alive)


def twin_schema(schema: str, ns: str, name: str, overload: str = "default") -> str:
    """``"ns::f(Tensor x) -> Tensor"`` -> ``"f_autograd(Tensor x) -> Tensor"``;
    an overload keeps its name: ``"ns::f.Scalar(...)"`` -> ``"f_autograd.Scalar(...)"``."""
    suffix = "" if overload == "default" else f".{overload}"
    head = f"{ns}::{name}{suffix}("
    if not schema.startswith(head):
        raise ValueError(f"schema {schema!r} is not the {overload} overload of {ns}::{name}")
    return f"{name}{TWIN_SUFFIX}{suffix}(" + schema[len(head) :]


def fragment(ns: str) -> torch.library.Library:
    """The FRAGMENT library that holds a namespace's Python registrations, kept alive for the process."""
    lib = _LIBS.get(ns)
    if lib is None:
        lib = _LIBS[ns] = torch.library.Library(ns, "FRAGMENT")
    return lib


def register_fake(qualname: str, fake: Callable[..., Any]) -> None:
    """``torch.library.register_fake(qualname, fake)``, its source named from ``fake``'s code instead of by torch's
    caller lookup, whose first call in a process reads every loaded module's file path (``inspect.getmodule``:
    ~3.5 ms of a warm ``get``). torch's own function when its registry is not where torch 2.13-2.15 keep it."""
    lib = fragment(qualname.split("::", 1)[0])
    try:
        holder = torch._library.simple_registry.singleton.find(qualname).fake_impl
        source = f"{fake.__code__.co_filename}:{fake.__code__.co_firstlineno}"
        lib._registration_handles.append(holder.register(fake, source, lib, allow_override=True))
    except (AttributeError, TypeError):
        torch.library.register_fake(qualname, fake, lib=lib)


def define_twin(
    ns: str,
    name: str,
    fake: Callable[..., Any],
    backward: Callable[..., Any],
    setup_context: Callable[..., None],
    overload: str = "default",
) -> None:
    """Define ``ns::<name>_autograd[.overload]`` from ``ns::<name>[.overload]``'s schema; register its fake
    kernel and derivative."""
    lib = fragment(ns)
    primal = getattr(getattr(getattr(torch.ops, ns), name), overload)
    lib.define(twin_schema(str(primal._schema), ns, name, overload))
    qualname = f"{ns}::{name}{TWIN_SUFFIX}" + ("" if overload == "default" else f".{overload}")
    register_fake(qualname, fake)
    torch.library.register_autograd(qualname, backward, setup_context=setup_context, lib=lib)
