"""jitops vs torch.utils.cpp_extension.load on an equivalent softmax, in one run.

Prints, side by side, and as ratios (jitops / cpp_extension, lower is better
except where noted):

* cold build: first ``jitops.get("softmax")`` into an empty cache and an empty state dir (so its toolchain
  self-check runs, as on a new machine) vs
  ``cpp_extension.load`` of ``baseline_softmax.cpp`` (<torch/extension.h> +
  pybind11, cpp_extension's default flags) into an empty build dir;
* warm load in a fresh process: ``import jitops`` + ``get`` vs
  ``import torch.utils.cpp_extension`` + warm ``load()``;
* ``import jitops`` beyond ``import torch``;
* per-call overhead on a 1x8 float32 tensor.

Each phase runs in fresh subprocesses. Usage: ``python benchmarks/loader.py [--repeat N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASELINE_SRC = HERE / "baseline_softmax.cpp"

TARGETS = {
    "cold build": 0.35,
    "warm import+get": 0.3,
    "per call vs raw torch.ops": 1.2,
}


def child(code: str, env: dict[str, str]) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


JITOPS_COLD = """
    import json, time, torch
    t0 = time.perf_counter(); import jitops; op = jitops.get("softmax"); t1 = time.perf_counter()
    assert op.library.built
    print(json.dumps({"seconds": t1 - t0}))
"""
BASELINE_COLD = """
    import json, os, time, torch
    t0 = time.perf_counter()
    import torch.utils.cpp_extension as ce
    mod = ce.load("baseline_softmax", [os.environ["BENCH_SRC"]], build_directory=os.environ["BENCH_BDIR"])
    t1 = time.perf_counter()
    print(json.dumps({"seconds": t1 - t0}))
"""
JITOPS_WARM = """
    import json, time, sys
    import torch
    t0 = time.perf_counter(); import jitops; t1 = time.perf_counter()
    op = jitops.get("softmax"); t2 = time.perf_counter()
    assert not op.library.built
    print(json.dumps({"import": t1 - t0, "get": t2 - t1, "total": t2 - t0}))
"""
BASELINE_WARM = """
    import json, os, time
    import torch
    t0 = time.perf_counter(); import torch.utils.cpp_extension as ce; t1 = time.perf_counter()
    mod = ce.load("baseline_softmax", [os.environ["BENCH_SRC"]], build_directory=os.environ["BENCH_BDIR"]); t2 = time.perf_counter()
    print(json.dumps({"import": t1 - t0, "load": t2 - t1, "total": t2 - t0}))
"""
IMPORT_ONLY = """
    import json, time
    t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); import jitops; t2 = time.perf_counter()
    print(json.dumps({"torch": t1 - t0, "jitops": t2 - t1}))
"""
PER_CALL = """
    import json, os, timeit, torch, jitops
    import torch.utils.cpp_extension as ce
    torch.set_num_threads(1)
    op = jitops.get("softmax")
    base = ce.load("baseline_softmax", [os.environ["BENCH_SRC"]], build_directory=os.environ["BENCH_BDIR"])
    x = torch.randn(1, 8)
    raw = getattr(torch.ops, op.namespace).softmax
    raw_default = raw.default
    cases = {
        "jitops op(x)": lambda: op(x),
        "raw torch.ops packet": lambda: raw(x),
        "raw OpOverload": lambda: raw_default(x),
        "torch.softmax": lambda: torch.softmax(x, -1),
        "pybind (cpp_extension)": lambda: base.softmax(x, -1),
    }
    out = {}
    for name, fn in cases.items():
        for _ in range(2000): fn()
        out[name] = min(timeit.repeat(fn, number=20000, repeat=9)) / 20000 * 1e6
    print(json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    from benchmeta import as_installed

    as_installed()  # jitops loads as installed: byte-compiled
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat", type=int, default=5, help="fresh processes per warm measurement"
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="jitops-bench-") as tmp:
        # a private state dir too: the self-check's verdict is remembered per user (issue 29 counts
        # it in the cold build)
        env = dict(
            os.environ,
            JITOPS_CACHE_DIR=os.path.join(tmp, "jitops-cache"),
            JITOPS_STATE_DIR=os.path.join(tmp, "jitops-state"),
            PYTHONDONTWRITEBYTECODE="",
        )
        env.pop("JITOPS_OFFLINE", None)
        bdir = os.path.join(tmp, "cpp-extension-build")
        os.makedirs(bdir)
        env.update(BENCH_SRC=str(BASELINE_SRC), BENCH_BDIR=bdir)

        print("cold builds (empty caches) ...", flush=True)
        j_cold = child(JITOPS_COLD, env)["seconds"]
        b_cold = child(BASELINE_COLD, env)["seconds"]

        print(f"warm loads ({args.repeat} fresh processes each) ...", flush=True)
        j_warm = [child(JITOPS_WARM, env) for _ in range(args.repeat)]
        b_warm = [child(BASELINE_WARM, env) for _ in range(args.repeat)]
        imports = [child(IMPORT_ONLY, env) for _ in range(args.repeat)]
        calls = child(PER_CALL, env)

    med = statistics.median
    jw, bw = med(r["total"] for r in j_warm), med(r["total"] for r in b_warm)
    imp = med(r["jitops"] for r in imports)
    rows = [
        ("cold build", f"{j_cold:.2f} s", f"{b_cold:.2f} s", j_cold / b_cold, "<= 0.35"),
        ("warm import+get", f"{jw * 1e3:.1f} ms", f"{bw * 1e3:.1f} ms", jw / bw, "<= 0.3"),
        (
            "  of which get / load()",
            f"{med(r['get'] for r in j_warm) * 1e3:.1f} ms",
            f"{med(r['load'] for r in b_warm) * 1e3:.1f} ms",
            None,
            "",
        ),
        (
            "  of which import",
            f"{med(r['import'] for r in j_warm) * 1e3:.1f} ms",
            f"{med(r['import'] for r in b_warm) * 1e3:.1f} ms",
            None,
            "",
        ),
        ("import jitops beyond torch", f"{imp * 1e3:.1f} ms", "", None, "<= 15 ms"),
        (
            "per call vs raw torch.ops",
            f"{calls['jitops op(x)']:.2f} us",
            f"{calls['raw torch.ops packet']:.2f} us",
            calls["jitops op(x)"] / calls["raw torch.ops packet"],
            "<= 1.2",
        ),
        (
            "per call vs torch.softmax",
            f"{calls['jitops op(x)']:.2f} us",
            f"{calls['torch.softmax']:.2f} us",
            calls["jitops op(x)"] / calls["torch.softmax"],
            "",
        ),
    ]
    print()
    print(f"{'figure':30} {'jitops':>12} {'baseline':>12} {'ratio':>7}  target")
    for name, a, b, ratio, tgt in rows:
        r = f"{ratio:.2f}" if ratio is not None else ""
        print(f"{name:30} {a:>12} {b:>12} {r:>7}  {tgt}")
    print(
        "\nbaselines: cpp_extension.load (<torch/extension.h> + pybind11, default flags) for build/load;"
    )
    print(
        "raw torch.ops packet and torch.softmax for per call. Per call (us, 1x8 float32, 1 thread):"
    )
    for name, us in calls.items():
        print(f"  {name:26} {us:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
