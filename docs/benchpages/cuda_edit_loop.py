"""The CUDA edit-loop page: a small kernel given to ``load_inline`` with ``cuda_sources``, built
cold and edited twice in one process, per loader and source layout, from
``benchmarks/cuda_edit_loop.py --out`` files (on a GPU node, or ``--build-only`` on a machine with
nvcc and no GPU).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .common import Run, conditions_table, foot, head, nothing_yet, pyplot, runs, save, title

TITLE = "CUDA edit loop"
INTRO = [
    "`python benchmarks/cuda_edit_loop.py` gives a 6-line CUDA kernel to `load_inline` with",
    "`cuda_sources`, builds it cold, then edits the kernel's body twice and reruns it in the same",
    "process, each loader in a fresh process with empty caches. Layouts: everything in the `.cu`",
    "(torch-style with `<torch/extension.h>`, jitops-style with lean ATen headers, or torch's",
    "stable ABI), or *split*: the `.cu` holds only the kernel and a C launcher, the host code",
    "(checks, allocation, stream, registration) is in `cpp_sources`. Each jitops loader is",
    "compared with torch's `load_inline` on the same layout; `torch / jitops` above 1 is how many",
    "times faster jitops is. Without a GPU (`--build-only`) a step is the build and the load, not",
    "the call. Where nvcc's time goes (its `--time` phases) is in each run's result file.",
]
STEPS = ("cold", "edit 1", "edit 2")
# each jitops loader's counterpart: torch's loader on the same layout
AGAINST = {
    "jitops-dropin": "torch",
    "jitops": "torch",
    "stable": "torch",
    "jitops-split": "torch-split",
    "dropin-split": "torch-split",
    "stable-split": "torch-split",
}
LAYOUT = {
    "torch": "torch `load_inline`, all in the `.cu` (`<torch/extension.h>`)",
    "jitops-dropin": "jitops drop-in, the same arguments",
    "jitops": "jitops, all in the `.cu` (lean ATen, `JITOPS_LIBRARY`)",
    "stable": "jitops, stable ABI, all in the `.cu`",
    "torch-split": "torch `load_inline`, split (`<torch/extension.h>` in the `.cpp`, "
    "`no_implicit_headers=True`)",
    "dropin-split": "jitops drop-in, split, the same arguments",
    "jitops-split": "jitops, split (lean ATen in the `.cpp`)",
    "stable-split": "jitops, split (stable ABI in the `.cpp`)",
}


def _phases(step: dict[str, Any]) -> str:
    top = sorted(step.get("phases", {}).items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{k} {v:.2f}" for k, v in top)


def table(found: list[Run]) -> list[str]:
    lines = [
        "| run | condition | loader and layout | cold s | edit 1 s | edit 2 s "
        "| torch / jitops, cold, edits | nvcc's largest phases in edit 1 (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(found, 1):
        for cond, by_loader in r.results.items():
            for loader, steps in by_loader.items():
                secs = [s["seconds"] for s in steps]
                other = by_loader.get(AGAINST.get(loader, ""))
                ratio = (
                    ", ".join(f"{o['seconds'] / s:.2f}" for o, s in zip(other, secs))
                    if other
                    else ""
                )
                lines.append(
                    f"| {i} | {cond} | {LAYOUT.get(loader, loader)} | "
                    + " | ".join(f"{s:.2f}" for s in secs)
                    + f" | {ratio} | {_phases(steps[1]) if len(steps) > 1 else ''} |"
                )
    return lines


def plot(found: list[Run], out: Path) -> None:
    plt = pyplot()
    groups = [
        (i, cond, loader, steps)
        for i, r in enumerate(found, 1)
        for cond, by_loader in r.results.items()
        for loader, steps in by_loader.items()
    ]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.8 * len(groups) + 1.5), 3.8))
    colors = ("#b0b0b0", "#2a7ab0", "#7fb3d5")
    for k, step in enumerate(STEPS):
        xs = [g + (k - 1) * 0.27 for g in range(len(groups))]
        values = [s[k]["seconds"] if len(s) > k else 0 for *_, s in groups]
        ax.bar(xs, values, 0.27, label=step, color=colors[k])
    ax.set_yscale("log")
    ax.set_xticks(
        range(len(groups)),
        [f"run {i} {cond}\n{loader}" for i, cond, loader, _ in groups],
        fontsize=6,
        rotation=60,
        ha="right",
    )
    ax.set_ylabel("seconds (log scale)")
    ax.legend(fontsize=7, ncol=3, loc="upper center")
    ax.set_ylim(ax.get_ylim()[0], ax.get_ylim()[1] * 4)  # room for the legend above the bars
    title(fig, "benchmarks/cuda_edit_loop.py", found)
    save(fig, out, whole=True)


def render(results: Path, out: Path) -> str:
    found = runs(results, "cuda-edit-loop*.json", "cuda_edit_loop")
    lines = head(TITLE, INTRO)
    if not found:
        lines += nothing_yet(
            "the CUDA edit loop",
            "python benchmarks/cuda_edit_loop.py --out cuda-edit-loop-X.json",
        )
        (out / "cuda-edit-loop.md").write_text("\n".join(lines))
        return "no CUDA edit-loop results -> docs/benchmarks/cuda-edit-loop.md says so"
    plot(found, out / "cuda-edit-loop.png")
    lines += [
        "![seconds per step, cold and two edits, per loader and layout](cuda-edit-loop.png)",
        "",
        *conditions_table(found),
        "",
        *table(found),
        "",
        *foot(found),
    ]
    (out / "cuda-edit-loop.md").write_text("\n".join(lines))
    return (
        f"{len(found)} CUDA edit-loop runs -> docs/benchmarks/cuda-edit-loop.md, cuda-edit-loop.png"
    )
