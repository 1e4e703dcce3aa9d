"""Python side of the softmax library: references, fake kernels, autograd."""

from __future__ import annotations

import torch

from .._autograd import define_twin

_FLOATS = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float64: "float64"}


def check_input(op: str, x: torch.Tensor, dim: int) -> None:
    """The C++ TORCH_CHECKs of softmax_common.h, word for word."""
    torch._check(
        x.dtype in _FLOATS,
        lambda: f"{op}: expected a float16, bfloat16, float32 or float64 tensor, got {str(x.dtype).removeprefix('torch.')}",
    )
    ndim = max(x.dim(), 1)
    torch._check(-ndim <= dim < ndim, lambda: f"{op}: dim {dim} is out of range for a tensor with {x.dim()} dimensions")


def _shifted(op: str, x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x - max(x)`` along ``dim``, widened to float for half/bfloat16 (never overflows exp)."""
    check_input(op, x, dim)
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return xf - xf.amax(dim=dim, keepdim=True)


def softmax_reference(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Pure PyTorch, numerically stable; accumulates half/bfloat16 in float."""
    if x.numel() == 0:
        check_input("softmax", x, dim)
        return torch.empty_like(x)
    e = _shifted("softmax", x, dim).exp()
    return (e / e.sum(dim=dim, keepdim=True)).to(x.dtype)


def log_softmax_reference(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Pure PyTorch, numerically stable; accumulates half/bfloat16 in float."""
    if x.numel() == 0:
        check_input("log_softmax", x, dim)
        return torch.empty_like(x)
    shifted = _shifted("log_softmax", x, dim)
    return (shifted - shifted.exp().sum(dim=dim, keepdim=True).log()).to(x.dtype)


REFERENCES = {"softmax": softmax_reference, "log_softmax": log_softmax_reference}


def register(ns: str) -> None:
    """Fake kernels and autograd for one loaded build (namespace ``ns``).

    The derivatives live on the twins ``softmax_autograd`` and
    ``log_softmax_autograd``; the C++ Autograd kernels of ``softmax`` and
    ``log_softmax`` call them only when an input requires grad.
    """
    ops = getattr(torch.ops, ns)

    def setup_context(ctx, inputs, output):  # type: ignore[no-untyped-def]
        ctx.dim = inputs[1]
        ctx.save_for_backward(output)

    for name in ("softmax", "log_softmax"):

        def fake(x: torch.Tensor, dim: int = -1, _name: str = name) -> torch.Tensor:
            check_input(_name, x, dim)
            return x.new_empty(x.shape)

        backward_op = getattr(ops, f"{name}_backward").default

        def backward(ctx, grad, _op=backward_op):  # type: ignore[no-untyped-def]
            (out,) = ctx.saved_tensors
            return _op(grad, out, ctx.dim), None

        torch.library.register_fake(f"{ns}::{name}", fake)
        define_twin(ns, name, fake, backward, setup_context)

    for name in ("softmax_backward", "log_softmax_backward"):

        def fake_backward(grad: torch.Tensor, out: torch.Tensor, dim: int) -> torch.Tensor:
            return out.new_empty(out.shape)

        torch.library.register_fake(f"{ns}::{name}", fake_backward)
