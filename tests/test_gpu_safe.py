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
    # a GPU node's image may set it (an H100's: 9.0a)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(
        jplan,
        "probe",
        lambda **_: dataclasses.replace(
            real(),
            torch_cuda="13.0",
            cuda_available=True,
            device_capability=(9, 0),
            torch_cuda_archs=("sm_90",),
        ),
    )
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("JITOPS_BUILDER", "fake")  # no nvcc lookup matters: only the plan is made


def test_a_library_without_cuda_sources_defaults_to_cpu_on_a_gpu_node(
    gpu_node, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """On main, a CPU-only user library planned a cuda build on a GPU node (and needed nvcc for it)."""
    spec = fake_spec(tmp_path / "specs", "cpu_only_lib")
    assert spec.devices == ("cpu",)
    plan = loader.make_plan(spec)
    assert plan.target.device == "cpu"
    assert plan.key == loader.make_plan(spec, "cpu").key


def test_builtin_ops_still_default_to_the_gpu(gpu_node) -> None:  # type: ignore[no-untyped-def]
    plan = loader.make_plan(registry.lookup("softmax"))
    assert plan.target.device == "cuda" and plan.target.archs == ("9.0",)


def test_a_cpu_plan_reads_no_cuda_facts_and_a_bad_fork_defaults_to_cpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A DataLoader worker forked from a process that used CUDA: torch raises on any call that would initialise CUDA
    there. On an H100 node jitops.get(name, device="cpu") failed in such a worker, reading the GPU's capability it
    did not need. No GPU here, so torch's CUDA calls are replaced by ones that raise as they do in that worker, and
    this torch is given a CUDA version."""
    import torch

    from jitops import target

    real = target._torch_facts
    monkeypatch.setattr(target, "_torch_facts", lambda: (*real()[:2], "13.0", *real()[3:]))

    def refuse(*_: object) -> None:
        raise RuntimeError("Cannot re-initialize CUDA in forked subprocess")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", refuse)
    monkeypatch.setattr(torch.cuda, "get_arch_list", refuse)
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("JITOPS_BUILDER", "fake")
    softmax = registry.lookup("softmax")
    assert loader.make_plan(softmax, "cpu").target.device == "cpu"  # no CUDA call for a CPU plan
    # the default device does read them: the stand-ins are live
    with pytest.raises(RuntimeError, match="re-initialize"):
        loader.make_plan(softmax)
    # torch's own flag in such a worker
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    # CUDA cannot run there, so the default is the CPU
    assert loader.make_plan(softmax).target.device == "cpu"
