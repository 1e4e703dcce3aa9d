"""Become uid nobody in this child, then run another scenario: ``helpers.run_as_nobody``.

Imports nothing of jitops or torch: the drop happens before any of it is imported. The
child runs in a private mount namespace (``unshare --mount``); the interpreter and the
checkout may live under a root-only directory (here /root/.pyenv, /root is 0700; a
checkout in a ``mktemp -d`` folder, with its .venv), so the directories on those paths
are re-exposed through 0755 bind mounts made in ``base``. The host sees nothing of it.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

NOBODY = 65534  # as tests/helpers.py (not imported: it imports pytest)
REPO = Path(__file__).resolve().parent.parent


def drop_to_nobody(base: Path) -> None:
    """Make this interpreter and the checkout reachable for nobody, then become nobody."""
    blocked: dict[
        Path, set[str]
    ] = {}  # a dir nobody cannot cross -> the children on our paths through it
    for target in (os.path.realpath(sys.executable), str(REPO)):
        for p in Path(target).parents:
            if p != Path("/") and not os.stat(p).st_mode & 0o001:
                blocked.setdefault(p, set()).add(Path(target).relative_to(p).parts[0])
    for i, d in enumerate(sorted(blocked, key=lambda p: len(p.parts))):  # outermost first
        view = base / f".view{i}"
        view.mkdir(mode=0o755, exist_ok=True)
        os.chmod(view, 0o755)
        for child in sorted(blocked[d]):
            (view / child).mkdir(exist_ok=True)
            subprocess.run(["mount", "--bind", str(d / child), str(view / child)], check=True)
        subprocess.run(["mount", "--rbind", str(view), str(d)], check=True)
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def as_nobody(base: str, scenario: str, kwargs: dict[str, Any]) -> Any:
    """Drop to nobody (views in ``base``), then import and run ``scenario`` (``module.fn`` under tests/)."""
    drop_to_nobody(Path(base))
    module, _, fn = scenario.rpartition(".")
    return getattr(importlib.import_module(f"tests.{module or 'scenarios'}"), fn)(**kwargs)
