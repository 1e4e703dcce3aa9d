"""A real client of the drop-in: DeepSpeed's CPU optimizers built through jitops give the bits of
DeepSpeed's own build through torch's loader.

DeepSpeed builds its CPU Adam, Adagrad and Lion through torch.utils.cpp_extension.load; with
jitops's swapped in, the parameters after five steps must be the same bytes. Each optimizer is two
real builds (-O3, <torch/extension.h>), so this is the suite's longest test: a file of its own, so
CI's ``--dist loadfile`` can hand it out first while the other worker runs the rest
(tests/xdist_order.py). Skipped without deepspeed.

Adam and Adagrad by default. Lion goes through the same op builder and the same jitops code, at
over half the compile time of all three; JITOPS_DEEPSPEED_OPTIMIZERS=adam,adagrad,lion checks it
too.
"""

from __future__ import annotations

import importlib.util
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import child_env, run_scenario

OPTIMIZERS = os.environ.get("JITOPS_DEEPSPEED_OPTIMIZERS", "adam,adagrad").split(",")


@pytest.mark.slow
@pytest.mark.compile
@pytest.mark.timeout(3000)
@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="deepspeed is not installed "
    "(pip install deepspeed --no-deps, plus einops hjson msgpack py-cpuinfo tqdm)",
)
def test_deepspeed_cpu_optimizers_through_jitops_give_torchs_bits(tmp_path: Path) -> None:
    """After five steps the parameters are the same bytes with jitops's build as with DeepSpeed's.

    The two builds share nothing (their own folders, their own processes), so they run side by side:
    a single-file optimizer leaves a core idle when they run one after the other."""

    def build_and_step(loader: str) -> Any:
        out = tmp_path / loader
        out.mkdir()
        env = child_env(
            TORCH_EXTENSIONS_DIR=str(tmp_path / "torch_extensions"),
            JITOPS_CACHE_DIR=str(tmp_path / "cache"),
        )
        return run_scenario(
            "scenarios_dropin.deepspeed_cpu_optimizers",
            loader=loader,
            out=str(out),
            optimizers=OPTIMIZERS,
            env=env,
            timeout=1400,
        )

    with ThreadPoolExecutor(max_workers=2) as pool:
        replies = dict(zip(("torch", "jitops"), pool.map(build_and_step, ("torch", "jitops"))))
    assert replies["jitops"]["loader_was"] == "jitops.api.dropin.load", replies
    for name in OPTIMIZERS:
        ours, theirs = (
            (tmp_path / "jitops" / f"{name}.bin").read_bytes(),
            (tmp_path / "torch" / f"{name}.bin").read_bytes(),
        )
        assert len(ours) == len(theirs) > 0
        assert ours == theirs, (
            f"{name}: {sum(a != b for a, b in zip(ours, theirs, strict=True))} bytes differ"
        )
