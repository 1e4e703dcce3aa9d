"""benchmarks/get_path.py: the modules a ``jitops.get`` passes and its climbs back up the import graph."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "bench_get_path", REPO / "benchmarks" / "get_path.py"
)
assert _spec and _spec.loader
get_path = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(get_path)


def test_collapse_merges_consecutive_repeats_only() -> None:
    assert get_path.collapse([]) == []
    assert get_path.collapse(["a", "a", "b", "b", "b", "a", "c", "c", "a"]) == [
        "a",
        "b",
        "a",
        "c",
        "a",
    ]


def test_climbs_count_moves_into_a_module_that_imports_the_current_one() -> None:
    # top imports mid, mid imports low; x and y import each other (a circle); low imports nothing.
    g = {"top": {"mid"}, "mid": {"low"}, "low": set(), "x": {"y"}, "y": {"x"}}
    reach = get_path.closure(g)
    assert reach["top"] == {"mid", "low"} and reach["low"] == set() and reach["x"] == {"x", "y"}
    seq = get_path.collapse(["top", "mid", "low", "low", "mid", "low", "top", "x", "y", "x", "low"])
    up = get_path.climbs(seq, reach)
    # down (top->mid, mid->low, top->x, x->low) is no climb; low->mid, low->top (transitive) and
    # both ways round the circle are.
    assert up == {("low", "mid"): 1, ("low", "top"): 1, ("x", "y"): 1, ("y", "x"): 1}
    assert sum(up.values()) == 4
    # callee, caller: top calls mid twice, mid calls low, low calls top back (an upcall), then top
    # calls x
    pairs = [
        ["top", "user"],
        ["mid", "top"],
        ["mid", "top"],
        ["low", "mid"],
        ["top", "low"],
        ["x", "top"],
    ]
    r = get_path.report(pairs, reach)
    assert r["modules"] == ["low", "mid", "top", "x"] and r["transitions"] == [
        "top",
        "mid",
        "low",
        "top",
        "x",
    ]
    assert r["climbs"] == 1 and r["climb_counts"] == [["low", "top", 1]] and r["calls"] == 6
    assert r["upcalls"] == 1 and r["upcall_counts"] == [["low", "top", 1]]
    # a return from a helper is a climb but no upcall: top calls low, then mid
    r = get_path.report([["low", "top"], ["mid", "top"]], reach)
    assert r["climbs"] == 1 and r["upcalls"] == 0
    # a call inside one module of a circle is no upcall; a call across the circle is, either way
    r = get_path.report([["x", "x"], ["y", "x"], ["x", "y"]], reach)
    assert r["upcall_counts"] == [["x", "y", 1], ["y", "x", 1]] and r["trace"] == [
        ["x", "x"],
        ["y", "x"],
        ["x", "y"],
    ]


def test_climbs_on_this_checkouts_import_graph() -> None:
    from import_graph import graph

    reach = get_path.closure(graph(annotations=True))
    assert get_path.climbs(["jitops.store.cache", "jitops.plan"], reach) == {
        ("jitops.store.cache", "jitops.plan"): 1
    }
    assert not get_path.climbs(["jitops.plan", "jitops.store.cache"], reach)
    assert graph(package=REPO / "jitops") == graph()  # the default is this checkout's package


def test_graph_reads_another_package_without_importing_it(tmp_path: Path) -> None:
    from import_graph import graph, modules

    pkg = tmp_path / "jitops"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .sub import low\nraise SystemExit('imported')\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "low.py").write_text("def f():\n    from jitops import top\n")
    (pkg / "top.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub import low\n"
    )
    assert set(modules(pkg)) == {"jitops", "jitops.sub", "jitops.sub.low", "jitops.top"}
    assert graph(package=pkg) == {
        "jitops": {"jitops.sub.low"},
        "jitops.sub": set(),
        "jitops.sub.low": {"jitops.top"},
        "jitops.top": {"jitops.sub.low"},
    }
    assert graph(annotations=False, package=pkg)["jitops.top"] == set()


@pytest.mark.process
def test_traced_get_cold_then_warm_with_the_fake_builder() -> None:
    """Two real child processes (a fake build, then a cache hit) on this checkout."""
    result = get_path.measure(REPO, "softmax", {"JITOPS_BUILDER": "fake"})
    cold, warm = result["cold"], result["warm"]
    for run in (cold, warm):
        assert {"jitops", "jitops.loading.loader", "jitops.registry", "jitops.plan"} <= set(
            run["modules"]
        )
        assert run["climbs"] == sum(n for *_, n in run["climb_counts"]) and run["climbs"] > 0
        assert run["upcalls"] == sum(n for *_, n in run["upcall_counts"])
        assert all(a != b for a, b in zip(run["transitions"], run["transitions"][1:]))
    assert (
        "jitops.build.publish" in cold["modules"] and "jitops.build.publish" not in warm["modules"]
    )
    assert warm["calls"] < cold["calls"]
    assert "WARM:" in get_path.table(result)


def test_the_script_fails_loudly_on_a_checkout_without_jitops(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "get_path.py"), "--repo", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "holds no jitops/ package" in proc.stderr
