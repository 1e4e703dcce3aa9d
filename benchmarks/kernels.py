"""Kernel benchmarks: jitops ops against torch (and torchvision's nms when importable), CPU.

Run from the repository root: ``python benchmarks/kernels.py``. Prints one
line per case: median times and the speed ratio (torch time / jitops time,
so > 1 means jitops is faster; the median of ratios taken in interleaved
rounds, see ``paired``). "alloc" cases allocate the output on every
call; "prealloc" cases write into an existing buffer (torch._softmax /
torch._log_softmax out=, torch.add out=, jitops add out=). jitops softmax has
no out= variant: the issue's schema is functional, so its softmax rows are
allocating only (torch's prealloc row is printed for reference).
"""

from __future__ import annotations

import statistics
import sys
import timeit
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.utils.benchmark as tb  # noqa: E402

import jitops  # noqa: E402


ROUNDS = 15  # paired rounds per case; each round times both sides back to back
BLOCK_S = 0.05  # seconds per timed block


def calibrate(fn: Callable[[], Any]) -> int:
    """Calls per block: torch.utils.benchmark's adaptive pass picks it."""
    m = tb.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.2)
    return max(1, round(BLOCK_S / max(m.median, 1e-9)))


def paired(ours: Callable[[], Any], theirs: Callable[[], Any]) -> tuple[float, float, float]:
    """Median time of each side and the median of the per-round ratios.

    The machine is shared (2 cores, other builds run), so the two sides are
    interleaved: each round times a block of one, then a block of the other,
    alternating which goes first, and a ratio is taken within the round, where
    both saw about the same load. Medians ignore the rounds a burst hit.
    """
    timers = [tb.Timer(stmt="fn()", globals={"fn": f}) for f in (ours, theirs)]
    number = min(calibrate(ours), calibrate(theirs))
    a: list[float] = []
    b: list[float] = []
    for r in range(ROUNDS):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        got = {i: timers[i].timeit(number).median for i in order}
        a.append(got[0])
        b.append(got[1])
    return statistics.median(a), statistics.median(b), statistics.median(y / x for x, y in zip(a, b))


def median(fn: Callable[[], Any]) -> float:
    return statistics.median(tb.Timer(stmt="fn()", globals={"fn": fn}).timeit(calibrate(fn)).median
                             for _ in range(ROUNDS))


def row(label: str, ours: Callable[[], Any], theirs: Callable[[], Any], against: str) -> None:
    a, b, ratio = paired(ours, theirs)
    print(f"{label:46s} jitops {a * 1e3:9.3f} ms   {against} {b * 1e3:9.3f} ms   ratio {ratio:5.2f}x", flush=True)


def per_call() -> None:
    x = torch.randn(1, 8)
    op = jitops.get("softmax")
    raw = getattr(torch.ops, op.namespace).softmax
    cases = {"op(x)": lambda: op(x), f"torch.ops.{op.namespace}.softmax(x)": lambda: raw(x),
             "torch.softmax(x, -1)": lambda: torch.softmax(x, -1)}
    best = {k: min(timeit.repeat(f, number=2000, repeat=25)) / 2000 for k, f in cases.items()}
    for k, v in best.items():
        print(f"per call, 1x8 float32: {k:52s} {v * 1e6:6.2f} us")


def softmaxes() -> None:
    for name, torch_fn, torch_out in (
        ("softmax", torch.softmax, torch._softmax),
        ("log_softmax", torch.log_softmax, torch._log_softmax),
    ):
        op = jitops.get(name)
        for shape in ((4096, 4096), (65536, 128), (128, 65536)):
            x = torch.randn(shape)
            out = torch.empty_like(x)
            row(f"{name} {shape} alloc", lambda: op(x, -1), lambda: torch_fn(x, -1), "torch")
            t = median(lambda: torch_out(x, -1, False, out=out))
            print(f"{name} {str(shape) + ' prealloc (torch only)':36s} {'':22s} torch {t * 1e3:9.3f} ms")


def adds() -> None:
    add = jitops.get("add")
    cases = {
        "(4096, 4096) + (4096, 4096)": (torch.randn(4096, 4096), torch.randn(4096, 4096)),
        "(4096, 4096) + (4096,) broadcast": (torch.randn(4096, 4096), torch.randn(4096)),
        "(1024, 1024) int64 + int64, alpha=3": (torch.randint(0, 9, (1024, 1024)), torch.randint(0, 9, (1024, 1024))),
        "(64, 64) + (64, 64) small": (torch.randn(64, 64), torch.randn(64, 64)),
    }
    for label, (a, b) in cases.items():
        alpha = 3 if a.dtype == torch.int64 else 1
        row(f"add {label} alloc", lambda: add(a, b, alpha=alpha), lambda: torch.add(a, b, alpha=alpha), "torch")
        out = torch.empty_like(a)
        row(f"add {label} prealloc", lambda: add(a, b, alpha=alpha, out=out),
            lambda: torch.add(a, b, alpha=alpha, out=out), "torch")
    # The floor for any op called through torch.ops: torch's own add kernel, reached the same way.
    a, b = cases["(64, 64) + (64, 64) small"]
    aten_add = torch.ops.aten.add.Tensor
    _, _, ratio = paired(lambda: aten_add(a, b), lambda: torch.add(a, b))
    print(f"{'add (64, 64) small: torch.ops.aten.add.Tensor':46s} (torch's own kernel via torch.ops)  ratio {ratio:5.2f}x")


def nmses() -> None:
    nms = jitops.get("nms")
    try:
        from torchvision.ops import nms as theirs

        against = "torchvision"
    except Exception:  # noqa: BLE001 - not installed, or its C++ ops do not load with this torch
        theirs, against = jitops.reference("nms"), "reference"
    gen = torch.Generator().manual_seed(0)
    for n in (1000, 10000):
        xy = torch.rand(n, 2, generator=gen) * 1000
        boxes = torch.cat([xy, xy + torch.rand(n, 2, generator=gen) * 100 + 1], 1)
        scores = torch.rand(n, generator=gen)
        assert torch.equal(nms(boxes, scores, 0.5), jitops.reference("nms")(boxes, scores, 0.5))
        row(f"nms {n} boxes, iou 0.5", lambda: nms(boxes, scores, 0.5), lambda: theirs(boxes, scores, 0.5), against)


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    per_call()
    softmaxes()
    adds()
    nmses()


if __name__ == "__main__":
    main()
