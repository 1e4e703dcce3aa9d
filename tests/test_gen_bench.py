"""The benchmark pages (``docs/gen_bench.py``) from tiny result files, and the conditions every
benchmark's ``--out`` file carries (``benchmarks/benchmeta.py``).

No benchmark runs here: the result files are written by hand in the shape the benchmarks write,
so a change to either side that breaks the other shows up without a timed run.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.helpers import REPO

pytest.importorskip("matplotlib")


def _load(name: str, path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def benchmeta(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return _load("benchmeta", REPO / "benchmarks" / "benchmeta.py", monkeypatch)


@pytest.fixture
def gen_bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return _load("gen_bench_under_test", REPO / "docs" / "gen_bench.py", monkeypatch)


def test_the_result_file_carries_the_conditions_and_what_was_printed(
    benchmeta: ModuleType, tmp_path: Path
) -> None:
    meta = benchmeta.start(None)
    assert meta["conditions"].startswith(("idle (", "busy (")) and "load" in meta["conditions"]
    assert benchmeta.start("busy: CI beside")["conditions"] == "busy: CI beside"
    with benchmeta.tee() as printed:
        print("a table")
    benchmeta.write(tmp_path / "r.json", "demo", meta, {"x": 1}, printed.getvalue())
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["benchmark"] == "demo" and doc["results"] == {"x": 1}
    assert doc["printed"] == "a table\n"
    for key in ("started", "ended", "load_start", "load_end", "cpus", "commit", "torch"):
        assert key in doc["meta"], key
    assert len(doc["meta"]["load_start"]) == 3 and doc["meta"]["started"].endswith("Z")


def _write(folder: Path, name: str, benchmark: str, results: dict[str, Any]) -> None:
    meta = {
        "started": "2026-11-28T19:00:00Z",
        "ended": "2026-11-28T19:01:00Z",
        "load_start": [0.31, 0.5, 0.6],
        "load_end": [1.2, 0.7, 0.6],
        "commit": "abc123def456",
        "torch": "2.13.0+cpu",
        "cpus": 2,
        "conditions": "idle: nothing else running",
    }
    doc = {"benchmark": benchmark, "meta": meta, "printed": "", "results": results}
    (folder / name).write_text(json.dumps(doc))


def _rows() -> list[dict[str, Any]]:
    return [
        {
            "label": "softmax (8, 8) alloc",
            "times": {"jitops": 1e-5, "torch": 2e-5},
            "ratios": {"torch": 2.0},
        },
        {
            "label": "softmax (8, 8) f32 fwd",
            "times": {"jitops": 1e-5, "eager": 1.5e-5, "compile": 3e-5},
            "ratios": {"eager": 1.5, "compile": 3.0},
            "fastest": 1.5,
            "bytes": 512,
            "note": None,
        },
    ]


def test_every_page_renders_from_tiny_results_and_states_its_conditions(
    gen_bench: ModuleType, tmp_path: Path
) -> None:
    folder = tmp_path / "results" / "2026-11-28-tiny"
    folder.mkdir(parents=True)
    (folder / "README.md").write_text("Tiny.\n\nMachine: a test box, 2 cores.\n")
    per_call = [
        {"op": "softmax", "side": side, "call": side, "seconds": s}
        for side, s in (("jitops", 2e-6), ("torch.ops packet", 1.8e-6), ("torch", 1e-6))
    ]
    _write(
        folder,
        "kernels-cpu.json",
        "kernels",
        {"device": "cpu", "device_name": "a CPU", "per_call": per_call, "rows": _rows()},
    )
    _write(
        folder,
        "warm-in-program-idle.json",
        "warm_in_program",
        {
            "repeat": 2,
            "sizes_bytes": {"small": 1_400_000},
            "cases": {
                "small: torch load": {"total_ms": [10.0, 12.0]},
                "small: jitops load": {
                    "total_ms": [5.0, 7.0],
                    "import_ms": [1.0, 1.0],
                    "call_ms": [4.0, 6.0],
                },
            },
            "torch_baseline": {"small": "small: torch load"},
        },
    )
    _write(
        folder,
        "cluster-idle.json",
        "cluster",
        {
            "build_seconds": 1.0,
            "ops": ["fakeadd", "fakemul"],
            "repeat": 3,
            "clusters": [
                {"store": "none", "nodes": n, "builds_per_op": f"{n}/{n}", "all_done_s": 1.5}
                for n in (1, 4)
            ],
            "gets": {
                "file": {
                    k: [10.0, 11.0, 12.0]
                    for k in (
                        "remote_first_ms",
                        "remote_second_ms",
                        "local_with_tier_ms",
                        "local_without_tier_ms",
                    )
                }
            },
        },
    )
    step = {"seconds": 2.0, "phases": {"cudafe++": 0.5, "cicc": 0.25}}
    _write(
        folder,
        "cuda-edit-loop-idle.json",
        "cuda_edit_loop",
        {
            "idle": {
                "torch-split": [dict(step, seconds=s) for s in (30.0, 20.0, 18.0)],
                "stable-split": [dict(step, seconds=s) for s in (3.0, 2.0, 1.8)],
            }
        },
    )
    out = tmp_path / "pages"
    assert gen_bench.main(tmp_path / "results", out) == 0
    pages = {p.stem: p.read_text() for p in out.glob("*.md")}
    for name in ("warm-load", "per-call", "kernels-cpu", "cluster", "cuda-edit-loop"):
        text = pages[name]
        assert (out / f"{name}.png").stat().st_size > 0 and f"]({name}.png)" in text, name
        for said in ("a test box, 2 cores", "idle: nothing else running", "0.31 / 1.2"):
            assert said in text, (name, said)
        assert "`abc123def456`" in text and "2026-11-28-tiny/" in text, name
    assert "| 1 | cpu | softmax | 2.00 | 1.80 | 1.00 | 2.00 |" in pages["per-call"]
    assert "| small: jitops load | 6.0 | 5.0 | 0.55 | 1.0 | 5.0 |" in pages["warm-load"]
    assert (
        "| softmax (8, 8) f32 fwd | 0.0100 | 0.0150 | 0.0300 | 1.50x | 3.00x |"
        in (pages["kernels-cpu"])
    )
    assert "| none | 4 | 4/4 | 1.50 |" in pages["cluster"]
    assert (
        "| 1 | idle | jitops, split (stable ABI in the `.cpp`) | 3.00 | 2.00 | 1.80 "
        "| 10.00, 10.00, 10.00 | cudafe++ 0.50, cicc 0.25 |" in pages["cuda-edit-loop"]
    )
    # No GPU result file: the page says so and shows no figure.
    gpu = pages["kernels-gpu"]
    assert "No result file" in gpu and ".png" not in gpu and not (out / "kernels-gpu.png").exists()
    # A GPU run (device cuda) goes to the GPU page, not the CPU one.
    _write(folder, "kernels-gpu.json", "kernels", {"device": "cuda", "rows": _rows()})
    gen_bench.main(tmp_path / "results", out)
    assert "No result file" not in (out / "kernels-gpu.md").read_text()
    assert (out / "kernels-gpu.png").exists()
    assert "kernels-gpu.json" not in (out / "kernels-cpu.md").read_text()


def test_the_nav_and_the_overview_name_every_generated_page() -> None:
    config = (REPO / "mkdocs.yml").read_text()
    overview = (REPO / "docs" / "benchmarks.md").read_text()
    names = ("edit-loop", "cuda-edit-loop", "loader", "warm-load", "per-call", "kernels-cpu")
    for name in (*names, "kernels-gpu"):
        assert f"benchmarks/{name}.md" in config and f"(benchmarks/{name}.md)" in overview, name
    assert "benchmarks/cluster.md" in config and "(benchmarks/cluster.md)" in overview


def test_the_edit_loop_page_shows_each_kernels_newest_runs_per_condition(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Newer code's runs replace older ones: for each kernel its newest folder, and in it, per
    condition and pause, the last file by name; a kernel measured only in an older folder stays."""
    monkeypatch.syspath_prepend(str(REPO / "docs"))
    from benchpages import edit_loop

    def run(style: str, cond: str, tag: str, pause: float = 0.0) -> dict[str, Any]:
        return {"style": style, "condition": cond, "pause": pause, "tag": tag}

    files = {
        "a-old/notebook-torch.json": [run("torch", "idle", "t-old"), run("torch", "busy", "t-old")],
        "a-old/notebook-stable.json": [run("stable", "idle", "s-old")],
        "b-new/notebook-stable-1.json": [
            run("stable", "idle", "s1"),
            run("stable", "busy", "s1"),
            run("stable", "busy", "s1", 5.0),
        ],
        "b-new/notebook-stable-2-busy.json": [run("stable", "busy", "s2")],
    }
    for name, runs in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(json.dumps({"runs": runs, "steps": []}))
    runs, chosen = edit_loop.notebook_runs(tmp_path)
    got = {(r["style"], r["condition"], r["pause"]): r["tag"] for r in runs}
    assert got == {
        ("torch", "idle", 0.0): "t-old",
        ("torch", "busy", 0.0): "t-old",
        ("stable", "idle", 0.0): "s1",
        ("stable", "busy", 0.0): "s2",  # a later file measured it again
        ("stable", "busy", 5.0): "s1",  # that file did not: the earlier one stays
    }
    assert [p.relative_to(tmp_path).as_posix() for p in chosen] == [
        "a-old/notebook-torch.json",
        "b-new/notebook-stable-1.json",
        "b-new/notebook-stable-2-busy.json",
    ]
