"""Parity of jitops's softmax / log_softmax with torch's: every call torch accepts, the same numbers.

For each op, every dtype torch supports for it on CPU (float16, bfloat16,
float32, float64), a grid of shapes and dims (0-d, 1-element, empty, short
and long rows, middle dims, non-contiguous views, -inf/huge values), with and
without ``dtype=``: the forward and the input gradient are compared with
torch's under ``torch.testing.assert_close``'s default tolerances for the
dtype, and in ulps: on CPU the results are bit-identical to torch's, forward
and backward, every dim (jitops follows ATen's own kernels step by step). Where torch raises, jitops raises the same exception type
with a message naming the op and the offending value.

The same grid runs on CUDA (``cuda`` marker, skipped without a GPU) against
torch on the same device, within a looser ulp bound: summation orders differ.
The library is built once per session (session cache, tests/conftest.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import jitops

pytestmark = pytest.mark.compile

OPS = ["softmax", "log_softmax"]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]

# (shape, dim, layout): layout "t" transposes the last two dims of a contiguous
# tensor (same values, permuted strides), "s" takes every other column.
SHAPES: list[tuple[tuple[int, ...], int, str]] = [
    ((), 0, ""),
    ((), -1, ""),
    ((1,), 0, ""),
    ((7,), 0, ""),
    ((0,), 0, ""),
    ((4, 0), -1, ""),
    ((0, 5), 0, ""),
    ((3, 0, 2), 1, ""),
    ((5, 5), -1, ""),
    ((5, 5), 0, ""),
    ((3, 17), -1, ""),
    ((5, 10, 5), 0, ""),
    ((5, 10, 5), 1, ""),
    ((5, 10, 5), 2, ""),
    ((2, 33, 40), 1, ""),
    ((64, 1000), -1, ""),
    ((8, 2048), -1, ""),
    ((300, 70), 0, ""),
    ((4, 5, 6, 7), 2, ""),
    ((5, 1), 1, ""),
    ((64, 33), 0, "t"),
    ((64, 33), -1, "t"),
    ((6, 16), -1, "s"),
    ((6, 16), 0, "s"),
]


def _dtype_args(dt: torch.dtype) -> list[torch.dtype | None]:
    return {
        torch.float16: [None, torch.float32],
        torch.bfloat16: [None, torch.float32],
        torch.float32: [None, torch.float64],
        torch.float64: [None],
    }[dt]


CASES = [
    pytest.param(
        name,
        dt,
        shape,
        dim,
        layout,
        out_dt,
        id=f"{name}-{str(dt)[6:]}-{'x'.join(map(str, shape)) or 'scalar'}-d{dim}{layout}-{str(out_dt)[6:] if out_dt else 'nodtype'}",
    )
    for name in OPS
    for dt in FLOATS
    for shape, dim, layout in SHAPES
    for out_dt in _dtype_args(dt)
]


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns mapped to integers that are monotonic in the float value (so a difference counts ulps)."""
    itype = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    bits = t.contiguous().view(itype).to(torch.int64)
    sign = torch.tensor(1, dtype=torch.int64) << (8 * t.element_size() - 1)
    return torch.where(bits < 0, -(bits & (sign - 1)), bits)


def max_ulp(got: torch.Tensor, want: torch.Tensor) -> int:
    """Largest distance in ulps between finite values; NaN must sit where torch has NaN."""
    got, want = got.detach().cpu(), want.detach().cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), "NaN in different places"
    if not got.numel():
        return 0
    d = (_ordered(got) - _ordered(want)).abs()
    return int(d[~nan].max()) if (~nan).any() else 0


def make_input(
    shape: tuple[int, ...], layout: str, dtype: torch.dtype, device: str, seed: int
) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    base = shape
    if layout == "t":
        base = shape[:-2] + (shape[-1], shape[-2])
    elif layout == "s":
        base = shape[:-1] + (shape[-1] * 2,)
    x = torch.randn(base, generator=g, dtype=torch.float64) * 4
    if x.numel() >= 12:  # -inf and large values, as real logits have
        flat = x.view(-1)
        flat[3] = float("-inf")
        flat[7] = 60.0
    x = x.to(dtype).to(device)
    if layout == "t":
        x = x.transpose(-1, -2)
    elif layout == "s":
        x = x[..., ::2]
    assert x.shape == shape
    return x


def ulp_bound(device: str, dtype: torch.dtype) -> int | None:
    """Largest ulp distance allowed from torch; None: only assert_close's tolerances."""
    if device == "cpu":
        return 0  # bit-identical: jitops's CPU kernels follow ATen's step by step, for every dim
    # CUDA sums in another order than torch: ~eps * log2(n) relative, which rounds to at most
    # 2 ulps in half types; in float32/64 that many ulps is not bounded, assert_close covers it.
    return 2 if dtype in (torch.float16, torch.bfloat16) else None


def check_case(
    device: str,
    name: str,
    dt: torch.dtype,
    shape: tuple[int, ...],
    dim: int,
    layout: str,
    out_dt: torch.dtype | None,
) -> None:
    op, ref = jitops.get(name, device=device), getattr(torch, name)
    x = make_input(shape, layout, dt, device, seed=len(shape) * 31 + dim)
    kwargs: dict[str, Any] = {} if out_dt is None else {"dtype": out_dt}
    xa = x.detach().clone().requires_grad_()
    xb = x.detach().clone().requires_grad_()
    got, want = op(xa, dim, **kwargs), ref(xb, dim, **kwargs)
    assert (
        got.dtype == want.dtype == (out_dt or dt)
        and got.shape == want.shape
        and got.device == want.device
    )
    torch.testing.assert_close(got, want, equal_nan=True)
    bound = ulp_bound(device, got.dtype)
    if bound is not None:
        assert max_ulp(got, want) <= bound, (
            f"forward differs from torch by {max_ulp(got, want)} ulp (bound {bound})"
        )

    if got.numel() == 0:
        return
    g = (
        torch.randn(got.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        .to(got.dtype)
        .to(device)
    )
    got.backward(g)
    want.backward(g)
    assert xa.grad is not None and xb.grad is not None
    # the gradient flows back to the input dtype, as torch's
    assert xa.grad.dtype == xb.grad.dtype == dt
    # The backward kernel against torch's, from the same output: bit-identical on CPU.
    backward_data = (
        torch._softmax_backward_data if name == "softmax" else torch._log_softmax_backward_data
    )
    torch_from_ours = backward_data(g, got.detach(), dim, got.dtype).to(dt)
    torch.testing.assert_close(xa.grad, torch_from_ours, equal_nan=True)
    # (on CUDA, y * (g - sum) near cancellation turns the sum's order into many ulps)
    if device == "cpu":
        assert max_ulp(xa.grad, torch_from_ours) == 0, "backward kernel differs from torch's"
    # End to end: where the forwards agree bit for bit, so must the gradients. (Elsewhere an ulp
    # of the output can move a gradient near cancellation, y * (g - sum), by much more.)
    if torch.equal(got.detach().nan_to_num(), want.detach().nan_to_num()):
        torch.testing.assert_close(xa.grad, xb.grad, equal_nan=True)


@pytest.mark.parametrize("name,dt,shape,dim,layout,out_dt", CASES)
def test_parity_cpu(
    name: str,
    dt: torch.dtype,
    shape: tuple[int, ...],
    dim: int,
    layout: str,
    out_dt: torch.dtype | None,
) -> None:
    check_case("cpu", name, dt, shape, dim, layout, out_dt)


@pytest.mark.cuda
@pytest.mark.parametrize("name,dt,shape,dim,layout,out_dt", CASES)
def test_parity_cuda(
    name: str,
    dt: torch.dtype,
    shape: tuple[int, ...],
    dim: int,
    layout: str,
    out_dt: torch.dtype | None,
) -> None:
    check_case("cuda", name, dt, shape, dim, layout, out_dt)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("name", OPS)
def test_integer_input_with_dtype_works_as_in_torch(device: str, name: str) -> None:
    x = torch.arange(12, device=device).reshape(3, 4)
    got = jitops.get(name, device=device)(x, -1, dtype=torch.float32)
    want = getattr(torch, name)(x, -1, dtype=torch.float32)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want)
    if device == "cpu":
        assert max_ulp(got, want) == 0


# Calls torch refuses, and the exception type it raises: jitops raises the same type.
ERRORS = [
    (
        "int input",
        lambda: (torch.arange(3), 0, {}),
        NotImplementedError,
        r"expected a float16, bfloat16, float32 or float64 tensor, got int64",
    ),
    (
        "bool input",
        lambda: (torch.ones(3, dtype=torch.bool), 0, {}),
        NotImplementedError,
        r"got bool",
    ),
    (
        "complex input",
        lambda: (torch.ones(3, dtype=torch.complex64), 0, {}),
        NotImplementedError,
        r"got complex64",
    ),
    (
        "integer dtype",
        lambda: (torch.ones(3), 0, {"dtype": torch.int64}),
        NotImplementedError,
        r"float64 dtype, got int64",
    ),
    (
        "dim too large",
        lambda: (torch.ones(3), 1, {}),
        IndexError,
        r"dim 1 is out of range for a tensor with 1 dimensions",
    ),
    (
        "dim too small",
        lambda: (torch.ones(2, 3), -3, {}),
        IndexError,
        r"dim -3 is out of range for a tensor with 2 dimensions",
    ),
    (
        "0-d, dim 1",
        lambda: (torch.tensor(1.0), 1, {}),
        IndexError,
        r"dim 1 is out of range for a tensor with 0 dimensions",
    ),
]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("case", ERRORS, ids=[e[0] for e in ERRORS])
def test_raises_where_torch_raises(device: str, name: str, case: Any) -> None:
    _, make, exc, message = case
    x, dim, kwargs = make()
    x = x.to(device)
    with pytest.raises(exc):
        getattr(torch, name)(x, dim, **kwargs)
    with pytest.raises(exc, match=f"^{name}: .*{message}"):
        jitops.get(name, device=device)(x, dim, **kwargs)
