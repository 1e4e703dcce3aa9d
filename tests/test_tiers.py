"""The fast tier (tests/tiers.py, applied by tests/conftest.py): what a bare `python -m pytest` runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import tiers
from tests.helpers import REPO, child_env


def test_only_allow_listed_tests_are_fast() -> None:
    assert tiers.is_fast("tests/test_pure_core.py::test_key_is_deterministic", [])
    # a heavy mark in a pure file
    assert not tiers.is_fast("tests/test_pure_core.py::test_x", ["process"])
    # named
    assert tiers.is_fast("tests/test_kernels.py::test_nms_matches_reference[cpu-1]", ["compile"])
    assert not tiers.is_fast("tests/test_kernels.py::test_opcheck[cpu-0]", ["compile"])
    for new in ("tests/adversarial/test_new.py::test_a", "tests/test_new_file.py::test_b"):
        assert not tiers.is_fast(new, [])  # not listed: full tier only
    # the versions tier: the fast tier, pure tests anywhere, the builtin ops' parity files (no
    # process test)
    assert tiers.in_versions_tier("tests/test_kernels.py::test_opcheck[cpu-0]", ["compile"])
    assert tiers.in_versions_tier("tests/adversarial/test_new.py::test_a", [])
    assert not tiers.in_versions_tier("tests/test_dropin.py::test_x", ["compile"])
    assert not tiers.in_versions_tier("tests/test_kernels.py::test_x", ["compile", "process"])
    assert tiers.stale(["tests/test_kernels.py::test_gradcheck[cpu]"]) == sorted(
        tiers.FAST_TESTS - {"tests/test_kernels.py::test_gradcheck"}
    )


def _collected(*args: str) -> tuple[set[str], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {ln for ln in proc.stdout.splitlines() if "::" in ln}, proc.stdout


@pytest.mark.process
@pytest.mark.timeout(600)
def test_the_bare_command_is_the_fast_tier_and_full_is_everything() -> None:
    fast, out = _collected()
    full, _ = _collected("--full")
    assert fast < full and not tiers.stale(full)
    assert all(tiers.is_fast(n, []) or n.split("[")[0] in tiers.FAST_TESTS for n in fast)
    assert (
        f"fast tier: {len(full) - len(fast)} more tests run with `python -m pytest --full`" in out
    )
    # new suites run in CI's full tier
    assert not any(n.startswith("tests/adversarial/") for n in fast)
    named, _ = _collected("tests/test_kernels.py")  # a named file: every test in it, as before
    assert named == {n for n in full if n.startswith("tests/test_kernels.py::")}
    versions, out = _collected("--tier", "versions")
    assert (
        fast < versions < full and f"versions tier: {len(full) - len(versions)} more tests" in out
    )
    assert {
        n for n in full if n.startswith("tests/test_parity_softmax.py::test_parity_cpu[")
    } <= versions
