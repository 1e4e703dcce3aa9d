"""Test-only op libraries for the fake builder (``JITOPS_BUILDER=fake``).

The fake builder compiles a tiny real shared library with no torch kernels
in it, so the kernels of these specs are registered from Python
(CompositeExplicitAutograd): every process that gets one of these ops can call
it and check the answer, which is what the race, kill and corruption tests
count. ``fakeadd`` is ``x + 1``; ``fakemul`` is ``x * 2``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from jitops import OpSpec

_HERE = Path(__file__).parent


def _spec(name: str) -> OpSpec:
    return OpSpec(
        name=name,
        root=_HERE,
        cpu_sources=("fake.cpp",),
        schemas=(f"{name}(Tensor x) -> Tensor",),
        python=__name__,
        origin="test",
    )


FAKEADD = _spec("fakeadd")
FAKEMUL = _spec("fakemul")
SPECS = (FAKEADD, FAKEMUL)

_IMPLS = {"fakeadd": lambda x: x + 1, "fakemul": lambda x: x * 2}
REFERENCES = dict(_IMPLS)


def register(ns: str) -> None:
    """Kernels for one loaded fake build (namespace ``ns``)."""
    for name, fn in _IMPLS.items():
        if hasattr(torch.ops, ns) and ns.startswith(f"jitops_{name}_"):
            torch.library.impl(f"{ns}::{name}", "CompositeExplicitAutograd")(fn)


def register_all() -> None:
    """Make both fake libraries reachable through ``jitops.get``."""
    import jitops

    for spec in SPECS:
        jitops.register(spec, replace=True)


def check(op, name: str) -> bool:  # type: ignore[no-untyped-def]
    """True if ``op`` computes what ``name`` should."""
    x = torch.arange(4.0)
    return bool(torch.equal(op(x), _IMPLS[name](x)))
