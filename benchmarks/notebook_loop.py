"""The edit loop as a user lives it: jitops side by side with what a user would otherwise pick.

One notebook session per loader and condition, in a fresh process with fresh caches (jitops: a
fresh ``JITOPS_CACHE_DIR`` and ``JITOPS_STATE_DIR``, so its once-per-compiler self-check counts;
torch: a fresh build directory; tvm-ffi: a fresh ``TVM_FFI_CACHE_DIR``). Each session runs the
steps a user makes, each right after the previous one or after a pause (the user's think time, not
timed): ``cold``, ``edit 1``, ``edit 2``, ``edit 3`` (one constant changed each time), ``error``
(the time until a C++ syntax error reaches the caller) and ``fixed`` (the corrected source again).

Kernels (``--styles``):

* ``torch``: a ``<torch/extension.h>`` kernel with ``functions=``, against
  ``torch.utils.cpp_extension.load_inline`` (torch's flags on both sides);
* ``stable``: a one-function kernel on torch's stable ABI, against ``tvm_ffi.cpp.load_inline``
  (apache-tvm-ffi, the ``bench`` extra) with the same loop on a DLPack tensor;
* ``stable-local``: the same, from a file whose first include is a local ``"kernel.h"``;
* ``stable-3file``: a library of three files (two helpers and the op), the third edited.

Files are edited in place. tvm-ffi's ``load`` then rebuilds into the same library path, and the
process gets the old module back from it (its results are stale), so its file kernels load under a
new name per step, as a user who wants the edit must do: every file recompiles.

Conditions (``--conditions``): ``idle`` or ``busy`` (one CPU-bound process per core, in a
session of its own as another program is, for the whole session), each with ``--pauses``
(seconds before each step after the cold one). Rounds interleave the loaders: for each round,
condition and kernel, every loader's session runs once, in turn. The table gives per step the
median over rounds, the spread (min-max) and the ratio other / jitops (at least 1.0: jitops is
not slower). ``--out`` writes every measurement as JSON (``docs/gen_bench.py`` reads it).

Usage: ``python benchmarks/notebook_loop.py [--styles torch,stable,stable-local,stable-3file]
[--conditions idle,busy] [--pauses 0,5] [--rounds N] [--out FILE]``.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from edit_loop import EXT_SRC  # noqa: E402  (benchmarks/ is not a package)

REPO = Path(__file__).resolve().parents[1]
STEPS = ("cold", "edit 1", "edit 2", "edit 3", "error", "fixed")
OTHER = {
    "torch": "torch",
    "stable": "tvm-ffi",
    "stable-local": "tvm-ffi",
    "stable-3file": "tvm-ffi",
}

TORCH_SRC = EXT_SRC  # edit_loop.py's <torch/extension.h> kernel (OFFSET: the edited constant)
STABLE_HEADERS = """#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/Exception.h>
"""
STABLE_OP = """using torch::stable::Tensor;
Tensor scale(Tensor x, double s) {
  STD_TORCH_CHECK(x.scalar_type() == torch::headeronly::ScalarType::Float, "x must be float32");
  Tensor out = torch::stable::empty_like(x);
  const float* xp = x.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) op[i] = HELP(xp[i] * static_cast<float>(s)) + OFFSET;
  return out;
}
STABLE_TORCH_LIBRARY(JITOPS_NS, m) { m.def("scale(Tensor x, float s) -> Tensor"); }
STABLE_TORCH_LIBRARY_IMPL(JITOPS_NS, CPU, m) { m.impl("scale", TORCH_BOX(&scale)); }
"""
TVM_HEADERS = "#include <tvm/ffi/container/tensor.h>\n#include <tvm/ffi/error.h>\n"
TVM_OP = """void scale(tvm::ffi::TensorView x, tvm::ffi::TensorView y, double s) {
  TVM_FFI_ICHECK(x.dtype().code == kDLFloat && x.dtype().bits == 32) << "x must be float32";
  const float* xp = static_cast<const float*>(x.data_ptr());
  float* op = static_cast<float*>(y.data_ptr());
  for (int64_t i = 0; i < x.size(0); ++i) op[i] = HELP(xp[i] * static_cast<float>(s)) + OFFSET;
}
"""
# the 3-file library: two helper files and the op's file (the one edited)
HELPERS = (
    "float twice(float v) { return v + v; }\n",
    "float half(float v) { return v * 0.5f; }\n",
)
HELP_DECLS = "float twice(float v);\nfloat half(float v);\n"


def sources(style: str, loader: str, offset: int, broken: bool) -> dict[str, str]:
    """{file name: text} of one step's sources (one entry for inline loads)."""
    if style == "torch":
        text = TORCH_SRC.replace("OFFSET", str(offset))
        return {"inline": text.replace("return y;", "return y") if broken else text}
    tvm = loader == "tvm-ffi"
    head, op = (TVM_HEADERS, TVM_OP) if tvm else (STABLE_HEADERS, STABLE_OP)
    op = op.replace("OFFSET", f"{offset}.0f")
    if broken:
        op = op.replace("return out;", "return out") if not tvm else op.replace("}\n", "", 1)
    if style == "stable":
        return {"inline": head + op.replace("HELP(", "(")}
    export = "TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale, scale);\n" if tvm else ""
    if style == "stable-local":
        text = '#include "kernel.h"\n' + op.replace("HELP(", "(") + export
        return {"kernel.h": head, "kernel.cpp": text}
    files = {"twice.cpp": HELPERS[0], "half.cpp": HELPERS[1]}
    files["op.cpp"] = (
        head
        + HELP_DECLS
        + op.replace("HELP(", "half(twice(").replace(
            "* static_cast<float>(s))", "* static_cast<float>(s)))"
        )
        + export
    )
    return files


CHILD = r"""
import json, os, sys, time
import torch
style, loader, pause = sys.argv[1], sys.argv[2], float(sys.argv[3])
steps = json.loads(sys.argv[4])  # [[step, offset, {file: text}], ...]
work = os.environ["BENCH_WORK"]
x = torch.arange(4, dtype=torch.float32)
out, t0 = {}, time.perf_counter()
if loader == "jitops":
    import jitops
elif loader == "tvm-ffi":
    import tvm_ffi.cpp
else:
    import torch.utils.cpp_extension as ce

def files_of(step, files):
    folder = os.path.join(work, "src")  # edited in place, as a user does
    os.makedirs(folder, exist_ok=True)
    for name, text in files.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    return folder, [os.path.join(folder, n) for n in files if n.endswith(".cpp")]

def run(step, off, files):
    if style == "torch":
        if loader == "jitops":
            return jitops.load_inline("nb_ext", files["inline"], functions=["sq"]).sq(x)
        return ce.load_inline("nb_ext", files["inline"], functions=["sq"],
                              build_directory=os.environ["BENCH_TORCH_DIR"]).sq(x)
    if loader == "tvm-ffi":
        y = torch.empty_like(x)
        if "inline" in files:
            mod = tvm_ffi.cpp.load_inline(
                "nb_scale", cpp_sources=files["inline"], functions=["scale"]
            )
        else:
            folder, cpps = files_of(step, files)
            # a new name per step: in place, the same library path reloads the old module
            tag = step.replace(" ", "_")
            mod = tvm_ffi.cpp.load(f"nb_scale_{tag}", cpp_files=cpps, extra_include_paths=[folder])
        mod.scale(x, y, 2.0)
        return y
    if "inline" in files:
        return jitops.load_inline("nb_scale", files["inline"]).scale(x, 2.0)
    folder, cpps = files_of(step, files)
    return jitops.load("nb_scale", cpps, extra_include_paths=[folder]).scale(x, 2.0)

for k, (step, off, files) in enumerate(steps):
    if k and pause:
        time.sleep(pause)
    s = t0 if k == 0 else time.perf_counter()
    try:
        y = run(step, off, files)
    except Exception as e:
        if step != "error":
            raise
        out[step] = time.perf_counter() - s
        continue
    out[step] = time.perf_counter() - s
    if step == "error":
        raise SystemExit("the broken source built")
    want = x * x + off if style == "torch" else x * 2 + off
    assert torch.equal(y, want), (step, y, want)
print(json.dumps(out))
"""


def session(style: str, loader: str, pause: float, base: dict[str, str]) -> dict[str, float]:
    """One notebook session in a fresh process and fresh caches; seconds per step."""
    steps, offsets = [], (0, 1, 2, 3, 4, 5)
    for step, off in zip(STEPS, offsets):
        steps.append([step, off, sources(style, loader, off, broken=step == "error")])
    with tempfile.TemporaryDirectory(prefix="notebook-loop-") as tmp:
        env = dict(
            base,
            BENCH_WORK=tmp,
            BENCH_TORCH_DIR=os.path.join(tmp, "torch"),
            JITOPS_CACHE_DIR=os.path.join(tmp, "jitops-cache"),
            JITOPS_STATE_DIR=os.path.join(tmp, "jitops-state"),
            TVM_FFI_CACHE_DIR=os.path.join(tmp, "tvm"),
        )
        os.makedirs(env["BENCH_TORCH_DIR"])
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, style, loader, str(pause), json.dumps(steps)],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if proc.returncode != 0:
            raise SystemExit(f"{style}/{loader} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}")
        if loader == "jitops":
            _end_background(Path(env["JITOPS_CACHE_DIR"]))
        return json.loads(proc.stdout.strip().splitlines()[-1])


def background_pids(cache: Path) -> list[int]:
    """The background PCH builds of the cache at ``cache`` (they outlive the session's process)."""
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [int(ln.split()[0]) for ln in ps.splitlines() if "pch_bg" in ln and str(cache) in ln]


def _end_background(cache: Path, limit: float = 60.0) -> None:
    """Sessions must not overlap: end the finished session's background PCH builds (SIGTERM: each
    kills its compile and publishes nothing). Busy, they run on idle CPU time only and would not
    end."""
    import signal

    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        pids = background_pids(cache)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        time.sleep(0.5)


def session_env() -> dict[str, str]:
    """This environment less every loader's settings (each session sets its own caches), with the
    checkout's jitops first on the path."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JITOPS_", "TVM_FFI_")) and k not in ("CXX", "MAX_JOBS")
    }
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), base.get("PYTHONPATH")) if p)
    return base


def busy_loops(n: int) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(n)
    ]


def main(argv: list[str] | None = None) -> int:
    from benchmeta import as_installed

    as_installed()  # jitops loads as installed: byte-compiled
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--styles", default="torch,stable,stable-local,stable-3file")
    ap.add_argument("--conditions", default="idle,busy")
    ap.add_argument("--pauses", default="0,5")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    styles = a.styles.split(",")
    pauses = [float(p) for p in a.pauses.split(",")]
    base = session_env()
    runs: list[dict[str, object]] = []
    print(
        f"notebook loop: {os.cpu_count()} cores, load average at start "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}",
        flush=True,
    )
    for rnd in range(a.rounds):
        for cond in a.conditions.split(","):
            loops = busy_loops(os.cpu_count() or 1) if cond == "busy" else []
            try:
                for pause in pauses:
                    for style in styles:
                        for loader in ("jitops", OTHER[style]):
                            t = session(style, loader, pause, base)
                            runs.append(dict(round=rnd, condition=cond, pause=pause, style=style,
                                             loader=loader, seconds=t))  # fmt: skip
                            print(
                                f"  round {rnd + 1} {cond:<4} pause {pause:g}s {style:<12} "
                                f"{loader:<7} " + " ".join(f"{s} {t[s]:.2f}" for s in STEPS),
                                flush=True,
                            )
            finally:
                for p in loops:
                    p.kill()
                    p.wait()
    print(f"load average at the end {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    report(runs)
    if a.out:
        a.out.write_text(json.dumps({"runs": runs, "steps": STEPS}, indent=1) + "\n")
    return 0


def table(runs: list[dict]) -> list[dict]:
    """Rows: per kernel, condition, pause and step, each loader's median and spread, the ratio."""
    rows = []
    keys = sorted({(r["style"], r["condition"], r["pause"]) for r in runs}, key=str)
    for style, cond, pause in keys:
        for step in STEPS:
            got = {}
            for loader in ("jitops", OTHER[style]):
                vals = [r["seconds"][step] for r in runs
                        if (r["style"], r["condition"], r["pause"], r["loader"])
                        == (style, cond, pause, loader)]  # fmt: skip
                got[loader] = (statistics.median(vals), min(vals), max(vals))
            ratio = got[OTHER[style]][0] / got["jitops"][0]
            rows.append(
                dict(style=style, condition=cond, pause=pause, step=step, jitops=got["jitops"],
                     other=got[OTHER[style]], ratio=ratio)
            )  # fmt: skip
    return rows


def report(runs: list[dict]) -> None:
    print(f"\n{'kernel':<13}{'cond':<6}{'pause':>6} {'step':<8}{'jitops s (min-max)':>22}"
          f"{'other s (min-max)':>22}{'other/jitops':>14}")  # fmt: skip
    for r in table(runs):
        j, o = r["jitops"], r["other"]
        print(
            f"{r['style']:<13}{r['condition']:<6}{r['pause']:>5g}s {r['step']:<8}"
            f"{j[0]:>8.2f} ({j[1]:.2f}-{j[2]:.2f}){o[0]:>8.2f} ({o[1]:.2f}-{o[2]:.2f})"
            f"{r['ratio']:>11.2f}"
        )
    print("other: torch's load_inline for the torch kernel, tvm_ffi.cpp for the stable ones")


if __name__ == "__main__":
    raise SystemExit(main())
