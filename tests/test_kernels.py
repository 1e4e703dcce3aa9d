"""Kernel library: every op against its pure-PyTorch reference, opcheck, gradcheck, torch.compile.

Each library is built once per session (session cache, see conftest.py);
CUDA cases carry the ``cuda`` marker and are skipped without a GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jitops
from tests.helpers import DEVICES

pytestmark = pytest.mark.compile

FAST = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
TOL = {
    torch.float16: (2e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float32: (1e-5, 1e-6),
    torch.float64: (1e-12, 1e-12),
}


@pytest.fixture(scope="session")
def get() -> Callable[[str, str], Any]:
    """jitops.get for a device; builds each library at most once per session."""

    def _get(name: str, device: str) -> Any:
        return jitops.get(name, device=device)

    return _get


def _shape_and_dim(draw: Any) -> tuple[list[int], int]:
    shape = draw(st.lists(st.integers(0, 6), min_size=0, max_size=4))
    nd = max(len(shape), 1)
    return shape, draw(st.integers(-nd, nd - 1))


@st.composite
def softmax_inputs(draw: Any) -> tuple[torch.Tensor, int]:
    shape, dim = _shape_and_dim(draw)
    dtype = draw(st.sampled_from(FLOATS))
    x = torch.randn(shape, dtype=torch.float64) * draw(st.sampled_from([1.0, 30.0]))
    if x.numel() and draw(st.booleans()):  # -inf and huge values
        flat = x.view(-1)
        flat[draw(st.integers(0, flat.numel() - 1))] = float("-inf")
        flat[draw(st.integers(0, flat.numel() - 1))] = torch.finfo(dtype).max / 4
    x = x.to(dtype)
    if x.dim() >= 2 and draw(st.booleans()):  # non-contiguous: a transposed view
        x = x.transpose(0, -1).contiguous().transpose(0, -1)
        assert (
            x.dim() < 2
            or x.shape[0] == 1
            or x.shape[-1] == 1
            or not x.is_contiguous()
            or x.numel() == 0
        )
    return x, dim


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@FAST
@given(case=softmax_inputs())
def test_softmax_matches_reference(
    get: Any, device: str, name: str, case: tuple[torch.Tensor, int]
) -> None:
    x, dim = case
    x = x.to(device)
    got = get(name, device)(x, dim)
    want = jitops.reference(name)(x, dim)
    assert got.dtype == x.dtype and got.shape == x.shape
    rtol, atol = TOL[x.dtype]
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)
    if x.dtype == torch.float32:
        torch.testing.assert_close(
            got, getattr(torch, name)(x, dim), rtol=1e-5, atol=1e-6, equal_nan=True
        )


INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


@st.composite
def add_inputs(draw: Any) -> tuple[torch.Tensor, torch.Tensor, float]:
    shape = draw(st.lists(st.integers(1, 5), min_size=0, max_size=3))
    other_shape = [draw(st.sampled_from([s, 1])) for s in shape][draw(st.integers(0, len(shape))) :]
    a_dtype, b_dtype = draw(st.sampled_from(FLOATS + INTS)), draw(st.sampled_from(FLOATS + INTS))

    def make(sh: list[int], dt: torch.dtype) -> torch.Tensor:
        if dt.is_floating_point:
            return (torch.randn(sh) * 100).to(dt)
        return torch.randint(0, 50, sh).to(dt)

    a, b = make(shape, a_dtype), make(other_shape, b_dtype)
    if draw(st.booleans()):
        a, b = b, a
    if a.dim() >= 2 and draw(st.booleans()):
        a = a.transpose(0, 1).contiguous().transpose(0, 1)  # same values, transposed strides
    result = torch.result_type(a, b)
    alpha = draw(st.sampled_from([1, 2, -3, 0.5] if result.is_floating_point else [1, 2, -3]))
    return a, b, alpha


@pytest.mark.parametrize("device", DEVICES)
@FAST
@given(case=add_inputs())
def test_add_matches_reference_and_torch(
    get: Any, device: str, case: tuple[torch.Tensor, torch.Tensor, float]
) -> None:
    a, b, alpha = (case[0].to(device), case[1].to(device), case[2])
    got = get("add", device)(a, b, alpha=alpha)
    want = torch.add(a, b, alpha=alpha)
    ref = jitops.reference("add")(a, b, alpha=alpha)
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    rtol, atol = TOL.get(want.dtype, (0, 0))
    # float16/bfloat16: torch may round once more than the float computation (1 ulp)
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol)
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("device", DEVICES)
def test_add_out_and_inplace(get: Any, device: str) -> None:
    add, add_ = get("add", device), get("add_", device)
    a = torch.randn(4, 3, device=device)
    b = torch.randn(3, device=device)
    out = torch.empty(0, device=device)
    assert add(a, b, alpha=2, out=out) is out  # the op handle resolves the out= overload
    torch.testing.assert_close(out, a + 2 * b)
    wrong = torch.empty(7, device=device)
    add(a, b, out=wrong)  # resized as torch does (TensorIterator's resize_output, with its warning)
    assert wrong.shape == (4, 3)
    torch.testing.assert_close(wrong, a + b)
    ints = torch.empty(4, 3, dtype=torch.float64, device=device)
    add(a, b, out=ints)  # float32 result cast into a float64 out=
    torch.testing.assert_close(ints, (a + b).double())
    c = a.clone()
    version = c._version
    assert add_(c, b, alpha=-1) is c
    assert c._version == version + 1
    torch.testing.assert_close(c, a - b)
    i = torch.arange(6, device=device).reshape(2, 3)
    assert add_(i, i, alpha=3) is i and i.tolist() == [[0, 4, 8], [12, 16, 20]]


BAD_ADD = [
    ("add", lambda T: (T(2, 3), T(4)), {}, "cannot be broadcast together (dim -1: 3 vs 4)"),
    (
        "add",
        lambda T: (T(2, dtype=torch.int64), T(2, dtype=torch.int64)),
        {"alpha": 0.5},
        "alpha must be an integer when the result dtype is int64, got 0.5",
    ),
    # bool is added now, as torch does; uint16 has no kernel in torch either
    (
        "add",
        lambda T: (T(2, dtype=torch.uint16), T(2, dtype=torch.uint16)),
        {},
        "the result dtype uint16 is not supported",
    ),
    (
        "add",
        lambda T: (T(2, dtype=torch.int64), T(2, dtype=torch.int64)),
        {"alpha": True},
        "alpha is a bool, but the result dtype int64 is not bool",
    ),
    (
        "add",
        lambda T: (T(2), T(2)),
        {"alpha": 1j},
        "alpha is complex, but the result dtype float32 is not",
    ),
    (
        "add",
        lambda T: (T(2, dtype=torch.bool), T(2, dtype=torch.bool)),
        {"alpha": 0.5},
        "alpha must be an integer when the result dtype is bool, got 0.5",
    ),
    (
        "add_",
        lambda T: (T(3, dtype=torch.int32), 2.5),
        {},
        "result dtype float32 cannot be cast to self's dtype int32",
    ),
    (
        "add_",
        lambda T: (T(3), T(2, 3)),
        {},
        "the broadcast shape [2, 3] differs from self's shape [3]",
    ),
    (
        "add_",
        lambda T: (T(3, dtype=torch.int32), T(3)),
        {},
        "result dtype float32 cannot be cast to self's dtype int32",
    ),
    (
        "add",
        lambda T: (T(3), T(3)),
        {"out": "int"},
        "result dtype float32 cannot be cast to out's dtype int64",
    ),
]


@pytest.mark.parametrize("name,make,kwargs,message", BAD_ADD)
def test_add_errors_match_between_kernel_and_fake(
    get: Any, name: str, make: Any, kwargs: dict[str, Any], message: str
) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = get(name, "cpu")

    def T(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype)

    def call() -> None:
        args = make(T)
        kw = {
            k: (torch.zeros(3, dtype=torch.int64) if v == "int" else v) for k, v in kwargs.items()
        }
        op(*args, **kw)

    with pytest.raises(RuntimeError, match=None) as real:
        call()
    with FakeTensorMode(), pytest.raises(RuntimeError) as fake:
        call()
    assert message in str(real.value)
    assert message in str(fake.value)


def _random_boxes(n: int, gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    xy = torch.rand(n, 2, generator=gen, dtype=torch.float64) * 50
    wh = torch.rand(n, 2, generator=gen, dtype=torch.float64) * 20
    wh[torch.rand(n, generator=gen) < 0.15] = 0  # degenerate, zero-area boxes
    return torch.cat([xy, xy + wh], 1).to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@FAST
@given(
    n=st.integers(0, 300),
    seed=st.integers(0, 2**31 - 1),
    ties=st.booleans(),
    threshold=st.sampled_from([0.0, 0.3, 0.5, 0.9, 1.0]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_nms_matches_reference(
    get: Any, device: str, n: int, seed: int, ties: bool, threshold: float, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(seed)
    boxes = _random_boxes(n, gen, dtype)
    scores = (
        torch.randint(0, 4, (n,), generator=gen) if ties else torch.rand(n, generator=gen)
    ).to(dtype)
    boxes, scores = boxes.to(device), scores.to(device)
    got = get("nms", device)(boxes, scores, threshold)
    want = jitops.reference("nms")(boxes, scores, threshold)
    assert got.dtype == torch.int64 and got.device == boxes.device
    assert got.tolist() == want.tolist()


def test_nms_errors_name_the_value(get: Any) -> None:
    nms = get("nms", "cpu")
    with pytest.raises(RuntimeError, match=r"nms: boxes must be \(N, 4\), got \[3, 5\]"):
        nms(torch.zeros(3, 5), torch.zeros(3), 0.5)
    with pytest.raises(
        RuntimeError, match=r"nms: scores must be \(N,\) for N = 3 boxes, got \[4\]"
    ):
        nms(torch.zeros(3, 4), torch.zeros(4), 0.5)
    with pytest.raises(
        RuntimeError,
        match="nms: boxes and scores must have the same dtype, got float32 and float64",
    ):
        nms(torch.zeros(3, 4), torch.zeros(3, dtype=torch.float64), 0.5)


def _opcheck_cases(device: str) -> list[tuple[str, str, tuple[Any, ...], dict[str, Any]]]:
    x = torch.randn(3, 5, device=device, dtype=torch.float64, requires_grad=True)
    a, b = torch.randn(4, 3, device=device), torch.randn(3, device=device, requires_grad=True)
    boxes = _random_boxes(20, torch.Generator().manual_seed(0), torch.float32).to(device)
    return [
        ("softmax", "default", (x, 1), {}),
        ("log_softmax", "default", (x, 0), {}),
        ("add", "default", (a, b), {"alpha": 2}),
        ("add", "out", (a, b.detach()), {"alpha": 2, "out": torch.empty(4, 3, device=device)}),
        ("add_", "default", (a.clone(), b.detach()), {"alpha": 0.5}),
        ("nms", "default", (boxes, torch.rand(20, device=device), 0.5), {}),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(6))
def test_opcheck(get: Any, device: str, case: int) -> None:
    name, overload, args, kwargs = _opcheck_cases(device)[case]
    op = getattr(get(name, device).packet, overload)
    # All four checks, add.out and add_ included: their aliased outputs (`-> Tensor(a!)`) trace
    # through the Functionalize kernels of jitops/functionalize.py.
    torch.library.opcheck(op, args, kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(get: Any, device: str) -> None:
    x = torch.randn(3, 5, device=device, dtype=torch.float64, requires_grad=True)
    x3 = torch.randn(2, 3, 4, device=device, dtype=torch.float64, requires_grad=True)
    for name in ("softmax", "log_softmax"):
        for dim in (0, 1, -1):
            assert torch.autograd.gradcheck(get(name, device), (x, dim))
            assert torch.autograd.gradcheck(get(name, device), (x3, dim))
    a = torch.randn(2, 3, 4, device=device, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 1, device=device, dtype=torch.float64, requires_grad=True)
    add = get("add", device)
    assert torch.autograd.gradcheck(lambda p, q: add(p, q, alpha=-2.5), (a, b))
    assert torch.autograd.gradcheck(lambda q: add(a.detach(), q), (b,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_dtype_keyword(get: Any, device: str, name: str) -> None:
    """torch's `softmax(x, dim, dtype=...)` form (issue 18): half logits, float32 result and gradient back in half."""
    op, ref = get(name, device), getattr(torch, name)
    x = torch.randn(4, 8, dtype=torch.float16, device=device)
    for got in (
        op(x, dim=-1, dtype=torch.float32),
        op(x, -1, torch.float32),
        op.default(x, -1, dtype=torch.float32),
    ):
        assert got.dtype == torch.float32
        torch.testing.assert_close(
            got,
            ref(x, dim=-1, dtype=torch.float32),
            rtol=0 if device == "cpu" else None,
            atol=0 if device == "cpu" else None,
        )
    xg = x.clone().requires_grad_()
    op(xg, -1, dtype=torch.float32).sum().backward()
    assert xg.grad is not None and xg.grad.dtype == torch.float16
    xd = torch.randn(3, 4, 5, dtype=torch.float64, device=device, requires_grad=True)
    torch.library.opcheck(op.packet.default, (xd, 1), {"dtype": torch.float32})
    assert torch.autograd.gradcheck(lambda t: op(t, 1, dtype=torch.float64), (xd,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["softmax_backward", "log_softmax_backward"])
def test_softmax_backward_is_one_fused_kernel(get: Any, device: str, name: str) -> None:
    """The backward ops have their own kernel per backend, not a composite chain of ATen ops."""
    ns = get("softmax", device).namespace
    qualname = f"{ns}::{name}"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(qualname, device.upper())
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CompositeExplicitAutograd")
    backward_op = getattr(getattr(torch.ops, ns), name).default
    for shape, dim in [((5, 7), 1), ((5, 7), 0), ((2, 3, 4), 1), ((3, 40), -1)]:
        y = torch.randn(shape, device=device, dtype=torch.float32)
        torch.library.opcheck(backward_op, (torch.randn_like(y), y, dim))
    with pytest.raises(RuntimeError, match=f"{name}: grad and out must have the same shape"):
        backward_op(torch.zeros(2, 3, device=device), torch.zeros(3, 2, device=device), 0)


def test_mutating_variants_refuse_grad(get: Any) -> None:
    a, b = torch.randn(3), torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="do not support autograd, but an input requires grad"):
        get("add_", "cpu")(a, b)
    with torch.no_grad():
        get("add_", "cpu")(a, b)  # fine without grad


def test_no_grad_call_runs_no_python_autograd(get: Any) -> None:
    """Without grad the C++ Autograd kernel goes straight to the backend: no Python frame per call."""
    x = torch.randn(2, 8)
    for name in ("softmax", "add"):
        op = get(name, "cpu")
        args = (x, x) if name == "add" else (x,)
        seen: list[tuple[str, str]] = []
        sys.setprofile(
            lambda frame, event, arg: (
                seen.append((Path(frame.f_code.co_filename).name, frame.f_code.co_name))
                if event == "call"
                else None
            )
        )
        try:
            op(*args)
        finally:
            sys.setprofile(None)
        # Only the handle's __call__ and torch's op object's __call__: no Python autograd frame.
        assert set(seen) <= {("ops.py", "__call__"), ("_ops.py", "__call__")} and len(seen) <= 2, (
            seen
        )
        y = x.clone().requires_grad_()
        assert op(*((y, y) if name == "add" else (y,))).grad_fn is not None


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        # The handles users get: Dynamo inlines Op.__call__ without a graph break.
        self.softmax, self.log_softmax, self.add = (
            jitops.get(n, device="cpu") for n in ("softmax", "log_softmax", "add")
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.add(self.lin(x), x, alpha=0.5)
        return self.log_softmax(h, -1) + self.softmax(h, 0)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_matches_eager(backend: str) -> None:
    torch.manual_seed(0)
    model = _Model()
    x = torch.randn(4, 8)
    eager = model(x)
    eager.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    out = compiled(x)
    out.sum().backward()
    torch.testing.assert_close(out, eager)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, fullgraph=True, backend=backend)(x), eager)


def _mutating(
    x: torch.Tensor, y: torch.Tensor, o: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    add, add_ = jitops.get("add", device="cpu"), jitops.get("add_", device="cpu")
    z = x * 2
    add_(z, y, alpha=3)  # an intermediate, mutated in place
    add(z, y, out=o)  # a graph input written through out=
    x.mul_(0.5)
    add_(x, y)  # a graph input mutated in place, after an aten mutation
    w = torch.empty(o.shape, dtype=torch.float64)
    add(z, y, alpha=-1, out=w)  # out= of a wider dtype: the result is cast
    return o + 1, w


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_in_place_and_out_variants_compile_fullgraph(backend: str) -> None:
    """add_ and add.out inside torch.compile: same values and same input mutations as eager,
    computed by the jitops kernel (the profiler sees the namespace's functional add), no graph break."""
    x, y, o = torch.randn(5, 7), torch.randn(5, 7), torch.zeros(5, 7)
    xe, oe = x.clone(), o.clone()
    eager = _mutating(xe, y, oe)
    compiled = torch.compile(_mutating, fullgraph=True, backend=backend)
    xc, oc = x.clone(), o.clone()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = compiled(xc, y, oc)
    torch.testing.assert_close(got, eager)
    torch.testing.assert_close(xc, xe)  # input mutations replayed on the real inputs
    torch.testing.assert_close(oc, oe)
    assert got[1].dtype == torch.float64
    ns = jitops.get("add", device="cpu").namespace
    ran = {e.name for e in prof.events()}
    assert f"{ns}::add" in ran, sorted(n for n in ran if "::" in n)[:20]


def test_issue_18_add_and_nms_calls(get: Any) -> None:
    """The calls issue 18 lists as failing or rounding differently on main, now as torch/torchvision."""
    add, add_, nms = get("add", "cpu"), get("add_", "cpu"), get("nms", "cpu")
    x = torch.randn(1000)
    # main: "Expected a value of type 'Tensor' for argument 'other'"
    assert torch.equal(add(x, 2.0), torch.add(x, 2.0))
    assert torch.equal(add(x, 2.0, alpha=3), torch.add(x, 2.0, alpha=3))
    i = torch.arange(5)
    # a number promotes as torch's
    assert add(i, 2.5).dtype == torch.float32 and torch.equal(add(i, 2.5), torch.add(i, 2.5))
    assert torch.equal(add_(x.clone(), 1.5, alpha=2), x.clone().add_(1.5, alpha=2))
    b = torch.tensor([True, False, False])
    assert torch.equal(
        add(b, torch.tensor([False, False, True]), alpha=3),
        torch.add(b, torch.tensor([False, False, True]), alpha=3),
    )
    c = torch.randn(7, dtype=torch.complex64)
    # complex: torch's own scalar loops place the fma of the complex product differently by element
    # position; held to assert_close's tolerances (docs/builtin-ops.md)
    torch.testing.assert_close(
        add(c, c.flip(0), alpha=1.5 - 2j), torch.add(c, c.flip(0), alpha=1.5 - 2j)
    )
    h, k = torch.randn(1037).half(), torch.randn(1037).half()
    # main: 0.0156 apart in the tail
    assert torch.equal(add(h, k, alpha=-3.125), torch.add(h, k, alpha=-3.125))
    assert torch.equal(
        add(h[1::2], k[::2][:518], alpha=-3.125), torch.add(h[1::2], k[::2][:518], alpha=-3.125)
    )
    boxes = torch.tensor([[0, 0, 10, 10], [0, 0, 10, 3.0], [1, 1, 11, 11]])
    scores = torch.tensor([1.0, 0.5, 0.7])
    assert nms(boxes.half(), scores.half(), 0.5).tolist() == [0, 1]  # main: float16 refused
    # IoU 30/100 rounds to float(0.3) in float32; torchvision's CPU kernel compares it with 0.3 as a
    # double
    assert nms(boxes[:2], scores[:2], 0.3).tolist() == [0]
    assert nms(boxes[:2].double(), scores[:2].double(), 0.3).tolist() == [0, 1]


@pytest.mark.parametrize("case", ["Scalar", "Scalar_out", "inplace_Scalar"])
def test_scalar_overloads_opcheck(get: Any, case: str) -> None:
    """add.Scalar's autograd twin, and add.Scalar_out / add_.Scalar through the Functionalize kernels."""
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    if case == "Scalar":
        torch.library.opcheck(get("add", "cpu").packet.Scalar, (x, 2.5), {"alpha": 2})
        assert torch.autograd.gradcheck(lambda t: get("add", "cpu")(t, 2.5, alpha=-3), (x,))
    elif case == "Scalar_out":
        torch.library.opcheck(
            get("add", "cpu").packet.Scalar_out,
            (x.detach(), 2, 3),
            {"out": torch.empty(4, 3, dtype=torch.float64)},
        )
    else:
        torch.library.opcheck(
            get("add_", "cpu").packet.Scalar, (x.detach().clone(), 1.5), {"alpha": -2}
        )


def _scalar_calls(x: torch.Tensor, o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    add, add_ = jitops.get("add"), jitops.get("add_")
    z = add(x, 2.0, alpha=3)  # add.Scalar
    add_(z, 1.5)  # add_.Scalar
    add(z, 3, out=o)  # add.Scalar_out
    return z, add(z, True)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_scalar_overloads_compile_fullgraph(backend: str) -> None:
    x, o = torch.randn(5), torch.zeros(5)
    oe = o.clone()
    want = _scalar_calls(x, oe)
    got = torch.compile(_scalar_calls, fullgraph=True, backend=backend)(x, o)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert torch.equal(o, oe)
