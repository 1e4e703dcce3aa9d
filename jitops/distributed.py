"""``jitops.distributed.warm``: at a torchrun job's start, every node gets every op, the builds spread across nodes.

Imports errors, entry, plan, registry, settings, and ``remote.job`` /
``remote.c10d_store`` (the job's store); ``torch.distributed`` only when a
``group`` is passed. Not imported by ``import jitops``: ``import jitops.distributed``.

A collective over the job's c10d store only (never a GPU or gloo collective):

1. each rank of the group writes its node identity (``JITOPS_HOST_ID``, else
   the hostname, plus its cache root: ranks sharing both share a node) and
   reads everyone's; nodes are numbered by their lowest rank;
2. node *i*'s lowest rank ensures the ops whose index is *i* mod n first,
   then the rest (fetched through the job's store, or waited for: one build
   per op for the job, by the tier's leases), in a worker thread, and
   publishes what it did; the other ranks of the node only watch the store;
3. every rank polls (every 0.1 s) for each node's report and for a failure.
   The first failure wins one ``compare_set``; every rank raises the same
   ``BuildError`` built from it, while builds elsewhere may still run. There
   is no barrier a failed rank can leave waiting: only step 1 waits for the
   others, bounded by ``JITOPS_LOCK_TIMEOUT`` (default 600 s), naming who is missing.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .entry import ensure_entry
from .errors import BuildError, CacheError, ConfigError, JitopsError, LockTimeout
from .plan import make_plan
from .registry import list_ops, lookup
from .settings import Settings
from .spec import OpSpec

POLL = 0.1
DEFAULT_WAIT = 600.0
_calls: dict[str, int] = {}  # group tag -> how many warms this process has started (the collective's sequence)


@dataclass(frozen=True)
class OpReport:
    """One library of the warm: who built it and how long it took, or that it was already cached."""

    op: str  # the library's name (one per library, whatever ops it exports)
    cached: bool  # True: no rank built it (in a local cache or the job's store already)
    built_by: int | None  # the rank whose node built it
    node: str | None  # that node's identity (host id and cache root)
    seconds: float  # the build's time on that node (0 when cached)
    builds: int  # how many nodes built it (1 for a cold op: the job store's leases; 0 when cached)


def _group(group: Any, settings: Settings) -> tuple[int, list[int]]:
    d = settings.distributed
    assert d is not None
    if group is None:
        return d.rank, list(range(d.world_size))
    import torch.distributed as dist

    return dist.get_rank(), sorted(dist.get_process_group_ranks(group))


def _specs(ops: Sequence[str] | None) -> list[OpSpec]:
    names = list_ops() if ops is None else list(ops)
    return list(dict.fromkeys(lookup(n) for n in names))


def warm(ops: Sequence[str] | None = None, group: Any = None, *, device: str | None = None) -> list[OpReport]:
    """Build or fetch ``ops`` (default: every registered op) on every node of the job; a per-library report.

    A collective: every rank of ``group`` (default: the whole job) calls it, in
    the same order as its other ``warm`` calls. Raises the same ``BuildError``
    on every rank when any build fails.
    """
    from .remote.c10d_store import C10dStore
    from .remote.job import job_tier

    settings = Settings.from_env()
    d = settings.distributed
    if d is None or not d.in_job():
        raise ConfigError("jitops.distributed.warm needs a torchrun job (MASTER_ADDR/MASTER_PORT and WORLD_SIZE > 1, "
                          "or an initialized default process group) with JITOPS_DISTRIBUTED not 0. Fix: run it "
                          "under torchrun, or use `jitops warm` on one machine")
    tier = job_tier(settings)
    store = tier.store if tier is not None else None
    if not isinstance(store, C10dStore):
        raise CacheError(f"jitops.distributed.warm cannot reach the job's store {d.tier.url}. Fix: check "
                         "MASTER_ADDR/MASTER_PORT (see the warning above), or set JITOPS_DISTRIBUTED=0")
    rank, ranks = _group(group, settings)
    specs = _specs(ops)
    tag = f"{zlib.crc32(','.join(map(str, ranks)).encode()):08x}"
    seq = _calls[tag] = _calls.get(tag, 0) + 1
    return _Warm(store, f"warm/{tag}/{seq}", rank, ranks, settings, device).run(specs)


class _Warm:
    def __init__(self, store: Any, ns: str, rank: int, ranks: list[int], settings: Settings,
                 device: str | None) -> None:
        self.store, self.ns, self.rank, self.ranks, self.settings, self.device = store, ns, rank, ranks, settings, device
        d = settings.distributed
        assert d is not None
        self.me = f"{d.host_id or socket.gethostname()}:{os.path.realpath(settings.cache_root())}"
        self.limit = settings.lock_timeout if settings.lock_timeout is not None else DEFAULT_WAIT

    def run(self, specs: list[OpSpec]) -> list[OpReport]:
        nodes, leaders = self._nodes()
        i = nodes.index(self.me)
        if self.rank == leaders[i]:
            mine = [s for j, s in enumerate(specs) if j % len(nodes) == i]
            rest = [s for s in specs if s not in mine]
            threading.Thread(target=self._work, args=(i, mine + rest), name="jitops-dist-warm", daemon=True).start()
        done: dict[int, dict[str, Any]] = {}
        while len(done) < len(nodes):
            self._raise_failure()
            for n in range(len(nodes)):
                if n not in done and (raw := self.store.get_value(f"{self.ns}/done/{n}")) is not None:
                    done[n] = json.loads(raw)
            if len(done) < len(nodes):
                time.sleep(POLL)
        return _report(specs, nodes, leaders, done)

    def _nodes(self) -> tuple[list[str], list[int]]:
        """(node identities, each node's lowest rank), ordered by that rank; waits for every rank to register."""
        self.store.put_value(f"{self.ns}/who/{self.rank}", self.me.encode())
        start, who = time.monotonic(), {}
        while True:
            self._raise_failure()
            for r in self.ranks:
                if r not in who and (raw := self.store.get_value(f"{self.ns}/who/{r}")) is not None:
                    who[r] = raw.decode()
            if len(who) == len(self.ranks):
                break
            if time.monotonic() - start > self.limit:
                missing = [r for r in self.ranks if r not in who]
                raise LockTimeout(f"jitops.distributed.warm: ranks {missing} did not call warm within {self.limit:g}s "
                                  "(JITOPS_LOCK_TIMEOUT). Fix: call it on every rank of the group, in the same order")
            time.sleep(POLL)
        leaders: dict[str, int] = {}
        for r in sorted(who):
            leaders.setdefault(who[r], r)
        nodes = sorted(leaders, key=leaders.__getitem__)
        return nodes, [leaders[n] for n in nodes]

    def _work(self, index: int, specs: list[OpSpec]) -> None:
        report: dict[str, Any] = {}
        for spec in specs:
            t0 = time.monotonic()
            try:
                plan = make_plan(spec, self.device, settings=self.settings)
                entry = ensure_entry(plan, settings=self.settings)
            except Exception as e:  # noqa: BLE001 - published to every rank, raised there
                self._fail(spec, e)
                return
            report[spec.name] = {"built": entry.built, "seconds": time.monotonic() - t0}
        self.store.put_value(f"{self.ns}/done/{index}", json.dumps(report).encode())

    def _fail(self, spec: OpSpec, e: BaseException) -> None:
        why = str(e) if isinstance(e, (JitopsError, OSError)) else f"{type(e).__name__}: {e}"
        body = {"op": spec.name, "rank": self.rank, "node": self.me, "type": type(e).__name__,
                "target": getattr(e, "target", ""), "message": why[:8000]}
        try:
            self.store.first_value(f"{self.ns}/failed", json.dumps(body).encode())
        except Exception:  # noqa: BLE001 - the store itself failed: the main thread's next poll raises that
            pass

    def _raise_failure(self) -> None:
        raw = self.store.get_value(f"{self.ns}/failed")
        if raw is None:
            return
        f = json.loads(raw)
        raise BuildError(f"jitops.distributed.warm: {f['op']} failed on rank {f['rank']} ({f['node']}), "
                         f"{f['type']}:\n{f['message']}", op=f["op"], target=str(f["target"]), log=f["message"],
                         log_path=None)


def _report(specs: list[OpSpec], nodes: list[str], leaders: list[int],
            done: dict[int, dict[str, Any]]) -> list[OpReport]:
    out = []
    for spec in specs:
        by = [n for n in range(len(nodes)) if done[n].get(spec.name, {}).get("built")]
        if by:
            n = by[0]
            out.append(OpReport(spec.name, False, leaders[n], nodes[n], float(done[n][spec.name]["seconds"]),
                                len(by)))
        else:
            out.append(OpReport(spec.name, True, None, None, 0.0, 0))
    return out
