"""Paired, interleaved CPU timing of softmax / log_softmax forward + backward: jitops vs torch.

Each round times one jitops call and one torch call back to back (order
alternating), so machine load hits both alike; the ratio is torch / jitops of
the medians (above 1: jitops is faster). Usage: python benchmarks/softmax_fwd_bwd.py [rounds]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

import jitops


def _fwd_bwd(fn, x: torch.Tensor, g: torch.Tensor) -> float:
    x = x.detach().requires_grad_()
    t0 = time.perf_counter()
    y = fn(x, -1)
    y.backward(g)
    return time.perf_counter() - t0


def main(rounds: int = 15) -> None:
    torch.manual_seed(0)
    x = torch.randn(2048, 2048)
    g = torch.randn(2048, 2048)
    for name in ("softmax", "log_softmax"):
        ours, theirs = jitops.get(name), getattr(torch, name)
        for _ in range(3):
            _fwd_bwd(ours, x, g), _fwd_bwd(theirs, x, g)
        a, b = [], []
        for r in range(rounds):
            pair = [(a, ours), (b, theirs)] if r % 2 == 0 else [(b, theirs), (a, ours)]
            for out, fn in pair:
                out.append(_fwd_bwd(fn, x, g))
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"{name} fwd+bwd (2048, 2048) f32: jitops {ma * 1e3:.2f} ms, torch {mb * 1e3:.2f} ms, "
              f"ratio {mb / ma:.2f}x (median of {rounds} paired rounds)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
