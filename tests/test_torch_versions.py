"""The supported torch range (jitops/torchcompat.py) and the cpp_extension helpers jitops/ninja.py relies on."""

from __future__ import annotations

import re
import tomllib
import warnings
from pathlib import Path

import pytest

from jitops.base import torchcompat
from jitops import target
from tests.helpers import REPO, child_env, run_scenario


@pytest.mark.parametrize(
    "version, inside",
    [
        ("2.13.0+cpu", True),
        ("2.15.0", True),
        ("2.7.1+cu126", False),
        ("2.14.1+cu130", True),
        ("2.6.0", False),
        ("2.16.0.dev20270101", False),
        ("3.0.0", False),
        ("weird", False),
    ],
)
def test_versions_outside_the_tested_range_warn_once(version: str, inside: bool) -> None:
    torchcompat._warned.discard(version)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torchcompat.check_version(version) is inside
        assert torchcompat.check_version(version) is inside
    if inside:
        assert not caught
    else:
        assert len(caught) == 1 and caught[0].category is RuntimeWarning
        assert version in str(caught[0].message) and "Fix: install a torch" in str(
            caught[0].message
        )


def test_pyproject_and_readme_state_the_tested_range() -> None:
    lo, hi = torchcompat.SUPPORTED
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"torch>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1] + 1}" in deps
    readme = (REPO / "README.md").read_text()
    assert f"torch {lo[0]}.{lo[1]}" in readme and f"{hi[0]}.{hi[1]}" in readme
    versions = re.findall(
        r"versions=\(\$\{JITOPS_TORCH_VERSIONS:-(.*)\}\)",
        (REPO / ".ci" / "torch-versions.sh").read_text(),
    )
    assert versions and any(v.startswith(f"{hi[0]}.{hi[1]}.") for v in versions[0].split())
    # the oldest: CI runs the README's set-up line (tests/test_docs_coverage.py)
    assert "torch==2.13.0" in readme


def test_a_faked_old_torch_warns_once_then_works(tmp_path: Path) -> None:
    """A torch outside the range: one clear warning from the first key, and the key still works."""
    r = run_scenario(
        "scenarios_inert.keys_with_torch_version",
        version="2.3.1+cpu",
        env=child_env(JITOPS_CACHE_DIR=str(tmp_path), JITOPS_BUILDER="fake"),
    )
    msgs = r["msgs"]
    assert len(msgs) == 1 and "2.3.1" in msgs[0] and "older than" in msgs[0], msgs
    assert r["differ"] is True, r


def test_the_cpp_extension_helpers_ninja_py_uses_exist_with_their_signatures() -> None:
    """jitops/ninja.py writes build.ninja itself and takes only public values from cpp_extension:
    include_paths("cpu"), library_paths("cpu"), COMMON_NVCC_FLAGS, CUDNN_HOME. The torch-versions CI
    leg runs this on every supported torch (2.13, 2.14, 2.15)."""
    import inspect

    import torch.utils.cpp_extension as ce

    for fn in (ce.include_paths, ce.library_paths):
        params = list(inspect.signature(fn).parameters)
        assert params and params[0] == "device_type", (fn.__name__, params)
        found = fn("cpu")
        assert found and all(Path(p).is_dir() for p in found), (fn.__name__, found)
    assert any((Path(p) / "torch" / "library.h").is_file() for p in ce.include_paths("cpu"))
    assert isinstance(ce.COMMON_NVCC_FLAGS, list) and hasattr(ce, "CUDNN_HOME")


def test_the_installed_torch_is_inside_the_range() -> None:
    import torch

    assert torchcompat.check_version(torch.__version__), torch.__version__
    assert target.probe().torch_version == torch.__version__
