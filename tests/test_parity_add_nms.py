"""Parity: jitops's add against torch.add, jitops's nms against torchvision's semantics.

Every overload (add, add.out, add_ and their Scalar variants; nms), every
dtype torch supports for it on CPU, a grid of shapes (broadcasts, 0-dim,
empty, non-contiguous, long enough for torch's vector loop, its tails and its
parallel chunks), Python scalars of each kind and 0-dim tensors as `other`,
forward and backward. Where torch raises, jitops must raise too, naming the
op. On CPU the target is bit-identical results: after
torch.testing.assert_close's default tolerances, the ulp distance must be 0
(on CUDA at most 1 ulp), with two measured exceptions that are torch's own
(float32: either of its two roundings; complex64/128: assert_close only; see
docs/builtin-ops.md). Each library is built once per session (the session cache, see
conftest.py); CUDA cases carry the `cuda` marker.

Size, measured on CPU: 849 test cases (867 more on CUDA), which compare
10,490 add calls with torch's results and 6,371 where both raise, and 1,764
nms calls (84 cases x 3 box grids x 7 thresholds) with the reference.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch

import jitops
from tests.helpers import DEVICES

pytestmark = pytest.mark.compile

DTYPES = [
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
]
ULP_LIMIT = {"cpu": 0, "cuda": 1}
# complex64/complex128 on CPU: torch's compiled complex multiply fuses its products differently in
# different loops (scalar tails, strided rows); jitops matches its vector body and most of the rest,
# and is held to assert_close's default tolerances there. The ulp distance is still recorded.
ULP_CHECKED = {torch.float16, torch.bfloat16, torch.complex32, torch.float32, torch.float64}
# (self shape, other shape, self transposed/strided?): vector body + tails (1000, 37), torch's
# parallel chunks (40000 > its 32768 grain), broadcasts, 0-dim, empty, 1-element, non-contiguous.
SHAPES = [
    ((1000,), (1000,), False),
    ((37,), (37,), False),
    ((40000,), (40000,), False),
    ((4, 33), (33,), False),
    ((3, 1, 5), (1, 4, 1), False),
    ((), (), False),
    ((6, 7), (), False),
    ((0, 3), (3,), False),
    ((1,), (1,), False),
    ((50, 40), (50, 40), True),
]
ALPHAS: list[Any] = [1, 3, -2.5, 0.3, -3.125, True, 1.5 - 2j]
SCALARS: list[Any] = [2, -3, 2.5, 0.3, True, False, 1.5 - 2j, 10**10]


def _make(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, seed: int, strided: bool = False
) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    full = (shape[1], shape[0], *shape[2:]) if strided else shape
    if dtype == torch.bool:
        t = torch.rand(full, generator=g) < 0.5
    elif dtype.is_complex:
        t = (torch.randn(full, generator=g, dtype=torch.complex128) * 10).to(dtype)
    elif dtype.is_floating_point:
        t = (torch.randn(full, generator=g, dtype=torch.float64) * 10).to(dtype)
    else:
        low = 0 if dtype == torch.uint8 else -100
        t = torch.randint(low, 100, full, generator=g).to(dtype)
    if strided:
        t = t.transpose(0, 1)  # a non-contiguous view of the wanted shape
        assert not t.is_contiguous()
    return t.to(device)


_REAL_OF = {
    torch.complex32: torch.float16,
    torch.complex64: torch.float32,
    torch.complex128: torch.float64,
}
_INT_OF = {
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}


def _line(t: torch.Tensor) -> torch.Tensor:
    """Float bit patterns mapped onto a line where neighbouring values differ by 1 (-0 and +0 both at 0)."""
    i = t.view(_INT_OF[t.dtype]).to(torch.int64)
    magnitude = i & ((1 << (torch.finfo(t.dtype).bits - 1)) - 1)
    return torch.where(i < 0, -magnitude, magnitude).double()


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in units in the last place between same-dtype floating or complex tensors; NaN == NaN."""
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.numel() == 0 or not (a.dtype.is_floating_point or a.dtype.is_complex):
        return 0
    if a.dtype.is_complex:  # the real and imaginary parts, each in the matching real dtype (exact)
        real = _REAL_OF[a.dtype]
        wide = torch.complex128
        a = torch.view_as_real(a.to(wide)).to(real)
        b = torch.view_as_real(b.to(wide)).to(real)
    d = (_line(a.contiguous()) - _line(b.contiguous())).abs()
    d[torch.isnan(a) & torch.isnan(b)] = 0
    return int(d.max())


def float32_roundings(
    self_t: torch.Tensor, other: Any, alpha: Any
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The two roundings torch's float32 CPU add uses: alpha * other + self fused (one rounding), or
    alpha * other rounded first. Which one an element gets depends on where it falls in torch's compiled
    loops: the scalar tail of a row whose `other` is a broadcast scalar goes unfused, in a pattern set by
    its compiler's vectorisation and the data's alignment (measured; see docs/builtin-ops.md)."""
    if isinstance(alpha, (bool, complex)) or alpha == 1 or self_t.device.type != "cpu":
        return None
    try:
        if torch.result_type(self_t, other) != torch.float32:
            return None
    except RuntimeError:
        return None
    y = other if isinstance(other, torch.Tensor) else torch.tensor(other)
    x, y = torch.broadcast_tensors(self_t.to(torch.float32), y.to(torch.float32))
    a = torch.tensor(alpha, dtype=torch.float32)
    fused = (x.double() + a.double() * y.double()).float()
    return fused, x + a * y


def assert_same(
    got: Any, want: Any, device: str, roundings: tuple[torch.Tensor, torch.Tensor] | None = None
) -> None:
    assert isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.device == want.device
    # default tolerances for the dtype (exact for integers)
    torch.testing.assert_close(got, want, equal_nan=True)
    ulps = ulp_distance(got, want)
    MAX_ULPS[(device, str(got.dtype))] = max(MAX_ULPS.get((device, str(got.dtype)), 0), ulps)
    if ulps > ULP_LIMIT[device] and roundings is not None:
        # float32: each element must be one of torch's two roundings, in both results
        fused, unfused = roundings
        for t in (got, want):
            ok = (t == fused) | (t == unfused) | torch.isnan(t)
            assert bool(ok.all()), (
                f"{ulps} ulp from torch, and not one of its two float32 roundings"
            )
        return
    if got.dtype in ULP_CHECKED:
        assert ulps <= ULP_LIMIT[device], f"{ulps} ulp from torch ({got.dtype})"


MAX_ULPS: dict[
    tuple[str, str], int
] = {}  # the largest ulp distance seen per (device, dtype), for the report
COMPARED = {"values": 0, "raised": 0}  # add calls compared with torch: same values / both raised


def outcome(fn: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    try:
        return fn(), None
    except (RuntimeError, TypeError, ValueError, OverflowError) as e:
        return None, e


def agree(
    got: tuple[Any, BaseException | None],
    want: tuple[Any, BaseException | None],
    device: str,
    op: str,
    roundings: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    (g, g_err), (w, w_err) = got, want
    COMPARED["raised" if w_err is not None else "values"] += 1
    if w_err is not None:
        assert g_err is not None, (
            f"torch raised {type(w_err).__name__}: {w_err}, jitops returned {g}"
        )
        assert op in str(g_err), f"jitops's error does not name {op}: {g_err}"
        return
    assert g_err is None, f"jitops raised {g_err!r}; torch returned a {w.dtype} result"
    assert_same(g, w, device, roundings)


@pytest.fixture(scope="module", autouse=True)
def _report_ulps(request: pytest.FixtureRequest) -> Any:
    """After the module: print the largest ulp distance from torch per device and dtype."""
    yield
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None and MAX_ULPS:
        with capture.global_and_fixture_disabled():
            print(
                f"\nadd calls compared with torch: {COMPARED['values']} with results, {COMPARED['raised']} where both raised"
            )
            print(
                "max ulp distance from torch: "
                + ", ".join(
                    f"{device} {dtype.removeprefix('torch.')} {ulps}"
                    for (device, dtype), ulps in sorted(MAX_ULPS.items())
                )
            )


@pytest.fixture(scope="session")
def ops() -> Callable[[str, str], Any]:
    def _get(name: str, device: str) -> Any:
        return jitops.get(name, device=device)

    return _get


def _run_variants(
    ops: Any, device: str, self_t: torch.Tensor, other: Any, alpha: Any, variant: str
) -> None:
    add, add_ = ops("add", device), ops("add_", device)
    r = float32_roundings(self_t, other, alpha)
    if variant == "functional":
        agree(
            outcome(lambda: add(self_t, other, alpha=alpha)),
            outcome(lambda: torch.add(self_t, other, alpha=alpha)),
            device,
            "add",
            r,
        )
    elif variant == "out":
        try:
            dtype = torch.result_type(self_t, other)
        except RuntimeError:
            dtype = self_t.dtype
        o_j, o_t = (
            torch.empty(0, dtype=dtype, device=device),
            torch.empty(0, dtype=dtype, device=device),
        )
        got = outcome(lambda: add(self_t, other, alpha=alpha, out=o_j))
        want = outcome(lambda: torch.add(self_t, other, alpha=alpha, out=o_t))
        agree(got, want, device, "add", r)
        if want[1] is None:
            assert got[0] is o_j
    else:
        s_j, s_t = self_t.clone(), self_t.clone()
        got = outcome(lambda: add_(s_j, other, alpha=alpha))
        want = outcome(lambda: s_t.add_(other, alpha=alpha))
        agree(got, want, device, "add_", r if self_t.dtype == torch.float32 else None)
        if want[1] is None:
            assert got[0] is s_j
            assert_same(s_j, s_t, device, r if self_t.dtype == torch.float32 else None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["functional", "out", "inplace"])
@pytest.mark.parametrize(
    "shapes", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}{'-strided' if s[2] else ''}"
)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_add_tensor_overloads(
    ops: Any, device: str, variant: str, shapes: Any, dtype: torch.dtype
) -> None:
    """add / add.out / add_ with a tensor `other` of the same dtype, every alpha kind."""
    s_shape, o_shape, strided = shapes
    self_t = _make(s_shape, dtype, device, 1, strided)
    other = _make(o_shape, dtype, device, 2)
    for alpha in ALPHAS:
        _run_variants(ops, device, self_t, other, alpha, variant)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["functional", "out", "inplace"])
@pytest.mark.parametrize("shape", [(1000,), (37,), (0, 4), (), (50, 40)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_add_scalar_overloads(
    ops: Any, device: str, variant: str, shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    """add.Scalar / add.Scalar_out / add_.Scalar: every kind of Python number as `other`, every alpha kind."""
    self_t = _make(shape, dtype, device, 3, strided=shape == (50, 40))
    for other, alpha in itertools.product(SCALARS, ALPHAS):
        _run_variants(ops, device, self_t, other, alpha, variant)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("other_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("self_dtype", DTYPES, ids=str)
def test_add_type_promotion(
    ops: Any, device: str, self_dtype: torch.dtype, other_dtype: torch.dtype
) -> None:
    """Every dtype pair, with a broadcast tensor, a 0-dim tensor (not a wrapped number) and into a wider out=."""
    self_t = _make((5, 3), self_dtype, device, 4)
    for other in (_make((3,), other_dtype, device, 5), _make((), other_dtype, device, 6)):
        for alpha in (1, 2, 0.5):
            for variant in ("functional", "out", "inplace"):
                _run_variants(ops, device, self_t, other, alpha, variant)
    add = ops("add", device)
    other = _make((3,), other_dtype, device, 5)
    o_j = torch.empty(5, 3, dtype=torch.complex128, device=device)
    o_t = o_j.clone()
    agree(
        outcome(lambda: add(self_t, other, out=o_j)),
        outcome(lambda: torch.add(self_t, other, out=o_t)),
        device,
        "add",
    )


GRAD_DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]


def _grads(
    fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor], seed: int
) -> list[torch.Tensor]:
    out = fn(*inputs)
    g = torch.Generator().manual_seed(seed)
    grad = torch.randn(
        out.shape, generator=g, dtype=torch.complex128 if out.dtype.is_complex else torch.float64
    )
    out.backward(grad.to(out.dtype).to(out.device))
    return [t.grad for t in inputs]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "pair",
    [(d, d) for d in GRAD_DTYPES]
    + [
        (torch.float32, torch.complex64),
        (torch.complex64, torch.float32),
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float64),
    ],
    ids=str,
)
def test_add_backward(ops: Any, device: str, pair: tuple[torch.dtype, torch.dtype]) -> None:
    """Gradients of both inputs (broadcast reduced, real part for a real input) and of the Scalar overload."""
    add = ops("add", device)
    s_dtype, o_dtype = pair
    complex_ok = s_dtype.is_complex or o_dtype.is_complex
    for (s_shape, o_shape, strided), alpha in itertools.product(
        [
            ((4, 33), (33,), False),
            ((3, 1, 5), (1, 4, 1), False),
            ((50, 40), (50, 40), True),
            ((), (), False),
        ],
        [1, -2.5, 0.3] + ([1.5 - 2j] if complex_ok else []),
    ):

        def inputs() -> list[torch.Tensor]:
            return [
                _make(s_shape, s_dtype, device, 7, strided).detach().requires_grad_(),
                _make(o_shape, o_dtype, device, 8).detach().requires_grad_(),
            ]

        got = _grads(lambda a, b: add(a, b, alpha=alpha), inputs(), 9)
        want = _grads(lambda a, b: torch.add(a, b, alpha=alpha), inputs(), 9)
        for g, w in zip(got, want):
            assert_same(g, w, device)
        for scalar in (2.5, 3, 1 - 1j):
            if isinstance(alpha, complex) and not (
                s_dtype.is_complex or isinstance(scalar, complex)
            ):
                # torch refuses a complex alpha for a real result (covered by the forward tests)
                continue
            a_j = _make(s_shape, s_dtype, device, 7, strided).detach().requires_grad_()
            a_t = a_j.detach().clone().requires_grad_()
            try:
                (w,) = _grads(lambda a: torch.add(a, scalar, alpha=alpha), [a_t], 10)
            # e.g. torch 2.14's bfloat16 + complex -> BComplex32, which has no add kernel
            except RuntimeError:
                with pytest.raises(RuntimeError, match="add"):
                    _grads(lambda a: add(a, scalar, alpha=alpha), [a_j], 10)
                continue
            (g,) = _grads(lambda a: add(a, scalar, alpha=alpha), [a_j], 10)
            assert_same(g, w, device)


# ---------------------------------------------------------------- nms


def _torchvision_nms() -> Callable[..., torch.Tensor] | None:
    try:
        import torchvision  # noqa: F401
        from torchvision.ops import nms

        nms(torch.zeros(1, 4), torch.zeros(1), 0.5)  # its C++ ops may not load with this torch
        return nms
    except Exception:  # noqa: BLE001
        return None


def _boxes(
    n: int, dtype: torch.dtype, seed: int, grid: float, ties: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g, dtype=torch.float64) * 50
    wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * 20
    wh[torch.rand(n, generator=g) < 0.15] = 0  # degenerate, zero-area boxes
    boxes = (
        torch.cat([xy, xy + wh], 1) * grid
    ).round() / grid  # a coarse grid makes IoU == threshold happen
    scores = (
        torch.randint(0, 4, (n,), generator=g).double()
        if ties
        else torch.rand(n, generator=g, dtype=torch.float64)
    )
    return boxes.to(dtype), scores.to(dtype)


NMS_DTYPES = [torch.float16, torch.float32, torch.float64]
THRESHOLDS = [0.0, 0.2, 0.25, 0.3, 0.5, 0.7, 1.0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("n", [0, 1, 2, 7, 64, 65, 300])
@pytest.mark.parametrize("dtype", NMS_DTYPES, ids=str)
def test_nms_matches_torchvision_semantics(
    ops: Any, device: str, layout: str, ties: bool, n: int, dtype: torch.dtype
) -> None:
    nms, ref, tv = ops("nms", device), jitops.reference("nms"), _torchvision_nms()
    for grid, threshold in itertools.product((1.0, 4.0, 1e6), THRESHOLDS):
        boxes, scores = _boxes(n, dtype, n * 7 + int(grid), grid, ties)
        if layout == "strided":  # non-contiguous views of the same values
            boxes = torch.stack([boxes, boxes], 2)[:, :, 0]
            scores = torch.stack([scores, scores], 1)[:, 0]
            assert n < 2 or not (boxes.is_contiguous() or scores.is_contiguous())
        boxes, scores = boxes.to(device), scores.to(device)
        got = nms(boxes, scores, threshold)
        assert got.dtype == torch.int64 and got.device == boxes.device and got.dim() == 1
        assert got.tolist() == ref(boxes, scores, threshold).tolist(), (grid, threshold)
        if tv is not None and (device == "cuda" or dtype != torch.float16):
            assert got.tolist() == tv(boxes, scores, threshold).tolist(), (grid, threshold)


@pytest.mark.parametrize("device", DEVICES)
def test_nms_refuses_what_it_cannot_do(ops: Any, device: str) -> None:
    """bfloat16 and integer boxes (torchvision refuses them too), mixed dtypes, bad shapes: a clear error."""
    nms = ops("nms", device)
    z = torch.zeros(3, 4, device=device)
    cases = [
        (
            (z.bfloat16(), torch.zeros(3, device=device).bfloat16()),
            "expected float16, float32 or float64 boxes, got bfloat16",
        ),
        (
            (z.long(), torch.zeros(3, device=device).long()),
            "expected float16, float32 or float64 boxes, got int64",
        ),
        (
            (z, torch.zeros(3, device=device).double()),
            "boxes and scores must have the same dtype, got float32 and float64",
        ),
        (
            (torch.zeros(3, 5, device=device), torch.zeros(3, device=device)),
            "boxes must be (N, 4), got [3, 5]",
        ),
    ]
    for args, message in cases:
        with pytest.raises(RuntimeError) as e:
            nms(*args, 0.5)
        assert message in str(e.value)


@pytest.mark.cuda
@pytest.mark.parametrize("n", [1000, 4096, 4097, 5000, 20000, 50000])
@pytest.mark.parametrize("dtype", NMS_DTYPES, ids=str)
def test_nms_cuda_large_matches_torchvision(ops: Any, n: int, dtype: torch.dtype) -> None:
    """Both greedy passes (host up to 4096 boxes, GPU above) against torchvision's CUDA nms."""
    tv = _torchvision_nms()
    if tv is None:
        pytest.skip("torchvision's C++ ops are not available")
    nms = ops("nms", "cuda")
    for ties, threshold in itertools.product((False, True), (0.3, 0.5, 0.7)):
        boxes, scores = _boxes(n, dtype, n, 4.0, ties)
        boxes, scores = boxes.cuda(), scores.cuda()
        got = nms(boxes, scores, threshold)
        assert got.tolist() == tv(boxes, scores, threshold).tolist()
        if dtype != torch.float16:  # float16 boxes on the CPU follow the same (CUDA) formula
            continue
        assert got.cpu().tolist() == nms(boxes.cpu(), scores.cpu(), threshold).tolist()
