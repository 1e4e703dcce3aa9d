"""Python side of the add library: reference, fake kernels, autograd."""

from __future__ import annotations

import torch

from .._autograd import define_twin

_UNSIGNED_WIDE = {getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _supported(dtype: torch.dtype) -> bool:
    if dtype in _UNSIGNED_WIDE or dtype.itemsize == 1 and dtype.is_floating_point:
        return False  # float8 variants and the wide unsigned types
    return dtype.is_floating_point or (not dtype.is_complex and dtype != torch.bool)


def _alpha_text(alpha: object) -> str:
    return f"{alpha:g}" if isinstance(alpha, float) else str(alpha)


def check_inputs(op: str, self: torch.Tensor, other: torch.Tensor, alpha: object, out: torch.Tensor | None = None,
                 out_name: str = "") -> torch.dtype:
    """The C++ checks of add_common.h, word for word; returns the computation dtype."""
    torch._check(
        _supported(self.dtype) and _supported(other.dtype),
        lambda: f"{op}: expected float or integer tensors, got {_name(self.dtype)} and {_name(other.dtype)}",
    )
    shape = broadcast_shape(op, self, other)
    dtype = torch.result_type(self, other)
    torch._check(
        not isinstance(alpha, (bool, complex)),
        lambda: f"{op}: alpha must be a real number, got a {'bool' if isinstance(alpha, bool) else 'complex'}",
    )
    torch._check(
        dtype.is_floating_point or not isinstance(alpha, float),
        lambda: f"{op}: alpha must be an integer when the result dtype is {_name(dtype)}, got {_alpha_text(alpha)}",
    )
    if out is not None:
        torch._check(
            torch.can_cast(dtype, out.dtype),
            lambda: f"{op}: result dtype {_name(dtype)} cannot be cast to {out_name}'s dtype {_name(out.dtype)}",
        )
        if out_name == "self":
            torch._check(
                list(out.shape) == shape,
                lambda: f"{op}: the broadcast shape {shape} differs from self's shape {list(out.shape)}",
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
            lambda: f"{op}: self of shape {list(self.shape)} and other of shape {list(other.shape)} "
            f"cannot be broadcast together (dim {i}: {a} vs {b})",
        )
        shape[n + i] = b if a == 1 else a
    return shape


def add_reference(self: torch.Tensor, other: torch.Tensor, *, alpha: float = 1, out: torch.Tensor | None = None) -> torch.Tensor:
    """Pure PyTorch: broadcast, promote, compute (float16/bfloat16 in float), cast."""
    dtype = check_inputs("add", self, other, alpha, out, "out")
    a, b = torch.broadcast_tensors(self.to(dtype), other.to(dtype))
    if dtype in (torch.float16, torch.bfloat16):
        alpha_rounded = torch.tensor(alpha, dtype=dtype).float()  # torch rounds alpha to the dtype first
        result = (a.float() + alpha_rounded * b.float()).to(dtype)
    else:
        result = a + (b if alpha == 1 else alpha * b)
    if out is None:
        return result.clone()
    if out.shape != result.shape:
        out.resize_(result.shape)
    return out.copy_(result)


def add_inplace_reference(self: torch.Tensor, other: torch.Tensor, *, alpha: float = 1) -> torch.Tensor:
    check_inputs("add_", self, other, alpha, self, "self")
    return self.copy_(add_reference(self, other, alpha=alpha))


REFERENCES = {"add": add_reference, "add_": add_inplace_reference}


def _reduce_to(grad: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    return grad.sum_to_size(shape).to(dtype)


def register(ns: str) -> None:
    """Fake kernels and autograd for one loaded build (namespace ``ns``)."""

    def fake_add(self: torch.Tensor, other: torch.Tensor, *, alpha: float = 1) -> torch.Tensor:
        check_inputs("add", self, other, alpha)
        return torch.add(self, other, alpha=alpha)  # under FakeTensorMode: metadata (shape, dtype, strides) only

    def fake_add_out(self: torch.Tensor, other: torch.Tensor, *, alpha: float = 1, out: torch.Tensor) -> torch.Tensor:
        check_inputs("add", self, other, alpha, out, "out")
        return torch.add(self, other, alpha=alpha, out=out)

    def fake_add_(self: torch.Tensor, other: torch.Tensor, *, alpha: float = 1) -> torch.Tensor:
        check_inputs("add_", self, other, alpha, self, "self")
        return self.add_(other, alpha=alpha)

    torch.library.register_fake(f"{ns}::add", fake_add)
    torch.library.register_fake(f"{ns}::add.out", fake_add_out)
    torch.library.register_fake(f"{ns}::add_", fake_add_)

    def setup_context(ctx, inputs, keyword_only_inputs, output):  # type: ignore[no-untyped-def]
        self, other = inputs
        ctx.alpha = keyword_only_inputs.get("alpha", 1)
        ctx.meta = (self.shape, self.dtype, other.shape, other.dtype)

    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        s_shape, s_dtype, o_shape, o_dtype = ctx.meta
        g_self = _reduce_to(grad, s_shape, s_dtype) if ctx.needs_input_grad[0] else None
        g_other = None
        if ctx.needs_input_grad[1]:
            g_other = _reduce_to(grad if ctx.alpha == 1 else grad * ctx.alpha, o_shape, o_dtype)
        return g_self, g_other

    define_twin(ns, "add", fake_add, backward, setup_context)
