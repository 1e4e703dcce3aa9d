"""The kernel pages, CPU and GPU: jitops's builtin ops against torch eager, ``torch.compile`` and
torchvision, from ``benchmarks/kernels.py --out`` files (their ``results.device`` says which page a
run belongs to). A device with no result file gets a page that says so, never figures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .common import Run, conditions_table, foot, head, nothing_yet, pyplot, runs, save, title

PAGES = {
    "cpu": ("kernels-cpu", "Kernels on CPU"),
    "cuda": ("kernels-gpu", "Kernels on a GPU"),
}
INTRO = {
    "cpu": [
        "`python benchmarks/kernels.py` times each builtin op against torch on the CPU, the",
        "two sides in paired, interleaved rounds (the machines are shared; each ratio is the",
        "median of the per-round ratios). `alloc` cases allocate the output every call,",
        "`prealloc` ones write into a buffer, `fwd+bwd` runs forward and `torch.autograd.grad`",
        "each call; nms runs against torchvision's, or the pure-PyTorch reference where",
        "torchvision does not load. Then softmax and log_softmax against torch eager and",
        "`torch.compile` (inductor, one compile per case). Ratios are other time / jitops time:",
        "above 1, jitops is faster.",
    ],
    "cuda": [
        "`python benchmarks/kernels.py --device cuda` (run by `benchmarks/gpu_session.sh` on a",
        "lent GPU) times nms against torchvision, then softmax and log_softmax, forward and",
        "backward, float32 and bfloat16, against torch eager and `torch.compile`, each side alone",
        "with triton's `do_bench` (L2 flushed, median). Ratios are other time / jitops time: above",
        "1, jitops is faster; `% copy` is jitops's traffic against the device's copy bandwidth.",
    ],
}


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return ""
    ms = seconds * 1e3
    return f"{ms:.1f}" if ms >= 100 else f"{ms:.3f}" if ms >= 1 else f"{ms:.4f}"


def _sides(row: dict[str, Any]) -> tuple[str, ...]:
    return tuple(row["times"])


def tables(run: Run) -> list[str]:
    """The run's rows, one table per set of sides (against torch; eager and compile; ...)."""
    rows = run.results.get("rows", [])
    copy = run.results.get("copy_bandwidth")
    lines: list[str] = []
    for sides in dict.fromkeys(_sides(r) for r in rows):
        ours, others = sides[0], [s for s in sides[1:]]
        ratios = [s for s in others] if ours == "jitops" else []
        gbps = ours == "jitops" and any(r.get("bytes") for r in rows if _sides(r) == sides)
        header = ["case", *(f"{s} ms" for s in sides), *(f"{s}/jitops" for s in ratios)]
        header += ["jitops GB/s"] if gbps else []
        header += ["jitops % copy"] if gbps and copy else []
        lines += ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
        for r in rows:
            if _sides(r) != sides:
                continue
            cells = [r["label"] + (" (!)" if r.get("note") else "")]
            cells += [_ms(r["times"].get(s)) for s in sides]
            cells += [f"{r['ratios'][s]:.2f}x" if s in r.get("ratios", {}) else "" for s in ratios]
            if gbps:
                rate = r["bytes"] / r["times"]["jitops"] if r.get("bytes") else None
                cells.append("" if rate is None else f"{rate / 1e9:.1f}")
                if copy:
                    cells.append("" if rate is None else f"{100 * rate / copy:.0f}")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    notes = [f"(!) {r['label']}: {r['note']}" for r in rows if r.get("note")]
    failed = run.results.get("failed") or []
    return lines + [*(f"- {n}" for n in notes + failed), ""] if notes or failed else lines


def plot(run: Run, out: Path) -> None:
    """Every ratio of the run (other / jitops) as a horizontal bar, on a log axis around 1."""
    plt = pyplot()
    rows = [r for r in run.results.get("rows", []) if r.get("ratios")]
    bars = [(r["label"], side, ratio) for r in rows for side, ratio in r["ratios"].items()]
    sides = list(dict.fromkeys(side for _, side, _ in bars))
    palette = ["#b0b0b0", "#e08a3c", "#6a9f58", "#8c6bb1"]
    fig, ax = plt.subplots(figsize=(8, 0.22 * len(bars) + 1.4))
    ax.barh(
        range(len(bars)),
        [b[2] for b in bars],
        color=[palette[sides.index(b[1]) % len(palette)] for b in bars],
    )
    ax.set_yticks(range(len(bars)), [f"{b[0]} vs {b[1]}" for b in bars], fontsize=6)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("other time / jitops time (above 1: jitops faster)", fontsize=8)
    title(fig, f"benchmarks/kernels.py, {run.results.get('device_name', '?')},", [run])
    save(fig, out, whole=True)


def page(device: str, found: list[Run], out: Path) -> str:
    name, title = PAGES[device]
    lines = head(title, INTRO[device])
    if not found:
        lines += nothing_yet(
            f"`benchmarks/kernels.py --device {device}`",
            f"python benchmarks/kernels.py --device {device} --out {name}.json",
        )
        if device == "cuda":
            lines += [
                "The machines these pages are usually made on have no GPU; on a lent one,",
                "`bash benchmarks/gpu_session.sh` writes `kernels-gpu.json` into its output",
                "folder. Tables from H100 runs on 2026-11-27, whose raw output was not kept, are",
                "quoted with their conditions in",
                "`benchmarks/results/2026-11-25-to-28-readme-log/README.md`;",
                "they are not rendered here.",
                "",
            ]
        (out / f"{name}.md").write_text("\n".join(lines))
        return f"no {device} kernel results -> docs/benchmarks/{name}.md says so"
    latest = found[-1]
    plot(latest, out / f"{name}.png")
    lines += [
        f"![other / jitops per case, run {len(found)}]({name}.png)",
        "",
        f"The plot shows the latest run ({len(found)}); the tables show every run.",
        "",
        *conditions_table(found),
        "",
    ]
    for i, r in enumerate(found, 1):
        x = r.results
        copy = x.get("copy_bandwidth")
        lines += [
            f"## Run {i}: {x.get('device_name', '?')}, {r.when} UTC"
            + (" (`--quick`)" if x.get("quick") else "")
            + (
                " (cut short: the cases measured before the time limit)"
                if x.get("interrupted")
                else ""
            ),
            "",
            f"{x.get('threads', '?')} threads; timer: {x.get('timer', '?')}"
            + (f"; copy bandwidth {copy / 1e9:.0f} GB/s (read + write)" if copy else "")
            + ".",
            "",
            *tables(r),
        ]
    (out / f"{name}.md").write_text("\n".join([*lines, *foot(found)]))
    return f"{len(found)} {device} kernel runs -> docs/benchmarks/{name}.md, {name}.png"


def render(results: Path, out: Path) -> str:
    every = [r for r in runs(results, "kernels*.json", "kernels") if r.results.get("rows")]
    return "; ".join(
        page(device, [r for r in every if r.results.get("device") == device], out)
        for device in PAGES
    )
