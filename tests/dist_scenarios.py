"""One rank of a real torchrun job for tests/test_distributed.py and benchmarks/cluster.py --torchrun.

Run by ``python -m torch.distributed.run ... -m tests.dist_scenarios <phases> <out dir> <ranks per node>``.
Simulated nodes: ranks ``k*per_node .. (k+1)*per_node - 1`` are node k, with
their own cache dir ``<out>/node<k>`` and host identity ``sim<k>``, set here
before jitops reads the environment (a test harness stands in for separate
machines). Each rank writes ``<out>/rank<r>.json`` with what it saw per phase:

- ``get``: ``jitops.get`` of fakeadd and fakemul, in a rank-rotated order, and calls them;
- ``warm``: ``jitops.distributed.warm`` of four more fake libraries;
- ``warmone``: ``warm`` of fakew0 alone (benchmarks/cluster.py's baseline for ``warm``);
- ``fail``: ``warm`` of ``fakefail``, whose compile fails (the test puts a ``cc`` on PATH that refuses it);
- ``kill``: every rank warms fakew0; then the first attempt's rank 0 gets fakeadd and is SIGKILLed
  mid-build; after torchrun's restart every rank warms fakew0 and fakew1 (a new attempt: not the first
  attempt's reports, which the agent's store still holds), reads the stale lease's holder, then gets fakeadd.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

WARM_OPS = ["fakew0", "fakew1", "fakew2", "fakew3"]


def _register_extra() -> None:
    import jitops
    from tests import fakelib

    for name in [*WARM_OPS, "fakefail"]:
        jitops.register(fakelib._spec(name), replace=True)


def phase_get(rank: int, out: dict[str, Any]) -> None:
    from tests import scenarios as S

    ops = ["fakeadd", "fakemul"]
    order = ops[rank % 2 :] + ops[: rank % 2]
    out["get_order"] = order
    out["get_start"] = time.time()
    out["get"] = {name: S.get_and_check(name) for name in order}
    out["get_done"] = time.time()


def phase_warm(rank: int, out: dict[str, Any]) -> None:
    import jitops.distributed

    t0 = time.time()
    report = jitops.distributed.warm(WARM_OPS)
    out["warm"] = {"start": t0, "end": time.time(), "report": [r.__dict__ for r in report]}


def phase_warmone(rank: int, out: dict[str, Any]) -> None:
    import jitops.distributed

    t0 = time.time()
    report = jitops.distributed.warm(WARM_OPS[:1])
    out["warmone"] = {"start": t0, "end": time.time(), "report": [r.__dict__ for r in report]}


def phase_fail(rank: int, out: dict[str, Any]) -> None:
    import jitops
    import jitops.distributed

    t0 = time.time()
    try:
        jitops.distributed.warm(["fakefail"])
        out["fail"] = {"raised": None}
    except jitops.BuildError as e:
        out["fail"] = {
            "raised": type(e).__name__,
            "message": str(e),
            "start": t0,
            "at": time.time(),
        }


def _quick_warm(ops: list[str]) -> list[dict[str, Any]]:
    """``warm`` of ``ops`` with quick fake builds (this phase's get stays slow enough to be killed)."""
    import jitops.distributed

    slow = os.environ.pop("JITOPS_FAKE_BUILD_SECONDS", None)
    try:
        return [r.__dict__ for r in jitops.distributed.warm(ops)]
    finally:
        if slow is not None:
            os.environ["JITOPS_FAKE_BUILD_SECONDS"] = slow


def phase_kill(rank: int, out: dict[str, Any]) -> None:
    from tests import scenarios as S

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    base = sys.argv[2]
    out[f"warm{attempt}"] = _quick_warm(WARM_OPS[: 1 + attempt])
    if attempt == 0:
        if rank == 0:
            with open(f"{base}/killed.json", "w") as f:
                json.dump({"pid": os.getpid()}, f)
            threading.Timer(
                float(os.environ["KILL_AFTER"]), os.kill, (os.getpid(), signal.SIGKILL)
            ).start()
            S.get_and_check("fakeadd")
        time.sleep(600)  # torchrun stops this attempt when rank 0 dies
    from jitops.remote.job import job_tier
    from jitops.base.settings import Settings

    tier = job_tier(Settings.from_env())
    assert tier is not None and tier.store is not None
    from jitops.plan import make_plan
    from jitops.registry import lookup

    plan = make_plan(lookup("fakeadd"))
    holder = tier.store.lease_holder(f"leases/{plan.spec.name}/{plan.key}", 1e9)
    out["stale_holder_pid"] = holder.pid if holder is not None else None
    t0 = time.time()
    out["get"] = {"fakeadd": S.get_and_check("fakeadd")}
    out["kill"] = {"start": t0, "end": time.time(), "attempt": attempt}


def main() -> None:
    phases, base, per_node = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3])
    rank = int(os.environ["RANK"])
    node = rank // per_node
    os.environ["JITOPS_CACHE_DIR"] = f"{base}/node{node}"
    os.environ["JITOPS_HOST_ID"] = f"sim{node}"
    from tests import fakelib

    fakelib.register_all()
    _register_extra()
    out: dict[str, Any] = {"rank": rank, "node": node, "pid": os.getpid()}
    for phase in phases:
        globals()[f"phase_{phase}"](rank, out)
    with open(f"{base}/rank{rank}.json.tmp", "w") as f:
        json.dump(out, f)
    os.replace(f"{base}/rank{rank}.json.tmp", f"{base}/rank{rank}.json")


if __name__ == "__main__":
    main()
