"""`jitops warm --all` in CI: a cold run into an empty cache, then second runs that must build nothing.

Each run is a fresh ``python -m jitops warm --all`` process, timed from the
outside (wall clock, interpreter start and ``import torch`` included) and
split by the child itself into ``import torch`` and the warm command. Issue 5's
target: a second run builds nothing and finishes in <= 2 s for all ops.

Usage: ``python benchmarks/warm.py [--repeat N] [--out FILE.json]`` (``--out``: the figures and
conditions for ``docs/gen_bench.py``, see ``benchmarks/benchmeta.py``).
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

import benchmeta

TARGET_S = 2.0

CHILD = """
import contextlib, io, json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
from jitops.cli import main
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    rc = main(["warm", "--all"])
t2 = time.perf_counter()
print(json.dumps({"rc": rc, "out": buf.getvalue(), "torch": t1 - t0, "warm": t2 - t1}))
"""


def run(env: dict[str, str]) -> dict:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=1800
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{proc.stdout}\n{proc.stderr}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if report["rc"] != 0:
        raise SystemExit(f"jitops warm --all failed:\n{report['out']}")
    report["wall"] = wall
    report["summary"] = report["out"].strip().splitlines()[-1]
    return report


def main(argv: list[str] | None = None) -> int:
    benchmeta.as_installed()  # jitops loads as installed: byte-compiled
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="second runs, each a fresh process")
    benchmeta.add_arguments(parser)
    args = parser.parse_args(argv)
    meta = benchmeta.start(args.conditions)
    with benchmeta.tee() as printed:
        results = measure(args.repeat)
    if args.out:
        benchmeta.write(args.out, "warm", meta, results, printed.getvalue())
    return 0


def measure(repeat: int) -> dict:
    """A cold run, then ``repeat`` second runs; prints the table and returns the figures."""
    with tempfile.TemporaryDirectory(prefix="jitops-bench-warm-") as tmp:
        # a private state dir too, as on a new machine: the cold run includes the toolchain's
        # one-time self-check, and no verdict or stamp of another run helps the second runs
        env = dict(
            os.environ,
            JITOPS_CACHE_DIR=os.path.join(tmp, "cache"),
            JITOPS_STATE_DIR=os.path.join(tmp, "state"),
            JITOPS_PROGRESS="0",
        )
        env.pop("JITOPS_OFFLINE", None)
        print("cold `jitops warm --all` (empty cache) ...", flush=True)
        cold = run(env)
        print(f"  {cold['summary']}", flush=True)
        print(f"second runs ({repeat} fresh processes) ...", flush=True)
        warm = [run(env) for _ in range(repeat)]
    rebuilt = [r["summary"] for r in warm if not r["summary"].startswith("warm: 0 built")]
    if rebuilt:
        raise SystemExit(f"a second run built something: {rebuilt[0]}")
    med = statistics.median
    wall, torch_s, ours = (
        med(r["wall"] for r in warm),
        med(r["torch"] for r in warm),
        med(r["warm"] for r in warm),
    )
    print()
    print(f"{'figure':44} {'seconds':>8} {'/ target':>9}")
    print(f"{'cold warm --all (builds every op)':44} {cold['wall']:8.2f}")
    print(
        f"{'second warm --all, whole process (wall)':44} {wall:8.2f} {wall / TARGET_S:9.2f}  target <= {TARGET_S:g} s"
    )
    print(f"{'  of which import torch':44} {torch_s:8.2f}")
    print(f"{'  of which jitops warm (0 built)':44} {ours:8.3f}")
    print(f"\nsecond-run summary: {warm[-1]['summary']}")
    return {
        "repeat": repeat,
        "target_s": TARGET_S,
        "cold_s": cold["wall"],
        "cold_summary": cold["summary"],
        "second_wall_s": [r["wall"] for r in warm],
        "second_import_torch_s": [r["torch"] for r in warm],
        "second_warm_s": [r["warm"] for r in warm],
        "second_summary": warm[-1]["summary"],
    }


if __name__ == "__main__":
    sys.exit(main())
