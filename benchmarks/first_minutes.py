"""A user's first minutes, jitops against torch's loader, side by side in one run (issue 29).

Each loader starts from a fresh cache (jitops: a fresh ``JITOPS_CACHE_DIR`` and ``JITOPS_STATE_DIR``, so its
self-check is counted; torch: a fresh build directory) and runs, in fresh subprocesses:

1. ``first get("softmax")``: ``jitops.get("softmax")`` against ``cpp_extension.load`` of the same kernel
   (``baseline_softmax.cpp``, as benchmarks/loader.py);
2. ``cold user kernel``: ``load_inline`` of a 10-line ``<torch/extension.h>`` kernel with ``functions=["sq"]``
   (benchmarks/edit_loop.py's ``ext`` case), then in the same process
3. ``first edit`` and 4. ``second edit`` (one constant changed each time), and
5. ``error reported``: the time to the exception for the same kernel with a C++ syntax error (a missing ``;``).

jitops builds a header prefix's PCH after its first edit, in the background (detached, ``nice``): the first
edit never waits for it. Before the second edit the child program waits until that PCH is there (a user's
think time; printed apart, never counted), so "second edit" is the edit loop a user gets from then on.
An edit that came sooner would compile without the PCH, as the first edit does.

jitops runs with g++ (the environment's ``c++``) and with clang++ when it is on PATH (``CXX=clang++``);
torch with its default compiler. Times exclude ``import torch``. ``--load`` runs two CPU-bound children
(``python -c "while 1: pass"``) for the whole measurement, killed at the end.

Usage: ``python benchmarks/first_minutes.py [--load] [--no-clang]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from edit_loop import EXT_SRC  # noqa: E402  (benchmarks/ is not a package)
from loader import BASELINE_COLD, BASELINE_SRC, JITOPS_COLD  # noqa: E402

BROKEN = EXT_SRC.replace("return y;", "return y")  # a syntax error in the user's own lines
KERNEL = r"""
import json, os, sys, time
import torch
src, broken = os.environ["BENCH_EXT"], os.environ["BENCH_BROKEN"]
x = torch.arange(4, dtype=torch.float32)
out = {}
if sys.argv[1] == "torch":
    import torch.utils.cpp_extension as ce
    def load(text, name="bench_ext"):
        return ce.load_inline(name, text, functions=["sq"], build_directory=os.environ["BENCH_BDIR"])
else:
    import jitops
    def load(text, name="bench_ext"):
        return jitops.load_inline(name, text, functions=["sq"])
for step, o in (("cold user kernel", 0), ("first edit", 1), ("second edit", 2)):
    if step == "second edit" and sys.argv[1] != "torch":
        from jitops.build import pch_bg
        s = time.perf_counter()
        pch_bg.wait(900)
        out["PCH ready (wait, not counted)"] = time.perf_counter() - s
    s = time.perf_counter()
    y = load(src.replace("OFFSET", str(o))).sq(x)
    out[step] = time.perf_counter() - s
    assert float(y[1]) == 1.0 + o, (float(y[1]), o)
s = time.perf_counter()
try:
    load(broken.replace("OFFSET", "3"), "bench_err")
except Exception as e:
    out["error reported"] = time.perf_counter() - s
    line = next((ln.strip() for ln in str(e).splitlines() if "error:" in ln), str(e)[:100])
    out["error says"] = line[line.find(".cpp:") + 1 if ".cpp:" in line else 0:][:100]
else:
    raise SystemExit("the broken kernel built")
print(json.dumps(out))
"""
STEPS = ('first get("softmax")', "cold user kernel", "first edit", "second edit", "error reported")


def child(code: str, env: dict[str, str], *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(loader: str, tmp: Path, base: dict[str, str]) -> dict:
    where = tmp / loader.replace(" ", "-").replace("+", "p")
    env = dict(
        base,
        JITOPS_CACHE_DIR=str(where / "cache"),
        JITOPS_STATE_DIR=str(where / "state"),
        BENCH_BDIR=str(where / "build"),
        BENCH_SRC=str(BASELINE_SRC),
    )
    os.makedirs(env["BENCH_BDIR"])
    if loader == "jitops clang++":
        env["CXX"] = shutil.which("clang++") or "clang++"
    first = child(BASELINE_COLD if loader == "torch" else JITOPS_COLD, env)["seconds"]
    print(f'  {loader}: first get("softmax") {first:.2f} s', flush=True)
    kernel = child(KERNEL, env, "torch" if loader == "torch" else "jitops")
    print(
        f"  {loader}: "
        + ", ".join(f"{k} {v:.2f} s" for k, v in kernel.items() if isinstance(v, float)),
        flush=True,
    )
    pch = where / "cache" / "v1" / "pch"
    kernel["pchs"] = len([p for p in pch.iterdir() if p.is_dir()]) if pch.is_dir() else 0
    return {STEPS[0]: first, **kernel}


def main(argv: list[str] | None = None) -> int:
    from benchmeta import as_installed

    as_installed()  # jitops loads as installed: byte-compiled
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--load", action="store_true", help="two CPU-bound children run during the measurement"
    )
    parser.add_argument("--no-clang", action="store_true", help="leave out jitops with clang++")
    args = parser.parse_args(argv)
    loaders = ["torch", "jitops g++"] + (
        [] if args.no_clang or not shutil.which("clang++") else ["jitops clang++"]
    )
    burners = [
        subprocess.Popen([sys.executable, "-c", "while 1: pass"])
        for _ in range(2 if args.load else 0)
    ]
    results: dict[str, dict] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="jitops-first-minutes-") as tmp:
            base = dict(
                os.environ, BENCH_EXT=EXT_SRC, BENCH_BROKEN=BROKEN, PYTHONDONTWRITEBYTECODE="1"
            )
            for var in (
                "JITOPS_OFFLINE",
                "JITOPS_PCH",
                "JITOPS_BUILDER",
                "JITOPS_PCH_BACKGROUND",
                "CXX",
            ):
                base.pop(var, None)
            print(
                f"first minutes, fresh caches, {'loaded: 2 CPU-bound children' if args.load else 'no extra load'}, "
                f"{os.cpu_count()} cores, load average at start {_load()} ...",
                flush=True,
            )
            for loader in loaders:
                results[loader] = measure(loader, Path(tmp), base)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    print(f"load average at the end (1, 5, 15 min; other users' jobs included): {_load()}")
    report(results, loaders)
    return 0


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def report(results: dict[str, dict], loaders: list[str]) -> None:
    head = f"{'step':<22}{'torch':>9}"
    for loader in loaders[1:]:
        head += f"{loader:>16}{'ratio':>7}"
    print("\n" + head)
    for step in STEPS:
        line = f"{step:<22}{results['torch'][step]:>8.2f}s"
        for loader in loaders[1:]:
            v = results[loader][step]
            line += f"{v:>15.2f}s{v / results['torch'][step]:>7.2f}"
        print(line)
    for loader in loaders[1:]:
        r = results[loader]
        print(
            f"{loader}: PCH ready {r['PCH ready (wait, not counted)']:.1f} s after the first edit returned "
            f"(waited for before the second edit); {r['pchs']} PCH(s) in its cache"
        )
    for loader in loaders:
        print(f"{loader} error: {results[loader]['error says']}")
    print("ratio: jitops / torch (at most 1.0 is the goal at every step)")


if __name__ == "__main__":
    raise SystemExit(main())
