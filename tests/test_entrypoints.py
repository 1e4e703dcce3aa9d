"""Kernel packages: a pip-installed distribution declares kernels through the ``jitops.kernels`` entry points."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jitops.registry.entrypoints import GROUP, load_entry_points
from jitops.spec import OpSpec, Registry
from tests.helpers import REPO, child_env, run_scenario

DEMO = REPO / "tests" / "data" / "jitops_demo_kernels"


@pytest.fixture(scope="module")
def demo_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo kernel package, built and pip-installed (no index, no deps) into a private folder."""
    work = tmp_path_factory.mktemp("demo-pkg")
    src = work / "src"
    shutil.copytree(DEMO, src)  # pip builds in-tree: keep the checkout clean
    target = work / "site"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--target",
            str(target),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(target.glob("jitops_demo_kernels-0.1.0.dist-info/entry_points.txt"))
    return target


@pytest.mark.process
@pytest.mark.compile
@pytest.mark.timeout(400)
def test_installed_package_is_found_by_get(demo_site: Path) -> None:
    env = child_env()
    env["PYTHONPATH"] = f"{demo_site}:{env['PYTHONPATH']}"
    out = run_scenario("scenarios_inert.installed_package_op", env=env, timeout=360)
    assert out["listed"] and out["ok"] and out["ref"] and out["compiled"], out
    assert out["origin"] == "package jitops-demo-kernels"
    assert out["qualname"].startswith("jitops_demo_kernels_")


def _dist(site: Path, name: str, entry_points: str) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n{entry_points}\n")


def test_broken_packages_are_skipped_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    site = tmp_path / "site"
    pkg = site / "goodkernels"
    pkg.mkdir(parents=True)
    (pkg / "csrc").mkdir()
    (pkg / "__init__.py").write_text(
        "from pathlib import Path\nfrom jitops import OpSpec\n"
        "SPEC = OpSpec(name='good', root=Path(__file__).parent / 'csrc', cpu_sources=(), exports=('good_op',))\n"
        "CLASH = OpSpec(name='other', root=Path(__file__).parent / 'csrc', cpu_sources=(), exports=('taken',))\n"
        "def specs():\n    return [SPEC]\n"
        "NOT_A_SPEC = 42\n"
    )
    _dist(site, "good-kernels", "good = goodkernels:SPEC\nfactory = goodkernels:specs")
    _dist(site, "clashing-kernels", "clash = goodkernels:CLASH")
    _dist(site, "missing-kernels", "missing = no_such_module_here:SPECS")
    _dist(site, "wrong-kernels", "wrong = goodkernels:NOT_A_SPEC")
    monkeypatch.syspath_prepend(str(site))

    reg = Registry()
    reg.add(OpSpec(name="builtin_lib", root=tmp_path, cpu_sources=(), exports=("taken",)))
    seen: set[str] = set()
    with caplog.at_level(logging.WARNING, logger="jitops"):
        assert load_entry_points(reg, seen) is True
    assert reg.find("good_op") is not None and reg.find("good_op").origin == "package good-kernels"
    assert reg.find("taken").name == "builtin_lib"  # a package cannot take over an existing op
    warnings = "\n".join(r.getMessage() for r in caplog.records)
    assert (
        "'missing'" in warnings
        and "ModuleNotFoundError" in warnings
        and "missing-kernels" in warnings
    )
    assert "'wrong'" in warnings and "expected a jitops.OpSpec" in warnings
    assert (
        "'other' from package clashing-kernels" in warnings
        and "already provided by library 'builtin_lib'" in warnings
    )

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="jitops"):
        # each entry point is read once; no repeated warnings
        assert load_entry_points(reg, seen) is False
    assert caplog.records == []
