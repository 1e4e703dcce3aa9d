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


PEER_NS = "jitops_peer"  # the fixed namespace of tests/data/stable_peer


def peer_build(loader: str, folder: str, flags: list[str], build_dir: str = "") -> dict[str, Any]:
    """Build tests/data/stable_peer with ``loader`` ("torch": torch.utils.cpp_extension.load, or "jitops":
    jitops.load), unchanged, in this new process; what it registered and what its ops return."""
    import torch

    sources = [f"{folder}/peer.cpp", f"{folder}/peer_rows.cpp"]
    start = time.perf_counter()
    extra: dict[str, Any] = {}
    if loader == "torch":
        from torch.utils.cpp_extension import load

        load(
            "stable_peer",
            sources,
            extra_cflags=flags,
            build_directory=build_dir,
            is_python_module=False,
        )
    else:
        import jitops

        lib = jitops.load("stable_peer", sources, extra_cflags=flags)
        again = jitops.load("stable_peer", sources, extra_cflags=flags)
        extra = {"exported": sorted(lib.ops), "same_object": again is lib}
    seconds = time.perf_counter() - start
    prefix = PEER_NS + "::"
    ops = sorted(
        n[len(prefix) :] for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix)
    )
    return {"ops": ops, "seconds": seconds, **extra, **_peer_calls(ops)}


def _peer_calls(ops: list[str]) -> dict[str, Any]:
    """Each op's schema, the dispatch keys holding its kernels, and its results on a few inputs."""
    import torch

    ns = getattr(torch.ops, PEER_NS)
    keys = ("CPU", "CUDA", "CompositeExplicitAutograd")
    registered = {
        op: [
            k for k in keys if torch._C._dispatch_has_kernel_for_dispatch_key(f"{PEER_NS}::{op}", k)
        ]
        for op in ops
    }
    schemas = {op: str(getattr(ns, op).default._schema) for op in ops}
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(7, generator=g), torch.randn(7, generator=g)
    m, bias = torch.randn(3, 4, generator=g), torch.randn(4, generator=g)
    scaled = m.clone()
    returned = ns.scale_(scaled, 3.0)
    try:
        ns.axpby(x.double(), y, 1.0, 1.0)
        error = ""
    except RuntimeError as e:
        error = str(e).splitlines()[0]
    results = {
        "axpby": ns.axpby(x, y, 2.0, -0.5).tolist(),
        "add_bias": ns.add_bias(m, bias).tolist(),
        "add_bias_none": ns.add_bias(m, None).tolist(),
        "scale_": [returned.tolist(), scaled.tolist(), returned.data_ptr() == scaled.data_ptr()],
        "copy_on_device": ns.copy_on_device(m).tolist(),
        "is_contiguous": [ns.is_contiguous(m), ns.is_contiguous(m.t())],
        "row_sums": ns.row_sums(m).tolist(),
        "error": error,
    }
    expected = {
        "axpby": (2.0 * x - 0.5 * y).tolist(),
        "add_bias": (m + bias).tolist(),
        "add_bias_none": m.tolist(),
        "copy_on_device": m.tolist(),
        "row_sums": m.sum(1).tolist(),
    }
    return {"registered": registered, "schemas": schemas, "results": results, "expected": expected}
