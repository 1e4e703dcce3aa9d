"""Python side of the add library: reference, fake kernels, autograd.

Overloads, named after torch's native ones: ``add`` (Tensor other; torch's
``add.Tensor``), ``add.out``, ``add_``, and ``add.Scalar``, ``add.Scalar_out``,
``add_.Scalar`` (a Python number as ``other``). Imports only torch and the
sibling ``_autograd`` module.
"""

from __future__ import annotations

from typing import Any

import torch

from .._autograd import define_twin, register_fake

_SUPPORTED = {
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex32,
    torch.complex64,
    torch.complex128,
}
_SUPPORTED_TEXT = (
    "bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64, complex32, "
    "complex64, complex128"
)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _alpha_text(alpha: object) -> str:
    if isinstance(alpha, complex):
        return "a complex number"
    return f"{alpha:g}" if isinstance(alpha, float) else str(alpha)


def _is_integral_alpha(alpha: object) -> bool:
    return isinstance(alpha, (bool, int)) or (isinstance(alpha, torch.SymInt))


def check_inputs(
    op: str,
    self: torch.Tensor,
    other: Any,
    alpha: object,
    out: torch.Tensor | None = None,
    out_name: str = "",
) -> torch.dtype:
    """The C++ checks of add_common.h, word for word; returns the computation dtype.

    ``other`` is a tensor or a Python number (the Scalar overloads)."""
    other_t = other if isinstance(other, torch.Tensor) else torch.empty(())
    shape = broadcast_shape(op, self, other_t)
    dtype = torch.result_type(self, other)
    torch._check(
        dtype in _SUPPORTED,
        lambda: (
            f"{op}: the result dtype {_name(dtype)} is not supported (torch.add has no kernel for it either); "
            f"supported: {_SUPPORTED_TEXT}"
        ),
    )
    torch._check(
        not isinstance(alpha, bool) or dtype == torch.bool,
        lambda: f"{op}: alpha is a bool, but the result dtype {_name(dtype)} is not bool",
    )
    torch._check(
        dtype.is_floating_point or dtype.is_complex or _is_integral_alpha(alpha),
        lambda: (
            f"{op}: alpha must be an integer when the result dtype is {_name(dtype)}, got {_alpha_text(alpha)}"
        ),
    )
    torch._check(
        dtype.is_complex or not isinstance(alpha, complex),
        lambda: f"{op}: alpha is complex, but the result dtype {_name(dtype)} is not",
    )
    if out is not None:
        torch._check(
            torch.can_cast(dtype, out.dtype),
            lambda: (
                f"{op}: result dtype {_name(dtype)} cannot be cast to {out_name}'s dtype {_name(out.dtype)}"
            ),
        )
        if out_name == "self":
            torch._check(
                list(out.shape) == shape,
                lambda: (
                    f"{op}: the broadcast shape {shape} differs from self's shape {list(out.shape)}"
                ),
            )
    return dtype


def broadcast_shape(op: str, self: torch.Tensor, other: torch.Tensor) -> list[int]:
    n = max(self.dim(), other.dim())
    shape = [0] * n
    for i in range(-1, -n - 1, -1):
        a = self.shape[i] if i >= -self.dim() else 1
        b = other.shape[i] if i >= -other.dim() else 1
        torch._check(
            a == b or a == 1 or b == 1,
            lambda: (
                f"{op}: self of shape {list(self.shape)} and other of shape {list(other.shape)} "
                f"cannot be broadcast together (dim {i}: {a} vs {b})"
            ),
        )
        shape[n + i] = b if a == 1 else a
    return shape


def add_reference(
    self: torch.Tensor, other: Any, *, alpha: Any = 1, out: torch.Tensor | None = None
) -> torch.Tensor:
    """torch.add itself, behind jitops's checks: the kernel's contract is to be bit-identical to it on CPU."""
    check_inputs("add", self, other, alpha, out, "out")
    if out is None:
        return torch.add(self, other, alpha=alpha)
    return torch.add(self, other, alpha=alpha, out=out)


def add_inplace_reference(self: torch.Tensor, other: Any, *, alpha: Any = 1) -> torch.Tensor:
    check_inputs("add_", self, other, alpha, self, "self")
    return self.add_(other, alpha=alpha)


REFERENCES = {"add": add_reference, "add_": add_inplace_reference}


def _grad_for(grad: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """torch's handle_r_to_c plus the broadcast reduction: a real input gets the real part of a complex grad."""
    if grad.is_complex() and not dtype.is_complex:
        grad = torch.real(grad)
    return grad.sum_to_size(shape).to(dtype)


def register(ns: str) -> None:
    """Fake kernels and autograd for one loaded build (namespace ``ns``)."""

    def fake_add(self: torch.Tensor, other: torch.Tensor, *, alpha: Any = 1) -> torch.Tensor:
        check_inputs("add", self, other, alpha)
        # under FakeTensorMode: metadata (shape, dtype, strides) only
        return torch.add(self, other, alpha=alpha)

    def fake_add_out(
        self: torch.Tensor, other: torch.Tensor, *, alpha: Any = 1, out: torch.Tensor
    ) -> torch.Tensor:
        check_inputs("add", self, other, alpha, out, "out")
        return torch.add(self, other, alpha=alpha, out=out)

    def fake_add_(self: torch.Tensor, other: torch.Tensor, *, alpha: Any = 1) -> torch.Tensor:
        check_inputs("add_", self, other, alpha, self, "self")
        return self.add_(other, alpha=alpha)

    def fake_add_scalar(self: torch.Tensor, other: Any, alpha: Any = 1) -> torch.Tensor:
        check_inputs("add", self, other, alpha)
        return torch.add(self, other, alpha=alpha)

    def fake_add_scalar_out(
        self: torch.Tensor, other: Any, alpha: Any = 1, *, out: torch.Tensor
    ) -> torch.Tensor:
        check_inputs("add", self, other, alpha, out, "out")
        return torch.add(self, other, alpha=alpha, out=out)

    def fake_add_scalar_(self: torch.Tensor, other: Any, alpha: Any = 1) -> torch.Tensor:
        check_inputs("add_", self, other, alpha, self, "self")
        return self.add_(other, alpha=alpha)

    for overload, fake in (
        ("add", fake_add),
        ("add.out", fake_add_out),
        ("add_", fake_add_),
        ("add.Scalar", fake_add_scalar),
        ("add.Scalar_out", fake_add_scalar_out),
        ("add_.Scalar", fake_add_scalar_),
    ):
        register_fake(f"{ns}::{overload}", fake)

    # torch's derivatives.yaml: self gets grad, other gets grad * conj(alpha), each reduced to its
    # shape and made real for a real input (handle_r_to_c).
    def setup_context(ctx, inputs, keyword_only_inputs, output):  # type: ignore[no-untyped-def]
        self, other = inputs
        ctx.alpha = keyword_only_inputs.get("alpha", 1)
        ctx.meta = (self.shape, self.dtype, other.shape, other.dtype)

    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        s_shape, s_dtype, o_shape, o_dtype = ctx.meta
        g_self = _grad_for(grad, s_shape, s_dtype) if ctx.needs_input_grad[0] else None
        g_other = None
        if ctx.needs_input_grad[1]:
            alpha = ctx.alpha.conjugate() if isinstance(ctx.alpha, complex) else ctx.alpha
            g_other = _grad_for(grad if alpha == 1 else grad * alpha, o_shape, o_dtype)
        return g_self, g_other

    def setup_context_scalar(ctx, inputs, output):  # type: ignore[no-untyped-def]
        ctx.meta = (inputs[0].shape, inputs[0].dtype)

    def backward_scalar(ctx, grad):  # type: ignore[no-untyped-def]
        return (_grad_for(grad, *ctx.meta) if ctx.needs_input_grad[0] else None), None, None

    define_twin(ns, "add", fake_add, backward, setup_context)
    define_twin(
        ns, "add", fake_add_scalar, backward_scalar, setup_context_scalar, overload="Scalar"
    )
