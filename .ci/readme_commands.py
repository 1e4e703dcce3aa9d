"""Print a command of README.md's as written, so CI runs the README instead of a copy of it.

    python3 .ci/readme_commands.py setup       # contributors' set-up (venv, install, main job)
    python3 .ci/readme_commands.py test        # the test command, its trailing comment dropped
    python3 .ci/readme_commands.py quickstart  # the Python block under "## Quickstart"

Standard library only: CI runs it before any virtualenv exists. A README whose blocks moved or
changed shape makes it exit non-zero with what it looked for, so CI fails instead of skipping them.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)


def blocks(text: str, lang: str, after: str) -> list[str]:
    """The fenced ``lang`` blocks of ``text`` after the first line that starts with ``after``."""
    start = text.find("\n" + after)
    if start < 0:
        raise SystemExit(f"README.md: no line starting with {after!r}")
    return [m.group(2) for m in _BLOCK.finditer(text, start) if m.group(1) == lang]


def command(text: str, which: str) -> str:
    """The README's ``which`` command (see the module docstring)."""
    if which == "quickstart":
        found = blocks(text, "python", "## Quickstart")
        if not found:
            raise SystemExit("README.md: no python block after '## Quickstart'")
        return found[0]
    found = blocks(text, "bash", "Contributors")
    lines = [ln for ln in found[0].splitlines() if ln.strip()] if found else []
    if len(lines) != 2:
        raise SystemExit("README.md: the contributors' block is not two lines (set-up, tests)")
    setup, test = lines
    if which == "setup":
        return setup
    if which == "test":
        return test.split("#", 1)[0].strip()
    raise SystemExit(f"unknown command {which!r}: setup, test or quickstart")


if __name__ == "__main__":
    print(command(README.read_text(), sys.argv[1]))
