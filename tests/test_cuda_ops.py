"""Every builtin op on a real GPU: correctness against its reference, opcheck, nms against torchvision.

All tests carry the ``cuda`` marker; tests/conftest.py skips them where
torch sees no GPU. The CUDA *build* is proven without a GPU by the CI leg
(.ci/cuda-leg.sh); these tests prove the kernels compute the right thing.
Each library is built once, for the current GPU, into the session cache.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

import jitops
from jitops.loading import loader
import jitops.registry as jregistry
from jitops.target.archs import default_arch
from jitops.errors import TargetError

pytestmark = [pytest.mark.cuda, pytest.mark.compile]

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
TOL: dict[Any, dict[str, float]] = {
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 1e-2, "rtol": 1.6e-2},
    torch.float32: {"atol": 1e-6, "rtol": 1e-5},
    torch.float64: {"atol": 1e-12, "rtol": 1e-10},
}


def cuda_op(name: str) -> Any:
    if name not in jitops.list_ops():
        pytest.skip(f"op {name!r} is not in this tree")
    return jitops.get(name, device="cuda")


def test_builds_for_the_current_gpu() -> None:
    op = cuda_op("softmax")
    assert op.library is not None
    if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        arch = default_arch(torch.cuda.get_device_capability(), tuple(torch.cuda.get_arch_list()))
        assert op.library.target == "cuda-sm" + arch.replace(".", "").replace("+PTX", "ptx")


def test_arch_list_without_this_gpu_is_refused_before_building() -> None:
    major, minor = torch.cuda.get_device_capability()
    other = "7.5" if major >= 8 else "9.0"  # another major and no PTX: nothing here would run
    with pytest.raises(TargetError, match=f"compute capability {major}.{minor}"):
        loader.load_library(jregistry.registry().library("softmax"), "cuda", other)


# ------------------------------------------------------------ softmax


def _softmax_inputs(dtype: Any) -> list[tuple[Any, int]]:
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape: int) -> Any:
        return (torch.randn(*shape, generator=g, device="cuda", dtype=torch.float64) * 4).to(dtype)

    cases: list[tuple[Any, int]] = [
        (randn(0), -1),
        (randn(1), 0),
        (randn(4, 0), -1),
        (randn(7), -1),
        (randn(3, 1000), -1),  # one block per row
        (randn(2, 5000), 1),  # rows longer than a block
        (randn(2, 3, 5), 0),  # strided kernel
        (randn(2, 3, 5), 1),
        (randn(2, 3, 5), -1),
        (randn(64, 33).t(), 0),  # non-contiguous
        (randn(6, 8)[:, ::2], -1),
        (torch.tensor(2.5, dtype=dtype, device="cuda"), 0),
    ]
    special = randn(4, 9)
    special[0, 3] = float("-inf")
    special[1] = float("-inf")  # a row of -inf gives NaN, as in torch
    special[2, 0] = torch.finfo(dtype).max
    special[3] *= 1000
    cases.append((special, -1))
    return cases


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_matches_reference(name: str, dtype: Any) -> None:
    op, ref = cuda_op(name), jitops.reference(name)
    for x, dim in _softmax_inputs(dtype):
        got = op(x, dim)
        assert got.device == x.device and got.dtype == dtype and got.shape == x.shape
        want = ref(x.double(), dim).to(dtype)
        torch.testing.assert_close(
            got,
            want,
            equal_nan=True,
            **TOL[dtype],
            msg=lambda m: f"{name} {tuple(x.shape)} dim={dim}: {m}",
        )


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_opcheck(name: str) -> None:
    op = cuda_op(name)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(5, 7, device="cuda", dtype=dtype, requires_grad=True)
        torch.library.opcheck(op.default, (x, 1))


# Each shape class of softmax_cuda_common.cuh, named for the kernel it reaches
# on an H100 (132 SMs; the classes depend on the SM count and shared memory).
SHAPE_CLASSES: list[tuple[str, tuple[int, ...], int]] = [
    ("warp-n1", (3, 1), -1),
    ("warp-subwarp-odd", (1000, 7), -1),
    ("warp-vec", (4096, 128), -1),
    ("warp-many-rows", (65536, 128), -1),
    ("warp-tiny-rows-huge-count", (1 << 20, 3), -1),
    ("warp-1023-scalar", (40, 1023), -1),
    ("warp-1024-vec", (40, 1024), -1),
    ("smem-1025", (300, 1025), -1),
    ("smem-4096", (512, 4096), -1),
    ("smem-lm-head", (300, 50257), -1),
    ("split-few-long", (4, 65536), -1),
    ("split-128x65536", (128, 65536), -1),
    ("split-too-long-for-smem", (300, 70001), -1),
    ("split-1100", (1, 1100), -1),
    ("strided-dim0", (4096, 64), 0),
    ("strided-middle", (64, 512, 256), 1),
    ("strided-small-inner", (7, 300, 3), 1),
    ("strided-outer-over-65535", (70000, 2, 3), 1),
    ("strided-dim0-square", (1024, 1024), 0),
    ("strided-inner-33-16-per-column", (2, 300, 33), 1),
    ("strided-inner-64-16-per-column", (3, 100, 64), 1),
    ("strided-inner-2-64-per-column", (5, 70, 2), 1),
]


def _ulps(got: Any, want: Any) -> int:
    from tests.test_parity_softmax import max_ulp

    return max_ulp(got, want)


def _class_cases() -> list[Any]:
    return [
        pytest.param(name, case, dtype, id=f"{name}-{case[0]}-{dtype}")
        for name in ("softmax", "log_softmax")
        for case in SHAPE_CLASSES
        for dtype in FLOATS
    ]


@pytest.mark.parametrize("name,case,dtype", _class_cases())
def test_softmax_shape_classes_match_torch(name: str, case: Any, dtype: Any) -> None:
    """Forward and backward of every kernel path against torch on the same GPU. The strided kernels (a dim other
    than the last) sum in torch's order with torch's thread count per column, so they must give torch's bits; an
    H100 measured the earlier online (max, sum) kernel 5 float16 ulps off for log_softmax over a middle dim."""
    label, shape, dim = case
    same_bits = label.startswith("strided")
    op = cuda_op(name)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(shape, generator=g, device="cuda", dtype=torch.float32) * 4).to(dtype)
    # a -inf logit (not in a row of one: that row would be all -inf)
    if x.size(dim) > 1 and x.numel() > 5:
        x.view(-1)[5] = float("-inf")
    got, want = op(x, dim), getattr(torch, name)(x, dim)
    torch.testing.assert_close(
        got, want, equal_nan=True, **({"rtol": 0, "atol": 0} if same_bits else {})
    )
    # both compute in float: at most 2 ulps after rounding
    if dtype in (
        torch.float16,
        torch.bfloat16,
    ):
        assert _ulps(got, want) <= 2
    # backward kernel, from torch's output
    ns = getattr(torch.ops, op.namespace)
    grad = torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)
    bwd, tbwd = (
        (ns.softmax_backward, torch._softmax_backward_data)
        if name == "softmax"
        else (ns.log_softmax_backward, torch._log_softmax_backward_data)
    )
    ours, theirs = bwd(grad, want, dim), tbwd(grad, want, dim, dtype)
    if same_bits:
        torch.testing.assert_close(ours, theirs, equal_nan=True, rtol=0, atol=0)
        return
    if dtype != torch.float32:
        torch.testing.assert_close(ours, theirs, equal_nan=True)
        return
    # float32: both sum the row in float, in different orders. Over long rows (log_softmax's sum of
    # grad reaches ~sqrt(n)) that alone moves results past assert_close's float32 tolerance
    # (measured on an H100: up to 5e-5 at 65536 columns), so each is judged by its distance from the
    # float64 result of the same inputs: jitops's may be at most twice torch's, plus 8 float32 ulps
    # of the largest gradient.
    exact = tbwd(grad.double(), want.double(), dim, torch.float64)
    assert (
        ours.dtype == theirs.dtype == dtype
        and torch.isfinite(exact).all()
        and torch.isfinite(ours).all()
    )
    ours_err, theirs_err = ((t.double() - exact).abs().max().item() for t in (ours, theirs))
    assert ours_err <= 2 * theirs_err + 8 * 2.0**-24 * exact.abs().max().item(), (
        ours_err,
        theirs_err,
    )


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_non_contiguous_and_edge_shapes(name: str) -> None:
    op, ref = cuda_op(name), getattr(torch, name)
    base = torch.randn(64, 2048, device="cuda")
    for x, dim in [
        (base.t(), 0),
        (base.t(), 1),
        (base[:, ::2], -1),
        (base[:, 1:], -1),  # 1-element offset: unaligned rows
        (base[::3, :1500], -1),
        (torch.randn(2, 3, 4, device="cuda").permute(2, 0, 1), 1),
        (torch.empty(0, 5, device="cuda"), -1),
        (torch.empty(5, 0, device="cuda"), -1),
        (torch.empty(3, 0, 4, device="cuda"), 0),
        (torch.tensor(3.0, device="cuda"), 0),
        (torch.tensor([3.0], device="cuda"), 0),
    ]:
        got = op(x, dim)
        assert got.shape == x.shape and got.device == x.device
        torch.testing.assert_close(got, ref(x, dim))


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_softmax_dtype_argument(name: str, dtype: Any) -> None:
    """dtype= casts first, as torch's; the gradient comes back in the input dtype."""
    op = cuda_op(name)
    x = torch.randn(33, 700, device="cuda", dtype=dtype)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = op(xa, -1, dtype=torch.float32), getattr(torch, name)(xb, -1, dtype=torch.float32)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want)
    g = torch.randn_like(got)
    got.backward(g)
    want.backward(g)
    assert xa.grad is not None and xa.grad.dtype == dtype
    torch.testing.assert_close(xa.grad, xb.grad)


# gradcheck (float64) through each class, at sizes gradcheck can afford.
GRADCHECK = [((3, 5), -1), ((2, 40), -1), ((2, 1100), -1), ((3, 4, 5), 1), ((6, 3), 0), ((), 0)]


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("case", GRADCHECK, ids=str)
def test_softmax_gradcheck(name: str, case: Any) -> None:
    shape, dim = case
    x = torch.randn(shape, device="cuda", dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(cuda_op(name), (x, dim), fast_mode=x.numel() > 200)


@pytest.mark.parametrize("name", ["softmax_backward", "log_softmax_backward"])
def test_softmax_backward_opcheck(name: str) -> None:
    ns = getattr(torch.ops, cuda_op("softmax").namespace)
    for shape, dim in [((5, 7), 1), ((5, 7), 0), ((2, 1500), -1)]:
        y = torch.randn(shape, device="cuda", dtype=torch.float32)
        torch.library.opcheck(getattr(ns, name).default, (torch.randn_like(y), y, dim))


# ---------------------------------------------------------------- add


ADD_DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
]


def _add_pair(dtype: Any, shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> tuple[Any, Any]:
    if dtype.is_floating_point:
        return torch.randn(shape_a, device="cuda").to(dtype), torch.randn(
            shape_b, device="cuda"
        ).to(dtype)
    low = 0 if dtype == torch.uint8 else -40  # |a + 2 * b| < 128: no wrap-around in 8 bits
    return (
        torch.randint(low, 40, shape_a, device="cuda", dtype=dtype),
        torch.randint(low, 40, shape_b, device="cuda", dtype=dtype),
    )


SHAPES = [
    ((0,), (0,)),
    ((1,), (1,)),
    ((1000,), (1000,)),
    ((4, 5), (5,)),
    ((3, 1, 7), (1, 6, 1)),
    ((6, 4), ()),
]


@pytest.mark.parametrize("dtype", ADD_DTYPES, ids=str)
def test_add_matches_torch_and_reference(dtype: Any) -> None:
    add, ref = cuda_op("add"), jitops.reference("add")
    alpha = 2 if not dtype.is_floating_point else 0.5
    for sa, sb in SHAPES:
        a, b = _add_pair(dtype, sa, sb)
        got = add(a, b, alpha=alpha)
        torch.testing.assert_close(
            got, torch.add(a, b, alpha=alpha), **TOL.get(dtype, {"atol": 0, "rtol": 0})
        )
        torch.testing.assert_close(
            got, ref(a, b, alpha=alpha), **TOL.get(dtype, {"atol": 0, "rtol": 0})
        )
    a, b = _add_pair(dtype, (8, 6), (6, 8))
    # non-contiguous
    torch.testing.assert_close(add(a, b.t(), alpha=alpha), torch.add(a, b.t(), alpha=alpha))


def test_add_type_promotion_and_variants() -> None:
    add, add_ = cuda_op("add"), cuda_op("add_")
    a = torch.randint(0, 10, (4, 5), device="cuda", dtype=torch.int32)
    b = torch.randn(4, 5, device="cuda", dtype=torch.float32)
    torch.testing.assert_close(add(a, b), torch.add(a, b))
    x = torch.randn(4, 5, device="cuda")
    y = torch.randn(5, device="cuda")
    want = torch.add(x, y, alpha=3)
    assert add_(x, y, alpha=3) is x
    torch.testing.assert_close(x, want)
    out = torch.empty(0, device="cuda")
    assert add(x, y, out=out) is out
    torch.testing.assert_close(out, torch.add(x, y))


def test_add_takes_a_cpu_scalar_operand() -> None:
    """torch.add(cuda, torch.tensor(2.5)) reaches the CUDA kernel with a CPU operand, on either side."""
    add = cuda_op("add")
    x = torch.randn(4, 5, device="cuda", dtype=torch.float16)
    for a, b in ((x, torch.tensor(2.5, dtype=torch.float64)), (torch.tensor(3), x)):
        got, want = add(a, b, alpha=2), torch.add(a, b, alpha=2)
        assert got.device == want.device and got.dtype == want.dtype == torch.float16
        torch.testing.assert_close(got, want, **TOL[torch.float16])


def test_add_opcheck() -> None:
    add = cuda_op("add")
    a = torch.randn(3, 4, device="cuda", requires_grad=True)
    b = torch.randn(4, device="cuda", requires_grad=True)
    torch.library.opcheck(add.default, (a, b), {"alpha": 2})
    add_ = cuda_op("add_")
    torch.library.opcheck(
        add_.default,
        (torch.randn(3, 4, device="cuda"), torch.randn(4, device="cuda")),
        {"alpha": 2},
    )
    if "out" in add.packet.overloads():
        out = torch.empty(3, 4, device="cuda")
        torch.library.opcheck(add.packet.out, (a.detach(), b.detach()), {"alpha": 2, "out": out})


@pytest.mark.parametrize(
    "dtype",
    [
        torch.bool,
        torch.uint8,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.complex32,
        torch.complex64,
        torch.complex128,
    ],
    ids=str,
)
def test_add_scalar_overloads_and_new_dtypes(dtype: Any) -> None:
    """add.Scalar / add.Scalar_out / add_.Scalar and the bool and complex dtypes on the GPU: the same
    opmath functor as torch's CUDA add, so the same bits."""
    add, add_ = cuda_op("add"), cuda_op("add_")
    x = (
        (torch.randn(1003, device="cuda", dtype=torch.complex128) * 10).to(dtype)
        if dtype.is_complex
        else (torch.randn(1003, device="cuda") * 10).to(dtype)
    )
    for other in (
        2,
        2.5,
        True,
        1.5 - 2j,
        x.flip(0),
        torch.tensor(0.3, device="cuda"),
        torch.tensor(3),
    ):
        for alpha in (1, 3, -3.125, 0.3, True, 2j):
            try:
                want = torch.add(x, other, alpha=alpha)
            except RuntimeError:
                with pytest.raises(RuntimeError, match="add"):
                    add(x, other, alpha=alpha)
                continue
            got = add(x, other, alpha=alpha)
            assert got.dtype == want.dtype and got.device == want.device
            torch.testing.assert_close(got, want, atol=0, rtol=0, equal_nan=True)
            out = torch.empty(0, device="cuda", dtype=want.dtype)
            assert add(x, other, alpha=alpha, out=out) is out
            torch.testing.assert_close(out, want, atol=0, rtol=0, equal_nan=True)
            if want.dtype == x.dtype:
                y = x.clone()
                assert add_(y, other, alpha=alpha) is y
                torch.testing.assert_close(y, want, atol=0, rtol=0, equal_nan=True)


def test_add_half_computes_in_float_and_rounds_once() -> None:
    """The issue's case: float16 with alpha=-3.125 (and a non-representable alpha) equals torch's CUDA add."""
    add = cuda_op("add")
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        # a[::2] and b[1::2]: 2050 elements each
        a = torch.randn(4100, generator=g, device="cuda").to(dtype)
        b = torch.randn(4100, generator=g, device="cuda").to(dtype)
        for alpha in (-3.125, 0.3, 7):
            torch.testing.assert_close(
                add(a, b, alpha=alpha), torch.add(a, b, alpha=alpha), atol=0, rtol=0
            )
            torch.testing.assert_close(
                add(a[::2], b[1::2], alpha=alpha),
                torch.add(a[::2], b[1::2], alpha=alpha),
                atol=0,
                rtol=0,
            )


def test_add_scalar_gradients_and_opcheck() -> None:
    add = cuda_op("add")
    x = torch.randn(3, 4, device="cuda", dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: add(t, 2.5, alpha=3), (x,))
    torch.library.opcheck(add.packet.Scalar, (x, 2.5), {"alpha": 3})
    torch.library.opcheck(
        add.packet.Scalar_out,
        (x.detach(), 2.5, 3),
        {"out": torch.empty(3, 4, device="cuda", dtype=torch.float64)},
    )
    torch.library.opcheck(cuda_op("add_").packet.Scalar, (x.detach().clone(), 2.5), {"alpha": 3})


# ---------------------------------------------------------------- nms


def _boxes(n: int, dtype: Any, seed: int) -> tuple[Any, Any]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    xy = torch.rand(n, 2, generator=g, device="cuda", dtype=torch.float64) * 100
    wh = torch.rand(n, 2, generator=g, device="cuda", dtype=torch.float64) * 30
    wh[: n // 10] = 0  # degenerate, zero-area boxes
    boxes = torch.cat([xy, xy + wh], dim=1).to(dtype)
    scores = torch.rand(n, generator=g, device="cuda", dtype=torch.float64).to(dtype)
    return boxes, scores


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 1000, 5000])
def test_nms_matches_torchvision(n: int, dtype: Any) -> None:
    tv = pytest.importorskip("torchvision")
    nms = cuda_op("nms")
    for seed, iou in ((0, 0.5), (1, 0.0), (2, 0.9)):
        boxes, scores = _boxes(n, dtype, seed)
        got = nms(boxes, scores, iou)
        assert got.device == boxes.device and got.dtype == torch.int64
        torch.testing.assert_close(got, tv.ops.nms(boxes, scores, iou), atol=0, rtol=0)
        torch.testing.assert_close(
            got.cpu(), jitops.reference("nms")(boxes.cpu(), scores.cpu(), iou), atol=0, rtol=0
        )


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("n", [1000, 4096, 4097, 5000, 20000, 50000])
def test_nms_both_greedy_passes_match_torchvision(n: int, dtype: Any) -> None:
    """Up to 4096 boxes the greedy pass runs on the host, above on the GPU; both give torchvision's indices,
    float16 included (its CUDA kernel takes float16)."""
    tv = pytest.importorskip("torchvision")
    nms = cuda_op("nms")
    for seed, iou in ((0, 0.5), (1, 0.3), (2, 0.7)):
        boxes, scores = _boxes(n, dtype, seed)
        got = nms(boxes, scores, iou)
        assert got.device == boxes.device and got.dtype == torch.int64
        assert got.tolist() == tv.ops.nms(boxes, scores, iou).tolist()
    # equal scores: stable order, as torchvision's sort
    ties = torch.randint(0, 3, (n,), device="cuda").to(dtype)
    assert nms(boxes, ties, 0.5).tolist() == tv.ops.nms(boxes, ties, 0.5).tolist()


def test_nms_float16_same_indices_on_cpu_and_cuda() -> None:
    """float16 on the CPU follows torchvision's CUDA formula, so both devices agree."""
    nms = cuda_op("nms")
    for n in (300, 5000):
        boxes, scores = _boxes(n, torch.float16, 4)
        assert (
            nms(boxes, scores, 0.5).cpu().tolist()
            == jitops.get("nms")(boxes.cpu(), scores.cpu(), 0.5).tolist()
        )


def test_nms_empty_input() -> None:
    nms = cuda_op("nms")
    got = nms(torch.empty(0, 4, device="cuda"), torch.empty(0, device="cuda"), 0.5)
    assert got.shape == (0,) and got.dtype == torch.int64 and got.is_cuda


def test_nms_opcheck() -> None:
    nms = cuda_op("nms")
    boxes, scores = _boxes(200, torch.float32, 3)
    torch.library.opcheck(nms.default, (boxes, scores, 0.5))


# ------------------------------------------------------ every op: streams, devices


def _inputs(name: str, device: str) -> tuple[Any, ...]:
    g = torch.Generator(device="cpu").manual_seed(7)
    if name == "softmax":
        return (torch.randn(256, 1024, generator=g).to(device), -1)
    if name == "add":
        return (
            torch.randn(256, 1024, generator=g).to(device),
            torch.randn(1024, generator=g).to(device),
        )
    xy, wh = torch.rand(500, 2, generator=g) * 100, torch.rand(500, 2, generator=g) * 30
    return (
        torch.cat([xy, xy + wh], dim=1).to(device),
        torch.rand(500, generator=g).to(device),
        0.5,
    )


def _on_cpu(name: str, args: tuple[Any, ...]) -> Any:
    return jitops.reference(name)(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])


@pytest.mark.parametrize("name", ["softmax", "add", "nms"])
def test_runs_on_the_current_stream(name: str) -> None:
    """The inputs are written on a side stream behind a ~0.1 s GPU sleep: a kernel
    launched on any other stream would read the zeros that are there before."""
    op = cuda_op(name)
    args = _inputs(name, "cuda")
    late = [torch.zeros_like(a) if isinstance(a, torch.Tensor) else a for a in args]
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(200_000_000)
        for dst, src in zip(late, args):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        got = op(*late)
    stream.synchronize()
    torch.testing.assert_close(
        got.cpu(), _on_cpu(name, args), **({} if name != "nms" else {"atol": 0, "rtol": 0})
    )


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("name", ["softmax", "add", "nms"])
def test_runs_on_the_inputs_device(name: str) -> None:
    """Inputs on cuda:1 while cuda:0 is current: the device guard puts the launch on cuda:1."""
    op = cuda_op(name)
    args = _inputs(name, "cuda:1")
    with torch.cuda.device(0):
        got = op(*args)
    assert got.device == torch.device("cuda:1")
    torch.testing.assert_close(
        got.cpu(), _on_cpu(name, args), **({} if name != "nms" else {"atol": 0, "rtol": 0})
    )
