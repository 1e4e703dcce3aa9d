"""Simulated nodes for the remote-tier tests: forked workers, each its own cache dir, one store.

Runs inside a child interpreter (``helpers.run_scenario("remote_scenarios.NAME", ...)``; see ``tests/scenarios.py``).
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from pathlib import Path
from typing import Any

from tests import scenarios as S


def node(ops: list[str]) -> dict[str, Any]:
    """Get every op in ``ops`` (rotated by pid, so nodes ask in different orders); what the node saw."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        k = os.getpid() % len(ops)
        got = {name: S.get_and_check(name) for name in ops[k:] + ops[:k]}
    from jitops.remote import active_tier

    tier = active_tier()
    return {
        "ops": got,
        "done": time.time(),
        "warnings": [str(w.message) for w in caught],
        "stats": tier.stats.__dict__ if tier is not None else None,
    }


def nodes(n: int, base: str, ops: list[str], timeout: float = 120) -> dict[str, Any]:
    """``n`` nodes released at one instant, node i using the cache ``base/node<i>``."""
    gate = os.pipe()
    workers = [
        S.spawn(node, ops, env={"JITOPS_CACHE_DIR": f"{base}/node{i}"}, gate=gate) for i in range(n)
    ]
    start = time.time()
    os.close(gate[1])
    replies = [S.collect(pid, fd, timeout) for pid, fd in workers]
    os.close(gate[0])
    return {"start": start, "replies": replies}


def preload_remote() -> None:
    """Import the tier's modules before forking: each simulated node then pays the protocol, not the
    import of redis-py and cryptography on a shared 2-core machine (real nodes import in parallel)."""
    import jitops.remote.session  # noqa: F401
    import jitops.remote.signing  # noqa: F401
    import jitops.remote.backends  # noqa: F401

    with contextlib.suppress(ImportError):
        import jitops.remote.redis_store  # noqa: F401
    with contextlib.suppress(ImportError):
        import s3fs  # noqa: F401
        from jitops.remote import object_store

        # botocore's parsed models, shared by every fork (each node parses them on its own CPU)
        object_store.warm()
    import jitops.remote.fs_store  # noqa: F401


def main_nodes(n: int, base: str, ops: list[str]) -> dict[str, Any]:
    """``nodes`` after preloading jitops and the remote tier (run by ``helpers.run_scenario``)."""
    S.preload()
    preload_remote()
    return nodes(n, base, ops)


def get_node(ops: list[str]) -> dict[str, Any]:
    """One node getting ``ops`` (see ``node``), with every warning shown on stderr too."""
    warnings.simplefilter("always")
    return node(ops)


def fingerprint(config_dir: str) -> str:
    """The fingerprint of the signing key kept in ``config_dir``."""
    from jitops.remote.config import RemoteSettings
    from jitops.remote.signing import load_signer

    return load_signer(RemoteSettings("file:///x", "write", None, None, config_dir))[0].fingerprint


def get_failing(name: str, root: str, source: str) -> dict[str, Any] | None:
    """Register a library ``name`` of the one C++ file ``root/source``, which does not compile, and get it: the
    BuildError's message and how long it took (None if it built)."""
    import jitops
    from jitops import OpSpec

    jitops.register(
        OpSpec(
            name=name,
            root=Path(root),
            cpu_sources=(source,),
            schemas=(f"{name}(Tensor x) -> Tensor",),
        )
    )
    t0 = time.monotonic()
    try:
        jitops.get(name)
    except jitops.BuildError as e:
        return {"error": str(e), "seconds": time.monotonic() - t0}
    return None


def timed_gets() -> dict[str, float]:
    """The first ``jitops.get`` of fakeadd, then of fakemul, timed (benchmarks/cluster.py)."""
    from tests import fakelib

    fakelib.register_all()
    import jitops

    t0 = time.perf_counter()
    jitops.get("fakeadd")
    t1 = time.perf_counter()
    jitops.get("fakemul")
    t2 = time.perf_counter()
    return {"first_get_s": t1 - t0, "second_get_s": t2 - t1}


def poll_job_store_then_exit(threads: int) -> dict[str, Any]:
    """Daemon threads polling a job store (a TCPStore on loopback) while this function returns and
    the process exits: a call that returns during finalization must not abort the process."""
    import threading

    import torch.distributed as dist

    from jitops.remote.c10d_store import C10dStore
    from jitops.remote.store import StoreError

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    store = C10dStore.connect("127.0.0.1", server.port, 5, 5)
    polls = [0] * threads

    def poll(i: int) -> None:
        while True:
            try:
                store.get_value("never/set")
            except StoreError:
                return
            polls[i] += 1

    for i in range(threads):
        threading.Thread(target=poll, args=(i,), daemon=True).start()
    time.sleep(0.3)
    return {"polls": list(polls), "server": server.port}
