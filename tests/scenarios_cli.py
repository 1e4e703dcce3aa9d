"""Child programs of tests/test_cli_process.py: the warm and offline paths, audited.

Imports nothing of jitops or torch at its top: a function installs its audit hook
(tests/audit.py) where the test wants the recording to begin, then imports the rest.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
import warnings
from typing import Any

from tests import audit


def offline_read_only() -> dict[str, Any]:
    """Every op offline from a read-only cache, the cache commands, and a new key (which must be refused):
    what was built, written and started meanwhile."""
    import torch

    import jitops
    import jitops.registry as jregistry
    from jitops.loading import loader
    from jitops.cli import main

    rec = audit.install()
    samples = {
        "softmax": lambda op, x: (op(x, dim=-1), torch.softmax(x, -1)),
        "log_softmax": lambda op, x: (op(x, dim=0), torch.log_softmax(x, 0)),
    }
    x = torch.randn(16, 37)
    report: dict[str, Any] = {"uid": os.geteuid(), "ops": {}}
    for name in jitops.list_ops():
        op = jitops.get(name, device="cpu")
        got, want = samples[name](op, x) if name in samples else (None, None)
        report["ops"][name] = {
            "built": op.library.built,
            "ok": got is None or bool(torch.allclose(got, want, atol=1e-5)),
            "checked": name in samples,
        }
    with contextlib.redirect_stdout(io.StringIO()):
        report["rcs"] = [main(["cache", "ls"]), main(["cache", "verify"]), main(["list"])]
    # a new key: offline must refuse, not build or write
    os.environ["CXXFLAGS"] = "-DJITOPS_NEW_FLAGS"
    try:
        loader.load_library(jregistry.registry().lookup("softmax"), "cpu")
        report["miss"] = None
    except jitops.OfflineMiss as e:
        report["miss"] = str(e)
    report.update(
        writes=rec.writes,
        spawns=rec.spawns,
        cpp_extension="torch.utils.cpp_extension" in sys.modules,
    )
    return report


def second_warm() -> dict[str, Any]:
    """``jitops warm --all --device cpu`` in-process, timed apart from the import of torch; what it started."""
    rec = audit.install()
    t0 = time.perf_counter()
    import torch  # noqa: F401 - timed

    t1 = time.perf_counter()
    from jitops.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["warm", "--all", "--device", "cpu"])
    t2 = time.perf_counter()
    return {
        "rc": rc,
        "out": buf.getvalue(),
        "torch_s": t1 - t0,
        "warm_s": t2 - t1,
        "spawns": rec.spawns,
    }


def load_softmax() -> dict[str, Any]:
    """Get softmax and check it; what was written and started meanwhile."""
    rec = audit.install()
    import torch

    import jitops

    op = jitops.get("softmax", device="cpu")
    x = torch.randn(8, 21)
    return {
        "built": op.library.built,
        "ok": bool(torch.allclose(op(x, dim=1), torch.softmax(x, 1), atol=1e-6)),
        "spawns": rec.spawns,
        "writes": rec.writes,
        "entry": str(op.library.entry),
    }


def fallback(record_writes: bool = False) -> dict[str, Any]:
    """softmax without the fallback (refused, with how long that took), then softmax twice and log_softmax with
    it (from JITOPS_FALLBACK, else the argument): whether they compute right, and the warnings."""
    rec = audit.install() if record_writes else None
    import torch

    import jitops
    from jitops.base.settings import Settings

    x = torch.randn(8, 33)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = time.monotonic()
        try:
            jitops.get("softmax", device="cpu")  # falls back only with JITOPS_FALLBACK=1
            refused = None
        except (jitops.ToolchainError, jitops.OfflineMiss) as e:
            refused = type(e).__name__ + ": " + str(e)
        refuse_s = time.monotonic() - t
        kw = {} if Settings.from_env().fallback else {"fallback": True}
        a, b, c = (jitops.get(n, device="cpu", **kw) for n in ("softmax", "softmax", "log_softmax"))
        ok = bool(
            torch.allclose(a(x, dim=-1), torch.softmax(x, -1))
            and torch.allclose(b(x, 0), torch.softmax(x, 0))
            and torch.allclose(c(x, dim=1), torch.log_softmax(x, 1), atol=1e-6)
        )
    warned = sorted(
        str(w.message).split("'")[1] for w in caught if "pure-PyTorch reference" in str(w.message)
    )
    report = {
        "refused": refused,
        "refuse_s": refuse_s,
        "ok": ok,
        "warned": warned,
        "fallback": a.library is None,
    }
    return {"writes": rec.writes, **report} if rec is not None else report
