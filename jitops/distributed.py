"""``jitops.distributed.warm``: at a torchrun job's start, every node gets every op, the builds spread across nodes.

Imports errors, entry, plan, registry, settings, spec, and ``remote.job`` /
``remote.c10d_store`` (the job's store) when called; ``torch.distributed``
only when a ``group`` is passed or a process group is already initialized (it
is then in ``sys.modules``). Not imported by ``import jitops``: ``import jitops.distributed``.

A collective over the job's c10d store only (never a GPU or gloo collective),
in a namespace of the group, torchrun's attempt (``TORCHELASTIC_RESTART_COUNT``:
the agent's store outlives a restart) and this process's count of warms:

1. each rank of the group writes its node identity (``JITOPS_HOST_ID``, else
   the hostname, plus its cache root: ranks sharing both share a node) and
   reads everyone's; nodes are numbered by their lowest rank;
2. node *i*'s lowest rank ensures the ops whose index is *i* mod n first,
   then the rest (fetched through the job's store, or waited for: one build
   per op for the job, by the tier's leases), in a worker thread that stops
   at another node's failure, beats a key every second meanwhile, and
   publishes what it did (or its own failure, whatever it was); the other
   ranks of the node only watch the store;
3. every rank polls (every 0.1 s) for each node's report, its beat and a failure.
   The first failure wins one ``compare_set``; every rank raises the same
   ``BuildError`` built from it, while builds elsewhere may still run.

Both waits are bounded, naming whom they wait for: step 1 by
``JITOPS_LOCK_TIMEOUT`` (default 600 s) for ranks that never call ``warm``;
step 3 by ``JITOPS_REMOTE_LEASE_SECONDS`` without a new beat from a node's
leader (``LockTimeout``). There is no barrier a failed rank can leave waiting.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .build.entry import ensure_entry
from .errors import BuildError, CacheError, ConfigError, JitopsError, LockTimeout
from .plan import make_plan
from .registry import list_ops, lookup
from .base.settings import Settings
from .spec import OpSpec

POLL = 0.1
BEAT = 1.0  # seconds between a node leader's heartbeats
DEFAULT_WAIT = 600.0
_calls: dict[
    str, int
] = {}  # group tag -> how many warms this process has started (the collective's sequence)


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
    up = sys.modules.get("torch.distributed")
    if group is None and not (up is not None and up.is_available() and up.is_initialized()):
        # torchrun's RANK/WORLD_SIZE: no process group to ask
        return d.rank, list(range(d.world_size))
    # a process group is the truth (mp.spawn sets no RANK/WORLD_SIZE)
    import torch.distributed as dist

    if group is None:
        return dist.get_rank(), list(range(dist.get_world_size()))
    return dist.get_rank(), sorted(dist.get_process_group_ranks(group))


def _specs(ops: Sequence[str] | None) -> list[OpSpec]:
    names = list_ops() if ops is None else list(ops)
    return list(dict.fromkeys(lookup(n) for n in names))


def warm(
    ops: Sequence[str] | None = None, group: Any = None, *, device: str | None = None
) -> list[OpReport]:
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
        raise ConfigError(
            "jitops.distributed.warm needs a torchrun job (MASTER_ADDR/MASTER_PORT and WORLD_SIZE > 1, "
            "or an initialized default process group) with JITOPS_DISTRIBUTED not 0. Fix: run it "
            "under torchrun, or use `jitops warm` on one machine"
        )
    tier = job_tier(settings)
    store = tier.store if tier is not None else None
    if not isinstance(store, C10dStore):
        raise CacheError(
            f"jitops.distributed.warm cannot reach the job's store {d.tier.url}. Fix: check "
            "MASTER_ADDR/MASTER_PORT (see the warning above), or set JITOPS_DISTRIBUTED=0"
        )
    rank, ranks = _group(group, settings)
    specs = _specs(ops)
    tag = f"{zlib.crc32(','.join(map(str, ranks)).encode()):08x}"
    seq = _calls[tag] = _calls.get(tag, 0) + 1
    return _Warm(store, f"warm/{tag}/{d.attempt}/{seq}", rank, ranks, settings, device).run(specs)


class _Warm:
    def __init__(
        self,
        store: Any,
        ns: str,
        rank: int,
        ranks: list[int],
        settings: Settings,
        device: str | None,
    ) -> None:
        self.store, self.ns, self.rank, self.ranks, self.settings, self.device = (
            store,
            ns,
            rank,
            ranks,
            settings,
            device,
        )
        d = settings.distributed
        assert d is not None
        self.me = f"{d.host_id or socket.gethostname()}:{os.path.realpath(settings.cache_root())}"
        self.limit = settings.lock_timeout if settings.lock_timeout is not None else DEFAULT_WAIT
        self.lease = d.tier.lease_seconds  # a node leader silent this long is gone
        self.finished = threading.Event()

    def run(self, specs: list[OpSpec]) -> list[OpReport]:
        nodes, leaders = self._nodes()
        i = nodes.index(self.me)
        if self.rank == leaders[i]:
            mine = [s for j, s in enumerate(specs) if j % len(nodes) == i]
            rest = [s for s in specs if s not in mine]
            threading.Thread(
                target=self._work, args=(i, mine + rest), name="jitops-dist-warm", daemon=True
            ).start()
            threading.Thread(
                target=self._beat, args=(i,), name="jitops-dist-beat", daemon=True
            ).start()
        done: dict[int, dict[str, Any]] = {}
        beats: dict[int, tuple[bytes | None, float]] = {
            n: (None, time.monotonic()) for n in range(len(nodes))
        }
        while len(done) < len(nodes):
            self._raise_failure()
            for n in range(len(nodes)):
                if (
                    n not in done
                    and (raw := self.store.get_value(f"{self.ns}/done/{n}")) is not None
                ):
                    done[n] = json.loads(raw)
                elif n not in done:
                    self._check_beat(n, leaders[n], nodes[n], beats)
            if len(done) < len(nodes):
                time.sleep(POLL)
        return _report(specs, nodes, leaders, done)

    def _beat(self, index: int) -> None:
        """The node leader's heartbeat while its work runs: a counter, rewritten every BEAT s."""
        n = 0
        while True:
            n += 1
            try:
                self.store.put_value(f"{self.ns}/beat/{index}", str(n).encode())
            except Exception:  # noqa: BLE001 - the store failed: the main thread's next poll raises that
                return
            if self.finished.wait(BEAT):
                return

    def _check_beat(
        self, n: int, leader: int, node: str, beats: dict[int, tuple[bytes | None, float]]
    ) -> None:
        beat, seen = beats[n]
        now = self.store.get_value(f"{self.ns}/beat/{n}")
        if now != beat:
            beats[n] = (now, time.monotonic())
        elif time.monotonic() - seen > self.lease:
            raise LockTimeout(
                f"jitops.distributed.warm: rank {leader}, which warms node {node}, "
                f"{'never started' if beat is None else 'stopped'} beating for {self.lease:g}s "
                "(JITOPS_REMOTE_LEASE_SECONDS) without reporting or failing: it died or hangs. "
                f"Fix: see rank {leader}'s log; torchrun restarts the group if allowed"
            )

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
                raise LockTimeout(
                    f"jitops.distributed.warm: ranks {missing} did not call warm within {self.limit:g}s "
                    "(JITOPS_LOCK_TIMEOUT). Fix: call it on every rank of the group, in the same order"
                )
            time.sleep(POLL)
        leaders: dict[str, int] = {}
        for r in sorted(who):
            leaders.setdefault(who[r], r)
        nodes = sorted(leaders, key=leaders.__getitem__)
        return nodes, [leaders[n] for n in nodes]

    def _work(self, index: int, specs: list[OpSpec]) -> None:
        report: dict[str, Any] = {}
        current: OpSpec | None = None
        try:
            for current in specs:
                if self.store.get_value(f"{self.ns}/failed") is not None:
                    # another node failed: every rank raises that; building on would only cost
                    return
                t0 = time.monotonic()
                plan = make_plan(current, self.device, settings=self.settings)
                entry = ensure_entry(plan, settings=self.settings)
                report[current.name] = {"built": entry.built, "seconds": time.monotonic() - t0}
            self.store.put_value(f"{self.ns}/done/{index}", json.dumps(report).encode())
        except BaseException as e:  # noqa: BLE001 - whatever stops this thread is published, raised on every rank
            self._fail(current, e)
        finally:
            self.finished.set()

    def _fail(self, spec: OpSpec | None, e: BaseException) -> None:
        why = str(e) if isinstance(e, (JitopsError, OSError)) else f"{type(e).__name__}: {e}"
        body = {
            "op": spec.name if spec is not None else "(warm)",
            "rank": self.rank,
            "node": self.me,
            "type": type(e).__name__,
            "target": getattr(e, "target", ""),
            "message": why[:8000],
        }
        try:
            self.store.first_value(f"{self.ns}/failed", json.dumps(body).encode())
        except Exception:  # noqa: BLE001 - the store itself failed: the main thread's next poll raises that
            pass

    def _raise_failure(self) -> None:
        raw = self.store.get_value(f"{self.ns}/failed")
        if raw is None:
            return
        f = json.loads(raw)
        raise BuildError(
            f"jitops.distributed.warm: {f['op']} failed on rank {f['rank']} ({f['node']}), "
            f"{f['type']}:\n{f['message']}",
            op=f["op"],
            target=str(f["target"]),
            log=f["message"],
            log_path=None,
        )


def _report(
    specs: list[OpSpec], nodes: list[str], leaders: list[int], done: dict[int, dict[str, Any]]
) -> list[OpReport]:
    out = []
    for spec in specs:
        by = [n for n in range(len(nodes)) if done[n].get(spec.name, {}).get("built")]
        if by:
            n = by[0]
            out.append(
                OpReport(
                    spec.name,
                    False,
                    leaders[n],
                    nodes[n],
                    float(done[n][spec.name]["seconds"]),
                    len(by),
                )
            )
        else:
            out.append(OpReport(spec.name, True, None, None, 0.0, 0))
    return out
