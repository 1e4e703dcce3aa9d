"""nms's CPU library on torch's stable ABI (what a CPU target builds) against its ATen build (the CPU half of a
CUDA build, built here for the CPU as before issue 31 item 4): cold build time and time per call.

    python benchmarks/nms_abi.py [--rounds 3] [--busy] [--json OUT]

BUILD: each round, each variant in a fresh interpreter with an empty cache of its own (and a private state
folder, so no PCH or self-check verdict carries over): ``jitops.get``'s build and load of nms for the CPU,
imports apart. Rows interleave. CALL: in this process, both variants built once in a private cache, their
indices compared (they must be equal), then ``torch.utils.benchmark`` (``blocked_autorange``, 1 s) at 1,000 and
10,000 boxes, interleaved twice; the median of each. ``--busy`` runs one busy loop per core meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VARIANTS = ("stable", "aten")


def _spec(variant: str):  # noqa: ANN202 - an OpSpec; jitops is imported late on purpose
    import dataclasses

    from jitops.registry import lookup

    spec = lookup("nms")
    return spec if variant == "stable" else dataclasses.replace(spec, stable_cpu_sources=())


def child(variant: str) -> None:
    """In a fresh interpreter: the seconds of one build and load of the variant (imports excluded)."""
    import torch  # noqa: F401 - imported before the clock, as a program would have

    from jitops.loading.loader import load_library

    spec = _spec(variant)
    start = time.perf_counter()
    lib = load_library(spec, "cpu")
    print(
        json.dumps(
            {"seconds": time.perf_counter() - start, "built": lib.built, "namespace": lib.namespace}
        )
    )


def build_times(rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(rounds):
        for variant in VARIANTS:
            with tempfile.TemporaryDirectory(prefix="jitops-nms-abi-") as tmp:
                env = {
                    **os.environ,
                    "JITOPS_CACHE_DIR": f"{tmp}/cache",
                    "JITOPS_STATE_DIR": f"{tmp}/state",
                    "JITOPS_PROGRESS": "0",
                    "PYTHONPATH": str(REPO),
                }
                proc = subprocess.run(
                    [sys.executable, __file__, "--child", variant],
                    env=env,
                    cwd=REPO,
                    capture_output=True,
                    text=True,
                    timeout=900,
                )
                if proc.returncode != 0:
                    raise SystemExit(f"{variant} build failed:\n{proc.stdout}\n{proc.stderr}")
                reply = json.loads(proc.stdout.strip().splitlines()[-1])
                if not reply["built"]:
                    raise SystemExit(f"{variant}: nothing was built (the cache was not empty)")
                out[variant].append(reply["seconds"])
    return out


def call_times() -> dict[str, dict[str, float]]:
    import torch
    from torch.utils import benchmark

    from jitops.loading.loader import load_library

    ops = {}
    for variant in VARIANTS:
        lib = load_library(_spec(variant), "cpu")
        ops[variant] = getattr(torch.ops, lib.namespace).nms
    g = torch.Generator().manual_seed(0)
    out: dict[str, dict[str, float]] = {}
    for n in (1000, 10000):
        xy = torch.rand(n, 2, generator=g) * 1000
        boxes = torch.cat([xy, xy + torch.rand(n, 2, generator=g) * 60], 1)
        scores = torch.rand(n, generator=g)
        if not ops["stable"](boxes, scores, 0.5).equal(ops["aten"](boxes, scores, 0.5)):
            raise SystemExit(f"the two builds disagree at {n} boxes")
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _ in range(2):
            for variant in VARIANTS:
                timer = benchmark.Timer(
                    "f(b, s, 0.5)", globals={"f": ops[variant], "b": boxes, "s": scores}
                )
                times[variant].append(timer.blocked_autorange(min_run_time=1.0).median)
        out[f"{n} boxes"] = {v: statistics.median(t) for v, t in times.items()}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--busy", action="store_true", help="one busy loop per core while measuring")
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return 0
    busy = (
        [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)
        ]
        if args.busy
        else []
    )
    try:
        builds = build_times(args.rounds)
        with tempfile.TemporaryDirectory(prefix="jitops-nms-abi-") as tmp:
            os.environ.update(
                JITOPS_CACHE_DIR=f"{tmp}/cache",
                JITOPS_STATE_DIR=f"{tmp}/state",
                JITOPS_PROGRESS="0",
            )
            calls = call_times()
        load = os.getloadavg()[0]
    finally:
        for p in busy:
            p.kill()
    print(
        f"nms CPU: stable-ABI build vs ATen build, {args.rounds} round(s), median, "
        f"{'busy cores' if args.busy else 'no added load'} (load average {load:.1f} on {os.cpu_count()} cores)"
    )
    print("| | stable ABI | ATen | stable / ATen |")
    print("|---|---|---|---|")
    b = {v: statistics.median(t) for v, t in builds.items()}
    print(
        f"| cold build + load (s) | {b['stable']:.2f} | {b['aten']:.2f} | {b['stable'] / b['aten']:.2f}x |"
    )
    for row, t in calls.items():
        print(
            f"| call, {row} (ms) | {t['stable'] * 1e3:.2f} | {t['aten'] * 1e3:.2f} | {t['stable'] / t['aten']:.2f}x |"
        )
    print(
        "each build round (s): "
        + "; ".join(f"{v} {', '.join(f'{s:.2f}' for s in builds[v])}" for v in VARIANTS)
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"builds": builds, "calls": calls, "busy": args.busy, "load": load})
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
