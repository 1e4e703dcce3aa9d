"""Subpackage ``jitops.registry`` (stage 5): which ops this process knows. Owns: this module
(``register`` -> ``Registration``, ``find``, ``lookup``, ``list_ops``, ``registry``) and ``entrypoints``
(third-party kernel packages, ``load_entry_points``). May import: ``jitops.kernels`` and the stages below it
(spec, base, errors, _version).

This module: Op names -> specs for this process: the builtins, kernel packages' entry points, and
what :func:`register` added. ``register`` returns a handle whose ``undo()`` takes it back.

The loader's memo needs no callback from here: it remembers the spec object
each op was built from and compares it with :func:`find` on every call.

Imports: errors, spec (entrypoints and kernels lazily).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from ..errors import UnknownOpError
from ..spec import OpSpec, Registry, validate_name

REGISTRY = Registry()
_builtins_loaded = False
_entry_points_seen: set[str] = set()
_lock = threading.RLock()


def _reset_after_fork() -> None:
    global _lock
    _lock = threading.RLock()


os.register_at_fork(after_in_child=_reset_after_fork)


def registry() -> Registry:
    global _builtins_loaded
    if not _builtins_loaded:
        with _lock:
            if not _builtins_loaded:
                from ..kernels import BUILTINS

                REGISTRY.extend(BUILTINS)
                _builtins_loaded = True
    return REGISTRY


def find(name: str) -> OpSpec | None:
    """The spec exporting ``name`` now, without loading anything (the loader memo's check)."""
    return REGISTRY.find(name)


def lookup(name: str) -> OpSpec:
    """The spec exporting op ``name``; on a miss, kernel packages' entry points are read first."""
    try:
        return registry().lookup(name)
    except UnknownOpError:
        if not load_entry_points():
            raise
    return registry().lookup(name)


def load_entry_points() -> bool:
    from .entrypoints import load_entry_points as _load

    with _lock:
        return _load(registry(), _entry_points_seen)


def list_ops() -> list[str]:
    load_entry_points()
    return registry().names()


@dataclass
class Registration:
    """What :func:`register` did; ``undo()`` restores the registry as it was (also as a context manager)."""

    spec: OpSpec
    previous: OpSpec | None
    undone: bool = field(default=False, repr=False)

    def undo(self) -> None:
        with _lock:
            if self.undone:
                return
            self.undone = True
            if self.previous is not None:
                REGISTRY.add(self.previous, replace=True)
            else:
                REGISTRY.remove(self.spec.name)

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


def register(spec: OpSpec, *, replace: bool = False) -> Registration:
    """Make a kernel library reachable through ``get``. Returns a handle that undoes it."""
    validate_name(spec.name, "library name")
    reg = registry()
    with _lock:
        previous = reg.get_library(spec.name)
        reg.add(spec, replace=replace)
    return Registration(spec, previous)
