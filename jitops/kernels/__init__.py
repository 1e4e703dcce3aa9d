"""The builtin op libraries, as data. Importing this imports no torch.

Each library is one folder here with its C++/CUDA sources and a ``python``
module holding its fake kernels, autograd formulas and pure-PyTorch
references. A new op costs one declaration below plus its folder.
"""

from __future__ import annotations

from pathlib import Path

from ..spec import OpSpec

_HERE = Path(__file__).parent

BUILTINS: tuple[OpSpec, ...] = (
    OpSpec(
        name="softmax",
        root=_HERE / "softmax",
        # the longest compile first
        cpu_sources=(
            "softmax_cpu_backward.cpp",
            "softmax_cpu.cpp",
            "softmax_cpu_backward_lastdim.cpp",
        ),
        cuda_sources=("softmax_cuda.cu", "softmax_cuda_backward.cu"),
        schemas=(  # torch's softmax.int / log_softmax.int, with dim defaulting to -1
            "softmax(Tensor x, int dim=-1, ScalarType? dtype=None) -> Tensor",
            "log_softmax(Tensor x, int dim=-1, ScalarType? dtype=None) -> Tensor",
            "softmax_backward(Tensor grad, Tensor out, int dim) -> Tensor",
            "log_softmax_backward(Tensor grad, Tensor out, int dim) -> Tensor",
        ),
        python="jitops.kernels.softmax.python",
        description="numerically stable softmax and log_softmax over one dim",
    ),
    OpSpec(
        name="add",
        root=_HERE / "add",
        cpu_sources=("add_cpu.cpp", "register.cpp"),
        cuda_sources=("add_cuda.cu",),
        # add_cpu.cpp spells out every fused multiply-add torch's compiled loops make (std::fma);
        # the compiler must not add its own, or tails would round differently from torch's.
        cflags=("-ffp-contract=off",),
        # ATen/native/cuda/Loops.cuh launches __device__ lambdas
        cuda_cflags=("--extended-lambda",),
        schemas=(
            "add(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
            "add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)",
            "add_(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)",
            # torch's add.Scalar family: a Python number as `other` (jitops.get("add") picks it as
            # torch.add does)
            "add.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",
            "add.Scalar_out(Tensor self, Scalar other, Scalar alpha=1, *, Tensor(a!) out) -> Tensor(a!)",
            "add_.Scalar(Tensor(a!) self, Scalar other, Scalar alpha=1) -> Tensor(a!)",
        ),
        python="jitops.kernels.add.python",
        description="self + alpha * other, bit-identical to torch.add on CPU: every dtype it takes, Tensor and Scalar other, in-place and out=",
    ),
    OpSpec(
        name="nms",
        root=_HERE / "nms",
        cpu_sources=("nms_cpu.cpp", "register.cpp"),  # the CPU half of a CUDA build
        cuda_sources=("nms_cuda.cu",),
        # A CPU target: torch's stable C ABI, so one build serves torch 2.13 and every later one
        stable_cpu_sources=("nms_stable.cpp",),
        # torchvision's CPU IoU rounds every product; no fused multiply-add
        cflags=("-ffp-contract=off",),
        schemas=("nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor",),
        python="jitops.kernels.nms.python",
        description="non-maximum suppression of (N, 4) xyxy boxes (float16/32/64), torchvision.ops.nms's indices",
    ),
)
