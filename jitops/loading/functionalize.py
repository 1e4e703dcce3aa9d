"""Functionalization kernels for in-place and ``out=`` ops, so they work inside torch.compile.

torch.compile (AOT autograd) and torch.export rewrite mutations into pure
ops. For a custom op that mutates an argument *and returns it* (``add_``:
``-> Tensor(a!)``, ``add.out``), torch has no automatic rewrite: tracing
fails with "cannot functionalize". PyTorch's own native ops solve this with
generated Functionalize kernels that call the functional variant and write
the result back into the mutated tensor's wrapper. This module derives the
same kernel for any op library that follows the native naming convention:

- ``foo_(Tensor(a!) self, ...) -> Tensor(a!)`` pairs with ``foo(self, ...)``;
- ``foo.out(..., *, Tensor(a!) out) -> Tensor(a!)`` pairs with ``foo(...)``;
- an overload pairs with its namesake: ``foo_.X`` and ``foo.X_out`` with ``foo.X``
  (``add_.Scalar`` and ``add.Scalar_out`` with ``add.Scalar``).

The pairing is checked against the schemas (same arguments, one written
tensor, one result); an op that does not fit is left alone. Eager calls
never reach these kernels: the Functionalize key is active only while torch
traces.

Imports: record (torch, lazily).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from ..base.record import record

log = logging.getLogger("jitops")

# The torch internals the kernels call: the same ones torch's Python functionalization uses.
REQUIRED = (
    "_from_functional_tensor",
    "_is_functional_tensor",
    "_sync",
    "_functionalize_replace",
    "_functionalize_commit_update",
    "_functionalize_sync",
    "_C._ExcludeDispatchKeyGuard",
    "_C._dispatch_has_kernel_for_dispatch_key",
    "_C._jit_get_schemas_for_operator",
)


@record
class Pairing:
    """A mutable overload and the functional overload that computes its result."""

    # "add_", "add.out", "add_.Scalar" (overload name after the dot; none for "default")
    mutable: str
    functional: str  # "add" or "add.Scalar"
    written: str  # the argument the mutable overload writes: "self" or "out"
    written_index: int  # its position in the mutable schema's arguments
    written_kwarg_only: bool


def _key(schema: Any) -> str:
    name = schema.name.split("::")[-1]
    return name if schema.overload_name in ("", "default") else f"{name}.{schema.overload_name}"


def _sig(args: Iterable[Any]) -> list[tuple[str, str, bool]]:
    return [(a.name, str(a.type), a.kwarg_only) for a in args]


def pairings(schemas: Iterable[Any]) -> list[Pairing]:
    """Mutable overloads among ``schemas`` (parsed FunctionSchemas) that have a functional twin."""
    by_key = {_key(s): s for s in schemas}
    found = []
    for key, s in by_key.items():
        if not s.is_mutable:
            continue
        written = [
            i
            for i, a in enumerate(s.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        ]
        if len(written) != 1 or len(s.returns) != 1:
            continue
        w = s.arguments[written[0]]
        ret = s.returns[0]
        if (
            str(w.type) != "Tensor"
            or ret.alias_info is None
            or ret.alias_info.before_set != w.alias_info.before_set
        ):
            continue
        name = s.name.split("::")[-1]
        overload = "" if s.overload_name in ("", "default") else s.overload_name
        if w.kwarg_only and (overload == "out" or overload.endswith("_out")):
            # foo.out pairs with foo, foo.X_out with foo.X (add.Scalar_out -> add.Scalar)
            functional_key = name if overload == "out" else f"{name}.{overload[:-4]}"
            rest = [a for i, a in enumerate(s.arguments) if i != written[0]]
        elif name.endswith("_") and written[0] == 0:
            # foo_ pairs with foo, foo_.X with foo.X (add_.Scalar -> add.Scalar)
            functional_key = name[:-1] + (f".{overload}" if overload else "")
            rest = list(s.arguments)
        else:
            continue
        f = by_key.get(functional_key)
        if f is None or f.is_mutable or len(f.returns) != 1 or str(f.returns[0].type) != "Tensor":
            continue
        if _sig(f.arguments) != _sig(rest):
            continue
        found.append(Pairing(key, functional_key, w.name, written[0], w.kwarg_only))
    return found


def _kernel(mutable_op: Any, functional_op: Any, p: Pairing) -> Callable[..., Any]:
    import torch

    def is_functional(t: Any) -> bool:
        return isinstance(t, torch.Tensor) and torch._is_functional_tensor(t)

    def unwrap(t: Any) -> Any:
        return torch._from_functional_tensor(t) if is_functional(t) else t

    skip = torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)

    def functionalized(*args: Any, **kwargs: Any) -> Any:
        target = kwargs[p.written] if p.written_kwarg_only else args[p.written_index]
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if not is_functional(target):
            if any(is_functional(t) for t in tensors):
                raise RuntimeError(
                    f"{mutable_op}: cannot write into a tensor that is not being traced ({p.written}) from a traced one; "
                    "pass tensors created inside the compiled function or its inputs"
                )
            with torch._C._ExcludeDispatchKeyGuard(skip):
                return mutable_op(*args, **kwargs)
        for t in tensors:
            if is_functional(t):
                torch._sync(t)  # apply pending mutations of views before reading
        inner_args = [unwrap(a) for a in args]
        inner_kwargs = {
            k: unwrap(v) for k, v in kwargs.items() if not (p.written_kwarg_only and k == p.written)
        }
        with torch._C._ExcludeDispatchKeyGuard(skip):
            result = functional_op(*inner_args, **inner_kwargs)
            # out= and in-place results take the written tensor's dtype
            if result.dtype != target.dtype:
                result = result.to(target.dtype)
        torch._functionalize_replace(target, result)
        torch._functionalize_commit_update(target)
        torch._functionalize_sync(target)
        return target

    return functionalized


def register(namespace: str, exports: Iterable[str], library: Any) -> list[str]:
    """Register Functionalize kernels in ``library`` (a torch.library.Library for
    ``namespace``) for the exported mutable ops that pair with a functional one.

    Returns the registered overloads, e.g. ``["add.out", "add_"]``.
    """
    import torch

    missing = [name for name in REQUIRED if not _has(torch, name)]
    if missing:
        log.warning(
            "jitops: torch %s lacks %s; in-place and out= ops of %s work in eager mode but not inside "
            "torch.compile",
            torch.__version__,
            ", ".join(f"torch.{n}" for n in missing),
            namespace,
        )
        return []
    schemas = [
        s for e in exports for s in torch._C._jit_get_schemas_for_operator(f"{namespace}::{e}")
    ]
    done = []
    for p in pairings(schemas):
        if torch._C._dispatch_has_kernel_for_dispatch_key(
            f"{namespace}::{p.mutable}", "Functionalize"
        ):
            continue  # the library's own Python side registered one
        name, _, overload = p.mutable.partition(".")
        mutable_op = getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
        f_name, _, f_overload = p.functional.partition(".")
        functional_op = getattr(
            getattr(getattr(torch.ops, namespace), f_name), f_overload or "default"
        )
        library.impl(p.mutable, _kernel(mutable_op, functional_op, p), "Functionalize")
        done.append(p.mutable)
    return sorted(done)


def _has(module: Any, dotted: str) -> bool:
    for part in dotted.split("."):
        module = getattr(module, part, None)
        if module is None:
            return False
    return True
