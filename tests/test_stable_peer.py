"""A stable-ABI extension as the ecosystem writes one, built unchanged by torch's loader and by jitops.

tests/data/stable_peer covers what PyTorch's own stable test extension does: a fixed namespace,
TORCH_BOX beside a hand-boxed kernel, Tensor and std::optional<Tensor> arguments, a device guard,
ops only a CUDA build compiles (#ifdef), FRAGMENTs, several IMPL blocks per dispatch key, two files
and a local header, with torch's stable flags (-DTORCH_STABLE_ONLY, -DTORCH_TARGET_VERSION). Each
loader builds it once, in its own fresh process (a fixed namespace is registered once per process),
and the two are compared op by op: the same ops, schemas, kernels per dispatch key and results.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import child_env, run_scenario

FOLDER = Path(__file__).parent / "data" / "stable_peer"
FLAGS = ["-DTORCH_STABLE_ONLY", "-DTORCH_TARGET_VERSION=0x020a000000000000"]
CPU_OPS = ["add_bias", "axpby", "copy_on_device", "is_contiguous", "row_sums", "scale_"]


@pytest.mark.slow
@pytest.mark.compile
@pytest.mark.process
@pytest.mark.timeout(900)
def test_the_peer_extension_builds_unchanged_through_both_loaders(tmp_path: Path) -> None:
    env = child_env(JITOPS_CACHE_DIR=str(tmp_path / "cache"), JITOPS_PCH_BACKGROUND="0")
    (tmp_path / "torch").mkdir()
    theirs = run_scenario(
        "scenarios_stable.peer_build",
        env=env,
        timeout=400,
        loader="torch",
        folder=str(FOLDER),
        flags=FLAGS,
        build_dir=str(tmp_path / "torch"),
    )
    ours = run_scenario(
        "scenarios_stable.peer_build",
        env=env,
        timeout=400,
        loader="jitops",
        folder=str(FOLDER),
        flags=FLAGS,
    )
    assert "ops" in theirs and "ops" in ours, (theirs, ours)  # else the child's error
    # the CUDA-only ops (#ifdef) are in neither; what the library registered is what jitops exports
    assert theirs["ops"] == ours["ops"] == CPU_OPS, (theirs["ops"], ours["ops"])
    assert ours["exported"] == CPU_OPS and ours["same_object"]
    assert ours["schemas"] == theirs["schemas"]
    assert ours["registered"] == theirs["registered"]
    assert ours["registered"]["axpby"] == ["CPU"]
    assert ours["registered"]["is_contiguous"] == ["CompositeExplicitAutograd"]
    for reply in (theirs, ours):
        results = reply["results"]
        for op, want in reply["expected"].items():
            torch.testing.assert_close(torch.tensor(results[op]), torch.tensor(want), msg=op)
        returned, scaled, aliased = results["scale_"]
        assert aliased and returned == scaled
        assert results["is_contiguous"] == [True, False]
        assert "axpby x: expected float32" in results["error"], results["error"]
    assert ours["results"] == theirs["results"]
    print(f"torch's load {theirs['seconds']:.1f} s, jitops.load {ours['seconds']:.1f} s")
