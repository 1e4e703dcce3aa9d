"""What the default device means on a GPU node, checked here with a probed system that claims a GPU.

Nothing CUDA runs: only the pure decision (target, key) is made, on a System
value replaced by hand, as the CUDA target tests do.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from jitops.loading import loader
from jitops import registry
from jitops import plan as jplan
from tests.cli_helpers import fake_spec


@pytest.fixture
def gpu_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    real = jplan.probe
    monkeypatch.setattr(jplan, "probe", lambda: dataclasses.replace(
        real(), torch_cuda="13.0", cuda_available=True, device_capability=(9, 0), torch_cuda_archs=("sm_90",)))
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("JITOPS_BUILDER", "fake")  # no nvcc lookup matters: only the plan is made


def test_a_library_without_cuda_sources_defaults_to_cpu_on_a_gpu_node(gpu_node, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """On main, a CPU-only user library planned a cuda build on a GPU node (and needed nvcc for it)."""
    spec = fake_spec(tmp_path / "specs", "cpu_only_lib")
    assert spec.devices == ("cpu",)
    plan = loader.make_plan(spec)
    assert plan.target.device == "cpu"
    assert plan.key == loader.make_plan(spec, "cpu").key


def test_builtin_ops_still_default_to_the_gpu(gpu_node) -> None:  # type: ignore[no-untyped-def]
    plan = loader.make_plan(registry.lookup("softmax"))
    assert plan.target.device == "cuda" and plan.target.archs == ("9.0",)
