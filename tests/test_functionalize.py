"""Functionalize kernels (jitops/functionalize.py) on a library defined in Python: no compiler needed.

The kernels here are torch calls registered for CPU, so the tests exercise the
pairing, registration, opcheck and torch.compile path in seconds; the compiled
add library gets the same checks in test_kernels.py.
"""

from __future__ import annotations

import itertools
import logging

import pytest
import torch

from jitops.loading import functionalize

_count = itertools.count()


def _scale_library() -> tuple[str, torch.library.Library, torch.library.Library]:
    """A fresh namespace with scale, scale.out and scale_ (CPU kernels and fakes)."""
    ns = f"jitops_test_fz{next(_count)}"
    lib = torch.library.Library(ns, "DEF")
    lib.define("scale(Tensor x, float s) -> Tensor")
    lib.define("scale.out(Tensor x, float s, *, Tensor(a!) out) -> Tensor(a!)")
    lib.define("scale_(Tensor(a!) x, float s) -> Tensor(a!)")
    lib.impl("scale", lambda x, s: x * s, "CPU")
    lib.impl("scale.out", lambda x, s, *, out: torch.mul(x, s, out=out), "CPU")
    lib.impl("scale_", lambda x, s: x.mul_(s), "CPU")
    torch.library.register_fake(f"{ns}::scale", lambda x, s: torch.empty_like(x), lib=lib)
    torch.library.register_fake(f"{ns}::scale.out", lambda x, s, *, out: out, lib=lib)
    torch.library.register_fake(f"{ns}::scale_", lambda x, s: x, lib=lib)
    return ns, lib, torch.library.Library(ns, "IMPL")


def test_registered_kernels_pass_opcheck_and_compile() -> None:
    ns, _lib, impl = _scale_library()
    assert functionalize.register(ns, ["scale", "scale_"], impl) == ["scale.out", "scale_"]
    ops = getattr(torch.ops, ns)
    x = torch.randn(3, 4)
    torch.library.opcheck(ops.scale_.default, (x.clone(), 2.0))
    torch.library.opcheck(ops.scale.out, (x, 2.0), {"out": torch.empty(3, 4)})

    def f(a: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        b = a + 1
        ops.scale_(b, 3.0)
        ops.scale.out(b, 0.5, out=o)
        ops.scale_(a, -1.0)
        return b

    a, o = torch.randn(5), torch.zeros(5)
    ae, oe, ac, oc = a.clone(), o.clone(), a.clone(), o.clone()
    want = f(ae, oe)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(ac, oc)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(ac, ae)
    torch.testing.assert_close(oc, oe)
    assert functionalize.register(ns, ["scale", "scale_"], impl) == []  # registered once


def test_without_the_torch_internals_eager_still_works(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ns, _lib, impl = _scale_library()
    monkeypatch.delattr(torch, "_functionalize_replace")
    with caplog.at_level(logging.WARNING, logger="jitops"):
        assert functionalize.register(ns, ["scale", "scale_"], impl) == []
    assert (
        "torch._functionalize_replace" in caplog.text and "not inside torch.compile" in caplog.text
    )
    x = torch.ones(3)
    getattr(torch.ops, ns).scale_(x, 2.0)
    assert x.tolist() == [2.0, 2.0, 2.0]


def test_overloads_pair_with_their_namesakes() -> None:
    """torch's convention: add_.Scalar and add.Scalar_out pair with add.Scalar, add.out and add_ with add."""
    schemas = [
        torch._C.parse_schema(s)
        for s in (
            "ns::add(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
            "ns::add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)",
            "ns::add_(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)",
            "ns::add.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",
            "ns::add.Scalar_out(Tensor self, Scalar other, Scalar alpha=1, *, Tensor(a!) out) -> Tensor(a!)",
            "ns::add_.Scalar(Tensor(a!) self, Scalar other, Scalar alpha=1) -> Tensor(a!)",
            "ns::add_.Other(Tensor(a!) self, int other) -> Tensor(a!)",  # no add.Other: left alone
        )
    ]
    found = {p.mutable: (p.functional, p.written) for p in functionalize.pairings(schemas)}
    assert found == {
        "add.out": ("add", "out"),
        "add_": ("add", "self"),
        "add.Scalar_out": ("add.Scalar", "out"),
        "add_.Scalar": ("add.Scalar", "self"),
    }
