"""Subpackage ``jitops.bench`` (stage 16): timing for ``jitops bench`` and ``benchmarks/``. Owns:
this module (``Case``, ``Row``, ``measure``, ``interleaved``, ``table``) and ``bench_ops``
(``request``, ``cases``, ``softmax_case``, ``nms_case``). May import: ``jitops`` (the public API)
and every stage below it; today ``bench_ops`` imports ``jitops``, ``jitops.errors`` and this module,
this module nothing of jitops.

This module: timing machinery shared by ``jitops bench`` and ``benchmarks/kernels.py``: one place to time, compare and print.

A :class:`Case` is a set of zero-argument callables, its *sides*; the first is
jitops's, the others are what it is compared with (torch eager, torch.compile,
the pure-PyTorch reference, torchvision). :func:`measure` times every side the
way the device needs and returns a :class:`Row`; :func:`table` prints rows as
a Markdown table with ratios (other time / jitops time, so above 1 means
jitops is faster), GB/s and the share of the copy bandwidth.

- CUDA: each side alone, with ``triton.testing.do_bench`` (L2 flushed before
  every call, median) when triton imports, else ``torch.utils.benchmark``
  (which synchronizes the device around its blocks; no L2 flush).
- CPU: paired, interleaved rounds (:func:`interleaved`), because the machines
  this runs on are shared and noisy; ratios are medians of per-round ratios.

May import: torch (at module level), triton (optional, at call time). This
module is never imported by ``import jitops`` nor by the CLI's torch-free
commands; only ``jitops bench`` and the benchmark scripts import it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.utils.benchmark as tb

ROUNDS = 15  # CPU: paired rounds per case; each round times a block of every side
BLOCK_S = 0.05  # CPU: seconds per timed block

Fn = Callable[[], Any]


@dataclass(frozen=True)
class Case:
    """One thing to time: ``sides`` maps a name to a call (the first is jitops's).

    ``bytes`` is the least memory traffic one call needs (for GB/s), None where
    that means nothing (nms). ``check`` runs once before timing and returns a
    problem (e.g. "differs from torchvision") or None.
    """

    label: str
    sides: dict[str, Fn]
    bytes: int | None = None
    check: Callable[[], str | None] | None = None


@dataclass(frozen=True)
class Row:
    """Measured times (seconds, median per call) and ratios (other side's time / jitops's)."""

    label: str
    times: dict[str, float]
    ratios: dict[str, float]
    # the fastest other side's time / jitops's (None with one other side)
    fastest: float | None = None
    bytes: int | None = None
    note: str | None = None

    def gbps(self, side: str) -> float | None:
        t = self.times.get(side)
        return None if self.bytes is None or not t else self.bytes / t / 1e9


@dataclass(frozen=True)
class Timing:
    """How CPU cases are timed (GPU cases use the GPU timer's own defaults)."""

    rounds: int = ROUNDS
    block_s: float = BLOCK_S


# ------------------------------------------------------------------ timers


def _calibrate(fn: Fn, block_s: float) -> int:
    """Calls per block, from torch.utils.benchmark's adaptive pass."""
    m = tb.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=4 * block_s)
    return max(1, round(block_s / max(m.median, 1e-9)))


def interleaved(
    fns: Sequence[Fn], rounds: int = ROUNDS, block_s: float = BLOCK_S
) -> tuple[list[float], list[float], float | None]:
    """CPU: each side's median time, each other side's median ratio to the first, and the fastest-other ratio.

    Every round times one block of each side back to back, in an order that
    rotates from round to round (with two sides: A B, then B A), and takes the
    ratios within the round, where all sides saw about the same load from other
    processes. Medians ignore the rounds that a burst of load hit.
    """
    timers = [tb.Timer(stmt="fn()", globals={"fn": f}) for f in fns]
    numbers = [_calibrate(f, block_s) for f in fns]
    per_round: list[list[float]] = []
    for r in range(rounds):
        got: dict[int, float] = {}
        for k in range(len(fns)):
            i = (r + k) % len(fns)
            got[i] = timers[i].timeit(numbers[i]).median
        per_round.append([got[i] for i in range(len(fns))])
    times = [statistics.median(t[i] for t in per_round) for i in range(len(fns))]
    ratios = [statistics.median(t[i] / t[0] for t in per_round) for i in range(1, len(fns))]
    fastest = statistics.median(min(t[1:]) / t[0] for t in per_round) if len(fns) > 2 else None
    return times, ratios, fastest


def cpu_time(fn: Fn, rounds: int = ROUNDS, block_s: float = BLOCK_S) -> float:
    """CPU: median per-call time over ``rounds`` blocks."""
    timer = tb.Timer(stmt="fn()", globals={"fn": fn})
    number = _calibrate(fn, block_s)
    return statistics.median(timer.timeit(number).median for _ in range(rounds))


def gpu_timer_name() -> str:
    try:
        import triton.testing  # noqa: F401
    except Exception:  # noqa: BLE001 - missing, or broken against this torch
        return "torch.utils.benchmark (median of blocks; no L2 flush)"
    return "triton.testing.do_bench (median, L2 flushed before each call)"


def gpu_time(fn: Fn) -> float:
    """CUDA: median seconds per call, by an established timer (never a host clock around an async launch)."""
    try:
        from triton.testing import do_bench
    except Exception:  # noqa: BLE001
        do_bench = None
    if do_bench is not None:
        return float(do_bench(fn, warmup=25, rep=200, return_mode="median")) / 1e3
    # warm-up (first-call allocations, lazy compiles); the Timer synchronizes the device itself
    fn()
    return float(
        tb.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.5).median
    )


# ------------------------------------------------------------------ measuring


def measure(case: Case, device: str, timing: Timing = Timing()) -> Row:
    """Time every side of ``case`` on ``device`` ("cpu" or "cuda")."""
    note = case.check() if case.check is not None else None
    names = list(case.sides)
    fns = [case.sides[n] for n in names]
    if device == "cuda":
        ts = [gpu_time(f) for f in fns]
        ratios = [t / ts[0] for t in ts[1:]]
        fastest = min(ts[1:]) / ts[0] if len(ts) > 2 else None
    else:
        ts, ratios, fastest = interleaved(fns, timing.rounds, timing.block_s)
    return Row(
        case.label, dict(zip(names, ts)), dict(zip(names[1:], ratios)), fastest, case.bytes, note
    )


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(device: str, nbytes: int | None = None, timing: Timing = Timing()) -> float:
    """Bytes per second of ``dst.copy_(src)`` between two large buffers on ``device``, counting read + write."""
    n = nbytes or (1 << 30 if device == "cuda" else 1 << 28)
    src = torch.ones(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    fn = lambda: dst.copy_(src)  # noqa: E731
    t = (
        gpu_time(fn)
        if device == "cuda"
        else cpu_time(fn, max(3, timing.rounds // 3), timing.block_s)
    )
    return 2 * n / t


def traffic(*tensors: torch.Tensor) -> int:
    """The bytes one pass over these tensors moves (each read or written once)."""
    return sum(t.numel() * t.element_size() for t in tensors)


# ------------------------------------------------------------------ output


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:.1f}" if ms >= 100 else f"{ms:.3f}" if ms >= 1 else f"{ms:.4f}"


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def table(rows: Sequence[Row], copy_bps: float | None = None) -> list[str]:
    """Rows as a Markdown table (aligned, so it reads in a terminal and pastes into a note); notes follow it."""
    if not rows:
        return []
    sides: list[str] = list(dict.fromkeys(s for r in rows for s in r.times))
    ours, others = sides[0], sides[1:]
    first = others[0] if others else None
    header = ["case", *(f"{s} ms" for s in sides), *(f"{s}/{ours}" for s in others)]
    header += [f"fastest/{ours}"] if len(others) > 1 else []
    header += (
        [f"{ours} GB/s"]
        + ([f"{first} GB/s"] if first else [])
        + ([f"{ours} % copy"] if copy_bps else [])
    )
    body = []
    for r in rows:
        cells = [r.label + (" (!)" if r.note else ""), *(_ms(r.times.get(s)) for s in sides)]
        cells += [_x(r.ratios.get(s)) for s in others]
        cells += [_x(r.fastest)] if len(others) > 1 else []
        ours_gbps = r.gbps(ours)
        cells += [_num(ours_gbps)] + ([_num(r.gbps(first))] if first else [])
        if copy_bps:
            cells.append(_num(None if ours_gbps is None else 100 * ours_gbps * 1e9 / copy_bps))
        body.append(cells)
    widths = [max(len(c[i]) for c in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return (
            "| "
            + " | ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
            )
            + " |"
        )

    rule = (
        "| " + " | ".join("-" * (w - 1) + (":" if i else "-") for i, w in enumerate(widths)) + " |"
    )
    notes = [f"(!) {r.label}: {r.note}" for r in rows if r.note]
    return [line(header), rule, *(line(b) for b in body), *notes]


def trace(cases: Sequence[Case], path: Path, device: str, calls: int = 3) -> None:
    """Run each side of each case ``calls`` times under torch.profiler; write a Chrome trace to ``path``."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    for case in cases:  # warm-up outside the trace (first-call allocations, lazy compiles)
        for fn in case.sides.values():
            fn()
    sync(device)
    with profile(activities=activities) as prof:
        for case in cases:
            for name, fn in case.sides.items():
                with record_function(f"{case.label} [{name}]"):
                    for _ in range(calls):
                        fn()
                    sync(device)
    prof.export_chrome_trace(str(path))
