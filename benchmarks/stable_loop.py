"""Edit loop of a one-function scale kernel on torch's stable ABI (issue 33), side by side with other loaders.

Rows (each in fresh subprocesses; times exclude ``import torch`` and include the loader's import on the
first load, the build or load, and one call):

* ``jitops-stable``: ``jitops.load_inline`` of a ``STABLE_TORCH_LIBRARY(JITOPS_NS, m)`` kernel (a dispatcher op);
* ``tvm-ffi``: ``tvm_ffi.cpp.load_inline`` of the same loop on a DLPack ``TensorView`` (apache-tvm-ffi, the
  ``bench`` extra; ``--tvm-path`` adds a folder it was installed into with ``pip install --target``);
* ``torch``: ``torch.utils.cpp_extension.load_inline`` with ``<torch/extension.h>`` and ``functions=`` (-O2);
* ``g++ alone``: the plain compile-and-link command by itself (jitops's flags, no PCH, linked against
  libtorch_cpu.so: what jitops ran before its PCH and link stub): the floor of a build without them.

Per round and row: a cold build (empty cache), two edits rerun in the same process, then a warm load of
the last edit in a new process (``warm`` = load + call; ``import`` = the loader's own modules, apart: for
jitops those its load imports on first use). Children cache bytecode under a private prefix, as an install does.
All flags are -O2. ``--busy`` runs one busy loop per core meanwhile. Rounds interleave the rows;
medians and the ratio to tvm-ffi's come from this run.

``--think S`` waits S seconds before each edit (the user's editing, not timed): jitops builds the stable
headers' PCH in the background after the cold build (~3 s here), so with S >= ~4 the edits use it; with 0
they come before it exists. ``--parts`` also times each step of a build by itself (parse, codegen, PCH,
link against libtorch_cpu.so or jitops's stub) and jitops's own time is printed under its row. This loop
is item 5 of issue 33 (jitops's stable row and tvm-ffi's, beside torch's loader); edit_loop.py keeps the
torch-style cases.

Usage: ``python benchmarks/stable_loop.py [--rounds N] [--only jitops-stable,tvm-ffi,torch,gcc] [--busy]
[--think S] [--parts]``.
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

REPO = Path(__file__).resolve().parents[1]
LOOP = "for (int64_t i = 0; i < n; ++i) op[i] = xp[i] * static_cast<float>(s) + OFFSET;"
STABLE_SRC = """#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/Exception.h>
using torch::stable::Tensor;
Tensor scale(Tensor x, double s) {
  STD_TORCH_CHECK(x.scalar_type() == torch::headeronly::ScalarType::Float, "scale: x must be float32");
  Tensor out = torch::stable::empty_like(x);
  const float* xp = x.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  int64_t n = x.numel();
  LOOP
  return out;
}
STABLE_TORCH_LIBRARY(JITOPS_NS, m) { m.def("scale(Tensor x, float s) -> Tensor"); }
STABLE_TORCH_LIBRARY_IMPL(JITOPS_NS, CPU, m) { m.impl("scale", TORCH_BOX(&scale)); }
""".replace("LOOP", LOOP)
TVM_SRC = """#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
void scale(tvm::ffi::TensorView x, tvm::ffi::TensorView y, double s) {
  TVM_FFI_ICHECK(x.dtype().code == kDLFloat && x.dtype().bits == 32) << "scale: x must be float32";
  const float* xp = static_cast<const float*>(x.data_ptr());
  float* op = static_cast<float*>(y.data_ptr());
  int64_t n = x.size(0);
  LOOP
}
""".replace("LOOP", LOOP)
EXT_SRC = """torch::Tensor scale(torch::Tensor x, double s) {
  auto out = torch::empty_like(x);
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  int64_t n = x.numel();
  LOOP
  return out;
}
""".replace("LOOP", LOOP)

CHILD = r"""
import json, os, sys, time
import torch
loader, offsets, sources = sys.argv[1], [int(o) for o in sys.argv[2].split(",")], json.loads(sys.argv[3])
think = float(sys.argv[4])
x = torch.arange(4, dtype=torch.float32)
times, compiles, t0 = [], [], time.perf_counter()
if loader == "jitops-stable":  # the modules its load imports on first use (import jitops alone is inert)
    import jitops, jitops.api.dropin, jitops.loading.loader, jitops.build.stable, jitops.api.user
elif loader == "tvm-ffi":
    import tvm_ffi.cpp
else:
    import torch.utils.cpp_extension as ce
imported = time.perf_counter() - t0
for k, off in enumerate(offsets):
    src = sources[loader].replace("OFFSET", f"{off}.0f")
    if k and think:
        time.sleep(think)  # the user's edit: jitops's background PCH may finish meanwhile
    t = time.perf_counter() if k else t0
    if loader == "jitops-stable":
        lib = jitops.load_inline("bench_scale", src)
        y = lib.scale(x, 2.0)
        files = lib.library.manifest.timings.get("files", {}) if lib.library.built else {}
        compiles.append(sum(f.get("seconds", 0.0) for f in files.values()))
    elif loader == "tvm-ffi":
        y = torch.empty_like(x)
        tvm_ffi.cpp.load_inline("bench_scale", cpp_sources=src, functions=["scale"]).scale(x, y, 2.0)
    else:
        y = ce.load_inline("bench_scale", cpp_sources=src, functions=["scale"], extra_cflags=["-O2"],
                           build_directory=os.environ["BENCH_TORCH_DIR"]).scale(x, 2.0)
    assert torch.equal(y, x * 2 + off), (loader, y)
    times.append(time.perf_counter() - t)
print(json.dumps({"times": times, "import": imported, "compiles": compiles}))
"""


def _child(
    loader: str, offsets: list[int], env: dict[str, str], think: float = 0.0
) -> dict[str, object]:
    sources = {"jitops-stable": STABLE_SRC, "tvm-ffi": TVM_SRC, "torch": EXT_SRC}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            loader,
            ",".join(map(str, offsets)),
            json.dumps(sources),
            str(think),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise SystemExit(f"{loader} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _gcc_alone(work: Path, offset: int) -> float:
    """jitops's stable command (flags as jitops passes them), run directly: compile + link."""
    import torch

    from jitops.key import STABLE_ABI_FLAG, STABLE_CFLAGS
    from jitops.build.stable import SHIM_LIBRARY, version_flag

    src = work / f"scale{offset}.cpp"
    src.write_text(STABLE_SRC.replace("OFFSET", f"{offset}.0f"))
    root = Path(torch.__file__).parent
    cmd = [
        "c++",
        "-shared",
        "-fPIC",
        *STABLE_CFLAGS,
        STABLE_ABI_FLAG,
        version_flag((2, 13)),
        "-DJITOPS_NS=bench",
        "-isystem",
        str(root / "include"),
        str(src),
        "-o",
        str(work / f"scale{offset}.so"),
        f"-L{root / 'lib'}",
        "-Wl,--as-needed",
        f"-l{SHIM_LIBRARY}",
    ]
    t = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - t


def one_round(loader: str, tvm_path: str | None, think: float = 0.0) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="stable-loop-") as tmp:
        work = Path(tmp)
        if loader == "gcc":
            cold, e1, e2 = (_gcc_alone(work, k) for k in range(3))
            return {"cold": cold, "edit 1": e1, "edit 2": e2}
        path = [str(REPO), *([tvm_path] if tvm_path else []), os.environ.get("PYTHONPATH", "")]
        # Bytecode cached (a private prefix: nothing written into the venv), as an installed package
        # has it.
        env = {
            **os.environ,
            "PYTHONDONTWRITEBYTECODE": "",
            "PYTHONPYCACHEPREFIX": str(Path(tempfile.gettempdir()) / "stable-loop-pyc"),
            "PYTHONPATH": os.pathsep.join(p for p in path if p),
            "JITOPS_CACHE_DIR": str(work / "jitops"),
            "TVM_FFI_CACHE_DIR": str(work / "tvm"),
            "BENCH_TORCH_DIR": str(work / "torch"),
        }
        (work / "torch").mkdir()
        loop = _child(loader, [0, 1, 2], env, think)
        warm = _child(loader, [2], env)
        cold, e1, e2 = loop["times"]  # type: ignore[misc]
        own = {
            f"own {c}": t - s
            for c, t, s in zip(("cold", "edit 1", "edit 2"), loop["times"], loop["compiles"])
        }  # type: ignore[call-overload]
        return {
            **own,
            "cold": cold,
            "edit 1": e1,
            "edit 2": e2,
            "warm": warm["times"][0] - warm["import"],  # type: ignore[index,operator]
            "import": warm["import"],
        }  # type: ignore[dict-item]


def parts(rounds: int) -> None:
    """Where a stable build's time goes, each step run by itself (g++, the benchmark's kernel, jitops's flags):
    parsing (``-fsyntax-only``), parse + codegen (``-c``), the same with the stable headers' PCH, the link against
    libtorch_cpu.so and against jitops's stub of it, and the one command jitops runs (PCH + stub)."""
    import torch

    from jitops.key import STABLE_ABI_FLAG, STABLE_CFLAGS
    from jitops.build.stable import SHIM_LIBRARY, version_flag
    from jitops.build.stable_fast import soname

    root = Path(torch.__file__).parent
    real = root / "lib" / f"lib{SHIM_LIBRARY}.so"
    flags = [
        "-fPIC",
        *STABLE_CFLAGS,
        STABLE_ABI_FLAG,
        version_flag((2, 13)),
        "-isystem",
        str(root / "include"),
    ]
    with tempfile.TemporaryDirectory(prefix="stable-parts-") as tmp:
        w = Path(tmp)
        src = w / "scale.cpp"
        src.write_text(STABLE_SRC.replace("OFFSET", "1.0f"))
        (w / "prefix.h").write_text("".join(ln + "\n" for ln in STABLE_SRC.splitlines()[:4]))
        t = time.perf_counter()
        subprocess.run(
            ["c++", *flags, "-x", "c++-header", str(w / "prefix.h"), "-o", str(w / "prefix.h.gch")],
            check=True,
        )
        made = time.perf_counter() - t
        subprocess.run(
            [
                "c++",
                "-shared",
                "-nostdlib",
                f"-Wl,-soname,{soname(str(real))}",
                "-x",
                "c++",
                os.devnull,
                "-o",
                str(w / "stub.so"),
            ],
            check=True,
        )
        ns, pch = ["-DJITOPS_NS=bench"], ["-include", str(w / "prefix.h"), "-Winvalid-pch"]
        steps = {
            "parse (-fsyntax-only)": ["c++", *flags, *ns, "-fsyntax-only", str(src)],
            "parse + codegen (-c)": ["c++", *flags, *ns, "-c", str(src), "-o", str(w / "a.o")],
            "  the same, with PCH": [
                "c++",
                *flags,
                *ns,
                *pch,
                "-c",
                str(src),
                "-o",
                str(w / "b.o"),
            ],
            "link, -ltorch_cpu": [
                "c++",
                "-shared",
                str(w / "a.o"),
                "-o",
                str(w / "a.so"),
                f"-L{root / 'lib'}",
                "-Wl,--as-needed",
                f"-l{SHIM_LIBRARY}",
            ],
            "link, stub": [
                "c++",
                "-shared",
                str(w / "a.o"),
                "-o",
                str(w / "b.so"),
                "-Wl,--no-as-needed",
                str(w / "stub.so"),
                "-Wl,--as-needed",
            ],
            "one command, before": [
                "c++",
                "-shared",
                *flags,
                *ns,
                str(src),
                "-o",
                str(w / "c.so"),
                f"-L{root / 'lib'}",
                "-Wl,--as-needed",
                f"-l{SHIM_LIBRARY}",
            ],
            "one command, PCH + stub": [
                "c++",
                "-shared",
                *flags,
                *ns,
                *pch,
                str(src),
                "-o",
                str(w / "d.so"),
                "-Wl,--no-as-needed",
                str(w / "stub.so"),
                "-Wl,--as-needed",
            ],
        }
        times: dict[str, list[float]] = {k: [] for k in steps}
        for _ in range(rounds):
            for name, cmd in steps.items():
                t = time.perf_counter()
                subprocess.run(cmd, check=True)
                times[name].append(time.perf_counter() - t)
        print(
            f"where a stable build's time goes: g++, {rounds} round(s), median (load average {os.getloadavg()[0]:.1f} "
            f"on {os.cpu_count()} cores); the PCH took {made:.2f} s once, {(w / 'prefix.h.gch').stat().st_size >> 20} MB"
        )
        for name, ts in times.items():
            print(f"  {name:<26}{statistics.median(ts):6.2f} s")


def main(argv: list[str] | None = None) -> int:
    from benchmeta import as_installed

    as_installed()  # jitops loads as installed: byte-compiled
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="jitops-stable,tvm-ffi,torch,gcc")
    parser.add_argument(
        "--tvm-path", default=None, help="a folder holding apache-tvm-ffi (pip install --target)"
    )
    parser.add_argument(
        "--busy", action="store_true", help="one busy loop per core while measuring"
    )
    parser.add_argument(
        "--think",
        type=float,
        default=0.0,
        help="seconds before each edit (the user's editing; not timed): jitops's PCH may finish",
    )
    parser.add_argument(
        "--parts", action="store_true", help="also time each step of the build by itself"
    )
    args = parser.parse_args(argv)
    loaders = args.only.split(",")
    busy = (
        [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)
        ]
        if args.busy
        else []
    )
    results: dict[str, list[dict[str, float]]] = {name: [] for name in loaders}
    try:
        for _ in range(args.rounds):
            for name in loaders:
                results[name].append(one_round(name, args.tvm_path, args.think))
        if args.parts:
            parts(args.rounds)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    columns = ("cold", "edit 1", "edit 2", "warm", "import")
    med = {
        n: {c: statistics.median(r[c] for r in rows) for c in columns if c in rows[0]}
        for n, rows in results.items()
    }
    base = med.get("tvm-ffi")
    load = os.getloadavg()[0]
    print(
        f"stable-ABI edit loop, {args.rounds} round(s), median, {'busy cores' if args.busy else 'no added load'}, "
        f"{args.think:g} s before each edit "
        f"(load average {load:.1f} on {os.cpu_count()} cores); warm = load + call in a new process, import apart"
    )
    print(f"{'loader':<16}" + "".join(f"{c:>18}" for c in columns))
    for name, row in med.items():
        cells = []
        for c in columns:
            if c not in row:
                cells.append(f"{'-':>18}")
                continue
            ratio = (
                f" ({row[c] / base[c]:.2f}x)"
                if base and c in base and name != "tvm-ffi" and c != "import"
                else ""
            )
            value = f"{row[c] * 1000:.1f} ms" if row[c] < 0.1 else f"{row[c]:.2f} s"
            cells.append(f"{value + ratio:>18}")
        print(f"{name:<16}" + "".join(cells))
        own = [
            f"{c} {statistics.median(r[f'own {c}'] for r in results[name]) * 1000:.0f} ms"
            for c in ("cold", "edit 1", "edit 2")
            if f"own {c}" in results[name][0]
        ]
        if own:
            print(
                f"{'':<16}its own time (less its compiler command; cold includes its import): {', '.join(own)}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
