"""Run one scenario function in this fresh interpreter: ``python -m tests.scenario_main NAME 'JSON'``.

NAME is ``fn`` (a function of ``tests/scenarios.py``) or ``module.fn`` (a function of
``tests/<module>.py``, e.g. ``scenarios_kill.signal_during_build``). The function is called
with the JSON object's keys as keyword arguments; its return value is printed as JSON, the
last line of stdout (``helpers.last_json`` reads it). An exception is reported the same way
(``scenarios.describe``: type, MRO names, message), with its traceback on stderr.

Only the named module is imported: a scenario about import costs or inertness stays in a
module that imports nothing of jitops at its top. Run as a script (``python tests/scenario_main.py``,
e.g. by another interpreter that must not see the checkout's jitops), it finds the module beside it.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any


def describe(e: BaseException) -> dict[str, Any]:
    return {
        "ok": False,
        "type": type(e).__name__,
        "mro": [c.__name__ for c in type(e).__mro__],
        "msg": str(e),
    }


def main(argv: list[str]) -> int:
    name, raw = argv
    module, _, fn = name.rpartition(".")
    package = "tests." if __package__ else ""  # run as a script: tests/ itself is on sys.path
    target = getattr(importlib.import_module(f"{package}{module or 'scenarios'}"), fn)
    try:
        result = target(**json.loads(raw))
    except Exception as e:  # noqa: BLE001 - the test reads the failure
        # only now: a scenario that measures imports starts from json and importlib alone
        import traceback

        traceback.print_exc()
        result = describe(e)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
