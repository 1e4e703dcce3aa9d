"""The CUDA edit loop (issue 27 item 4): a small ``load_inline`` kernel with ``cuda_sources``, cold build, then
edits of the kernel rerun in the same process; jitops against ``torch.utils.cpp_extension.load_inline``.

Loaders, each in a fresh process with fresh cache and build folders:

* ``torch``: torch's ``load_inline`` on torch-style sources (``#include <torch/extension.h>`` in the ``.cu``,
  a declaration in ``cpp_sources``, ``functions=["scale"]``): the snippet a user pastes;
* ``jitops-dropin``: ``jitops.load_inline`` on the very same arguments;
* ``jitops``: ``jitops.load_inline`` on jitops-style sources (lean ATen headers, ``JITOPS_LIBRARY``).

Each child builds version 1 (cold), then versions 2 and 3 (two edits of the kernel's body, the
``cpp_sources`` unchanged), calling the kernel after each and checking its result. Times include the build
or load and one call (synchronized). Where the time goes: every nvcc run appends its phases to a CSV
(``NVCC_APPEND_FLAGS=--time FILE``), summed per step and phase (cudafe++ and cicc are the front end and
the device code generator, ptxas the assembler, gcc the host passes); the rest of a step is the host
compile of the ``.cpp``, the link and loading. The jitops children share ``JITOPS_STATE_DIR``: point it at
a folder where this jitops has built once (its remembered self-check verdict), or the first jitops cold
build also waits for the once-per-compiler self-check. A loader whose child fails or outlasts
``--child-timeout`` is reported and skipped; the others still run.

Needs a GPU and nvcc; ``--build-only`` (with ``TORCH_CUDA_ARCH_LIST``) times the same builds and loads without
calling the kernel, so a machine with nvcc and a CUDA torch but no GPU can run it.
Usage: ``python benchmarks/cuda_edit_loop.py [--only torch,jitops-dropin,jitops] [--build-only]``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

KERNEL = """
__global__ void scale_kernel(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i] + OFFSET.0f;
}
"""
TORCH_CPP = "#include <torch/extension.h>\ntorch::Tensor scale(torch::Tensor x);\n"
TORCH_CU = (
    "#include <torch/extension.h>\n#include <ATen/cuda/CUDAContext.h>\n"
    + KERNEL
    + """
torch::Tensor scale(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat && x.is_contiguous(), "scale: a contiguous float32 CUDA tensor");
  auto y = torch::empty_like(x);
  int64_t n = x.numel();
  scale_kernel<<<(unsigned)((n + 255) / 256), 256, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
  return y;
}
"""
)
LEAN_CPP = '#include <jitops/op.h>\nJITOPS_LIBRARY(m) { m.def("scale(Tensor x) -> Tensor"); }\n'
LEAN_CU = (
    """#include <jitops/op.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAStream.h>
"""
    + KERNEL
    + """
at::Tensor scale(const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat && x.is_contiguous(), "scale: a contiguous float32 CUDA tensor");
  at::Tensor y = at::empty_like(x);
  int64_t n = x.numel();
  scale_kernel<<<(unsigned)((n + 255) / 256), 256, 0, c10::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
  return y;
}
JITOPS_LIBRARY_IMPL(CUDA, m) { m.impl("scale", &scale); }
"""
)

CHILD = r"""
import json, os, sys, time
import torch
loader, offsets, csv_path = sys.argv[1], [int(o) for o in sys.argv[2].split(",")], sys.argv[3]
src = json.loads(os.environ["BENCH_SOURCES"])
call = os.environ["BENCH_CALL"] == "1"  # else build and load only (no GPU needed)
x = torch.arange(8, dtype=torch.float32, device="cuda") if call else None
if call:
    torch.cuda.synchronize()

def rows():
    try:
        with open(csv_path) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0

def load(o):
    cu = src["torch_cu" if loader != "jitops" else "lean_cu"].replace("OFFSET", str(o))
    if loader == "torch":
        import torch.utils.cpp_extension as ce
        m = ce.load_inline("cuda_loop", src["torch_cpp"], cuda_sources=cu, functions=["scale"],
                           extra_cuda_cflags=["-O3"], build_directory=os.environ["BENCH_BDIR"])
        return m.scale(x) if call else None
    import jitops
    if loader == "jitops-dropin":
        m = jitops.load_inline("cuda_loop", src["torch_cpp"], cuda_sources=cu, functions=["scale"], extra_cuda_cflags=["-O3"])
    else:
        m = jitops.load_inline("cuda_loop_lean", src["lean_cpp"], cuda_sources=cu, extra_cuda_cflags=["-O3"], device="cuda")
    return m.scale(x) if call else None

steps = []
for o in offsets:
    before = rows()
    s = time.perf_counter()
    y = load(o)
    if call:
        torch.cuda.synchronize()
    steps.append({"seconds": time.perf_counter() - s, "csv_from": before, "csv_to": rows()})
    if call:
        assert float(y[1]) == 2.0 + o, (float(y[1]), o)
print(json.dumps(steps))
"""

LOADERS = ("torch", "jitops-dropin", "jitops")
STEPS = ("cold", "edit 1", "edit 2")


def phases(csv_path: Path, start: int, stop: int) -> dict[str, float]:
    """Seconds per nvcc phase in rows [start, stop) of nvcc's ``--time`` CSV (header rows skipped)."""
    out: dict[str, float] = defaultdict(float)
    if not csv_path.exists():
        return out
    with open(csv_path, newline="") as f:
        for i, row in enumerate(csv.reader(f, skipinitialspace=True)):
            if not (start <= i < stop) or len(row) < 3:
                continue
            try:
                value, unit = float(row[-2]), row[-1].strip().strip('"')
            except ValueError:
                continue  # a header row
            phase = row[1].strip().strip('"')
            phase = "gcc (host passes)" if phase.startswith("gcc") else phase
            out[phase] += value / (1000.0 if unit == "ms" else 1.0)
    return out


def run(loader: str, work: Path, state: str, call: bool, timeout: float) -> list[dict] | None:
    folder = work / loader
    (folder / "build").mkdir(parents=True)
    csv_path = folder / "nvcc-time.csv"
    env = dict(
        os.environ,
        JITOPS_CACHE_DIR=str(folder / "cache"),
        JITOPS_STATE_DIR=state,
        BENCH_BDIR=str(folder / "build"),
        NVCC_APPEND_FLAGS=f"--time {csv_path}",
        BENCH_CALL="1" if call else "0",
        BENCH_SOURCES=json.dumps(
            {"torch_cpp": TORCH_CPP, "torch_cu": TORCH_CU, "lean_cpp": LEAN_CPP, "lean_cu": LEAN_CU}
        ),
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, loader, "1,2,3", str(csv_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        print(
            f"{loader:14s} did not finish in {timeout:.0f} s (--child-timeout): skipped", flush=True
        )
        return None
    if proc.returncode != 0:
        print(
            f"{loader:14s} FAILED:\n{proc.stdout}\n{proc.stderr[-4000:]}",
            file=sys.stderr,
            flush=True,
        )
        return None
    steps = json.loads(proc.stdout.strip().splitlines()[-1])
    for step in steps:
        step["phases"] = phases(csv_path, step["csv_from"], step["csv_to"])
    return steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(LOADERS), help="comma-separated loaders")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument(
        "--child-timeout", type=float, default=900, help="seconds for one loader's three steps"
    )
    p.add_argument(
        "--build-only",
        action="store_true",
        help="build and load each version without calling it: no GPU needed (a CUDA torch and nvcc are; "
        "set TORCH_CUDA_ARCH_LIST, e.g. 9.0)",
    )
    args = p.parse_args(argv)
    import torch

    call = not args.build_only
    if call and not torch.cuda.is_available():
        print(
            "cuda_edit_loop: needs a CUDA GPU (torch.cuda.is_available() is False); --build-only times the builds "
            "without one",
            file=sys.stderr,
        )
        return 2
    if not call and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        print(
            "cuda_edit_loop --build-only: set TORCH_CUDA_ARCH_LIST (e.g. 9.0): there is no GPU to read it from",
            file=sys.stderr,
        )
        return 2
    where = (
        torch.cuda.get_device_name()
        if call
        else f"no GPU call, archs {os.environ['TORCH_CUDA_ARCH_LIST']}"
    )
    print(
        f"{where}, torch {torch.__version__} (CUDA {torch.version.cuda}); {os.cpu_count()} cores; "
        "one round, loaders one after another",
        flush=True,
    )
    results: dict[str, list[dict]] = {}
    failed = False
    with tempfile.TemporaryDirectory(prefix="jitops-cuda-loop-") as tmp:
        work = Path(tmp)
        state = os.environ.get("JITOPS_STATE_DIR") or str(work / "state")
        for loader in args.only.split(","):
            steps = run(loader, work, state, call, args.child_timeout)
            if steps is None:
                failed = True
                continue
            results[loader] = steps
            times = "  ".join(f"{s}: {r['seconds']:6.2f} s" for s, r in zip(STEPS, steps))
            print(f"{loader:14s} {times}", flush=True)
    print(
        "\n| loader | step | total s | nvcc phases (s, summed over nvcc runs) |\n|---|---|--:|---|"
    )
    for loader, steps in results.items():
        for name, step in zip(STEPS, steps):
            ph = ", ".join(
                f"{k} {v:.2f}" for k, v in sorted(step["phases"].items(), key=lambda kv: -kv[1])
            )
            print(f"| {loader} | {name} | {step['seconds']:.2f} | {ph or '-'} |")
    if "torch" in results:
        for loader in (k for k in results if k != "torch"):
            ratios = ", ".join(
                f"{s} {a['seconds'] / b['seconds']:.2f}x"
                for s, a, b in zip(STEPS, results[loader], results["torch"])
            )
            print(f"{loader} / torch (time ratio, < 1: jitops faster): {ratios}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
