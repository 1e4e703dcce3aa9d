"""Child programs for tests/test_stable_abi.py: a stable-ABI kernel loaded in a fresh interpreter."""

from __future__ import annotations

import time
from typing import Any


KERNEL = r"""#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/csrc/stable/ops.h>
using torch::stable::Tensor;
Tensor scale(Tensor x, double s) {
  Tensor out = torch::stable::empty_like(x);
  const float* xp = x.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) op[i] = xp[i] * static_cast<float>(s);
  return out;
}
STABLE_TORCH_LIBRARY(JITOPS_NS, m) { m.def("scale(Tensor x, float s) -> Tensor"); }
STABLE_TORCH_LIBRARY_IMPL(JITOPS_NS, CPU, m) { m.impl("scale", TORCH_BOX(&scale)); }
"""


def load_stable(name: str, source: str = KERNEL) -> dict[str, Any]:
    """load_inline a stable-ABI scale kernel in this new process: built or not, its result, the load's time.

    .ci/torch-versions.sh builds KERNEL under the main leg's torch, then loads it offline under each other version."""
    import sys

    import torch

    start = time.perf_counter()
    import jitops

    lib = jitops.load_inline(name, source)
    ms = (time.perf_counter() - start) * 1000
    # the torch-style path's modules and verbose's: a stable load (verbose=False) has no use for
    # them
    unused = sorted(
        m
        for m in ("jitops.api.cpp_ext_style", "jitops.spec.headers", "jitops.api.verbose")
        if m in sys.modules
    )
    return {
        "built": lib.library.built,
        "out": lib.scale(torch.ones(3), 4.0).tolist(),
        "ms": ms,
        "unused_imported": unused,
    }
