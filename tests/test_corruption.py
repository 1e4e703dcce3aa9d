"""Damaged and planted cache entries are detected before anything is loaded.

A truncated or flipped library or manifest is a cache miss: the entry is set
aside and rebuilt, once, and the damaged file is never dlopened (an audit
hook records the inode of every library ``ctypes`` opens). A planted library
whose constructor would write a marker file never runs without a valid
manifest.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import child_env, run_scenario, tattletale_library

pytestmark = [pytest.mark.process]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_truncations_and_flips_detected_before_load(tmp_path: Path) -> None:
    r = run_scenario(
        "scenarios_damage.truncations_and_flips",
        root=str(tmp_path),
        seed=3,
        flips=300,
        through_get=60,
        env=child_env(JITOPS_BUILDER="fake"),
        timeout=390,
    )
    assert r["verify_flips"] == 300 and r["undetected"] == []
    rows = r["rows"]
    assert len(rows) == 12 + 60
    bad = [x for x in rows if not (x["ok"] and x["exit"] == 0 and x["works"] and x["built"])]
    assert not bad, bad[:3]
    assert [x for x in rows if x["loaded_damaged"]] == []
    assert all(x["loads"] == 1 for x in rows)  # one dlopen: the rebuilt library; no retry loop


@pytest.mark.timeout(120)
def test_planted_library_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "PLANTED-LIBRARY-RAN"
    evil = tattletale_library(tmp_path, marker)
    hows = [
        "no-manifest",
        "garbage-manifest",
        "empty-manifest",
        "other-key",
        "claims-planted-sha",
        "symlinked-library",
        "old-manifest",
        "in-staging",
    ]
    rows = run_scenario(
        "scenarios_damage.planted_library",
        root=str(tmp_path),
        evil=str(evil),
        hows=hows,
        env=child_env(JITOPS_BUILDER="fake"),
    )
    assert len(rows) == 8
    assert not marker.exists(), "a planted library ran"
    assert all(r["ok"] and r["works"] and r["built"] for r in rows), rows


def test_tattletale_is_a_working_detector(tmp_path: Path) -> None:
    """The planted library does run when loaded directly (so its silence above means something)."""
    import ctypes

    marker = tmp_path / "RAN"
    lib = tattletale_library(tmp_path, marker)
    assert run_scenario("scenarios_damage.dlopen", path=str(lib)) is True
    assert marker.exists()
    del ctypes
