"""``jitops explain``: why this machine would load, build or rebuild an op.

The answer comes from :func:`entry.entry_status`, the question ``get`` asks; on a miss the
plan's ingredients are compared with the nearest cached entry's, leaf by leaf.

Imports: entry, manifest, plan, settings, spec.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import plan as planning
from ..build.entry import Compatible, Damaged, entry_status
from ..store.manifest import Hit
from ..base.settings import Settings
from ..spec import OpSpec

_ABSENT = "(absent)"


def diff_ingredients(cached: Any, here: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted path, cached value, value here) for every leaf that differs."""
    if isinstance(cached, dict) and isinstance(here, dict):
        out = []
        for k in sorted(set(cached) | set(here)):
            out += diff_ingredients(cached.get(k, _ABSENT), here.get(k, _ABSENT), f"{prefix}.{k}" if prefix else k)
        return out
    return [] if cached == here else [(prefix, cached, here)]


@dataclass(frozen=True)
class Explanation:
    plan: planning.Plan
    verdict: str
    nearest: Path | None = None
    diffs: tuple[tuple[str, Any, Any], ...] = ()


def explain(spec: OpSpec, device: str | None = None, archs: str | None = None,
            settings: Settings | None = None) -> Explanation:
    """Why this machine would load, build or rebuild ``spec``, against the nearest cached entry."""
    plan = planning.make_plan(spec, device, archs, settings=settings)
    status = entry_status(plan)
    if isinstance(status, Hit):
        return Explanation(plan, f"cached: loads {plan.entry} with no build")
    if isinstance(status, Damaged):
        return Explanation(plan, f"would rebuild: the entry for this key is damaged ({status.reason}); the next use "
                                 "sets it aside and builds again", plan.entry)
    if isinstance(status, Compatible):
        return Explanation(plan, f"cached: no compiler here, loads {status.path} (same ingredients, other compiler)")
    here = json.loads(json.dumps(plan.ingredients))
    best: tuple[int, int, Path, list[tuple[str, Any, Any]]] | None = None
    for path in sorted(plan.cache.library_dir(spec.name).glob("*/*")):
        m = plan.cache.read_manifest(path)
        if m is None:
            continue
        diffs = diff_ingredients(m.ingredients, here)
        rank = (len(diffs), int(m.target != plan.target.name))
        if best is None or rank < best[:2]:
            best = (*rank, path, diffs)
    missing = f" (and it cannot: {str(plan.toolchain_error).partition(' Fix: ')[0]})" if plan.toolchain_error else ""
    if best is None:
        return Explanation(plan, f"would build {plan.what}: nothing is cached for {spec.name!r} yet{missing}")
    return Explanation(plan, f"would build {plan.what}: no cached entry has this key; the nearest differs in "
                             f"{best[0]} ingredient(s){missing}", best[2], tuple(best[3]))
