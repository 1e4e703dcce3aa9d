"""Child programs about what jitops does before and without work: imports, names, file access.

Imports nothing of jitops or torch at its top (nor tests.scenarios, which does): each function
imports what it needs itself, so what it measures or audits starts from a bare interpreter.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any


def hostile_names(pickled_hex: str) -> tuple[list[tuple[str, str]], list[Any]]:
    """Each name (a pickle, as hex: some are not JSON) through get(), reference() and OpSpec() (as a name and
    as an export); the file, import and process events an audit hook saw meanwhile, and how each was rejected."""
    import jitops
    import jitops.loader  # noqa: F401 - loaded before the hook: not under test
    from jitops import InvalidNameError, OpSpec

    jitops.list_ops()  # the registry is loaded before the hook: it is not under test
    names = pickle.loads(bytes.fromhex(pickled_hex))  # noqa: S301 - the test's own data
    events: list[tuple[str, str]] = []
    watch = ("open", "os.", "subprocess.", "shutil.", "ctypes.", "import", "glob.", "socket.", "tempfile.", "fcntl.")
    sys.addaudithook(lambda e, a: events.append((e, repr(a)[:80])) if e.startswith(watch) else None)
    rejected: list[Any] = []
    for n in names:
        for call in (lambda: jitops.get(n), lambda: jitops.reference(n),
                     lambda: OpSpec(name=n, root=Path("/nonexistent"), cpu_sources=("a.cpp",), exports=("x",)),
                     lambda: OpSpec(name="x", root=Path("/nonexistent"), cpu_sources=("a.cpp",), exports=(n,))):
            try:
                call()
            except InvalidNameError as e:
                rejected.append(isinstance(e, ValueError))
                continue
            except TypeError:  # OpSpec's field type check sees a non-str first
                rejected.append(not isinstance(n, str))
                continue
            rejected.append(("accepted", repr(n)))
    return events, rejected
