"""The CUDA edit loop: a small ``load_inline`` kernel with ``cuda_sources``, built cold, then edited
twice and rerun in the same process; jitops against ``torch.utils.cpp_extension.load_inline``.

Loaders (sources and layouts), each in a fresh process with fresh cache and build folders:

* ``torch``: torch's ``load_inline`` on torch-style sources (``#include <torch/extension.h>`` in the
  ``.cu``, a declaration in ``cpp_sources``, ``functions=["scale"]``): the snippet a user pastes;
* ``jitops-dropin``: ``jitops.load_inline`` on the very same arguments;
* ``jitops``: jitops-style sources, all in the ``.cu`` (lean ATen headers, ``JITOPS_LIBRARY``);
* ``stable``: torch's stable ABI, all in one ``.cu``, as stable extensions are written;
* the split layouts, where the ``.cu`` holds only the kernel and a C launcher (no torch header) and
  the host code (checks, allocation, stream, registration) is in ``cpp_sources``: ``torch-split``
  (torch's loader, ``<torch/extension.h>`` in the ``.cpp``, ``no_implicit_headers=True``),
  ``dropin-split`` (``jitops.load_inline`` on the same arguments), ``jitops-split`` (lean ATen)
  and ``stable-split``.

Each child builds version 1 (cold), then versions 2 and 3 (two edits of the kernel's body in the
``.cu``; ``cpp_sources`` unchanged), calling the kernel after each and checking its result. Times
include the build or load and one call (synchronized). Where the time goes: every nvcc run appends
its phases to a CSV (``NVCC_APPEND_FLAGS=--time FILE``), summed per step and phase (cudafe++ and
cicc are the front end and the device code generator, ptxas the assembler; the host compiler's
passes are summed as one); the rest of a step is the host compile of the ``.cpp``, the link and
loading. The jitops children share ``JITOPS_STATE_DIR``: point it at a folder where this jitops has
built once (its remembered self-check verdict), or the first jitops cold build also waits for the
once-per-compiler self-check. A loader whose child fails or outlasts ``--child-timeout`` is reported
and skipped; the others still run. ``--busy idle,busy`` runs every loader again beside one CPU-bound
process per core.

Needs a GPU and nvcc; ``--build-only`` (with ``TORCH_CUDA_ARCH_LIST``) times the same builds and
loads without calling the kernel, so a machine with nvcc and a CUDA torch but no GPU can run it.
Usage: ``python benchmarks/cuda_edit_loop.py [--only torch,stable-split,...] [--build-only]
[--busy idle,busy] [--out FILE.json]``.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

KERNEL = """
__global__ void scale_kernel(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i] + OFFSET.0f;
}
"""
TORCH_CPP = "#include <torch/extension.h>\ntorch::Tensor scale(torch::Tensor x);\n"
TORCH_CU = (
    # the stream from c10/cuda: ATen/cuda/CUDAContext.h also needs cuSPARSE's headers, which a
    # toolkit without the math libraries lacks
    "#include <torch/extension.h>\n#include <c10/cuda/CUDAStream.h>\n"
    + KERNEL
    + """
torch::Tensor scale(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat && x.is_contiguous(),
              "scale: a contiguous float32 CUDA tensor");
  auto y = torch::empty_like(x);
  int64_t n = x.numel();
  scale_kernel<<<(unsigned)((n + 255) / 256), 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), y.data_ptr<float>(), n);
  return y;
}
"""
)
LEAN_CPP = '#include <jitops/op.h>\nJITOPS_LIBRARY(m) { m.def("scale(Tensor x) -> Tensor"); }\n'
# jitops style: lean ATen headers and the CUDA stream
LEAN_HEADERS = """#include <jitops/op.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAStream.h>
"""
LEAN_CU = (
    LEAN_HEADERS
    + KERNEL
    + """
at::Tensor scale(const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "scale: a contiguous float32 CUDA tensor");
  at::Tensor y = at::empty_like(x);
  int64_t n = x.numel();
  scale_kernel<<<(unsigned)((n + 255) / 256), 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), y.data_ptr<float>(), n);
  return y;
}
JITOPS_LIBRARY_IMPL(CUDA, m) { m.impl("scale", &scale); }
"""
)
# The split: the .cu holds the kernel and a C launcher, no torch header; the host code (checks,
# allocation, stream, registration) is in the .cpp, which the host compiler builds (with a PCH).
SPLIT_CU = (
    "#include <cstdint>\n"
    + KERNEL
    + """
extern "C" int scale_launch(const float* x, float* y, int64_t n, void* stream) {
  scale_kernel<<<(unsigned)((n + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(x, y, n);
  return static_cast<int>(cudaGetLastError());
}
"""
)
LAUNCH_DECL = 'extern "C" int scale_launch(const float* x, float* y, int64_t n, void* stream);\n'
LEAN_SPLIT_CPP = (
    LEAN_HEADERS
    + LAUNCH_DECL
    + """
at::Tensor scale(const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "scale: a contiguous float32 CUDA tensor");
  at::Tensor y = at::empty_like(x);
  int err = scale_launch(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(),
                         c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == 0, "scale: launch failed (cudaError ", err, ")");
  return y;
}
JITOPS_LIBRARY(m) { m.def("scale(Tensor x) -> Tensor"); }
JITOPS_LIBRARY_IMPL(CUDA, m) { m.impl("scale", &scale); }
"""
)
TORCH_SPLIT_CPP = (
    "#include <torch/extension.h>\n#include <c10/cuda/CUDAStream.h>\n"
    + LAUNCH_DECL
    + """
torch::Tensor scale(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat && x.is_contiguous(),
              "scale: a contiguous float32 CUDA tensor");
  auto y = torch::empty_like(x);
  int err = scale_launch(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(),
                         c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == 0, "scale: launch failed (cudaError ", err, ")");
  return y;
}
"""
)
STABLE_HEADERS = """#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>
"""
STABLE_BODY = """
using torch::stable::Tensor;
Tensor scale(Tensor x) {
  STD_TORCH_CHECK(x.is_cuda() && x.is_contiguous() &&
                  x.scalar_type() == torch::headeronly::ScalarType::Float,
                  "scale: a contiguous float32 CUDA tensor");
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  Tensor y = torch::stable::empty_like(x);
  void* stream = torch::stable::accelerator::getCurrentStream(x.get_device_index()).nativeHandle();
  LAUNCH
  return y;
}
STABLE_TORCH_LIBRARY(JITOPS_NS, m) { m.def("scale(Tensor x) -> Tensor"); }
STABLE_TORCH_LIBRARY_IMPL(JITOPS_NS, CUDA, m) { m.impl("scale", TORCH_BOX(&scale)); }
"""
# torch's stable ABI, one .cu as extensions on it are written (torch's own stable CUDA test
# extension, torchvision's nms)
STABLE_CU = (
    STABLE_HEADERS
    + "#include <cuda_runtime.h>\n"
    + KERNEL
    + STABLE_BODY.replace(
        "LAUNCH",
        """int64_t n = x.numel();
  scale_kernel<<<(unsigned)((n + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      x.const_data_ptr<float>(), y.mutable_data_ptr<float>(), n);
  cudaError_t err = cudaGetLastError();
  STD_TORCH_CHECK(err == cudaSuccess, "scale: launch failed: ", cudaGetErrorString(err));""",
    )
)
STABLE_SPLIT_CPP = (
    STABLE_HEADERS
    + LAUNCH_DECL
    + STABLE_BODY.replace(
        "LAUNCH",
        """int err = scale_launch(x.const_data_ptr<float>(), y.mutable_data_ptr<float>(), x.numel(),
                         stream);
  STD_TORCH_CHECK(err == 0, "scale: launch failed (cudaError ", err, ")");""",
    )
)
# loader: (which function, cpp_sources, cuda_sources, keywords); an edit changes OFFSET in the .cu
SOURCES = {
    "torch": ("torch", TORCH_CPP, TORCH_CU, {"functions": ["scale"], "extra_cuda_cflags": ["-O3"]}),
    # no_implicit_headers: else torch's loader puts <torch/types.h> back on top of the .cu
    "torch-split": (
        "torch",
        TORCH_SPLIT_CPP,
        SPLIT_CU,
        {"functions": ["scale"], "extra_cuda_cflags": ["-O3"], "no_implicit_headers": True},
    ),
    "dropin-split": (
        "jitops",
        TORCH_SPLIT_CPP,
        SPLIT_CU,
        {"functions": ["scale"], "extra_cuda_cflags": ["-O3"], "no_implicit_headers": True},
    ),
    "jitops-dropin": (
        "jitops",
        TORCH_CPP,
        TORCH_CU,
        {"functions": ["scale"], "extra_cuda_cflags": ["-O3"]},
    ),
    "jitops": ("jitops", LEAN_CPP, LEAN_CU, {"extra_cuda_cflags": ["-O3"], "device": "cuda"}),
    "jitops-split": (
        "jitops",
        LEAN_SPLIT_CPP,
        SPLIT_CU,
        {"extra_cuda_cflags": ["-O3"], "device": "cuda"},
    ),
    "stable": ("jitops", "", STABLE_CU, {"device": "cuda"}),
    "stable-split": ("jitops", STABLE_SPLIT_CPP, SPLIT_CU, {"device": "cuda"}),
}

CHILD = r"""
import json, os, sys, time
import torch
loader, offsets, csv_path = sys.argv[1], [int(o) for o in sys.argv[2].split(",")], sys.argv[3]
src = json.loads(os.environ["BENCH_SOURCES"])[loader]
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
    which, cpp, cu, kw = src
    cu = cu.replace("OFFSET", str(o))
    name = "cuda_loop_" + loader.replace("-", "_")
    if which == "torch":
        import torch.utils.cpp_extension as ce
        bdir = os.environ["BENCH_BDIR"]
        m = ce.load_inline(name, cpp, cuda_sources=cu, build_directory=bdir, **kw)
    else:
        import jitops
        m = jitops.load_inline(name, cpp, cuda_sources=cu, **kw)
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

LOADERS = tuple(SOURCES)
STEPS = ("cold", "edit 1", "edit 2")


def phases(csv_path: Path, start: int, stop: int) -> dict[str, float]:
    """Seconds per nvcc phase in rows [start, stop) of nvcc's ``--time`` CSV (header rows
    skipped)."""
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
            host = phase.startswith(("gcc", "c++", "g++"))
            phase = "host compiler passes" if host else phase
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
        BENCH_SOURCES=json.dumps(SOURCES),
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


# each jitops loader against torch's loader on the same layout
AGAINST = {"jitops-dropin": "torch", "jitops": "torch", "stable": "torch"} | {
    "jitops-split": "torch-split",
    "dropin-split": "torch-split",
    "stable-split": "torch-split",
}


def report(results: dict[str, dict[str, list[dict]]]) -> None:
    """Per condition: each loader's steps with nvcc's phases, then each jitops loader's time ratio
    to torch's loader on the same layout."""
    print("\n| condition | loader | step | total s | nvcc phases (s, summed over nvcc runs) |")
    print("|---|---|---|--:|---|")
    for cond, by_loader in results.items():
        for loader, steps in by_loader.items():
            for name, step in zip(STEPS, steps):
                ph = ", ".join(
                    f"{k} {v:.2f}" for k, v in sorted(step["phases"].items(), key=lambda kv: -kv[1])
                )
                print(f"| {cond} | {loader} | {name} | {step['seconds']:.2f} | {ph or '-'} |")
    for cond, by_loader in results.items():
        for loader, other in AGAINST.items():
            if loader in by_loader and other in by_loader:
                ratios = ", ".join(
                    f"{s} {b['seconds'] / a['seconds']:.2f}"
                    for s, a, b in zip(STEPS, by_loader[loader], by_loader[other])
                )
                print(f"{cond}: {other} / {loader} (time ratio, > 1: jitops faster): {ratios}")


def main(argv: list[str] | None = None) -> int:
    import benchmeta
    from notebook_loop import _end_background, busy_loops

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(LOADERS), help="comma-separated loaders")
    p.add_argument(
        "--child-timeout", type=float, default=900, help="seconds for one loader's three steps"
    )
    p.add_argument(
        "--build-only",
        action="store_true",
        help="build and load each version without calling it: no GPU needed (a CUDA torch and "
        "nvcc are; set TORCH_CUDA_ARCH_LIST, e.g. 9.0)",
    )
    p.add_argument(
        "--busy",
        default="idle",
        help="comma-separated: idle (nothing else started) and/or busy (one CPU-bound process per "
        "core beside the loaders)",
    )
    benchmeta.add_arguments(p)
    args = p.parse_args(argv)
    import torch

    call = not args.build_only
    if call and not torch.cuda.is_available():
        print(
            "cuda_edit_loop: needs a CUDA GPU (torch.cuda.is_available() is False); "
            "--build-only times the builds without one",
            file=sys.stderr,
        )
        return 2
    if not call and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        print(
            "cuda_edit_loop --build-only: set TORCH_CUDA_ARCH_LIST (e.g. 9.0): there is no GPU "
            "to read it from",
            file=sys.stderr,
        )
        return 2
    benchmeta.as_installed()
    said = {"idle": "idle: nothing else started", "busy": "busy: one CPU-bound process per core"}
    meta = benchmeta.start(
        args.conditions or "; ".join(said.get(c, c) for c in args.busy.split(","))
    )
    where = (
        torch.cuda.get_device_name()
        if call
        else f"no GPU call, archs {os.environ['TORCH_CUDA_ARCH_LIST']}"
    )
    results: dict[str, dict[str, list[dict]]] = {}
    failed = False
    with benchmeta.tee() as printed, tempfile.TemporaryDirectory(prefix="jitops-cuda-loop-") as tmp:
        print(
            f"{where}, torch {torch.__version__} (CUDA {torch.version.cuda}); "
            f"{os.cpu_count()} cores; one round, loaders one after another",
            flush=True,
        )
        state = os.environ.get("JITOPS_STATE_DIR") or str(Path(tmp) / "state")
        for cond in args.busy.split(","):
            loops = busy_loops(os.cpu_count() or 1) if cond == "busy" else []
            try:
                for loader in args.only.split(","):
                    work = Path(tmp) / cond
                    steps = run(loader, work, state, call, args.child_timeout)
                    _end_background(work / loader / "cache")  # no PCH child runs into the next
                    if steps is None:
                        failed = True
                        continue
                    results.setdefault(cond, {})[loader] = steps
                    times = "  ".join(f"{s}: {r['seconds']:6.2f} s" for s, r in zip(STEPS, steps))
                    print(f"{cond:4s} {loader:14s} {times}", flush=True)
                    if args.out:  # after each loader: a time limit keeps what was measured
                        benchmeta.write(
                            args.out, "cuda_edit_loop", meta, results, printed.getvalue()
                        )
            finally:
                for proc in loops:
                    proc.kill()
                    proc.wait()
        report(results)
    if args.out:
        benchmeta.write(args.out, "cuda_edit_loop", meta, results, printed.getvalue())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
