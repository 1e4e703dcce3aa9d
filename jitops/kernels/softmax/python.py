"""Python side of the softmax library: references, fake kernels, autograd.

Imports only torch and the sibling ``_autograd`` module.
"""

from __future__ import annotations

from typing import Any

import torch

from .._autograd import define_twin, register_fake

_FLOATS = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_input(
    op: str, x: torch.Tensor, dim: int, dtype: torch.dtype | None = None
) -> torch.dtype:
    """The C++ checks of softmax_common.h (``checked_input``), word for word and with torch's
    exception types (NotImplementedError for a dtype, IndexError for a dim); returns the result dtype."""
    st = x.dtype if dtype is None else dtype
    torch._check_not_implemented(
        st in _FLOATS,
        lambda: (
            f"{op}: expected a float16, bfloat16, float32 or float64 {'dtype' if dtype is not None else 'tensor'}, "
            f"got {_name(st)}"
            + ("" if dtype is not None else ". Fix: convert the input, or pass dtype=torch.float32")
        ),
    )
    ndim = max(x.dim(), 1)
    torch._check_index(
        -ndim <= dim < ndim,
        lambda: f"{op}: dim {dim} is out of range for a tensor with {x.dim()} dimensions",
    )
    return st


def check_backward(op: str, grad: torch.Tensor, out: torch.Tensor, dim: int) -> None:
    """The C++ ``check_backward`` of softmax_common.h, word for word."""
    torch._check(
        out.dtype in _FLOATS,
        lambda: (
            f"{op}: expected a float16, bfloat16, float32 or float64 output, got {_name(out.dtype)}"
        ),
    )
    torch._check(
        grad.dtype == out.dtype,
        lambda: (
            f"{op}: grad and out must have the same dtype, got {_name(grad.dtype)} and {_name(out.dtype)}"
        ),
    )
    torch._check(
        grad.shape == out.shape,
        lambda: (
            f"{op}: grad and out must have the same shape, got {list(grad.shape)} and {list(out.shape)}"
        ),
    )
    ndim = max(out.dim(), 1)
    torch._check_index(
        -ndim <= dim < ndim,
        lambda: f"{op}: dim {dim} is out of range for a tensor with {out.dim()} dimensions",
    )


def _shifted(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x - max(x)`` along ``dim``, widened to float for half/bfloat16 (never overflows exp)."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return xf - xf.amax(dim=dim, keepdim=True)


def softmax_reference(
    x: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Pure PyTorch, numerically stable; accumulates half/bfloat16 in float."""
    x = x.to(check_input("softmax", x, dim, dtype))
    if x.numel() == 0:
        return torch.empty_like(x)
    e = _shifted(x, dim).exp()
    return (e / e.sum(dim=dim, keepdim=True)).to(x.dtype)


def log_softmax_reference(
    x: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Pure PyTorch, numerically stable; accumulates half/bfloat16 in float."""
    x = x.to(check_input("log_softmax", x, dim, dtype))
    if x.numel() == 0:
        return torch.empty_like(x)
    shifted = _shifted(x, dim)
    return (shifted - shifted.exp().sum(dim=dim, keepdim=True).log()).to(x.dtype)


REFERENCES = {"softmax": softmax_reference, "log_softmax": log_softmax_reference}


def register(ns: str) -> None:
    """Fake kernels and autograd for one loaded build (namespace ``ns``).

    The derivatives live on the twins ``softmax_autograd`` and
    ``log_softmax_autograd``; the C++ Autograd kernels of ``softmax`` and
    ``log_softmax`` call them only when an input requires grad. As torch's,
    the gradient is computed in the result's dtype and flows back to the
    input's dtype (``dtype=`` casts first).
    """
    ops = getattr(torch.ops, ns)

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        ctx.dim = inputs[1]
        ctx.input_dtype = inputs[0].dtype
        ctx.save_for_backward(output)

    for name in ("softmax", "log_softmax"):

        def fake(
            x: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None, _name: str = name
        ) -> torch.Tensor:
            st = check_input(_name, x, dim, dtype)
            return torch.empty(x.shape, dtype=st, device=x.device)

        backward_op = getattr(ops, f"{name}_backward").default

        def backward(
            ctx: Any, grad: torch.Tensor, _op: Any = backward_op
        ) -> tuple[Any, None, None]:
            (out,) = ctx.saved_tensors
            return _op(grad.to(out.dtype), out, ctx.dim).to(ctx.input_dtype), None, None

        register_fake(f"{ns}::{name}", fake)
        define_twin(ns, name, fake, backward, setup_context)

    for name in ("softmax_backward", "log_softmax_backward"):

        def fake_backward(
            grad: torch.Tensor, out: torch.Tensor, dim: int, _name: str = name
        ) -> torch.Tensor:
            check_backward(_name, grad, out, dim)
            return torch.empty(out.shape, dtype=out.dtype, device=out.device)

        register_fake(f"{ns}::{name}", fake_backward)
