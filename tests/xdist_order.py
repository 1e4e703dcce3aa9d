"""CI's order of test files under pytest-xdist's ``--dist loadfile``: the longest files first.

xdist hands out files largest first by test count, so a file of few but long tests (DeepSpeed's
six real builds) started late and ended the run alone on one worker while the other idled. Handing
the longest files out first lets the other worker drain the many short files meanwhile. Only the
order changes: every file still runs whole on one worker. tests/conftest.py installs it.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadFileScheduling

# The files of CI's slowest tests (its --durations), longest first; the others keep xdist's order.
LONG_FILES = (
    "tests/test_dropin_deepspeed.py",
    "tests/test_dropin_peers.py",
    "tests/test_dropin_parity.py",
    "tests/test_kill.py",
    "tests/test_recall.py",
)


class LongFilesFirst(LoadFileScheduling):
    """``--dist loadfile`` that hands out LONG_FILES, in their order, before any other file."""

    def _assign_work_unit(self, node: Any) -> None:
        for path in reversed(LONG_FILES):
            if path in self.workqueue:
                self.workqueue.move_to_end(path, last=False)
        super()._assign_work_unit(node)
