"""Simulated CUDA machines for tests on a machine without a GPU or toolkit.

``gpu_system`` is this machine's probed facts as if torch were a CUDA 13.0
build with a GPU of a given compute capability. ``fake_toolkit`` makes a
directory with ``bin/nvcc`` (a shell script printing what a real nvcc prints
for ``--version``) and ``include/cuda_runtime_api.h``; jitops really runs it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from jitops.target import System, probe

NVCC_13_0 = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0"""


def gpu_system(capability: tuple[int, int] | None = (9, 0), **env: str) -> System:
    return dataclasses.replace(
        probe(environ={}, cuda=False),
        torch_cuda="13.0",
        cuda_available=capability is not None,
        device_capability=capability,
        build_env=tuple(sorted(env.items())),
    )


def fake_toolkit(root: Path, release: str, *, headers: bool = True) -> Path:
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\ncat <<'EOF'\n{NVCC_13_0.replace('13.0', release)}\nEOF\n")
    nvcc.chmod(0o755)
    if headers:
        (root / "include").mkdir()
        (root / "include" / "cuda_runtime_api.h").write_text("/* fake */\n")
    return root
