"""Scenario functions for tests/test_selfcheck.py (run by tests/scenario_main.py in fresh interpreters)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def selfcheck_race(ready_dir: str, count: int, op: str = "add") -> dict[str, Any]:
    """Make the plan, wait (at most 180 s) until ``count`` processes are ready, then run the self-check the way
    a first build does (``entry.before_first_build``) and wait for its verdict."""
    from jitops.build import entry
    from jitops.plan import make_plan
    from jitops.registry import lookup
    from jitops.base.settings import Settings

    settings = Settings.from_env()
    plan = make_plan(lookup(op), "cpu", settings=settings)
    (Path(ready_dir) / str(os.getpid())).touch()
    deadline = time.monotonic() + 180
    while len(os.listdir(ready_dir)) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    t = time.monotonic()
    # (before issue 29 it ran the check itself and returned None)
    pending = entry.before_first_build(plan, settings)
    result = pending.result() if pending is not None else None
    return {
        "ok": True if result is None else result.ok,
        "cached": None if result is None else result.cached,
        "seconds": time.monotonic() - t,
    }
