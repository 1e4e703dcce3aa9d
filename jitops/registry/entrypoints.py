"""Kernel packages: third-party distributions that ship kernels for ``jitops.get``.

A package declares its kernel libraries in the ``jitops.kernels`` entry-point
group, in the same spec format as the builtins::

    [project.entry-points."jitops.kernels"]
    mykernels = "mykernels:SPECS"   # an OpSpec, an iterable of OpSpecs, or a function returning one

Entry points are read lazily: when ``jitops.get`` misses an unknown name and
when ``jitops.list_ops`` runs, never at import. Each entry point is loaded at
most once per process; a broken one is logged (once) and skipped, so one bad
package cannot break the others or the builtins.

Imports: spec.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from importlib import metadata

from ..spec import OpSpec, Registry

log = logging.getLogger("jitops")

GROUP = "jitops.kernels"


def _specs_of(obj: object) -> list[OpSpec]:
    if callable(obj) and not isinstance(obj, OpSpec):
        obj = obj()
    if isinstance(obj, OpSpec):
        return [obj]
    if isinstance(obj, Iterable) and not isinstance(obj, (str, bytes)):
        items = list(obj)
        if all(isinstance(s, OpSpec) for s in items):
            return items
    raise TypeError(f"expected a jitops.OpSpec or an iterable of them, got {type(obj).__name__}")


def load_entry_points(registry: Registry, seen: set[str]) -> bool:
    """Register the specs of every ``jitops.kernels`` entry point not in ``seen``.

    ``seen`` (entry points already handled, loaded or broken) is updated.
    Returns True if any spec was added.
    """
    added = False
    for ep in metadata.entry_points(group=GROUP):
        dist = ep.dist.name if ep.dist is not None else "unknown distribution"
        ident = f"{dist}:{ep.name}={ep.value}"
        if ident in seen:
            continue
        seen.add(ident)
        try:
            specs = _specs_of(ep.load())
        except Exception as e:  # noqa: BLE001 - a broken package must not break jitops
            log.warning(
                "ignoring kernel package entry point %r (%s) from %s: %s: %s",
                ep.name,
                ep.value,
                dist,
                type(e).__name__,
                e,
            )
            continue
        for spec in specs:
            spec = dataclasses.replace(spec, origin=f"package {dist}")
            try:
                registry.add(spec)
            except ValueError as e:
                log.warning("ignoring kernel library %r from package %s: %s", spec.name, dist, e)
                continue
            added = True
    return added
