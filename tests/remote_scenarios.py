"""Simulated nodes for the remote-tier tests: forked workers, each its own cache dir, one store.

Runs inside a child interpreter (see ``tests/scenarios.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import warnings
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
    return {"ops": got, "done": time.time(), "warnings": [str(w.message) for w in caught],
            "stats": tier.stats.__dict__ if tier is not None else None}


def nodes(n: int, base: str, ops: list[str], timeout: float = 120) -> dict[str, Any]:
    """``n`` nodes released at one instant, node i using the cache ``base/node<i>``."""
    gate = os.pipe()
    workers = [S.spawn(node, ops, env={"JITOPS_CACHE_DIR": f"{base}/node{i}"}, gate=gate) for i in range(n)]
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

        object_store.warm()  # botocore's parsed models, shared by every fork (each node parses them on its own CPU)
    import jitops.remote.fs_store  # noqa: F401


def main_nodes(n: int, base: str, ops: list[str]) -> None:
    S.preload()
    preload_remote()
    print(json.dumps(nodes(n, base, ops)))
