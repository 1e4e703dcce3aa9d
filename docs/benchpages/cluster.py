"""The cluster page: ``benchmarks/cluster.py --out`` files. Simulated nodes (forked processes, each
its own cache, a fake builder that sleeps) on one store: builds per op and the time until every
node has every op; then the first ``jitops.get`` of a remote hit against a local one; and, from
``--torchrun`` runs, real torchrun jobs with the job's own store as the tier.
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

TITLE = "Clusters: one build per op across nodes"
INTRO = [
    "`python benchmarks/cluster.py` starts N simulated nodes (processes, each with its own cache",
    "dir) at once on a cold store: none (every node builds), a shared folder (`file://`), Redis",
    "and moto's S3 server, each on loopback. The builder is jitops's fake one, a fixed sleep per",
    "build, so the figures measure the coordination, not this machine's compiler. With a store,",
    "builds per op should stay 1 at every N. Then, per store, the first `jitops.get` in a fresh",
    "process: a remote hit (local cache empty, store warm) against a local hit with and without",
    "the tier configured.",
]


def cluster_table(run: Run) -> list[str]:
    lines = [
        "| store | nodes | builds per op | all nodes have all ops (s) |",
        "| --- | --- | --- | --- |",
    ]
    for c in run.results.get("clusters", []):
        lines.append(
            f"| {c['store']} | {c['nodes']} | {c['builds_per_op']} | {c['all_done_s']:.2f} |"
        )
    return lines


def gets_table(run: Run) -> list[str]:
    lines = [
        "| store | remote hit, first op ms | remote hit, second op ms | local hit, tier set ms "
        "| local hit, no tier ms |",
        "| --- | --- | --- | --- | --- |",
    ]
    keys = ("remote_first_ms", "remote_second_ms", "local_with_tier_ms", "local_without_tier_ms")
    for store, g in run.results.get("gets", {}).items():
        lines.append(f"| {store} | " + " | ".join(f"{median(g[k]):.1f}" for k in keys) + " |")
    return lines


def torchrun_lines(run: Run) -> list[str]:
    t = run.results["torchrun"]
    lines = [
        f"torchrun, {t['ranks']} ranks on {t['nodes']} simulated nodes, {t['build_seconds']:g} s "
        "per fake build:",
        "",
        "| tier | builds per op | all ranks have all ops (s) |",
        "| --- | --- | --- |",
        *(f"| {j['tier']} | {j['builds_per_op']} | {j['all_done_s']:.2f} |" for j in t["jobs"]),
        "",
    ]
    w = t.get("warm")
    if w:
        lines += [
            f"`jitops.distributed.warm` of {w['ops']} ops: {w['all_ops_s']:.2f} s until every rank "
            f"returned, against {w['one_op_s']:.2f} s for one op alone "
            f"({w['all_ops_s'] / w['one_op_s']:.2f}x); built on {w['nodes_built_on']} nodes.",
            "",
        ]
    return lines


def plot(found: list[Run], out: Path) -> None:
    plt = pyplot()
    sim = [r for r in found if r.results.get("clusters")]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for r in sim:
        stores = dict.fromkeys(c["store"] for c in r.results["clusters"])
        for store in stores:
            pts = [
                (c["nodes"], c["all_done_s"]) for c in r.results["clusters"] if c["store"] == store
            ]
            axes[0].plot(
                *zip(*pts), marker="o", label=f"{store} ({r.label})" if len(sim) > 1 else store
            )
    axes[0].set_xlabel("nodes")
    axes[0].set_ylabel("s until every node has every op")
    axes[0].set_title("simulated cluster, cold store", fontsize=9)
    axes[0].legend(fontsize=7)
    last = sim[-1].results.get("gets", {}) if sim else {}
    keys = ("remote_first_ms", "remote_second_ms", "local_with_tier_ms", "local_without_tier_ms")
    names = ("remote, 1st op", "remote, 2nd op", "local, tier set", "local, no tier")
    for k, (key, name) in enumerate(zip(keys, names)):
        xs = [i + (k - 1.5) * 0.2 for i in range(len(last))]
        axes[1].bar(xs, [median(g[key]) for g in last.values()], 0.2, label=name)
    axes[1].set_xticks(range(len(last)), list(last), fontsize=8)
    axes[1].set_ylabel("ms, first get in a fresh process")
    axes[1].set_title("remote hit against local hit (latest run)", fontsize=9)
    axes[1].legend(fontsize=7)
    title(fig, "benchmarks/cluster.py", sim)
    save(fig, out, whole=True)


def render(results: Path, out: Path) -> str:
    found = runs(results, "cluster*.json", "cluster")
    lines = head(TITLE, INTRO)
    if not found:
        lines += nothing_yet(
            "benchmarks/cluster.py", "python benchmarks/cluster.py --out cluster-X.json"
        )
        (out / "cluster.md").write_text("\n".join(lines))
        return "no cluster results -> docs/benchmarks/cluster.md says so"
    if any(r.results.get("clusters") for r in found):
        plot(found, out / "cluster.png")
        lines += ["![time until every node has every op; first-get latency](cluster.png)", ""]
    lines += [*conditions_table(found), ""]
    for i, r in enumerate(found, 1):
        x = r.results
        lines += [f"## Run {i}, {r.when} UTC", ""]
        if x.get("clusters"):
            lines += [
                f"Ops {', '.join(x['ops'])}; {x['build_seconds']:g} s per fake build; first-get "
                f"figures are medians of {x['repeat']} fresh processes.",
                "",
                *cluster_table(r),
                "",
                *gets_table(r),
                "",
            ]
        if x.get("torchrun"):
            lines += torchrun_lines(r)
    (out / "cluster.md").write_text("\n".join([*lines, *foot(found)]))
    return f"{len(found)} cluster runs -> docs/benchmarks/cluster.md, cluster.png"
