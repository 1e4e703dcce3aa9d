"""Child programs of tests/test_kill.py: builds killed by real signals at chosen or random moments.

Each function runs in a fresh interpreter (``helpers.run_scenario("scenarios_kill.NAME", ...)``),
forks the workers it kills (see tests/scenarios.py) and returns what the test checks.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests import scenarios as S


def kill_fuzz(root: str, seed: int, kills: int, terms: int, ints: int) -> dict[str, Any]:
    """Time a full get() of fakeadd, then kill ``kills``/``terms``/``ints`` workers (SIGKILL/SIGTERM/SIGINT),
    each in its own cache: a quarter mid-compile, a quarter once published, half at a random moment. After
    each kill, a fresh get() in that cache; one row per kill."""
    S.preload()
    base = Path(root)
    rng = random.Random(seed)

    def timed(cache: Path) -> float:
        os.environ["JITOPS_CACHE_DIR"] = str(cache)
        t = time.monotonic()
        r = S.call(S.get_and_check, "fakeadd", timeout=30)
        assert r["ok"], r
        return time.monotonic() - t

    full = sorted(timed(base / f"m{i}") for i in range(3))[1]
    sigs = [signal.SIGKILL] * kills + [signal.SIGTERM] * terms + [signal.SIGINT] * ints
    rng.shuffle(sigs)
    rows = []
    for i, sig in enumerate(sigs):
        cache = base / f"k{i}"
        os.environ["JITOPS_CACHE_DIR"] = str(cache)
        pid, fd = S.spawn(S.get_and_check, "fakeadd")
        if i % 4 == 2:  # mid-compile, whatever the machine's load
            S.wait_phase(cache, "building")
        elif i % 4 == 3:  # after publishing
            S.wait_phase(cache, "published")
        else:  # at a random moment
            time.sleep(rng.uniform(0, full * 1.1))
        t = time.monotonic()
        os.kill(pid, sig)
        victim = S.collect(pid, fd, 10)
        exited_in = time.monotonic() - t
        where = S.phase(cache)
        orphans = S.wait_no_builders(cache, 2.0)
        t = time.monotonic()
        after = S.call(S.get_and_check, "fakeadd", timeout=full + 5)
        rows.append(
            {
                "sig": int(sig),
                "phase": where,
                "exited_in": exited_in,
                "victim": victim.get("type"),
                "orphans": orphans,
                "ok": after["ok"] and after["value"]["works"],
                "after_s": time.monotonic() - t,
                "after": after if not after["ok"] else None,
            }
        )
    return {"full": full, "rows": rows}


def signal_during_long_build(cache: str, sig: str) -> dict[str, Any]:
    """A worker's 30 s fake build gets signal ``sig`` once its compiler runs; then a quick get() in that cache."""
    S.preload()
    root = Path(cache)
    os.environ["JITOPS_CACHE_DIR"] = str(root)
    pid, fd = S.spawn(S.get_and_check, "fakeadd", env={"JITOPS_FAKE_BUILD_SECONDS": "30"})
    deadline = time.monotonic() + 20
    while not S.builders_under(root) and time.monotonic() < deadline:
        time.sleep(0.02)
    running = S.builders_under(root)
    time.sleep(0.3)
    t = time.monotonic()
    os.kill(pid, getattr(signal, sig))
    victim = S.collect(pid, fd, 10)
    exited_in = time.monotonic() - t
    orphans = S.wait_no_builders(root, 2.0)
    t = time.monotonic()
    after = S.call(S.get_and_check, "fakeadd", env={"JITOPS_FAKE_BUILD_SECONDS": "0"}, timeout=20)
    return {
        "running": running,
        "victim": victim,
        "exited_in": exited_in,
        "orphans": orphans,
        "after": after,
        "after_s": time.monotonic() - t,
    }


def kills_during_real_builds(cache: str, seed: int, sigs: list[str]) -> dict[str, Any]:
    """Real compiler: for each signal in ``sigs``, a worker builds softmax and gets it once cc1plus runs;
    then a clean get() in the same cache."""
    from jitops.plan import make_plan
    from jitops.registry import lookup
    from jitops.build.selfcheck import ensure_sound
    from jitops.base.settings import Settings

    S.preload()
    root = Path(cache)
    os.environ["JITOPS_CACHE_DIR"] = str(root)
    rng = random.Random(seed)
    # The toolchain self-check runs before the first build in a new cache; it is not what is timed
    # here.
    ensure_sound(make_plan(lookup("softmax"), "cpu"), Settings.from_env())
    rows = []
    for name in sigs:
        sig = getattr(signal, name)
        t0 = time.monotonic()
        pid, fd = S.spawn(S.get_and_check, "softmax")
        deadline = time.monotonic() + 30
        while (
            not any("cc1plus" in p for p in S.builders_under(root)) and time.monotonic() < deadline
        ):
            time.sleep(0.02)
        started_in = time.monotonic() - t0
        time.sleep(rng.uniform(0.2, 3.0))
        compiling = any("cc1plus" in p for p in S.builders_under(root))
        t = time.monotonic()
        os.kill(pid, sig)
        victim = S.collect(pid, fd, 10)
        rows.append(
            {
                "sig": int(sig),
                "started_in": started_in,
                "compiling": compiling,
                "victim": victim.get("type"),
                "exited_in": time.monotonic() - t,
                "orphans": S.wait_no_builders(root, 2.0),
            }
        )
    t = time.monotonic()
    final = S.call(S.get_and_check, "softmax", timeout=300)
    manifest = json.loads(next((root / "v1" / "entries").glob("*/*/*/manifest.json")).read_text())
    return {
        "rows": rows,
        "final": final,
        "final_s": time.monotonic() - t,
        "build_seconds": manifest["build_seconds"],
    }


# Each publish step, as the audit event that begins it.
PUBLISH_STEPS: dict[str, Callable[[str, tuple[Any, ...]], bool]] = {
    "copy library into the staged entry": lambda e, a: e == "shutil.copyfile",
    "start writing the manifest": lambda e, a: e == "open" and ".manifest.json." in str(a[0]),
    "manifest written, before rename": lambda e, a: (
        e == "os.rename" and "manifest.json" in str(a[1])
    ),
    "publish rename": lambda e, a: (
        e == "os.rename" and "/staging/" in str(a[0]) and "/entries/" in str(a[1])
    ),
    "after publish, before dlopen": lambda e, a: e == "ctypes.dlopen",
}


def _die_at(step: str) -> dict[str, Any]:
    match = PUBLISH_STEPS[step]

    def hook(e: str, a: tuple[Any, ...]) -> None:
        if match(e, a):
            os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)
    return S.get_and_check("fakeadd")


def sigkill_at_each_publish_step(root: str) -> list[dict[str, Any]]:
    """A worker SIGKILLs itself at each publish step (cache ``root/s<i>``); then a fresh get() there."""
    S.preload()
    rows = []
    for i, step in enumerate(PUBLISH_STEPS):
        cache = Path(root) / f"s{i}"
        os.environ["JITOPS_CACHE_DIR"] = str(cache)
        victim = S.call(_die_at, step, timeout=30)
        where = S.phase(cache)
        after = S.call(S.get_and_check, "fakeadd", timeout=10)
        rows.append({"step": step, "victim": victim["type"], "phase": where, "after": after})
    return rows
