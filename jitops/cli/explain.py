"""``jitops explain``: why this machine would load, build or rebuild an op; and ``jitops doctor
--offline-ready``: whether each of some ops would load with zero builds.

The answer comes from :func:`entry.entry_status`, the question ``get`` asks; on a miss the
plan's ingredients are compared with the nearest cached or bundled entry's, leaf by leaf.

Imports: entry, errors, manifest, plan, registry, settings, spec, store.bundles (installed bundles: their entries are candidates too).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import plan as planning
from .. import registry
from ..build.entry import Compatible, Damaged, entry_status, installed_bundles
from ..store import bundles
from ..errors import JitopsError
from ..store.manifest import Hit
from ..base.settings import Settings
from ..spec import OpSpec

_ABSENT = "(absent)"


def diff_ingredients(cached: Any, here: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted path, cached value, value here) for every leaf that differs."""
    if isinstance(cached, dict) and isinstance(here, dict):
        out = []
        for k in sorted(set(cached) | set(here)):
            out += diff_ingredients(
                cached.get(k, _ABSENT), here.get(k, _ABSENT), f"{prefix}.{k}" if prefix else k
            )
        return out
    return [] if cached == here else [(prefix, cached, here)]


@dataclass(frozen=True)
class Explanation:
    plan: planning.Plan
    verdict: str
    ready: bool  # get() would load an entry with no build (entry_status: Hit or Compatible)
    nearest: Path | None = None
    diffs: tuple[tuple[str, Any, Any], ...] = ()


def explain(
    spec: OpSpec,
    device: str | None = None,
    archs: str | None = None,
    settings: Settings | None = None,
) -> Explanation:
    """Why this machine would load, build or rebuild ``spec``, against the nearest cached entry."""
    return explain_plan(planning.make_plan(spec, device, archs, settings=settings))


def _bundle(path: Path) -> str:
    bundle = bundles.holding(path)
    return f" (the bundle {bundle.name})" if bundle is not None else ""


def explain_plan(plan: planning.Plan) -> Explanation:
    """:func:`explain` for a plan already made. Reads the cache; builds nothing."""
    spec, status = plan.spec, entry_status(plan)
    if isinstance(status, Hit):
        return Explanation(
            plan, f"cached: loads {status.path} with no build{_bundle(status.path)}", True
        )
    # only a bundle's entry was refused: skipped, not set aside
    if isinstance(status, Damaged) and not plan.entry.exists():
        return Explanation(
            plan, f"would build {plan.what}: no usable entry ({status.reason})", False
        )
    if isinstance(status, Damaged):
        return Explanation(
            plan,
            f"would rebuild: the entry for this key is damaged ({status.reason}); the next use "
            "sets it aside and builds again",
            False,
            plan.entry,
        )
    if isinstance(status, Compatible):
        return Explanation(
            plan,
            f"cached: no compiler here, loads {status.path} (same ingredients, other compiler)"
            f"{_bundle(status.path)}",
            True,
        )
    here = json.loads(json.dumps(plan.ingredients))
    best: tuple[int, int, Path, list[tuple[str, Any, Any]]] | None = None
    for path in [
        p
        for c in (plan.cache, *installed_bundles())
        for p in sorted(c.library_dir(spec.name).glob("*/*"))
    ]:
        # installed bundles' entries too: the nearest may be a bundle's
        m = plan.cache.read_manifest(path)
        if m is None:
            continue
        diffs = diff_ingredients(m.ingredients, here)
        rank = (len(diffs), int(m.target != plan.target.name))
        if best is None or rank < best[:2]:
            best = (*rank, path, diffs)
    missing = (
        f" (and it cannot: {str(plan.toolchain_error).partition(' Fix: ')[0].rstrip('. ')})"
        if plan.toolchain_error
        else ""
    )
    if best is None:
        return Explanation(
            plan,
            f"would build {plan.what}: nothing is cached for {spec.name!r} yet{missing}",
            False,
        )
    return Explanation(
        plan,
        f"would build {plan.what}: no cached entry has this key; the nearest differs in "
        f"{best[0]} ingredient(s){missing}",
        False,
        best[2],
        tuple(best[3]),
    )


def offline_ready(
    names: Sequence[str], device: str | None = None, settings: Settings | None = None
) -> list[tuple[str, bool, str]]:
    """(op, ready, why) per op name: would ``jitops.get(op, device=device)`` load it here with zero builds?

    The plan is the one ``get`` makes (the toolchain probe, the GPU's archs); then the cache is only read.
    """
    settings = Settings.from_env() if settings is None else settings
    rows = []
    for name in names:
        try:
            plan = planning.make_plan(registry.lookup(name), device, settings=settings)
            ex = explain_plan(planning.runnable_here(plan, None, settings))
        except (
            JitopsError
        ) as e:  # an unknown op, no target for the device: reported on its line, the others still
            rows.append((name, False, str(e)))
            continue
        where = f"{ex.plan.target.name}, key {ex.plan.key[:12]}"
        if ex.ready:
            rows.append((name, True, f"{where}: {ex.verdict}"))
            continue
        near = (
            f" ({', '.join(d[0] for d in ex.diffs[:3])}{', ...' if len(ex.diffs) > 3 else ''})"
            if ex.diffs
            else ""
        )
        remote = (
            "; a remote tier is set (a fetch from it builds nothing), but only this cache was checked"
            if settings.remote is not None
            else ""
        )
        rows.append(
            (
                name,
                False,
                f"{where}: {ex.verdict}{near}{remote}. Fix: `jitops warm {name}` here or in the "
                "image build, with the same torch, compiler and flags",
            )
        )
    return rows
