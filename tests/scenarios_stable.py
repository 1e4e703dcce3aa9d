"""Child programs for tests/test_stable_abi.py: a stable-ABI kernel loaded in a fresh interpreter."""

from __future__ import annotations

import time
from typing import Any


def load_stable(name: str, source: str) -> dict[str, Any]:
    """load_inline a stable-ABI scale kernel in this new process: built or not, its result, the load's time."""
    import torch

    start = time.perf_counter()
    import jitops

    lib = jitops.load_inline(name, source)
    ms = (time.perf_counter() - start) * 1000
    return {"built": lib.library.built, "out": lib.scale(torch.ones(3), 4.0).tolist(), "ms": ms}
