"""The warm-load page: how long a warm ``jitops.get`` / ``jitops.load`` takes in a new process of
a program that already imported torch and ``torch.utils.cpp_extension``, against torch's own warm
``cpp_extension.load`` (``benchmarks/warm_in_program.py --out``), and CI's second
``jitops warm --all`` (``benchmarks/warm.py --out``), when such files exist.
"""

from __future__ import annotations

from pathlib import Path

from .common import (
    Run,
    conditions_table,
    foot,
    head,
    median,
    nothing_yet,
    pyplot,
    runs,
    save,
    title,
)

TITLE = "Warm load against cpp_extension"
INTRO = [
    "`python benchmarks/warm_in_program.py` times one warm load per fresh process, inside a",
    "program that has already imported `torch` and `torch.utils.cpp_extension` (not timed), as",
    "DeepSpeed's have: torch's warm `cpp_extension.load` (source hashes, a ninja run, dlopen)",
    "against `import jitops` plus `jitops.load` of the same sources (the drop-in) or",
    '`jitops.get("softmax")`. `small` is a pybind11 module written for torch, `big` a lean',
    "`TORCH_LIBRARY` op carrying a 16 MiB table (what hashing a large library costs); `new state",
    "dir` is the first process after a build, which checks the library's sha256 in full. Cases",
    "run round-robin; `/ torch` is jitops's median over torch's for the same library (softmax:",
    "over the small one's): below 1, jitops is faster.",
]


def in_program_table(run: Run) -> list[str]:
    cases = run.results["cases"]
    base = run.results.get("torch_baseline", {})
    lines = [
        "| case | median ms | min ms | / torch | import jitops ms | first call ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, c in cases.items():
        torch_case = base.get(name.split(":")[0])
        ratio = ""
        if "jitops" in name and torch_case in cases:
            ratio = f"{median(c['total_ms']) / median(cases[torch_case]['total_ms']):.2f}"
        parts = [f"{median(c[k]):.1f}" if k in c else "" for k in ("import_ms", "call_ms")]
        lines.append(
            f"| {name} | {median(c['total_ms']):.1f} | {min(c['total_ms']):.1f} | {ratio} "
            f"| {parts[0]} | {parts[1]} |"
        )
    return lines


def warm_all_table(found: list[Run], first: int) -> list[str]:
    lines = [
        "| run | cold `warm --all` s | second run, whole process s | of which import torch s "
        "| of which jitops warm s | second run's summary |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(found, first):
        x = r.results
        lines.append(
            f"| {i} | {x['cold_s']:.2f} | {median(x['second_wall_s']):.2f} "
            f"| {median(x['second_import_torch_s']):.2f} | {median(x['second_warm_s']):.3f} "
            f"| {x['second_summary'].split('; cache ')[0].rstrip(')')}) |"  # no temporary path
        )
    return lines


def plot(found: list[Run], out: Path) -> None:
    plt = pyplot()
    cases = list(dict.fromkeys(n for r in found for n in r.results["cases"]))
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(cases) * len(found) + 1.4))
    height = 0.8 / len(found)
    for k, r in enumerate(found):
        ys = [i + k * height for i in range(len(cases))]
        values = [
            median(r.results["cases"][c]["total_ms"]) if c in r.results["cases"] else 0
            for c in cases
        ]
        colors = ["#b0b0b0" if "torch" in c else "#2a7ab0" for c in cases]
        ax.barh(ys, values, height, color=colors, alpha=1 - 0.35 * k, label=r.label)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(cases))], cases, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms, median per fresh process (grey: torch, blue: jitops)")
    if len(found) > 1:
        ax.legend(fontsize=7)
    title(fig, "benchmarks/warm_in_program.py", found)
    save(fig, out, whole=True)


def render(results: Path, out: Path) -> str:
    in_program = runs(results, "warm-in-program*.json", "warm_in_program")
    warm_all = runs(results, "warm*.json", "warm")
    lines = head(TITLE, INTRO)
    if not in_program and not warm_all:
        lines += nothing_yet(
            "benchmarks/warm_in_program.py",
            "python benchmarks/warm_in_program.py --out warm-in-program-X.json",
        )
        (out / "warm-load.md").write_text("\n".join(lines))
        return "no warm-load results -> docs/benchmarks/warm-load.md says so"
    every = in_program + warm_all
    if in_program:
        plot(in_program, out / "warm-load.png")
        lines += ["![warm load per case, jitops against torch](warm-load.png)", ""]
    lines += ["## Runs", "", *conditions_table(every), ""]
    for i, r in enumerate(in_program, 1):
        size = r.results.get("sizes_bytes", {})
        libs = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in size.items())
        lines += [
            f"## Run {i}: warm loads ({r.when} UTC, {r.results.get('repeat')} processes per case)",
            "",
            f"Libraries: {libs}." if libs else "",
            "",
            *in_program_table(r),
            "",
        ]
    if warm_all:
        lines += [
            "## `jitops warm --all` in CI",
            "",
            "`python benchmarks/warm.py` runs `jitops warm --all` into an empty cache, then again",
            "in fresh processes that must build nothing (wall clock, interpreter start included;",
            "the median of the second runs). The target for a second run is at most 2 s.",
            "",
            *warm_all_table(warm_all, len(in_program) + 1),
            "",
        ]
    (out / "warm-load.md").write_text("\n".join([*lines, *foot(every)]))
    return f"{len(every)} warm-load runs -> docs/benchmarks/warm-load.md, warm-load.png"
