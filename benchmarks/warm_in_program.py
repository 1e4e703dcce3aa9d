"""Warm loads inside a real program: jitops's first call vs torch.utils.cpp_extension.load's (issue 32 item 4).

A program like DeepSpeed's has already imported ``torch`` and ``torch.utils.cpp_extension`` when it
asks for an op. Each measurement is one fresh subprocess that imports both first (not timed), then
times one warm load of an op that is already built (and, for jitops, settled: after one untimed process has
stamped the library and remembered the request, as in any process but the first after a build):

* ``torch load`` : ``cpp_extension.load(name, sources, build_directory=...)`` (torch's warm path:
  source hashes, a ninja run, dlopen);
* ``jitops load``: ``import jitops`` + ``jitops.load(name, sources)`` (the drop-in, same sources, cache warm);
* ``jitops get`` : ``import jitops`` + ``jitops.get("softmax")``.

Two libraries: ``small``, a pybind11 module written for torch (``<torch/extension.h>``, as DeepSpeed's
ops are), and ``big``, a lean ``TORCH_LIBRARY`` op whose library carries a 16 MiB read-only table (an
assembler ``.fill``), which shows what hashing a large library costs. ``jitops load, new state dir``
runs with an empty ``JITOPS_STATE_DIR`` each time: the first process after a build, which checks the
library's sha256 in full (later processes reuse the verified stamp).

Cases run round-robin (so a load spike on a shared machine spreads over all of them); the table
shows medians and minima in ms and jitops/torch ratios of the medians. Bytecode caching is on
(``PYTHONDONTWRITEBYTECODE`` unset), as in an installed program.

Usage: ``python benchmarks/warm_in_program.py [--repeat N] [--against CHECKOUT] [--out FILE.json]``
(a few minutes on 2 cores, most of it the cold builds; ``--out``: the figures and conditions for
``docs/gen_bench.py``, see ``benchmarks/benchmeta.py``).

The jitops measured is the one on ``PYTHONPATH`` / installed; ``--against`` also
runs each jitops case with another checkout first on ``PYTHONPATH`` (e.g. ``git worktree add /tmp/old <commit>``),
in the same rounds and on the same cache, so both are measured under the same load (rows marked ``[other]``).
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
import time
from pathlib import Path
from typing import Any

import benchmeta

SMALL = """\
#include <torch/extension.h>
torch::Tensor scale(torch::Tensor x, double a) { return x * a; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("scale", &scale, "x * a"); }
"""
BIG_MIB = 16
BIG = f"""\
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <torch/library.h>
// {BIG_MIB} MiB of read-only data, so the library is large (as one with big tables or many instantiations is)
asm(".section .rodata.bench_table,\\"a\\"\\n.globl bench_table\\nbench_table:\\n.fill {BIG_MIB << 20},1,0x5a\\n.previous");
at::Tensor twice(const at::Tensor& x) {{ return at::add(x, x); }}
TORCH_LIBRARY(bench_big, m) {{ m.def("twice(Tensor x) -> Tensor"); }}
TORCH_LIBRARY_IMPL(bench_big, CPU, m) {{ m.impl("twice", &twice); }}
"""

PRELUDE = """
import json, os, sys, time
import torch, torch.utils.cpp_extension as ce
src, name, bdir, py = os.environ["B_SRC"], os.environ["B_NAME"], os.environ["B_BDIR"], os.environ["B_PY"] == "1"
"""
TORCH_LOAD = (
    PRELUDE
    + """
t0 = time.perf_counter()
m = ce.load(name, [src], build_directory=bdir, is_python_module=py)
t1 = time.perf_counter()
print(json.dumps({"total": t1 - t0}))
"""
)
JITOPS_LOAD = (
    PRELUDE
    + """
t0 = time.perf_counter()
import jitops
t1 = time.perf_counter()
m = jitops.load(name, [src], is_python_module=py)
t2 = time.perf_counter()
print(json.dumps({"total": t2 - t0, "import": t1 - t0, "call": t2 - t1, "modules": sorted(k for k in sys.modules if k.startswith("jitops")),
                  "recalled": "jitops.plan" not in sys.modules}))
"""
)
JITOPS_GET = (
    PRELUDE
    + """
t0 = time.perf_counter()
import jitops
t1 = time.perf_counter()
op = jitops.get("softmax")
t2 = time.perf_counter()
assert not op.library.built
print(json.dumps({"total": t2 - t0, "import": t1 - t0, "call": t2 - t1}))
"""
)
CHECK = (
    PRELUDE
    + """
import jitops
m = jitops.load(name, [src], is_python_module=py)
x = torch.ones(3)
if py:
    assert torch.equal(m.scale(x, 3.0), x * 3)
else:
    assert torch.equal(torch.ops.bench_big.twice(x), x * 2)
if os.environ.get("B_GET"):
    assert torch.equal(jitops.get("softmax")(x), torch.softmax(x, -1))
print(json.dumps({"ok": True}))
"""
)


def child(code: str, env: dict[str, str], timeout: float = 900) -> dict:
    # cwd: a folder without jitops in it (``-c`` puts the cwd first on sys.path, ahead of
    # PYTHONPATH)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=env["B_CWD"],
    )
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    benchmeta.as_installed()  # jitops loads as installed: byte-compiled
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="fresh processes per case")
    parser.add_argument(
        "--against",
        metavar="CHECKOUT",
        help="also measure the jitops in this checkout (rows [other])",
    )
    benchmeta.add_arguments(parser)
    args = parser.parse_args(argv)
    meta = benchmeta.start(args.conditions)
    with benchmeta.tee() as printed:
        results = measure(args)
    if args.out:
        benchmeta.write(args.out, "warm_in_program", meta, results, printed.getvalue())
    return 0


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Build, settle, time every case round-robin and print the table; the figures as data."""
    with tempfile.TemporaryDirectory(prefix="jitops-bench-wip-") as tmp:
        root = Path(tmp)
        srcs = root / "src"  # the sources live apart from every cache and build folder
        srcs.mkdir()
        (srcs / "bench_small.cpp").write_text(SMALL)
        (srcs / "bench_big.cpp").write_text(BIG)
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("JITOPS_") and k != "PYTHONDONTWRITEBYTECODE"
        }
        base.update(
            JITOPS_CACHE_DIR=str(root / "cache"),
            JITOPS_STATE_DIR=str(root / "state"),
            JITOPS_PROGRESS="0",
            B_CWD=tmp,
        )
        libs = {}
        for lib, py in (("small", "1"), ("big", "0")):
            bdir = root / f"torch-{lib}"
            bdir.mkdir()
            libs[lib] = dict(
                base,
                B_SRC=str(srcs / f"bench_{lib}.cpp"),
                B_NAME=f"bench_{lib}",
                B_BDIR=str(bdir),
                B_PY=py,
            )
        print("cold builds (torch and jitops, small and big; softmax) ...", flush=True)
        other = (
            os.pathsep.join([os.path.abspath(args.against), base.get("PYTHONPATH", "")]).rstrip(
                os.pathsep
            )
            if args.against
            else None
        )
        for lib, env in libs.items():
            child(TORCH_LOAD, env)
            child(CHECK, dict(env, B_GET="1") if lib == "small" else env)
            if other is not None:  # its keys may differ: its own entries, built here too
                get = {"B_GET": "1"} if lib == "small" else {}
                child(CHECK, dict(env, PYTHONPATH=other, **get))
        # Settled (stamps.SETTLED, 2 s), then one untimed process per case: it hashes and stamps the
        # library and remembers the drop-in request (loading.recall), as any process after the first
        # does once, so the rounds time what every later process pays.
        time.sleep(2.5)
        for env in libs.values():
            child(JITOPS_LOAD, env)
            if other is not None:
                child(JITOPS_LOAD, dict(env, PYTHONPATH=other))
        sizes = {
            lib: os.path.getsize(
                next((root / "cache").glob(f"v1/entries/bench_{lib}/*/*/libbench_{lib}.so"))
            )
            for lib in libs
        }
        cases: dict[str, tuple[str, dict[str, str]]] = {
            "small: torch load": (TORCH_LOAD, libs["small"]),
            "small: jitops load": (JITOPS_LOAD, libs["small"]),
            "softmax: jitops get": (JITOPS_GET, libs["small"]),
            "big: torch load": (TORCH_LOAD, libs["big"]),
            "big: jitops load": (JITOPS_LOAD, libs["big"]),
            "big: jitops load, new state dir": (JITOPS_LOAD, libs["big"]),
        }
        # the other checkout's jitops first on the path, same cache and sources
        if other is not None:
            cases = {
                k: v
                for name, (code, env) in cases.items()
                for k, v in (
                    [(name, (code, env))]
                    + (
                        [(f"{name} [other]", (code, dict(env, PYTHONPATH=other)))]
                        if "jitops" in name
                        else []
                    )
                )
            }
        results: dict[str, list[dict]] = {name: [] for name in cases}
        print(f"warm loads ({args.repeat} fresh processes per case, round-robin) ...", flush=True)
        for i in range(args.repeat):
            for name, (code, env) in cases.items():
                if "new state dir" in name:
                    env = dict(
                        env,
                        JITOPS_STATE_DIR=str(
                            root / f"state-{i}-{len(results[name])}-{name.endswith(']')}"
                        ),
                    )
                results[name].append(child(code, env))
    med = statistics.median
    ms = {name: [r["total"] * 1e3 for r in rs] for name, rs in results.items()}
    torch_of = {
        "small": med(ms["small: torch load"]),
        "softmax": med(ms["small: torch load"]),
        "big": med(ms["big: torch load"]),
    }
    print(
        f"\nlibraries: small {sizes['small'] / 1e6:.1f} MB, big {sizes['big'] / 1e6:.1f} MB; after "
        "`import torch, torch.utils.cpp_extension` (not timed)\n"
    )
    print(
        f"{'case':34} {'median ms':>10} {'min ms':>8} {'/ torch':>8}   {'import jitops':>13} {'first call':>10}"
    )
    for name, values in ms.items():
        rs = results[name]
        ratio = "" if "torch" in name else f"{med(values) / torch_of[name.split(':')[0]]:.2f}"
        split = (
            f"{med(r['import'] for r in rs) * 1e3:13.1f} {med(r['call'] for r in rs) * 1e3:10.1f}"
            if "import" in rs[0]
            else ""
        )
        print(f"{name:34} {med(values):10.1f} {min(values):8.1f} {ratio:>8}   {split}")
    recalled = {
        name: sum(bool(r.get("recalled")) for r in rs)
        for name, rs in results.items()
        if "jitops load" in name
    }
    print(
        "\nrecalled without a plan (loading.recall), of each case's processes: "
        + ", ".join(f"{name} {n}/{len(results[name])}" for name, n in recalled.items())
    )
    for name in ("small: jitops load", "small: jitops load [other]"):
        if name in results:
            mods = results[name][0]["modules"]
            print(
                f"\n{name}: jitops modules imported ({len(mods)}): {' '.join(m.removeprefix('jitops.') for m in mods)}"
            )
    print(
        "`/ torch`: jitops's median over torch's warm cpp_extension.load of the same library (softmax: over the small one's)"
    )
    return {
        "repeat": args.repeat,
        "against": args.against,
        "sizes_bytes": sizes,
        "cases": {
            name: {
                "total_ms": ms[name],
                **{
                    f"{part}_ms": [r[part] * 1e3 for r in rs]
                    for part in ("import", "call")
                    if part in rs[0]
                },
                **({"recalled": recalled[name]} if name in recalled else {}),
            }
            for name, rs in results.items()
        },
        "torch_baseline": {
            "small": "small: torch load",
            "softmax": "small: torch load",
            "big": "big: torch load",
        },
    }


if __name__ == "__main__":
    sys.exit(main())
