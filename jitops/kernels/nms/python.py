"""Python side of the nms library: reference and fake kernel (nms is not differentiable)."""

from __future__ import annotations

import torch


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_inputs(boxes: torch.Tensor, scores: torch.Tensor) -> None:
    """The C++ checks of nms_common.h, word for word."""
    torch._check(boxes.dim() == 2 and boxes.shape[1] == 4, lambda: f"nms: boxes must be (N, 4), got {list(boxes.shape)}")
    torch._check(
        scores.dim() == 1 and scores.shape[0] == boxes.shape[0],
        lambda: f"nms: scores must be (N,) for N = {boxes.shape[0]} boxes, got {list(scores.shape)}",
    )
    torch._check(
        boxes.dtype in (torch.float32, torch.float64),
        lambda: f"nms: expected float32 or float64 boxes, got {_name(boxes.dtype)}",
    )
    torch._check(
        scores.dtype == boxes.dtype,
        lambda: f"nms: boxes and scores must have the same dtype, got {_name(boxes.dtype)} and {_name(scores.dtype)}",
    )
    torch._check(
        boxes.device == scores.device,
        lambda: f"nms: boxes and scores must be on the same device, got {boxes.device} and {scores.device}",
    )


def nms_reference(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Plain greedy NMS: visit boxes by decreasing score (ties by index), keep one, drop those with IoU > threshold."""
    check_inputs(boxes, scores)
    order = torch.sort(scores, descending=True, stable=True).indices
    b = boxes[order]
    x1, y1, x2, y2 = b.unbind(1)
    area = (x2 - x1) * (y2 - y1)
    alive = torch.ones(len(order), dtype=torch.bool, device=boxes.device)
    keep = []
    for i in range(len(order)):
        if not alive[i]:
            continue
        keep.append(order[i])
        w = (torch.minimum(x2[i], x2) - torch.maximum(x1[i], x1)).clamp(min=0)
        h = (torch.minimum(y2[i], y2) - torch.maximum(y1[i], y1)).clamp(min=0)
        inter = w * h
        iou = inter / (area[i] + area - inter)
        alive &= ~(iou > iou_threshold)
    if not keep:
        return torch.empty(0, dtype=torch.int64, device=boxes.device)
    return torch.stack(keep).to(torch.int64)


REFERENCES = {"nms": nms_reference}


def register(ns: str) -> None:
    """Fake kernel for one loaded build (namespace ``ns``): the output length depends on the data."""

    def fake_nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
        check_inputs(boxes, scores)
        ctx = torch.library.get_ctx()
        k = ctx.new_dynamic_size()  # data-dependent; at most N (a SymInt bound is not accepted)
        return boxes.new_empty((k,), dtype=torch.int64)

    torch.library.register_fake(f"{ns}::nms", fake_nms)
