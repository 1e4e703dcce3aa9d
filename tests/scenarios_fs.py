"""Child programs of tests/test_filesystem.py, test_diagnostics.py and test_progress.py: caches on
read-only, full or odd filesystems, a lock held by another process, a build's progress.

Each function runs in a fresh interpreter (``helpers.run_scenario("scenarios_fs.NAME", ...)``, or
as root in a private mount namespace through ``test_filesystem.run_in_mount_ns``, where its mounts
vanish with it) and returns what the test checks.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
import warnings
from pathlib import Path
from typing import Any

from tests import audit
from tests import scenarios as S


def warm(names: list[str]) -> bool:
    """Get each op in ``names``; each must work."""
    for n in names:
        assert S.get_and_check(n)["works"]
    return True


def readonly_warm(binds: list[list[str]], fake_cache: str, real_cache: str) -> dict[str, Any]:
    """Bind-mount each ``[src, dst]`` read-only, then get fakeadd from ``fake_cache`` and softmax (built for
    real) from ``real_cache`` under an audit hook: every write and process start, and every warning."""
    for src, dst in binds:
        subprocess.run(["mount", "--bind", src, dst], check=True)
        subprocess.run(["mount", "-o", "remount,ro,bind", dst], check=True)
    import torch  # noqa: F401 - imported before the audit, as a user's program would

    import jitops  # noqa: F401
    from tests import fakelib

    fakelib.register_all()
    writes = audit.install_anywhere()
    results = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        os.environ["JITOPS_CACHE_DIR"] = fake_cache
        results["fakeadd"] = S.get_and_check("fakeadd")
        os.environ["JITOPS_CACHE_DIR"] = real_cache
        # the builder is part of the key: softmax was built for real
        del os.environ["JITOPS_BUILDER"]
        results["softmax"] = S.get_and_check("softmax")
    return {"writes": writes, "warnings": [str(w.message) for w in caught], "results": results}


def readonly_cold(ro: str) -> dict[str, Any]:
    """Make ``ro`` a read-only bind mount of itself, then get fakeadd, fakemul, fakeadd (the cache names it):
    the values or the error, the warnings, and what ``ro`` holds afterwards."""
    subprocess.run(["mount", "--bind", ro, ro], check=True)
    subprocess.run(["mount", "-o", "remount,ro,bind", ro], check=True)
    out: dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out["values"] = [S.get_and_check(n) for n in ("fakeadd", "fakemul", "fakeadd")]
        except Exception as e:  # noqa: BLE001 - reported to the test
            out["error"] = {
                "type": type(e).__name__,
                "mro": [c.__name__ for c in type(e).__mro__],
                "msg": str(e),
            }
    out["warnings"] = [str(w.message) for w in caught]
    out["ro_contents"] = os.listdir(ro)
    return out


def full_disk(mnt: str, free_kibs: list[int]) -> list[dict[str, Any]]:
    """A 256 KiB tmpfs at ``mnt``; per free size, fill it to leave that much, then get fakeadd in a fresh
    worker with its cache there: the outcome, and the entries and staging dirs left."""
    root = Path(mnt)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(root)], check=True
    )
    S.preload()
    rows = []
    for free_kib in free_kibs:
        for p in root.iterdir():
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
        with open(root / "filler", "wb") as f:
            try:
                f.write(b"x" * ((256 - free_kib) * 1024))
            except OSError:
                pass
        cache = root / "cache"
        os.environ["JITOPS_CACHE_DIR"] = str(cache)
        r = S.call(S.get_and_check, "fakeadd", timeout=30)
        entries = list((cache / "v1" / "entries").glob("*/*/*")) if cache.exists() else []
        staging = (
            list((cache / "v1" / "staging").glob("*"))
            if (cache / "v1" / "staging").exists()
            else []
        )
        rows.append(
            {
                "free_kib": free_kib,
                "ok": r["ok"],
                "type": r.get("type"),
                "mro": r.get("mro"),
                "msg": r.get("msg"),
                "entries": len(entries),
                "staging": len(staging),
            }
        )
    return rows


def full_disk_real(mnt: str) -> dict[str, Any]:
    """A 192 KiB tmpfs at ``mnt`` holding the cache ``mnt/c``: a real build of softmax in a fresh worker; its
    outcome, and the entries and staging dirs left."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=192k,mode=0700", "tmpfs", mnt], check=True)
    r = S.call(S.get_and_check, "softmax", timeout=280)
    cache = Path(mnt) / "c"
    r["entries"] = len(list((cache / "v1" / "entries").glob("*/*/*")))
    r["staging"] = len(list((cache / "v1" / "staging").glob("*")))
    return r


def with_umask(umask: int, names: list[str]) -> list[dict[str, Any]]:
    """Get each op in ``names`` with ``umask`` set first."""
    os.umask(umask)
    return [S.get_and_check(n) for n in names]


def softmax_with_umask_0() -> dict[str, Any]:
    """Get softmax with umask 0; and which jitops was imported."""
    import jitops

    os.umask(0)
    r = S.get_and_check("softmax")
    r["jitops"] = jitops.__file__
    return r


def lock_wait() -> dict[str, Any]:
    """A worker holds fakeadd's lock with a 20 s build; a second waits for it (JITOPS_LOCK_TIMEOUT=1.5,
    progress every 0.3 s): its error and the progress lines it logged, and the holder's pid."""
    import jitops.store.lock

    S.preload()
    holder, fd = S.spawn(S.get_and_check, "fakeadd", env={"JITOPS_FAKE_BUILD_SECONDS": "20"})
    assert S.wait_builders(Path(os.environ["JITOPS_CACHE_DIR"])), (
        "the holder never started its build"
    )
    lines: list[str] = []

    class H(logging.Handler):
        def emit(self, rec: logging.LogRecord) -> None:
            lines.append(rec.getMessage())

    def waiter() -> dict[str, Any]:
        logging.getLogger("jitops").addHandler(H())
        jitops.store.lock.PROGRESS_EVERY = 0.3
        t = time.monotonic()
        try:
            S.get_and_check("fakeadd")
            return {"ok": True}
        except Exception as e:  # noqa: BLE001 - reported to the test
            return {
                "type": type(e).__name__,
                "mro": [c.__name__ for c in type(e).__mro__],
                "msg": str(e),
                "seconds": time.monotonic() - t,
                "lines": lines,
            }

    r = S.call(waiter, env={"JITOPS_LOCK_TIMEOUT": "1.5"}, timeout=30)
    os.kill(holder, 9)
    S.collect(holder, fd, 10)
    r["holder"] = holder
    return r
