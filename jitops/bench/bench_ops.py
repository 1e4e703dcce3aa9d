"""What ``jitops bench OP`` runs: each op's inputs, its torch counterparts, and the cases to time.

:func:`request` checks the command's arguments before anything is built
(every problem is a :class:`~jitops.errors.JitopsError` naming the fix);
:func:`cases` turns a request into :class:`~jitops.bench.Case` values.
:func:`softmax_case` and :func:`nms_case` also serve ``benchmarks/kernels.py``,
so the script and the command time the same calls.

May import: torch, jitops's public API (``get``, ``reference``, errors),
:mod:`jitops.bench`; torchvision optionally, at call time. Like
:mod:`jitops.bench`, only ``jitops bench`` and the benchmark scripts import it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import jitops

from .. import bench
from . import Case, Fn, traffic
from ..errors import JitopsError, UnknownOpError

SOFTMAXES = {"softmax": torch.softmax, "log_softmax": torch.log_softmax}
# nms: a shape is the number of boxes; others default to 4096x4096
DEFAULT_SHAPES = {"nms": ((1000,),)}
_ALIASES = {
    "f16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "float": "float32",
    "f64": "float64",
    "double": "float64",
}


@dataclass(frozen=True)
class Request:
    """A checked ``jitops bench`` command line."""

    op: str
    shapes: tuple[tuple[int, ...], ...]
    dtype: torch.dtype
    device: str
    dim: int
    backward: bool
    reference: Callable[..., Any] | None
    trace: Path | None = None


def parse_shape(text: str) -> tuple[int, ...]:
    """``"4096,4096"`` (or ``4096x4096``) -> ``(4096, 4096)``."""
    if not re.fullmatch(r"\s*\d+(\s*[,x]\s*\d+)*\s*", text):
        raise JitopsError(
            f"invalid shape {text!r}: expected sizes separated by commas, e.g. --shape 4096,4096"
        )
    return tuple(int(s) for s in re.split(r"[,x]", text.replace(" ", "")))


def parse_dtype(text: str) -> torch.dtype:
    name = _ALIASES.get(text.lower(), text.lower()).removeprefix("torch.")
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise JitopsError(
            f"unknown dtype {text!r}: use a torch dtype name, e.g. float32, bfloat16, float16, int64"
        )
    return dtype


def request(
    op: str,
    shapes: Sequence[str] | None,
    dtype: str,
    device: str | None,
    dim: int | None,
    backward: bool,
    trace: str | None = None,
) -> Request:
    """Check everything the user typed; raise JitopsError (usage) before anything is built or timed."""
    try:
        # raises UnknownOpError, listing close matches, for a name nobody knows
        ref = jitops.reference(op)
    except UnknownOpError:
        raise
    except KeyError:
        ref = None  # an op of a user library without a reference
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        why = (
            "this torch is built without CUDA"
            if not torch.version.cuda
            else "torch.cuda.is_available() is False"
        )
        raise JitopsError(
            f"--device cuda: no usable CUDA GPU here ({why}). Fix: run on a GPU machine, or use --device cpu"
        )
    parsed = (
        tuple(parse_shape(s) for s in shapes) if shapes else DEFAULT_SHAPES.get(op, ((4096, 4096),))
    )
    dt = parse_dtype(dtype)
    if dim is not None and op not in SOFTMAXES:
        raise JitopsError(f"--dim applies to softmax and log_softmax, not to {op}")
    if backward and (op == "nms" or op.endswith("_")):
        raise JitopsError(f"--backward: {op} is not differentiable; drop --backward")
    if backward and not dt.is_floating_point:
        raise JitopsError(f"--backward needs a floating dtype, got {dtype}")
    if op == "nms" and any(len(s) != 1 for s in parsed):
        raise JitopsError("nms: give the number of boxes as the shape, e.g. --shape 20000")
    if op in SOFTMAXES:
        d = -1 if dim is None else dim
        for s in parsed:
            if not -max(len(s), 1) <= d < max(len(s), 1):
                raise JitopsError(f"--dim {d} is out of range for shape {s}")
    if trace is not None and not Path(trace).resolve().parent.is_dir():
        raise JitopsError(f"--trace {trace}: folder {Path(trace).resolve().parent} does not exist")
    return Request(
        op,
        parsed,
        dt,
        device,
        -1 if dim is None else dim,
        backward,
        ref,
        None if trace is None else Path(trace),
    )


# ------------------------------------------------------------------ inputs and calls


def random(
    shape: Sequence[int], dtype: torch.dtype, device: str, gen: torch.Generator | None = None
) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(tuple(shape), generator=gen, device=device).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, tuple(shape), generator=gen, device=device).bool()
    return torch.randint(0, 100, tuple(shape), generator=gen, device=device).to(dtype)


def random_boxes(
    n: int, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` xyxy boxes in a 1100-wide square with sides 1-101, and their scores (as benchmarks/kernels.py always made them)."""
    gen = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=gen) * 1000
    boxes = torch.cat([xy, xy + torch.rand(n, 2, generator=gen) * 100 + 1], 1)
    scores = torch.rand(n, generator=gen)
    return boxes.to(device, dtype), scores.to(device, dtype)


def call(
    fn: Callable[..., Any], inputs: Sequence[torch.Tensor], mode: str = "forward", **kw: Any
) -> Fn:
    """A zero-argument call of ``fn(*inputs, **kw)``.

    ``mode``: "forward"; "backward", the backward alone (``torch.autograd.grad``
    of an output computed once here, graph retained); "fwd+bwd", both every call.
    """
    if mode == "forward":
        return lambda: fn(*inputs, **kw)
    leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
    wrt = [t for t in leaves if t.requires_grad]
    out = fn(*leaves, **kw)
    grad = torch.randn_like(out)
    if mode == "backward":
        return lambda: torch.autograd.grad(out, wrt, grad, retain_graph=True)
    if mode == "fwd+bwd":
        return lambda: torch.autograd.grad(fn(*leaves, **kw), wrt, grad)
    raise ValueError(f"mode must be forward, backward or fwd+bwd, got {mode!r}")


def close_to(
    expected: Callable[[], Any], got: Callable[[], Any], what: str
) -> Callable[[], str | None]:
    """A Case check: ``got()`` equals ``expected()`` within torch.testing's tolerance for the dtype."""

    def check() -> str | None:
        try:
            torch.testing.assert_close(got(), expected())
        except AssertionError as e:
            return f"result differs from {what}: {str(e).splitlines()[0]}"
        return None

    return check


def softmax_case(
    name: str,
    x: torch.Tensor,
    dim: int,
    mode: str,
    sides: dict[str, Callable[..., Any]],
    check_against: str | None = None,
) -> Case:
    """softmax or log_softmax of ``x`` along ``dim``: ``sides`` maps a name to ``fn(x, dim)`` (jitops's first)."""
    calls = {k: call(f, [x], mode, dim=dim) for k, f in sides.items()}
    # fwd: x, y; bwd: grad, out, grad_in
    moved = traffic(x, x) if mode == "forward" else traffic(x, x, x)
    ours = next(iter(sides.values()))
    check = None
    if check_against is not None:
        check = close_to(
            lambda: sides[check_against](x, dim=dim), lambda: ours(x, dim=dim), check_against
        )
    dims = "" if dim in (-1, x.dim() - 1) else f" dim={dim}"
    kind = {"forward": "fwd", "backward": "bwd", "fwd+bwd": "fwd+bwd"}[mode]
    dt = str(x.dtype).removeprefix("torch.").replace("float", "f")
    return Case(f"{name} {tuple(x.shape)}{dims} {dt} {kind}", calls, moved, check)


def nms_case(
    n: int,
    sides: dict[str, Callable[..., Any]],
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    iou: float = 0.5,
    check_against: str | None = None,
) -> Case:
    boxes, scores = random_boxes(n, dtype, device)
    calls = {k: call(f, [boxes, scores, iou]) for k, f in sides.items()}  # type: ignore[list-item]
    check = None
    if check_against is not None:
        ours, theirs = next(iter(calls.values())), calls[check_against]

        def check() -> str | None:
            return (
                None
                if torch.equal(ours(), theirs())
                else f"kept indices differ from {check_against}'s"
            )

    return Case(f"nms {n} boxes, iou {iou}", calls, None, check)


def torchvision_nms() -> Callable[..., Any] | None:
    """torchvision.ops.nms, or None when torchvision is missing or its C++ ops do not load with this torch."""
    try:
        from torchvision.ops import nms

        nms(torch.zeros(1, 4), torch.zeros(1), 0.5)
        return nms
    except Exception:  # noqa: BLE001
        return None


def cases(req: Request) -> list[Case]:
    """The cases of a request: jitops's op, then torch's native op where there is one, then the reference."""
    op = jitops.get(req.op, device=req.device)
    mode = "backward" if req.backward else "forward"
    natives: dict[str, Callable[..., Any]] = {"add": torch.add, "add_": torch.Tensor.add_}
    native: Callable[..., Any] | None = natives.get(req.op)
    if req.op in SOFTMAXES:
        native = SOFTMAXES[req.op]
    elif req.op == "nms":
        native = torchvision_nms()
    named = {
        "jitops": op,
        "torch" if req.op != "nms" else "torchvision": native,
        "reference": req.reference,
    }
    sides = {k: f for k, f in named.items() if f is not None}
    against = "reference" if req.reference is not None else None
    out: list[Case] = []
    for shape in req.shapes:
        if req.op in SOFTMAXES:
            x = random(shape, req.dtype, req.device)
            out.append(softmax_case(req.op, x, req.dim, mode, sides, check_against=against))
        elif req.op == "nms":
            out.append(nms_case(shape[0], sides, req.dtype, req.device, check_against=against))
        # add, add_, and a user library's op: one tensor per input (add: self and other, same shape)
        else:
            inputs = [
                random(shape, req.dtype, req.device)
                for _ in range(2 if req.op in ("add", "add_") else 1)
            ]
            calls = {k: call(f, inputs, mode) for k, f in sides.items()}
            check = None
            if against is not None and mode == "forward" and not req.op.endswith("_"):
                check = close_to(calls[against], calls["jitops"], against)
            dt = str(req.dtype).removeprefix("torch.")
            # inputs read and the output written (backward: the grad read and one grad per input
            # written)
            out.append(
                Case(
                    f"{req.op} {shape} {dt}{' bwd' if req.backward else ''}",
                    calls,
                    traffic(*inputs, inputs[0]),
                    check,
                )
            )
    return out


def run(req: Request, rounds: int = bench.ROUNDS) -> list[str]:
    """Measure a request's cases; the lines to print (a header, the table, notes)."""
    timing = bench.Timing(rounds=rounds)
    try:
        todo = cases(req)
        rows = [bench.measure(c, req.device, timing) for c in todo]
    except JitopsError:
        raise  # a failed build says so itself (BuildError is a RuntimeError too)
    except RuntimeError as e:  # a kernel's TORCH_CHECK on these inputs: say which, no traceback
        raise JitopsError(f"{req.op} failed on these inputs: {str(e).splitlines()[0]}") from e
    copy = bench.copy_bandwidth(req.device, timing=timing)
    timer = (
        bench.gpu_timer_name()
        if req.device == "cuda"
        else f"CPU, {rounds} interleaved rounds, medians"
    )
    where = (
        torch.cuda.get_device_name()
        if req.device == "cuda"
        else f"{torch.get_num_threads()} threads"
    )
    lines = [
        f"jitops bench {req.op} on {req.device} ({where}), torch {torch.__version__}; timer: {timer}",
        f"copy bandwidth {copy / 1e9:.0f} GB/s; ratio = other time / jitops time (> 1: jitops faster)"
        + ("; backward alone (autograd.grad of a precomputed output)" if req.backward else ""),
    ]
    lines += bench.table(rows, copy)
    if req.trace is not None:
        bench.trace(todo, req.trace, req.device)
        lines.append(f"trace: {req.trace} (open in chrome://tracing or https://ui.perfetto.dev)")
    return lines
