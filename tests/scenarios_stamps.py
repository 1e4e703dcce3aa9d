"""Child programs for the verified stamps (tests/test_warm_stamps.py): what a warm check does, audited.

Imports nothing of jitops at its top: the function imports what it needs, after the environment is set.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any


def stamped_check(root: str, name: str) -> dict[str, Any]:
    """Ensure a fake-built entry of ``name`` (specs under ``root``) once, wait until it is settled, then check it
    twice more under an audit hook: the processes started and whether its library was opened, per check."""
    import jitops.build.entry as jentry
    import jitops.plan as jplan
    from jitops.store import stamps
    from tests.cli_helpers import fake_spec

    stamps.SETTLED = 0.2
    spec = fake_spec(Path(root), name)
    first = jentry.ensure_entry(jplan.make_plan(spec, "cpu"))  # builds (the fake builder)
    lib = str(first.path / first.manifest.library_file)
    time.sleep(0.5)
    events: list[tuple[str, str]] = []

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in (
            "subprocess.Popen",
            "os.posix_spawn",
            "os.exec",
            "os.fork",
            "os.forkpty",
            "os.system",
        ):
            events.append((event, ""))
        elif event == "open" and str(args[0]) == lib:
            events.append(("open", lib))

    sys.addaudithook(hook)
    report: dict[str, Any] = {}
    for label in ("full", "stamped"):
        events.clear()
        entry = jentry.ensure_entry(jplan.make_plan(spec, "cpu"))
        report[label] = {"built": entry.built, "events": sorted({e for e, _ in events})}
    return report
