"""No stale answer: ``get`` inside one process after a build variable changes, and the drop-in's recall after an
include path is created or a source's bytes change without its stat.

Audit 2026-11-28, defects 8, 2 and 9.

- ``jitops.get`` in a running process plans again when a build variable its key holds (``CXXFLAGS``, ...) changes,
  as ``load`` and a fresh process do; with nothing changed (or only a CUDA variable, for a CPU op) it answers from
  its memo without planning.
- A remembered drop-in call is not recalled once an ``extra_include_paths`` folder that was missing when it was
  remembered exists: it plans, and builds the header the new folder holds.
- A source rewritten through a shared mapping (the page already dirty, so neither ctime nor mtime moves) is not
  recalled: recall checks the bytes of small sources, not their stat alone.

Tiers: in-process with the fake builder (``get``); one real torch-style pybind11 module built once for the module
(``<torch/extension.h>``, include paths ``[override, base]``), each load a fresh process
(``scenarios_dropin.warm_load``) on a private state dir, a rebuild per test after its change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import jitops
from jitops.loading import loader
from tests.cli_helpers import fake_spec

# ------------------------------------------------------------------ defect 8: get's memo and the environment


def test_get_plans_again_when_a_build_variable_changes_in_the_process(
    private_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JITOPS_BUILDER", "fake")
    monkeypatch.setenv("JITOPS_PROGRESS", "0")
    for var in ("CXXFLAGS", "CFLAGS", "LDFLAGS", "TORCH_CUDA_ARCH_LIST"):
        monkeypatch.delenv(var, raising=False)
    jitops.register(fake_spec(tmp_path / "specs", "memo_env"), replace=True)
    plans: list[str] = []
    real = loader.make_plan

    def counting(*args: Any, **kwargs: Any) -> Any:
        plans.append(args[0].name)
        return real(*args, **kwargs)

    monkeypatch.setattr(loader, "make_plan", counting)
    first = jitops.get("memo_env", device="cpu")
    assert first.library is not None and first.library.built and len(plans) == 1
    for _ in range(20):
        assert jitops.get("memo_env", device="cpu") is first
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")  # not in a CPU key
    assert jitops.get("memo_env", device="cpu") is first and len(plans) == 1

    monkeypatch.setenv("CXXFLAGS", "-DX=10")  # a notebook's cell
    second = jitops.get("memo_env", device="cpu")
    assert second.library is not None and second.library.key != first.library.key, (
        "get answered from its memo after CXXFLAGS changed"
    )
    assert second.library.built and len(plans) == 2
    assert jitops.get("memo_env", device="cpu") is second and len(plans) == 2

    monkeypatch.delenv("CXXFLAGS")  # back: the library already loaded, no build
    third = jitops.get("memo_env", device="cpu")
    assert third.library is not None and third.library.key == first.library.key
    assert len(plans) == 3 and jitops.get("memo_env", device="cpu") is third
