"""The callable handle that :func:`jitops.get` returns for one dispatcher op.

Imports: nothing of jitops at run time (LoadedLibrary and OpSpec are read by attribute).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .plan import LoadedLibrary
    from .spec import OpSpec


class Op:
    """A callable handle to one dispatcher op, memoised per process.

    ``op(x, dim=-1)`` calls the torch op (``torch.ops.<ns>.<name>``); a plain
    Python ``__call__`` so that torch.compile inlines it without a graph break.
    """

    __slots__ = ("name", "library", "qualname", "packet", "reference", "_fn", "_out", "_tensor", "__weakref__")

    def __init__(self, name: str, library: LoadedLibrary | None, fn: Callable[..., Any], packet: Any,
                 reference: Callable[..., Any] | None, out: Callable[..., Any] | None = None,
                 tensor: type | None = None) -> None:
        self.name = name
        self.library = library
        self.qualname = f"{library.namespace}::{name}" if library else f"reference::{name}"
        self.packet = packet
        self.reference = reference
        self._fn = fn
        self._out = out
        self._tensor = tensor  # set when the op has Scalar overloads (torch.Tensor)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # A second argument that is not a tensor (a Python number) goes to the packet, which picks
        # foo.Scalar / foo.Scalar_out, as torch.add treats a number; tensors, 0-dim ones included,
        # take the Tensor overloads directly.
        if self._tensor is not None and (len(args) < 2 or not isinstance(args[1], self._tensor)):
            return self.packet(*args, **kwargs)
        if self._out is not None and "out" in kwargs:
            return self._out(*args, **kwargs)
        return self._fn(*args, **kwargs)

    def __repr__(self) -> str:
        where = f"{self.library.target}, key {self.library.key[:12]}" if self.library else "PyTorch fallback"
        return f"<jitops op {self.qualname} ({where})>"

    @property
    def default(self) -> Any:
        return self.packet.default

    @property
    def namespace(self) -> str | None:
        return self.library.namespace if self.library else None


def op_from_library(lib: LoadedLibrary, name: str) -> Op:
    import torch

    packet = getattr(getattr(torch.ops, lib.namespace), name)
    overloads = set(packet.overloads())
    if "default" in overloads and overloads <= {"default", "out", "Scalar", "Scalar_out"}:
        # Call the overloads directly: the packet's overload resolution costs ~0.3 us per call.
        return Op(name, lib, packet.default, packet, reference_for(lib.spec, name),
                  packet.out if "out" in overloads else None, torch.Tensor if "Scalar" in overloads else None)
    return Op(name, lib, packet, packet, reference_for(lib.spec, name))


def reference_for(spec: OpSpec, name: str) -> Callable[..., Any] | None:
    if not spec.python:
        return None
    return getattr(importlib.import_module(spec.python), "REFERENCES", {}).get(name)


def ops_in_namespace(namespace: str) -> list[str]:
    """Op names registered in ``namespace`` (overloads folded), from the dispatcher."""
    import torch

    prefix = namespace + "::"
    names = {n[len(prefix):].split(".", 1)[0] for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix)}
    return sorted(names)
