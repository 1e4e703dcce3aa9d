"""The supported torch range and the cpp_extension differences jitops bridges (jitops/torchcompat.py)."""

from __future__ import annotations

import re
import tomllib
import warnings
from pathlib import Path

import pytest

from jitops import target, torchcompat
from tests.helpers import REPO, child_env, run_py


@pytest.mark.parametrize("version, inside", [
    ("2.13.0+cpu", True), ("2.15.0", True), ("2.7.1+cu126", False), ("2.14.1+cu130", True),
    ("2.6.0", False), ("2.16.0.dev20270101", False), ("3.0.0", False), ("weird", False),
])
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
        assert version in str(caught[0].message) and "Fix: install a torch" in str(caught[0].message)


def test_pyproject_and_readme_state_the_tested_range() -> None:
    lo, hi = torchcompat.SUPPORTED
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"torch>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1] + 1}" in deps
    readme = (REPO / "README.md").read_text()
    assert f"torch {lo[0]}.{lo[1]}" in readme and f"{hi[0]}.{hi[1]}" in readme
    versions = re.findall(r"versions=\(\$\{JITOPS_TORCH_VERSIONS:-(.*)\}\)", (REPO / ".ci" / "torch-versions.sh").read_text())
    assert versions and any(v.startswith(f"{hi[0]}.{hi[1]}.") for v in versions[0].split())
    assert "torch==2.13.0" in (REPO / ".ci" / "run").read_text()  # the oldest: CI's main job


def test_a_faked_old_torch_warns_once_then_works(tmp_path: Path) -> None:
    """A torch outside the range: one clear warning from the first key, and the key still works."""
    proc = run_py("""
        import warnings, torch
        torch.__version__ = "2.3.1+cpu"
        import jitops
        from jitops import loader
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            a = loader.make_plan(loader.lookup("softmax"), "cpu").key
            b = loader.make_plan(loader.lookup("add"), "cpu").key
        msgs = [str(x.message) for x in w if "jitops" in str(x.message)]
        assert len(msgs) == 1 and "2.3.1" in msgs[0] and "older than" in msgs[0], msgs
        print("OK", a != b)
    """, env=child_env(JITOPS_CACHE_DIR=str(tmp_path), JITOPS_BUILDER="fake"))
    assert proc.stdout.split()[-2:] == ["OK", "True"], proc.stdout + proc.stderr


def _ce_old(extra_ldflags, with_cuda, verbose, is_standalone):  # torch 2.4-2.9's signature  # noqa: ANN001, ANN202
    return [*extra_ldflags, f"cuda={with_cuda}", f"v={verbose}", f"s={is_standalone}"]


def _ce_new(extra_ldflags, with_cuda, with_sycl, verbose, is_standalone):  # torch 2.13's  # noqa: ANN001, ANN202
    return [*extra_ldflags, f"cuda={with_cuda}", f"sycl={with_sycl}", f"v={verbose}", f"s={is_standalone}"]


def test_cpp_extension_helpers_are_called_by_parameter_name() -> None:
    """On main, the 5-argument call failed with TypeError on torch < 2.10 (4 parameters)."""
    class Old:
        _prepare_ldflags = staticmethod(_ce_old)

    class New:
        _prepare_ldflags = staticmethod(_ce_new)

    assert torchcompat.prepare_ldflags(Old, ["-lx"], True) == ["-lx", "cuda=True", "v=False", "s=False"]
    assert torchcompat.prepare_ldflags(New, ["-lx"], False) == ["-lx", "cuda=False", "sycl=False", "v=False",
                                                                  "s=False"]
    seen = {}

    def old_writer(path, name, sources, extra_cflags, extra_cuda_cflags, extra_ldflags, extra_include_paths,  # noqa: ANN001
                   with_cuda, is_standalone):
        seen.update(locals())

    class Writer:
        _write_ninja_file_to_build_library = staticmethod(old_writer)

    torchcompat.write_ninja_file(Writer, "p", "n", ["a.cpp"], ["-O3"], [], ["-lz"], ["/inc"], False)
    assert seen["extra_cflags"] == ["-O3"] and seen["extra_ldflags"] == ["-lz"] and seen["is_standalone"] is False
    assert seen["extra_include_paths"] == ["/inc"]


def test_the_installed_torch_is_inside_the_range() -> None:
    import torch

    assert torchcompat.check_version(torch.__version__), torch.__version__
    assert target.probe().torch_version == torch.__version__
