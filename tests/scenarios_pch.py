"""Children for tests/test_pch_background.py: the background PCH child's entry point, run in a process of its own
(it renices itself and configures logging, which a test process must not)."""

from __future__ import annotations

import json
import logging
from typing import Any


def background_child(spec: dict[str, Any]) -> dict[str, Any]:
    """``pch_bg.child_main`` on ``spec``: its exit code and what it logged."""
    from jitops.build import pch_bg

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logging.getLogger("jitops").addHandler(Keep())
    return {"code": pch_bg.child_main(json.dumps(spec)), "log": lines}


def spin(seconds: float) -> dict[str, Any]:
    """Keep one core busy for ``seconds`` (another user's program, for the CPU-pressure tests)."""
    import time

    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return {"loops": n}
