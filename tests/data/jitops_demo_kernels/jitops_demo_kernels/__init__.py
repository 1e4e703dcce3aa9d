"""Kernel specs shipped by this package, in the same format as jitops's builtins.

Importing this imports no torch: jitops reads SPECS through the
``jitops.kernels`` entry point only when ``jitops.get`` or ``list_ops`` needs it.
"""

from pathlib import Path

from jitops import OpSpec

SPECS = (
    OpSpec(
        name="demo_kernels",
        root=Path(__file__).parent / "csrc",
        cpu_sources=("axpy.cpp",),
        schemas=("demo_axpy(Tensor x, Tensor y, float alpha=1.0) -> Tensor",),
        python="jitops_demo_kernels.python",
        description="x + alpha * y",
    ),
)
