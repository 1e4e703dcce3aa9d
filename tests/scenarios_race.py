"""Child programs of tests/test_race.py: many processes and threads want one op at once.

Each function runs in a fresh interpreter (``helpers.run_scenario("scenarios_race.NAME", ...)``)
and returns what the test checks; see tests/scenarios.py for the building blocks.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import jitops
from tests import fakelib
from tests import scenarios as S


def race_rounds(base: str, rounds: int, n: int) -> list[list[dict[str, Any]]]:
    """``rounds`` races of ``n`` forked workers for fakeadd, round r in the cache ``base/round<r>``."""
    S.preload()
    out = []
    for r in range(rounds):
        os.environ["JITOPS_CACHE_DIR"] = f"{base}/round{r}"
        out.append(S.race(n))
    return out


def race_in(cache: str, n: int, name: str, worker_timeout: float) -> list[dict[str, Any]]:
    """One race of ``n`` forked workers for ``name`` in ``cache``."""
    S.preload()
    os.environ["JITOPS_CACHE_DIR"] = cache
    return S.race(n, name, timeout=worker_timeout)


def get_after_gate(gate: str) -> dict[str, Any]:
    """Wait until the file ``gate`` exists (so independent interpreters start together), then get fakeadd."""
    while not os.path.exists(gate):
        time.sleep(0.005)
    return S.get_and_check("fakeadd")


def threads_one_build(n: int = 16) -> dict[str, Any]:
    """``n`` threads released by a barrier each get fakeadd; what they got and how many builds ran."""
    S.preload()
    builds = []
    sys.addaudithook(
        lambda ev, a: (
            builds.append(1) if ev == "subprocess.Popen" and "_supervise.py" in str(a[1]) else None
        )
    )
    barrier = threading.Barrier(n)
    got: list[Any] = []
    errors: list[str] = []

    def worker() -> None:
        barrier.wait()
        try:
            got.append(jitops.get("fakeadd"))
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors.append(repr(e))

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return {
        "n": len(got),
        "errors": errors,
        "ids": len({id(o) for o in got}),
        "builds": len(builds),
        "works": all(fakelib.check(o, "fakeadd") for o in got),
        "alive": sum(t.is_alive() for t in threads),
    }


def forked_after_load() -> list[dict[str, Any]]:
    """Load softmax and fakeadd, then fork a worker per op (DataLoader style) that gets and calls it."""
    S.preload()
    jitops.get("softmax", device="cpu")
    jitops.get("fakeadd")
    return [S.call(S.get_and_check, name, timeout=30) for name in ("softmax", "fakeadd", "fakemul")]


def fork_while_a_thread_builds() -> dict[str, Any]:
    """A thread starts building fakeadd; once the build runs, a forked worker gets fakeadd too."""
    S.preload()
    t = threading.Thread(target=jitops.get, args=("fakeadd",))
    t.start()
    # the thread holds the key's locks
    building = S.wait_builders(Path(os.environ["JITOPS_CACHE_DIR"]))
    reply = S.call(S.get_and_check, "fakeadd", timeout=30)
    t.join(30)
    reply["building"] = bool(building)
    return reply
