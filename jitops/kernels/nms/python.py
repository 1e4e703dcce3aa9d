"""Python side of the nms library: reference and fake kernel (nms is not differentiable).

The reference follows torchvision's IoU formulas (see nms_common.h): its CPU
kernel's for float32/float64 CPU tensors, its CUDA kernel's for CUDA tensors
and for float16 anywhere, its QuantizedCPU kernel's for quantized tensors;
under torch.autocast float16/bfloat16 inputs are computed in float32, as the
C++ Autocast kernels do. Imports only torch and the sibling ``_autograd`` module (``register_fake``).
"""

from __future__ import annotations

import torch

from .._autograd import fragment, register_fake

_DTYPES = (torch.float16, torch.float32, torch.float64)
_QDTYPES = (torch.qint8, torch.quint8, torch.qint32)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_inputs(boxes: torch.Tensor, scores: torch.Tensor) -> None:
    """The C++ checks of nms_common.h, word for word: check_quantized_inputs when either input is
    quantized (the QuantizedCPU kernel), else check_inputs."""
    torch._check(
        boxes.dim() == 2 and boxes.shape[1] == 4,
        lambda: f"nms: boxes must be (N, 4), got {list(boxes.shape)}",
    )
    torch._check(
        scores.dim() == 1 and scores.shape[0] == boxes.shape[0],
        lambda: (
            f"nms: scores must be (N,) for N = {boxes.shape[0]} boxes, got {list(scores.shape)}"
        ),
    )
    quantized = boxes.is_quantized or scores.is_quantized
    if not quantized:
        torch._check(
            boxes.dtype in _DTYPES,
            lambda: (
                f"nms: expected float16, float32 or float64 boxes, got {_name(boxes.dtype)} (bfloat16 is taken "
                "under torch.autocast, which computes it in float32; quantized boxes need quantized scores)"
            ),
        )
    torch._check(
        scores.dtype == boxes.dtype,
        lambda: (
            f"nms: boxes and scores must have the same dtype, got {_name(boxes.dtype)} and {_name(scores.dtype)}"
        ),
    )
    torch._check(
        boxes.device == scores.device,
        lambda: (
            f"nms: boxes and scores must be on the same device, got {boxes.device} and {scores.device}"
        ),
    )
    if quantized:
        torch._check(
            boxes.dtype in _QDTYPES,
            lambda: (
                f"nms: expected qint8, quint8 or qint32 quantized boxes, got {_name(boxes.dtype)}"
            ),
        )
        for what, t in (("boxes", boxes), ("scores", scores)):
            scheme = str(t.qscheme()).removeprefix("torch.")
            torch._check(
                t.qscheme() == torch.per_tensor_affine,
                lambda: (
                    f"nms: quantized {what} must be quantized per tensor (torch.quantize_per_tensor), got "
                    f"{scheme}: per-channel scales would make the integer values of different boxes incomparable. "
                    "Fix: dequantize them first"
                ),
            )


def _max(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.where(a < b, b, a)  # std::max(a, b), NaN handling included


def _min(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.where(b < a, b, a)  # std::min(a, b)


def _iou_cpu(b: torch.Tensor, area: torch.Tensor, i: int, threshold: float) -> torch.Tensor:
    """torchvision's CPU kernel: IoU in the box dtype, compared with the threshold as a double."""
    x1, y1, x2, y2 = b.unbind(1)
    zero = torch.zeros((), dtype=b.dtype, device=b.device)
    w = _max(zero, _min(x2[i], x2) - _max(x1[i], x1))
    h = _max(zero, _min(y2[i], y2) - _max(y1[i], y1))
    inter = w * h
    return (inter / (area[i] + area - inter)).double() > threshold


def _iou_cuda(b: torch.Tensor, area: torch.Tensor, i: int, threshold: float) -> torch.Tensor:
    """torchvision's CUDA kernel: accumulate in float for float16 (differences rounded to float16),
    fmax/fmin, compared with the threshold as a float."""
    acc = torch.float32 if b.dtype == torch.float16 else b.dtype
    x1, y1, x2, y2 = b.unbind(1)
    width = torch.fmax(
        torch.fmin(x2[i], x2) - torch.fmax(x1[i], x1),
        torch.zeros((), dtype=b.dtype, device=b.device),
    )
    height = torch.fmax(
        torch.fmin(y2[i], y2) - torch.fmax(y1[i], y1),
        torch.zeros((), dtype=b.dtype, device=b.device),
    )
    inter = width.to(acc) * height.to(acc)
    iou = inter / (area[i] + area - inter)
    return iou > torch.tensor(threshold, dtype=torch.float32).to(acc)


def _cuda_area(b: torch.Tensor) -> torch.Tensor:
    acc = torch.float32 if b.dtype == torch.float16 else b.dtype
    x1, y1, x2, y2 = b.unbind(1)
    # (y2 - y1) in the box dtype, as torchvision's
    return (x2.to(acc) - x1.to(acc)) * (y2 - y1).to(acc)


def _autocast(t: torch.Tensor) -> torch.Tensor:
    """register.cpp's autocast rule: under torch.autocast for the tensor's device, float16 and bfloat16
    are computed in float32 (float32 and float64 as they are)."""
    device = t.device.type
    if (
        t.dtype in (torch.float16, torch.bfloat16)
        and device in ("cpu", "cuda")
        and torch.is_autocast_enabled(device)
    ):
        return t.float()
    return t


def nms_reference(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Plain greedy NMS: visit boxes by decreasing score (ties by index), keep one, drop those it suppresses.

    Quantized inputs: torchvision's QuantizedCPU rule, on the stored integers (see nms_greedy.h)."""
    boxes, scores = _autocast(boxes), _autocast(scores)
    check_inputs(boxes, scores)
    if boxes.is_quantized:
        raw = boxes.int_repr().to(torch.int64)
        order = torch.sort(scores.int_repr(), descending=True, stable=True).indices
        raw = raw[order]
        b = raw.float()
        area = ((raw[:, 2] - raw[:, 0]) * (raw[:, 3] - raw[:, 1])).float()
        suppress = _iou_cpu
    else:
        order = torch.sort(scores, descending=True, stable=True).indices
        b = boxes[order]
        if boxes.is_cuda or boxes.dtype == torch.float16:
            area, suppress = _cuda_area(b), _iou_cuda
        else:
            x1, y1, x2, y2 = b.unbind(1)
            area, suppress = (x2 - x1) * (y2 - y1), _iou_cpu
    alive = torch.ones(len(order), dtype=torch.bool, device=boxes.device)
    keep = []
    for i in range(len(order)):
        if not alive[i]:
            continue
        keep.append(order[i])
        alive &= ~suppress(b, area, i, iou_threshold)
    if not keep:
        return torch.empty(0, dtype=torch.int64, device=boxes.device)
    return torch.stack(keep).to(torch.int64)


REFERENCES = {"nms": nms_reference}


def register(ns: str) -> None:
    """Fake kernel for one loaded build (namespace ``ns``): the output length depends on the data; and
    the autocast rule where the library has none."""

    def fake_nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
        check_inputs(boxes, scores)
        ctx = torch.library.get_ctx()
        k = ctx.new_dynamic_size()  # data-dependent; at most N (a SymInt bound is not accepted)
        return boxes.new_empty((k,), dtype=torch.int64)

    register_fake(f"{ns}::nms", fake_nms)
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::nms", "AutocastCPU"):
        # The stable-ABI build (nms_stable.cpp), whose C ABI cannot redispatch: torchvision's rule,
        # as register.cpp's (float16 and bfloat16 on the CPU in float32, float32 and float64 as they
        # are; torch.amp's cast rule), then the op again with autocast excluded, so fake tensors
        # reach the fake kernel.
        torch.library.register_autocast(f"{ns}::nms", "cpu", torch.float32, lib=fragment(ns))
