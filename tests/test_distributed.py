"""The job's c10d store as a cache tier (issue 16), with real torchrun jobs on loopback (gloo, CPU).

Each job is ``python -m torch.distributed.run --nnodes=1 --nproc-per-node=N``
running ``tests/dist_scenarios.py``; simulated nodes are groups of ranks with
their own ``JITOPS_CACHE_DIR`` and ``JITOPS_HOST_ID``. Builds use the fake
builder, counted by what each rank's ``jitops.get`` reports (``built``) and by
``warm``'s report. Every job runs under a hard timeout and is killed with its
whole process group past it. Few jobs, several checks each: torchrun's
start costs seconds on a 2-core machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.dist_scenarios import WARM_OPS
from tests.helpers import REPO, child_env, run_scenario, scenario_argv
from tests.remote_helpers import free_port

pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]

FAILING_CC = """#!/bin/sh
case "$*" in *fakefail*) echo "fakefail: deliberately broken by the test" >&2; exit 1;; esac
exec {cc} "$@"
"""


def torchrun(
    tmp: Path,
    ranks: int,
    per_node: int,
    phases: str,
    timeout: float = 120,
    restarts: int = 0,
    **env: str,
) -> tuple[dict[int, dict[str, Any]], subprocess.CompletedProcess[str]]:
    """Run one job; each rank's JSON reply by rank."""
    out = tmp / "job"
    out.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={ranks}",
        f"--master-port={free_port()}",
        f"--max-restarts={restarts}",
        "--monitor-interval=0.2",
        "-m",
        "tests.dist_scenarios",
        phases,
        str(out),
        str(per_node),
    ]
    full = child_env(
        JITOPS_BUILDER="fake",
        JITOPS_REMOTE_CACHE=None,
        JITOPS_DISTRIBUTED=None,
        OMP_NUM_THREADS="1",
        **env,
    )
    proc = subprocess.Popen(
        cmd,
        env=full,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"the torchrun job hung past {timeout}s\n{stderr[-4000:]}") from None
    done = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}\n{stderr[-6000:]}"
    replies = {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}
    assert sorted(replies) == list(range(ranks)), (
        f"ranks that reported: {sorted(replies)}\n{stderr[-4000:]}"
    )
    return replies, done


def builds(replies: dict[int, dict[str, Any]], op: str) -> int:
    return sum(r["get"][op]["built"] for r in replies.values())


def check_gets(replies: dict[int, dict[str, Any]]) -> None:
    for op in ("fakeadd", "fakemul"):
        assert builds(replies, op) == 1, f"{op}: one build for the whole job"
        assert all(r["get"][op]["works"] for r in replies.values()), "every rank got a working op"
        assert len({r["get"][op]["sha256"] for r in replies.values()}) == 1, (
            "every node has the one entry"
        )


def test_four_ranks_two_nodes_one_build_per_op_and_a_failure_reaches_every_rank(
    tmp_path: Path,
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    cc = bindir / "cc"
    cc.write_text(FAILING_CC.format(cc="/usr/bin/cc"))
    cc.chmod(0o755)
    replies, _ = torchrun(
        tmp_path,
        4,
        2,
        "get,fail",
        JITOPS_FAKE_BUILD_SECONDS="1",
        PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}",
    )
    check_gets(replies)
    assert {tuple(r["get_order"]) for r in replies.values()} == {
        ("fakeadd", "fakemul"),
        ("fakemul", "fakeadd"),
    }
    from jitops.store.cache import Cache
    from jitops.remote.stats import read_totals

    totals = [read_totals(Cache(tmp_path / "job" / f"node{n}").remote_stats) for n in (0, 1)]
    assert sum(t.hits for t in totals) >= 1, (
        "job-store hits reach `jitops cache stats` (the tier's at-exit)"
    )
    fails = [r["fail"] for r in replies.values()]
    assert all(f["raised"] == "BuildError" for f in fails), fails
    assert len({f["message"] for f in fails}) == 1, "the same error on every rank"
    assert "deliberately broken by the test" in fails[0]["message"], fails[0]["message"]
    spread = max(f["at"] for f in fails) - min(f["at"] for f in fails)
    assert spread < 5, (
        f"every rank raised within 5 s of the first (the builder's own): {spread:.2f}s"
    )
    logs = [
        p
        for n in (0, 1)
        for p in (tmp_path / "job" / f"node{n}" / "v1" / "logs").glob("fakefail-*")
    ]
    assert len(logs) == 1, "one node built (and failed) fakefail; the other did not try"


def test_eight_ranks_four_nodes_get_and_warm_spread(tmp_path: Path) -> None:
    replies, _ = torchrun(tmp_path, 8, 2, "get,warm", JITOPS_FAKE_BUILD_SECONDS="2")
    check_gets(replies)
    reports = [r["warm"]["report"] for r in replies.values()]
    assert all(rep == reports[0] for rep in reports), "every rank returns the same report"
    by_op = {e["op"]: e for e in reports[0]}
    assert sorted(by_op) == WARM_OPS
    assert all(e["builds"] == 1 and not e["cached"] for e in by_op.values()), by_op
    assert len({e["node"] for e in by_op.values()}) == 4, f"four nodes built one op each: {by_op}"
    for n in range(4):  # every node has every op in its own cache
        names = {p.name for p in (tmp_path / "job" / f"node{n}" / "v1" / "entries").iterdir()}
        assert set(WARM_OPS) <= names, (n, names)
    took = max(r["warm"]["end"] for r in replies.values()) - min(
        r["warm"]["start"] for r in replies.values()
    )
    assert took < 4 * 2, f"spread builds, not four in a row: {took:.1f}s"


def test_sigkilled_builder_is_taken_over_after_its_lease(tmp_path: Path) -> None:
    replies, _ = torchrun(
        tmp_path,
        4,
        2,
        "kill",
        restarts=1,
        JITOPS_FAKE_BUILD_SECONDS="5",
        KILL_AFTER="3",
        JITOPS_REMOTE_LEASE_SECONDS="2",
    )
    killed = json.loads((tmp_path / "job" / "killed.json").read_text())["pid"]
    assert all(r["kill"]["attempt"] == 1 for r in replies.values())
    # the restarted attempt's warm is its own collective, not the first attempt's
    for r in replies.values():
        after = {e["op"]: e for e in r["warm1"]}
        assert after["fakew0"]["cached"], f"fakew0 was warmed by the first attempt: {after}"
        assert not after["fakew1"]["cached"] and after["fakew1"]["builds"] == 1, after
    assert any(r["stale_holder_pid"] == killed for r in replies.values()), (
        "the dead rank's lease was still there"
    )
    assert builds(replies, "fakeadd") == 1, "one more build after the takeover"
    assert all(r["get"]["fakeadd"]["works"] for r in replies.values())


def test_without_torch_distributed_nothing_changes(tmp_path: Path) -> None:
    job = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "WORLD_SIZE": "2"}
    for i, variables in enumerate(
        ({}, {**job, "WORLD_SIZE": "1"}, {**job, "JITOPS_DISTRIBUTED": "0"})
    ):
        base: dict[str, str | None] = {
            "JITOPS_CACHE_DIR": str(tmp_path / f"c{i}"),
            "JITOPS_BUILDER": "fake",
            "JITOPS_REMOTE_CACHE": None,
            "JITOPS_DISTRIBUTED": None,
        }
        env = child_env(**{**base, **variables})
        out = run_scenario(
            "scenarios_inert.get_reporting_distributed_imports", env=env, timeout=120
        )
        assert out == {"built": True, "extra": []}, out


def test_a_local_hit_inside_a_job_starts_nothing_and_connects_nowhere(tmp_path: Path) -> None:
    """WORLD_SIZE=2 and MASTER_ADDR/MASTER_PORT naming a dead port: a local hit never looks for the store."""
    base: dict[str, str | None] = {
        "JITOPS_CACHE_DIR": str(tmp_path / "c"),
        "JITOPS_BUILDER": "fake",
        "JITOPS_REMOTE_CACHE": None,
        "JITOPS_DISTRIBUTED": None,
    }
    out = run_scenario(
        "scenarios_inert.get_reporting_distributed_imports", env=child_env(**base), timeout=120
    )
    assert out["built"] is True  # filled outside a job
    job = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": "2",
        "RANK": "1",
    }
    out = run_scenario(
        "scenarios_inert.local_hit_in_job", env=child_env(**base, **job), timeout=120
    )
    assert out == {"built": False, "connects": [], "spawns": [], "job_tier": False}, out


def test_settings() -> None:
    from jitops.errors import ConfigError
    from jitops.base.settings import Settings

    job = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "8", "RANK": "3"}
    d = Settings.from_env(job).distributed
    assert (
        d is not None
        and d.in_job()
        and d.rank == 3
        and d.tier.url == "c10d://10.0.0.1:29500"
        and not d.signed
    )
    assert (
        d.attempt == 0
        and Settings.from_env({**job, "TORCHELASTIC_RESTART_COUNT": "2"}).distributed.attempt == 2
    )  # type: ignore[union-attr]
    assert Settings.from_env({**job, "JITOPS_DISTRIBUTED": "0"}).distributed is None
    signed = Settings.from_env({**job, "JITOPS_DISTRIBUTED": "signed"}).distributed
    assert signed is not None and signed.signed
    assert Settings.from_env({**job, "WORLD_SIZE": "1"}).distributed.in_job() is False  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="JITOPS_DISTRIBUTED"):
        Settings.from_env({"JITOPS_DISTRIBUTED": "maybe"})


def test_c10d_store_blobs_leases_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend against a real TCPStore server in this process: chunking, torn uploads, lease rules."""
    import time

    import torch.distributed as dist

    from jitops.remote import c10d_store
    from jitops.remote.store import Holder

    monkeypatch.setattr(c10d_store, "CHUNK", 1000)
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    a = c10d_store.C10dStore.connect("127.0.0.1", server.port, 5, 5)
    b = c10d_store.C10dStore.connect("127.0.0.1", server.port, 5, 5)
    blob = os.urandom(3500)
    a.put_blob("entries/x/cpu/k", blob)
    assert b.get_blob("entries/x/cpu/k") == blob and b.get_blob("entries/none") is None
    assert a.list_blobs("entries/x") == ["entries/x/cpu/k"]
    meta = json.loads(bytes(server.get("jitops/v1/blobs/entries/x/cpu/k")))
    assert meta["chunks"] == 4
    # damaged in the store
    server.set(f"jitops/v1/chunks/entries/x/cpu/k@{meta['id']}/2", b"x" * 1000)
    assert b.get_blob("entries/x/cpu/k") is None, (
        "a blob whose digest differs from the published one"
    )
    ha, hb = Holder.me(), Holder.me()
    assert a.acquire_lease("L", ha, 0.5) is None
    assert b.acquire_lease("L", hb, 0.5) == ha  # held: b sees who holds it
    assert a.renew_lease("L", ha, 0.5)
    assert b.acquire_lease("L", hb, 0.5) == ha  # renewed (changed) since b looked: not lapsed
    time.sleep(0.6)
    assert b.acquire_lease("L", hb, 0.5) is None, "unchanged for the ttl: taken over"
    assert not a.renew_lease("L", ha, 0.5), "the lapsed holder learns it lost the lease"
    a.release_lease("L", ha)  # not ours any more: a no-op
    assert a.lease_holder("L", 0.5) == hb
    b.release_lease("L", hb)
    assert a.lease_holder("L", 0.5) is None and a.acquire_lease("L", ha, 0.5) is None
    a.put_record("r", b"why", 60)
    a.put_record("old", b"why", 0.01)
    time.sleep(0.05)
    assert b.get_record("r") == b"why" and b.get_record("old") is None


def test_store_host_going_away_raises_not_hangs(tmp_path: Path) -> None:
    """Once connected, the job's store failing is the job's failure: CacheError, within the op timeout."""
    import time

    from jitops.errors import CacheError
    from jitops.remote.c10d_store import C10dStore
    from jitops.remote.digest import DigestSigner, JobTrust
    from jitops.remote.tier import Tier
    from jitops.base.settings import Settings

    port = free_port()
    server = subprocess.Popen(
        scenario_argv("scenarios_inert.tcp_store_server", port=port, seconds=120),
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        d = Settings.from_env(
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "WORLD_SIZE": "2",
                "JITOPS_REMOTE_TIMEOUT": "3",
            }
        ).distributed
        assert d is not None
        tier = Tier(
            d.tier,
            C10dStore.connect("127.0.0.1", port, 5, 3),
            JobTrust(),
            DigestSigner(),
            fail_open=False,
        )
    finally:
        server.kill()
        server.wait(timeout=30)
    from tests import fakelib
    from jitops.store.cache import Cache
    from jitops.plan import make_plan

    cache = Cache(tmp_path / "c")
    plan = make_plan(
        fakelib.FAKEADD,
        "cpu",
        settings=Settings.from_env({"JITOPS_CACHE_DIR": str(tmp_path / "c")}),
    )
    t0 = time.monotonic()
    with pytest.raises(CacheError, match="torch.distributed's failure"):
        tier.obtain(plan, cache, lambda: pytest.fail("must not build quietly"))  # type: ignore[arg-type,return-value]
    assert time.monotonic() - t0 < 10


def test_job_trust_digest_by_default_signatures_when_required(tmp_path: Path) -> None:
    from jitops.store.manifest import EntryProblem
    from jitops.remote.digest import DIGEST_SIGNER, DigestSigner, JobTrust
    from jitops.remote.signing import load_signer, load_trust
    from jitops.base.settings import Settings
    from tests.remote_helpers import keygen

    manifest = b'{"key": "abc"}'
    digest = DigestSigner().sign(manifest)
    JobTrust().verify(manifest, DIGEST_SIGNER, digest)
    with pytest.raises(EntryProblem, match="differs from the digest"):
        JobTrust().verify(manifest + b" ", DIGEST_SIGNER, digest)
    with pytest.raises(EntryProblem, match="JITOPS_DISTRIBUTED=signed"):
        JobTrust(signed=True).verify(manifest, DIGEST_SIGNER, digest)
    keygen(tmp_path / "cfg")
    d = Settings.from_env(
        {"JITOPS_DISTRIBUTED": "signed", "JITOPS_CONFIG_DIR": str(tmp_path / "cfg")}
    ).distributed
    assert d is not None and d.signed
    signer, _ = load_signer(d.tier)
    assert signer is not None
    trust = JobTrust(signed=True, keyed=load_trust(d.tier))
    trust.verify(manifest, signer.fingerprint, signer.sign(manifest))
    with pytest.raises(EntryProblem):
        trust.verify(manifest + b" ", signer.fingerprint, signer.sign(manifest))
    with pytest.raises(EntryProblem, match="checks digests only"):
        JobTrust().verify(manifest, signer.fingerprint, signer.sign(manifest))


def test_remote_tier_first_and_never_resigns_what_the_job_store_gave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Remote tier, then job store, then build: an entry fetched from the job's store is not uploaded,
    neither then nor by a later ``jitops cache push`` (``warm --push`` runs the same)."""
    import argparse

    from jitops.remote.commands import cmd_push
    import torch.distributed as dist

    from jitops.store.cache import Cache
    from jitops.plan import make_plan
    from jitops.build.publish import build_and_publish
    from jitops.remote import obtain
    from jitops.base.settings import Settings
    from tests import fakelib
    from tests.remote_helpers import keygen

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    keygen(tmp_path / "cfg")
    (tmp_path / "shared").mkdir()
    job = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(server.port),
        "WORLD_SIZE": "2",
        "JITOPS_BUILDER": "fake",
        "JITOPS_CONFIG_DIR": str(tmp_path / "cfg"),
    }
    remote = {**job, "JITOPS_REMOTE_CACHE": f"file://{tmp_path / 'shared'}"}
    results = []
    for env, name in ((job, "a"), (remote, "b")):
        s = Settings.from_env({**env, "JITOPS_CACHE_DIR": str(tmp_path / name)})
        cache = Cache(tmp_path / name)
        plan = make_plan(fakelib.FAKEADD, "cpu", settings=s, cache=cache)
        results.append(
            obtain(plan, cache, lambda: build_and_publish(plan, cache, None, s), s, True)
        )
    assert [built for _, built in results] == [True, False], (
        "node b fetched node a's build from the job store"
    )
    assert results[0][0].sha256 == results[1][0].sha256
    uploaded = [p for p in (tmp_path / "shared").rglob("*") if p.is_file() and "entries" in p.parts]
    assert uploaded == [], "the remote tier got no upload of an entry this node did not build"
    fakelib.register_all()
    for k, v in {**remote, "JITOPS_CACHE_DIR": str(tmp_path / "b")}.items():
        monkeypatch.setenv(k, v)
    capsys.readouterr()
    assert cmd_push(argparse.Namespace(ops=["fakeadd"], device=None)) == 0
    said = capsys.readouterr().out
    assert (
        "installed from the job's store c10d://127.0.0.1:" in said and "never re-signs" in said
    ), said
    assert [
        p for p in (tmp_path / "shared").rglob("*") if p.is_file() and "entries" in p.parts
    ] == []
    for k, v in {
        **remote,
        "JITOPS_CACHE_DIR": str(tmp_path / "a"),
    }.items():  # node a built it: pushed
        monkeypatch.setenv(k, v)
    assert cmd_push(argparse.Namespace(ops=["fakeadd"], device=None)) == 0
    assert "pushed  fakeadd" in capsys.readouterr().out


def _warm_in_process(tmp: Path, **env: str) -> tuple[Any, Any, Any]:
    """A TCPStore server in this process, a ``_Warm`` of rank 0 of ranks [0, 1] on it, and the settings."""
    import torch.distributed as dist

    from jitops.distributed import _Warm
    from jitops.remote.c10d_store import C10dStore
    from jitops.base.settings import Settings

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    store = C10dStore.connect("127.0.0.1", server.port, 5, 5)
    s = Settings.from_env({"JITOPS_CACHE_DIR": str(tmp / "c"), "JITOPS_BUILDER": "fake", **env})
    return server, _Warm(store, "warm/t/0/1", 0, [0, 1], s, None), s


def test_warm_wait_for_a_silent_node_is_bounded_by_its_heartbeat(tmp_path: Path) -> None:
    """Node 1's leader registered, then neither beats, reports nor fails: rank 0 raises naming it, within the
    lease (here 1 s), instead of waiting for ever."""
    import threading
    import time

    from jitops.errors import LockTimeout

    server, w, _ = _warm_in_process(tmp_path, JITOPS_REMOTE_LEASE_SECONDS="1")
    w.store.put_value("warm/t/0/1/who/1", b"elsewhere:/cache")
    got: list[BaseException | object] = []
    t0 = time.monotonic()
    th = threading.Thread(target=lambda: got.append(_catch(lambda: w.run([]))), daemon=True)
    th.start()
    th.join(timeout=20)
    assert got, "warm waited past 20 s for a node whose leader never beat"
    assert isinstance(got[0], LockTimeout), got
    assert "rank 1" in str(got[0]) and "JITOPS_REMOTE_LEASE_SECONDS" in str(got[0]), got[0]
    assert time.monotonic() - t0 < 10
    del server


def _catch(fn: Any) -> BaseException | object:
    try:
        return fn()
    except BaseException as e:  # noqa: BLE001 - the test inspects it
        return e


def test_warm_leader_stops_at_another_nodes_failure_and_publishes_its_own(tmp_path: Path) -> None:
    from tests import fakelib

    server, w, s = _warm_in_process(tmp_path)
    w.store.put_value(
        "warm/t/0/1/failed",
        json.dumps(
            {
                "op": "x",
                "rank": 1,
                "node": "n",
                "type": "BuildError",
                "target": "",
                "message": "boom",
            }
        ).encode(),
    )
    w._work(0, [fakelib.FAKEADD])
    assert not (tmp_path / "c" / "v1" / "entries").exists() or not any(
        (tmp_path / "c" / "v1" / "entries").iterdir()
    ), "the leader built on after another node's failure"
    assert w.store.get_value("warm/t/0/1/done/0") is None and w.finished.is_set()
    server2, w2, _ = _warm_in_process(tmp_path / "2")
    # any error in the worker thread, not only a build's, reaches every rank
    w2.device = "no-such-device"
    w2._work(0, [fakelib.FAKEADD])
    failed = json.loads(w2.store.get_value("warm/t/0/1/failed"))
    assert failed["op"] == "fakeadd" and failed["rank"] == 0, failed
    del server, server2


def test_warm_takes_rank_and_world_from_an_initialized_process_group(tmp_path: Path) -> None:
    """mp.spawn + init_process_group(rank=r, world_size=n) sets no RANK/WORLD_SIZE: the group is the truth."""
    import torch.distributed as dist

    # torch's own single-process test group
    from torch.testing._internal.distributed.fake_pg import (
        FakeStore,
    )

    from jitops.distributed import _group
    from jitops.base.settings import Settings

    s = Settings.from_env({"JITOPS_CACHE_DIR": str(tmp_path)})
    assert _group(None, s) == (0, [0])  # no group, no torchrun variables
    dist.init_process_group("fake", rank=1, world_size=3, store=FakeStore())
    try:
        assert _group(None, s) == (1, [0, 1, 2])
    finally:
        dist.destroy_process_group()


def test_a_failed_connect_is_retried_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 may host the store only later: a failed connect builds locally, then is tried again (not at
    once: at most every RETRY s), and the connected tier registers its at-exit counters."""
    import atexit
    import warnings

    import torch.distributed as dist

    from jitops.remote import job
    from jitops.base.settings import Settings

    monkeypatch.setattr(job, "_tier", None)
    monkeypatch.setattr(job, "_failed_at", None)
    registered: list[Any] = []
    monkeypatch.setattr(atexit, "register", registered.append)
    port = free_port()
    s = Settings.from_env(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": "2",
            "JITOPS_REMOTE_CONNECT_TIMEOUT": "0.5",
        }
    )
    with pytest.warns(RuntimeWarning, match="builds without the job's store"):
        first = job.job_tier(s)
    assert first is not None and first.store is None and registered == []
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert job.job_tier(s) is first, "not retried at once"
        monkeypatch.setattr(job, "RETRY", 0.0)
        second = job.job_tier(s)
    assert second is not None and second.store is not None and registered == [second.at_exit]
    assert job.job_tier(s) is second
    del server
