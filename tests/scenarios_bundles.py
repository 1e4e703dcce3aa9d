"""Child programs for the bundle tier (tests/test_bundles.py): ``jitops.get("add")`` in a fresh process whose
path holds an installed bundle, audited (processes started, what got mapped).

Imports nothing of jitops at its top: the function imports what it needs, after the environment is set.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

SPAWNS = ("subprocess.Popen", "os.posix_spawn", "os.exec", "os.fork", "os.forkpty", "os.system")


def get_add(bundle_root: str) -> dict[str, Any]:
    """``jitops.get("add")``; (the error, or the loaded entry, whether it built, its bits against torch.add), the
    processes started, whether any file under ``bundle_root`` was mapped, the bundles this process found."""
    import torch

    import jitops
    from jitops.loading import loader
    from jitops.store import bundles

    spawned: list[list[str]] = []  # each process started: its argv (a compiler's --version probe is no build)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in SPAWNS:
            argv = args[1] if event in ("subprocess.Popen", "os.posix_spawn", "os.exec") else ()
            spawned.append([event, *map(str, argv or ())])

    sys.addaudithook(hook)
    out: dict[str, Any] = {}
    try:
        op = jitops.get("add")
    except Exception as e:  # noqa: BLE001 - the test reads it
        out["error"] = {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "msg": str(e)}
    else:
        g = torch.Generator().manual_seed(31)
        same = []
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            a, b = torch.randn(4099, generator=g).to(dtype), torch.randn(4099, generator=g).to(dtype)
            mine, theirs = op(a, b, alpha=0.5), torch.add(a, b, alpha=0.5)
            same.append(mine.dtype == theirs.dtype and mine.view(torch.uint8).equal(theirs.view(torch.uint8)))
        out["bit_identical"] = same
        (lib,) = loader._libraries.values()
        out["entry"], out["built"] = str(lib.entry), lib.built
    maps = Path("/proc/self/maps").read_text()
    out["mapped_from_bundle"] = sorted({line.split()[-1] for line in maps.splitlines()
                                        if line.split() and line.split()[-1].startswith(bundle_root)})
    out["spawned"] = spawned
    out["bundles"] = [b.name for b in bundles.installed()]
    from jitops.api import warm
    from jitops.cli.explain import explain, offline_ready  # `jitops explain add`, `doctor --offline-ready add`
    from jitops.registry import lookup

    ((_, ready, why),) = offline_ready(["add"])
    out["offline_ready"] = [ready, why]
    (warmed,) = warm.warm(warm.tasks_for([lookup("add")], ["cpu"]), jobs=1)  # `jitops warm add`
    out["warm"] = [warmed.status, warmed.message]

    ex = explain(lookup("add"))
    out["explain"] = {"verdict": ex.verdict, "ready": ex.ready, "nearest": str(ex.nearest) if ex.nearest else None,
                      "diffs": [d[0] for d in ex.diffs]}
    return out
