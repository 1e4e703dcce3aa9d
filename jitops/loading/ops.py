"""The callable handle that :func:`jitops.get` returns for one dispatcher op.

Imports: nothing of jitops at run time (plan.LoadedLibrary and spec.OpSpec, read by attribute, for annotations).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..plan import LoadedLibrary
    from ..spec import OpSpec


class Op:
    """A callable handle to one dispatcher op, memoised per process.

    ``op(x, dim=-1)`` calls the torch op (``torch.ops.<ns>.<name>``); a plain
    Python ``__call__`` so that torch.compile inlines it without a graph break.
    """

    __slots__ = ("name", "library", "qualname", "packet", "reference", "_fn", "_out", "__weakref__")

    def __init__(
        self,
        name: str,
        library: LoadedLibrary | None,
        fn: Callable[..., Any],
        packet: Any,
        reference: Callable[..., Any] | None,
        out: Callable[..., Any] | None = None,
    ) -> None:
        self.name = name
        self.library = library
        self.qualname = f"{library.namespace}::{name}" if library else f"reference::{name}"
        self.packet = packet
        self.reference = reference
        self._fn = fn
        self._out = out

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._out is not None and "out" in kwargs:
            return self._out(*args, **kwargs)
        return self._fn(*args, **kwargs)

    def __repr__(self) -> str:
        where = (
            f"{self.library.target}, key {self.library.key[:12]}"
            if self.library
            else "PyTorch fallback"
        )
        return f"<jitops op {self.qualname} ({where})>"

    @property
    def default(self) -> Any:
        return self.packet.default

    @property
    def namespace(self) -> str | None:
        return self.library.namespace if self.library else None


class ScalarOp(Op):
    """An op with torch's ``.Scalar`` overloads (add): a Python number as the second argument takes
    ``foo.Scalar`` / ``foo.Scalar_out``, as ``torch.add`` treats a number (the packet's own overload
    resolution costs ~60 us for it); a tensor, 0-dim ones included, takes the Tensor overloads."""

    __slots__ = ("_tensor", "_scalar", "_scalar_out")

    def __init__(
        self, name: str, library: LoadedLibrary, packet: Any, reference: Callable[..., Any] | None
    ) -> None:
        import torch

        overloads = set(packet.overloads())
        super().__init__(
            name,
            library,
            packet.default,
            packet,
            reference,
            packet.out if "out" in overloads else None,
        )
        self._tensor = torch.Tensor
        self._scalar = packet.Scalar
        self._scalar_out = packet.Scalar_out if "Scalar_out" in overloads else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) > 1 and not isinstance(args[1], self._tensor):
            if self._scalar_out is not None and "out" in kwargs:
                return self._scalar_out(*args, **kwargs)
            return self._scalar(*args, **kwargs)
        if self._out is not None and "out" in kwargs:
            return self._out(*args, **kwargs)
        return self._fn(*args, **kwargs)


def op_from_library(lib: LoadedLibrary, name: str) -> Op:
    import torch

    packet = getattr(getattr(torch.ops, lib.namespace), name)
    overloads = set(packet.overloads())
    if (
        "default" in overloads
        and "Scalar" in overloads
        and overloads <= {"default", "out", "Scalar", "Scalar_out"}
    ):
        return ScalarOp(name, lib, packet, reference_for(lib.spec, name))
    if "default" in overloads and overloads <= {"default", "out"}:
        # Call the overloads directly: the packet's overload resolution costs ~0.3 us per call.
        return Op(
            name,
            lib,
            packet.default,
            packet,
            reference_for(lib.spec, name),
            packet.out if "out" in overloads else None,
        )
    return Op(name, lib, packet, packet, reference_for(lib.spec, name))


def reference_for(spec: OpSpec, name: str) -> Callable[..., Any] | None:
    if not spec.python:
        return None
    return getattr(importlib.import_module(spec.python), "REFERENCES", {}).get(name)


def ops_in_namespace(namespace: str) -> list[str]:
    """Op names registered in ``namespace`` (overloads folded), from the dispatcher."""
    import torch

    prefix = namespace + "::"
    names = {
        n[len(prefix) :].split(".", 1)[0]
        for n in torch._C._dispatch_get_all_op_names()
        if n.startswith(prefix)
    }
    return sorted(names)
