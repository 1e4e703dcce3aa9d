"""The per-call page: what one call of a small op costs through jitops (its ``Op``, and its raw
``torch.ops`` packet) against torch's own op, from ``benchmarks/kernels.py --out`` files that hold
a ``per_call`` section (``--mode per-call``, or the default ``all``), on any device.
"""

from __future__ import annotations

from pathlib import Path

from .common import Run, conditions_table, foot, head, nothing_yet, pyplot, runs, save, title

TITLE = "Per-call cost of a small op"
INTRO = [
    "`python benchmarks/kernels.py --mode per-call` calls a 1x8 float32 softmax and add 2,000",
    "times in a block and keeps the best of 25 blocks (on CUDA each block ends with a",
    "synchronize): through jitops's `Op` (what `jitops.get` returns), through the op's raw",
    "`torch.ops` packet, and as torch's own `torch.softmax` / `torch.add`. On a tensor this small",
    "the kernel costs next to nothing, so the figure is the dispatch overhead. `jitops / torch`",
    "above 1 is what a call through jitops costs more than torch's built-in op.",
]
SIDES = ("jitops", "torch.ops packet", "torch")


def table(found: list[Run]) -> list[str]:
    lines = [
        "| run | device | op | jitops Op µs | torch.ops packet µs | torch's op µs "
        "| jitops / torch |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(found, 1):
        us = {(c["op"], c["side"]): c["seconds"] * 1e6 for c in r.results["per_call"]}
        for op in dict.fromkeys(c["op"] for c in r.results["per_call"]):
            cells = [us.get((op, s)) for s in SIDES]
            ratio = f"{cells[0] / cells[2]:.2f}" if cells[0] and cells[2] else ""
            lines.append(
                f"| {i} | {r.results.get('device', '?')} | {op} | "
                + " | ".join("" if c is None else f"{c:.2f}" for c in cells)
                + f" | {ratio} |"
            )
    return lines


def plot(found: list[Run], out: Path) -> None:
    plt = pyplot()
    groups = [
        (i, r, op)
        for i, r in enumerate(found, 1)
        for op in dict.fromkeys(c["op"] for c in r.results["per_call"])
    ]
    fig, ax = plt.subplots(figsize=(max(4.5, 1.3 * len(groups) + 1.5), 3.4))
    colors = {"jitops": "#2a7ab0", "torch.ops packet": "#7fb3d5", "torch": "#b0b0b0"}
    for k, side in enumerate(SIDES):
        values = []
        for _, r, op in groups:
            got = [
                c["seconds"] * 1e6
                for c in r.results["per_call"]
                if (c["op"], c["side"]) == (op, side)
            ]
            values.append(got[0] if got else 0)
        xs = [g + (k - 1) * 0.27 for g in range(len(groups))]
        ax.bar(xs, values, 0.27, label=side, color=colors[side])
    ax.set_xticks(
        range(len(groups)),
        [f"run {i}: {op}\n{r.results.get('device', '?')}" for i, r, op in groups],
        fontsize=7,
    )
    ax.set_ylabel("µs per call, 1x8 float32")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.25)  # room for the legend above the bars
    ax.legend(fontsize=7, ncol=3, loc="upper center")
    title(fig, "benchmarks/kernels.py (per call)", found)
    save(fig, out, whole=True)


def render(results: Path, out: Path) -> str:
    found = [r for r in runs(results, "kernels*.json", "kernels") if r.results.get("per_call")]
    lines = head(TITLE, INTRO)
    if not found:
        lines += nothing_yet(
            "the per-call cost", "python benchmarks/kernels.py --mode per-call --out kernels-X.json"
        )
        (out / "per-call.md").write_text("\n".join(lines))
        return "no per-call results -> docs/benchmarks/per-call.md says so"
    plot(found, out / "per-call.png")
    lines += [
        "![µs per call: jitops's Op, its torch.ops packet, torch's op](per-call.png)",
        "",
        *conditions_table(found),
        "",
        *table(found),
        "",
        *foot(found),
    ]
    (out / "per-call.md").write_text("\n".join(lines))
    return f"{len(found)} per-call runs -> docs/benchmarks/per-call.md, per-call.png"
