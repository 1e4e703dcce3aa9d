"""``jitops bench`` and benchmarks/kernels.py: the timing, the table, the command, the script.

The CPU path runs for real (tiny shapes, few rounds, the session cache); the
CUDA path of the script runs only where there is a GPU (``cuda`` marker).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import jitops
from jitops import bench
from jitops.bench import Row
from jitops.cli import main
from tests.helpers import REPO, child_env, run_scenario

FAST = bench.Timing(rounds=2, block_s=0.002)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def parse_table(
    out: str, holding: str | None = None
) -> tuple[list[str], dict[str, dict[str, str]]]:
    """The first Markdown table printed in ``out`` (the first with a case label holding ``holding``, if given)
    -> its header and {case: {column: cell}}."""
    tables: list[list[str]] = [[]]
    for ln in out.splitlines():
        if ln.startswith("|"):
            tables[-1].append(ln)
        elif tables[-1]:
            tables.append([])
    for lines in tables:
        cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
        if len(cells) < 2 or (holding is not None and not any(holding in r[0] for r in cells[2:])):
            continue
        header, rule, body = cells[0], cells[1], cells[2:]
        assert all(re.fullmatch(r"-+:?", c) for c in rule)
        return header, {r[0]: dict(zip(header, r)) for r in body}
    raise AssertionError(f"no table{f' with a {holding!r} case' if holding else ''} in:\n{out}")


def kernels_script() -> Any:
    spec = importlib.util.spec_from_file_location(
        "bench_kernels_script", REPO / "benchmarks" / "kernels.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------ machinery (no compiler)


def test_interleaved_measures_each_side_and_the_ratios() -> None:
    def sleeper(seconds: float) -> Any:
        return lambda: time.sleep(seconds)

    # sleeps long enough that a loaded machine's wake-up delay (~1 ms) stays small beside them
    times, ratios, fastest = bench.interleaved(
        [sleeper(0.01), sleeper(0.02), sleeper(0.03)], rounds=3, block_s=0.1
    )
    assert 0.01 <= times[0] < 0.02 < times[2]
    assert ratios[0] == pytest.approx(2, rel=0.25) and ratios[1] == pytest.approx(3, rel=0.25)
    assert fastest == pytest.approx(ratios[0], rel=0.01)  # the faster of the two others
    assert bench.interleaved([sleeper(0.001), sleeper(0.001)], rounds=2, block_s=0.01)[2] is None


def test_table_has_ratios_bandwidth_and_notes() -> None:
    rows = [
        Row(
            "softmax (4096, 4096) f32 fwd",
            {"jitops": 0.001, "eager": 0.002, "compile": 0.0015},
            {"eager": 2.0, "compile": 1.5},
            1.5,
            bytes=2 << 26,
        ),
        Row(
            "softmax (8, 8) f32 fwd",
            {"jitops": 4e-6, "eager": 2e-6},
            {"eager": 0.5},
            None,
            bytes=512,
            note="result differs from eager",
        ),
    ]
    lines = bench.table(rows, copy_bps=200e9)
    header, body = parse_table("\n".join(lines))
    assert header == [
        "case",
        "jitops ms",
        "eager ms",
        "compile ms",
        "eager/jitops",
        "compile/jitops",
        "fastest/jitops",
        "jitops GB/s",
        "eager GB/s",
        "jitops % copy",
    ]
    big = body["softmax (4096, 4096) f32 fwd"]
    assert (
        big["jitops ms"] == "1.000" and big["eager ms"] == "2.000" and big["compile ms"] == "1.500"
    )
    assert big["eager/jitops"] == "2.00x" and big["fastest/jitops"] == "1.50x"
    assert (
        big["jitops GB/s"] == "134" and big["eager GB/s"] == "67" and big["jitops % copy"] == "67"
    )
    small = body["softmax (8, 8) f32 fwd (!)"]
    assert (
        small["compile ms"] == "-"
        and small["compile/jitops"] == "-"
        and small["fastest/jitops"] == "-"
    )
    assert small["jitops ms"] == "0.0040" and small["jitops GB/s"] == "0.1"
    assert lines[-1] == "(!) softmax (8, 8) f32 fwd: result differs from eager"
    assert len({len(ln) for ln in lines[:-1]}) == 1  # aligned
    # Without a copy figure or a second competitor, those columns go.
    header, _ = parse_table(
        "\n".join(bench.table([Row("nms 10 boxes", {"jitops": 1e-3, "tv": 2e-3}, {"tv": 2.0})]))
    )
    assert header == ["case", "jitops ms", "tv ms", "tv/jitops", "jitops GB/s", "tv GB/s"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "sofmax"], "unknown op 'sofmax'; did you mean 'softmax'"),
        (["bench", "softmax", "--shape", "4096,,8"], "invalid shape '4096,,8'"),
        (["bench", "softmax", "--dtype", "float33"], "unknown dtype 'float33'"),
        (
            ["bench", "softmax", "--shape", "8,8", "--dim", "2"],
            "--dim 2 is out of range for shape (8, 8)",
        ),
        (["bench", "add", "--dim", "0"], "--dim applies to softmax and log_softmax"),
        (["bench", "nms", "--backward"], "nms is not differentiable"),
        (["bench", "nms", "--shape", "10,4"], "give the number of boxes"),
        (["bench", "softmax", "--trace", "/nonexistent-dir/t.json"], "does not exist"),
        (["bench", "softmax", "--rounds", "0"], "--rounds must be at least 1"),
    ],
)
def test_bad_usage_exits_2_with_the_cause(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = run(argv, capsys)
    assert rc == 2 and out == ""
    assert err.startswith("jitops bench: ") and message in err and "Traceback" not in err


def test_cuda_without_a_gpu_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    rc, _, err = run(["bench", "softmax", "--device", "cuda"], capsys)
    assert rc == 2 and "no usable CUDA GPU here" in err and "--device cpu" in err


@pytest.mark.process
@pytest.mark.timeout(120)
def test_bench_help_imports_no_torch() -> None:
    assert run_scenario("scenarios_inert.bench_help", timeout=100) == {"help": True, "torch": []}


# ------------------------------------------------ real runs on CPU (each op built once per session)


def _times(row: dict[str, str], *columns: str) -> list[float]:
    return [float(row[c]) for c in columns]


@pytest.mark.compile
def test_bench_softmax_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(
        [
            "bench",
            "softmax",
            "--shape",
            "64,64",
            "--shape",
            "4,8,16",
            "--dim",
            "1",
            "--device",
            "cpu",
            "--rounds",
            "2",
        ],
        capsys,
    )
    assert rc == 0, err
    assert out.startswith("jitops bench softmax on cpu") and "copy bandwidth" in out
    header, body = parse_table(out)
    assert header[:4] == ["case", "jitops ms", "torch ms", "reference ms"]
    # dim 1 is last in 2-d
    assert set(body) == {
        "softmax (64, 64) f32 fwd",
        "softmax (4, 8, 16) dim=1 f32 fwd",
    }
    for row in body.values():
        assert all(t > 0 for t in _times(row, "jitops ms", "torch ms", "reference ms"))
        assert float(row["torch/jitops"].rstrip("x")) > 0 and float(row["jitops GB/s"]) > 0
    assert "(!)" not in out  # jitops matched the reference


@pytest.mark.compile
def test_bench_backward_bf16_writes_a_chrome_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "trace.json"
    rc, out, err = run(
        [
            "bench",
            "log_softmax",
            "--shape",
            "32,48",
            "--dtype",
            "bf16",
            "--backward",
            "--device",
            "cpu",
            "--rounds",
            "2",
            "--trace",
            str(path),
        ],
        capsys,
    )
    assert rc == 0, err
    _, body = parse_table(out)
    assert list(body) == ["log_softmax (32, 48) bf16 bwd"]
    assert "backward alone" in out and f"trace: {path}" in out
    events = json.loads(path.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    for side in ("jitops", "torch", "reference"):
        assert f"log_softmax (32, 48) bf16 bwd [{side}]" in names
    assert any("log_softmax_backward" in str(n) for n in names)  # jitops's own backward kernel ran


@pytest.mark.compile
@pytest.mark.parametrize(
    ("argv", "case", "against"),
    [
        (["add", "--shape", "16,16", "--dtype", "int64"], "add (16, 16) int64", "torch"),
        (["nms", "--shape", "200"], "nms 200 boxes, iou 0.5", "reference"),
    ],
)
def test_bench_add_and_nms(
    argv: list[str], case: str, against: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = run(["bench", *argv, "--device", "cpu", "--rounds", "1"], capsys)
    assert rc == 0, err
    _, body = parse_table(out)
    assert list(body) == [case] and float(body[case][f"{against} ms"]) > 0


@pytest.mark.compile
def test_gpu_suite_logic_runs_on_cpu() -> None:
    """benchmarks/kernels.py's CUDA tables, on CPU: only the timer (and torch.compile, skipped) differ on a GPU."""
    kb = kernels_script()
    rows, failed = kb.softmax_rows(
        "cpu", [((8, 16), -1), ((4, 8, 6), 1)], [torch.float32, torch.bfloat16], False, FAST
    )
    assert failed == [] and len(rows) == 2 * 2 * 2 * 2
    assert {r.label for r in rows} >= {
        "softmax (8, 16) f32 fwd",
        "log_softmax (4, 8, 6) dim=1 bf16 bwd",
    }
    assert all(r.note is None and min(r.times.values()) > 0 and r.ratios["eager"] > 0 for r in rows)
    header, body = parse_table("\n".join(bench.table(rows, 1e10)))
    assert "jitops % copy" in header and len(body) == 16
    # the reference stands in for torchvision
    nrows, failed = kb.nms_rows("cpu", (50,), jitops.reference("nms"), FAST)
    assert failed == [] and nrows[0].label == "nms 50 boxes, iou 0.5" and nrows[0].note is None


# ------------------------------------------------------------------ the GPU script (needs a GPU)


@pytest.mark.cuda
@pytest.mark.compile
@pytest.mark.timeout(900)
def test_kernels_script_quick_on_cuda() -> None:
    proc = subprocess.run(
        [sys.executable, "benchmarks/kernels.py", "--device", "cuda", "--quick"],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=850,
    )
    # rc 1: a case failed or differed from torch; the rows are checked first, so a failure shows
    # them.
    assert proc.returncode in (0, 1), proc.stderr
    assert re.search(r"copy bandwidth: \d+ GB/s", proc.stdout), proc.stdout
    _, body = parse_table(proc.stdout, holding="softmax")
    for name in ("softmax", "log_softmax"):
        for case in ("(4096, 4096)", "(64, 512, 256) dim=1"):
            for dt in ("f32", "bf16"):
                for kind in ("fwd", "bwd"):
                    row = body[f"{name} {case} {dt} {kind}"]
                    assert all(t > 0 for t in _times(row, "jitops ms", "eager ms", "compile ms"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
