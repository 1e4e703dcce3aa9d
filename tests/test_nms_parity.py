"""nms's two extra ways in, as torchvision takes them: autocast and quantized inputs.

- Under torch.autocast (CPU; CUDA with the ``cuda`` marker), float16 and
  bfloat16 boxes and scores are computed in float32: the indices are those of
  the float32 call on the same (rounded) values. float32 and float64 inputs
  are left alone; outside autocast bfloat16 is still refused.
- Quantized boxes and scores (CPU) follow torchvision's QuantizedCPU kernel:
  the greedy pass on the stored integers. Where the dequantized values are
  exact in float32 (8-bit values, scales that are small integers or powers of
  two) that is the float32 result on the dequantized tensors, bit for bit.
- Both registrations pass torch.library.opcheck (schema, autograd
  registration, fake tensor, AOT dispatch), and torch.compile traces the
  autocast one.

The library is built once per session (the session cache, see conftest.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch

import jitops
from tests.helpers import DEVICES

pytestmark = [
    pytest.mark.compile,
    pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions.*"),
]

THRESHOLDS = [0.0, 0.2, 0.5, 0.8, 1.0]


@pytest.fixture(scope="module", params=["stable", "aten"])
def get(request: pytest.FixtureRequest) -> Callable[[str], Any]:
    """nms for a device. CPU twice: the stable-ABI library a CPU target builds (``jitops.get``), and the ATen
    library whose CPU kernels (nms_cpu.cpp, register.cpp's Autocast and QuantizedCPU) a CUDA build carries."""
    if request.param == "stable":
        return lambda device: jitops.get("nms", device=device)
    import dataclasses

    from jitops.loading.loader import load_library
    from jitops.loading.ops import op_from_library
    from jitops.registry import lookup

    def aten(device: str) -> Any:
        if device != "cpu":
            pytest.skip("a CUDA build is the ATen library already")
        return op_from_library(
            load_library(dataclasses.replace(lookup("nms"), stable_cpu_sources=()), "cpu"), "nms"
        )

    return aten


def test_both_cpu_builds_define_the_spec_s_schema(get: Any) -> None:
    """The stable library defines its schema in C++ (nms_stable.cpp), the ATen one from the spec: the same."""
    from jitops.registry import lookup

    nms = get("cpu")
    assert str(nms.packet.default._schema).split("::", 1)[1] == lookup("nms").schemas[0]


def _boxes(n: int, seed: int, grid: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 xyxy boxes on a grid (so IoU == threshold and equal scores both happen), some of zero area."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g, dtype=torch.float64) * 200
    wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * 60
    wh[torch.rand(n, generator=g) < 0.1] = 0
    boxes = (torch.cat([xy, xy + wh], 1) * grid).round() / grid
    scores = (torch.rand(n, generator=g, dtype=torch.float64) * 8 * grid).round() / grid
    return boxes, scores


# ---------------------------------------------------------------- autocast


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("n", [0, 1, 40, 700])
def test_autocast_gives_the_float32_indices(
    get: Any, device: str, low: torch.dtype, n: int
) -> None:
    nms = get(device)
    for (seed, grid), threshold in itertools.product(
        [(n, 1.0), (n + 1, 4.0), (n + 2, 1e3)], THRESHOLDS
    ):
        boxes, scores = (t.to(low).to(device) for t in _boxes(n, seed, grid))
        want = nms(boxes.float(), scores.float(), threshold)
        with torch.autocast(device, dtype=low):
            got = nms(boxes, scores, threshold)
            ref = jitops.reference("nms")(boxes, scores, threshold)
            mixed = nms(boxes, scores.float(), threshold)  # one input already float32
        assert got.dtype == torch.int64 and got.device == boxes.device
        assert got.tolist() == want.tolist() == ref.tolist() == mixed.tolist(), (
            seed,
            grid,
            threshold,
        )


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_leaves_float32_and_float64_alone(get: Any, device: str) -> None:
    """float64 is not cast down and float32 not touched: same indices as outside autocast; a float64
    box set with bfloat16 scores becomes float64 + float32 and is refused, as torchvision does."""
    nms = get(device)
    boxes, scores = (t.to(device) for t in _boxes(300, 5, 1e4))
    for dtype in (torch.float32, torch.float64):
        b, s = boxes.to(dtype), scores.to(dtype)
        with torch.autocast(device, dtype=torch.bfloat16):
            got = nms(b, s, 0.5)
        assert got.tolist() == nms(b, s, 0.5).tolist()
    with torch.autocast(device, dtype=torch.bfloat16):
        with pytest.raises(
            RuntimeError,
            match="nms: boxes and scores must have the same dtype, got float64 and float32",
        ):
            nms(boxes, scores.bfloat16(), 0.5)


def test_bfloat16_outside_autocast_is_still_refused(get: Any) -> None:
    nms = get("cpu")
    z = torch.zeros(3, 4, dtype=torch.bfloat16)
    with pytest.raises(
        RuntimeError,
        match="expected float16, float32 or float64 boxes, got bfloat16 .*under torch.autocast",
    ):
        nms(z, torch.zeros(3, dtype=torch.bfloat16), 0.5)
    with torch.autocast("cpu", enabled=False), pytest.raises(RuntimeError, match="got bfloat16"):
        nms(z, torch.zeros(3, dtype=torch.bfloat16), 0.5)


def test_autocast_float16_takes_the_float32_formula_not_the_float16_one(get: Any) -> None:
    """Outside autocast CPU float16 follows torchvision's CUDA float16 formula (differences rounded to
    float16); under autocast it must be the float32 one. Find inputs where the two disagree and check
    that autocast gives the float32 answer there."""
    nms = get("cpu")
    differ = 0
    for seed, threshold in itertools.product(range(12), (0.7, 0.9)):
        # boxes from near 0 to 500..2000: their float16 differences round (spacing 0.5..1 up there)
        g = torch.Generator().manual_seed(seed)
        boxes = torch.cat(
            [torch.rand(60, 2, generator=g) * 3, 500 + torch.rand(60, 2, generator=g) * 1500], 1
        ).half()
        scores = torch.rand(60, generator=g).half()
        half_way = nms(boxes, scores, threshold)
        float_way = nms(boxes.float(), scores.float(), threshold)
        with torch.autocast("cpu", dtype=torch.float16):
            got = nms(boxes, scores, threshold)
        assert got.tolist() == float_way.tolist()
        differ += half_way.tolist() != float_way.tolist()
    assert differ > 0, "no input separated the two formulas: the test proves nothing"


def test_autocast_opcheck_and_compile(get: Any) -> None:
    nms = get("cpu")
    boxes, scores = (t.bfloat16() for t in _boxes(50, 9, 1.0))
    want = nms(boxes.float(), scores.float(), 0.5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.library.opcheck(nms.packet.default, (boxes, scores, 0.5))
        torch._dynamo.reset()
        compiled = torch.compile(lambda b, s: nms(b, s, 0.5), fullgraph=True, dynamic=True)
        assert compiled(boxes, scores).tolist() == want.tolist()


# ---------------------------------------------------------------- quantized


def _quantize(t: torch.Tensor, scale: float, zero_point: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.quantize_per_tensor(t.float(), scale=scale, zero_point=zero_point, dtype=dtype)


# (dtype, scale, zero point): scales whose dequantized 8-bit values, differences and products are
# exact in float32, so the integer rule and the float rule on the dequantized values decide every
# case alike.
EXACT = [
    (torch.quint8, 1.0, 0),
    (torch.quint8, 2.0, 50),
    (torch.quint8, 3.0, 10),
    (torch.quint8, 0.5, 7),
    (torch.qint8, 1.0, 0),
    (torch.qint8, 0.25, -20),
    (torch.qint8, 3.0, 5),
]


@pytest.mark.parametrize(
    "qcase", EXACT, ids=lambda c: f"{str(c[0]).removeprefix('torch.')}-{c[1]}-{c[2]}"
)
@pytest.mark.parametrize("n", [0, 1, 30, 1000])
def test_quantized_gives_the_dequantized_result(
    get: Any, qcase: tuple[torch.dtype, float, int], n: int
) -> None:
    nms = get("cpu")
    dtype, scale, zero_point = qcase
    for (seed, grid), threshold in itertools.product([(n, 1.0), (n + 1, 0.25)], THRESHOLDS):
        boxes, scores = _boxes(n, seed, grid)
        # qint8 holds -128..127: shift the boxes into its range; many scores tie after quantization
        qb = _quantize(
            boxes * (0.5 if dtype == torch.qint8 else 1.0) - (60 if dtype == torch.qint8 else 0),
            scale,
            zero_point,
            dtype,
        )
        qs = _quantize(scores, scale, zero_point, dtype)
        got = nms(qb, qs, threshold)
        assert got.dtype == torch.int64 and got.device.type == "cpu"
        want = nms(qb.dequantize(), qs.dequantize(), threshold)
        assert (
            got.tolist() == want.tolist() == jitops.reference("nms")(qb, qs, threshold).tolist()
        ), (seed, threshold)


def test_quantized_compares_the_stored_integers(get: Any) -> None:
    """qint32 with a scale whose dequantized values are not exact: torchvision's rule uses the stored
    integers, so the result is the float32 result on those integers (and the reference's)."""
    nms = get("cpu")
    for seed, threshold in itertools.product(range(4), THRESHOLDS):
        boxes, scores = _boxes(500, seed, 1.0)
        qb, qs = (
            _quantize(boxes * 1e3, 0.1, 17, torch.qint32),
            _quantize(scores, 0.1, -3, torch.qint32),
        )
        got = nms(qb, qs, threshold)
        ints = (qb.int_repr() - 17).float()  # exact: |values| < 2**24
        assert got.tolist() == nms(ints, qs.int_repr().float(), threshold).tolist()
        assert got.tolist() == jitops.reference("nms")(qb, qs, threshold).tolist()


def test_quantized_inputs_that_cannot_be_compared_are_refused(get: Any) -> None:
    nms = get("cpu")
    boxes, scores = _boxes(6, 1, 1.0)
    qb, qs = _quantize(boxes, 1.0, 0, torch.quint8), _quantize(scores, 1.0, 0, torch.quint8)
    per_channel = torch.quantize_per_channel(
        boxes.float(),
        torch.ones(6, dtype=torch.float64),
        torch.zeros(6, dtype=torch.int64),
        0,
        torch.quint8,
    )
    cases = [
        (
            (qb, scores.float()),
            "nms: boxes and scores must have the same dtype, got quint8 and float32",
        ),
        (
            (boxes.float(), qs),
            "nms: boxes and scores must have the same dtype, got float32 and quint8",
        ),
        ((qb, _quantize(scores, 1.0, 0, torch.qint8)), "same dtype, got quint8 and qint8"),
        ((per_channel, qs), "quantized boxes must be quantized per tensor"),
        ((qb[:, :3], qs), r"boxes must be \(N, 4\)"),
    ]
    for args, message in cases:
        for fn in (nms, jitops.reference("nms")):
            with pytest.raises(RuntimeError, match=message):
                fn(*args, 0.5)


def test_quantized_opcheck(get: Any) -> None:
    """Schema, autograd registration and fake tensor checks pass. AOT dispatch cannot run: torch has no
    meta (fake) quantized tensors, and says so (torchvision's generated opcheck tests skip that error)."""
    nms = get("cpu")
    boxes, scores = _boxes(40, 3, 1.0)
    args = (
        _quantize(boxes, 2.0, 50, torch.quint8),
        _quantize(scores * 30, 2.0, 50, torch.quint8),
        0.5,
    )
    torch.library.opcheck(
        nms.packet.default,
        args,
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )
    with pytest.raises(Exception, match="test_aot_dispatch_dynamic failed") as e:
        torch.library.opcheck(nms.packet.default, args, test_utils="test_aot_dispatch_dynamic")
    assert isinstance(
        e.value.__cause__, torch._subclasses.fake_tensor.UnsupportedFakeTensorException
    )


# ------------------------------------------------------------ against torchvision, where it imports


def _torchvision_nms() -> Callable[..., torch.Tensor] | None:
    try:
        from torchvision.ops import nms

        nms(torch.zeros(1, 4), torch.zeros(1), 0.5)  # its C++ ops may not load with this torch
        return nms
    except Exception:  # noqa: BLE001
        return None


def test_same_indices_as_torchvision_for_autocast_and_quantized(get: Any) -> None:
    tv = _torchvision_nms()
    if tv is None:
        pytest.skip(
            "torchvision's C++ ops do not load with this torch (run in a venv with a matching torchvision)"
        )
    nms = get("cpu")
    for seed, threshold in itertools.product(range(3), THRESHOLDS):
        boxes, scores = _boxes(800, seed, 4.0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            b, s = boxes.bfloat16(), scores.bfloat16()
            assert nms(b, s, threshold).tolist() == tv(b, s, threshold).tolist()
        for dtype, scale, zero_point in [*EXACT, (torch.qint32, 0.1, 17)]:
            qb = _quantize(boxes * (0.5 if dtype == torch.qint8 else 1.0), scale, zero_point, dtype)
            qs = _quantize(scores, scale, zero_point, dtype)
            assert nms(qb, qs, threshold).tolist() == tv(qb, qs, threshold).tolist(), (
                dtype,
                scale,
                threshold,
            )
