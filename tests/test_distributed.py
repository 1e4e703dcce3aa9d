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
from tests.helpers import REPO, child_env, last_json, run_py
from tests.remote_helpers import free_port

pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]

FAILING_CC = """#!/bin/sh
case "$*" in *fakefail*) echo "fakefail: deliberately broken by the test" >&2; exit 1;; esac
exec {cc} "$@"
"""


def torchrun(tmp: Path, ranks: int, per_node: int, phases: str, timeout: float = 120, restarts: int = 0,
             **env: str) -> tuple[dict[int, dict[str, Any]], subprocess.CompletedProcess[str]]:
    """Run one job; each rank's JSON reply by rank."""
    out = tmp / "job"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={ranks}",
           f"--master-port={free_port()}", f"--max-restarts={restarts}", "--monitor-interval=0.2",
           "-m", "tests.dist_scenarios", phases, str(out), str(per_node)]
    full = child_env(JITOPS_BUILDER="fake", JITOPS_REMOTE_CACHE=None, JITOPS_DISTRIBUTED=None, OMP_NUM_THREADS="1",
                     **env)
    proc = subprocess.Popen(cmd, env=full, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"the torchrun job hung past {timeout}s\n{stderr[-4000:]}") from None
    done = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}\n{stderr[-6000:]}"
    replies = {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}
    assert sorted(replies) == list(range(ranks)), f"ranks that reported: {sorted(replies)}\n{stderr[-4000:]}"
    return replies, done


def builds(replies: dict[int, dict[str, Any]], op: str) -> int:
    return sum(r["get"][op]["built"] for r in replies.values())


def check_gets(replies: dict[int, dict[str, Any]]) -> None:
    for op in ("fakeadd", "fakemul"):
        assert builds(replies, op) == 1, f"{op}: one build for the whole job"
        assert all(r["get"][op]["works"] for r in replies.values()), "every rank got a working op"
        assert len({r["get"][op]["sha256"] for r in replies.values()}) == 1, "every node has the one entry"


def test_four_ranks_two_nodes_one_build_per_op_and_a_failure_reaches_every_rank(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    cc = bindir / "cc"
    cc.write_text(FAILING_CC.format(cc="/usr/bin/cc"))
    cc.chmod(0o755)
    replies, _ = torchrun(tmp_path, 4, 2, "get,fail", JITOPS_FAKE_BUILD_SECONDS="1",
                          PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    check_gets(replies)
    assert {tuple(r["get_order"]) for r in replies.values()} == {("fakeadd", "fakemul"), ("fakemul", "fakeadd")}
    fails = [r["fail"] for r in replies.values()]
    assert all(f["raised"] == "BuildError" for f in fails), fails
    assert len({f["message"] for f in fails}) == 1, "the same error on every rank"
    assert "deliberately broken by the test" in fails[0]["message"], fails[0]["message"]
    spread = max(f["at"] for f in fails) - min(f["at"] for f in fails)
    assert spread < 5, f"every rank raised within 5 s of the first (the builder's own): {spread:.2f}s"
    logs = [p for n in (0, 1) for p in (tmp_path / "job" / f"node{n}" / "v1" / "logs").glob("fakefail-*")]
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
    took = max(r["warm"]["end"] for r in replies.values()) - min(r["warm"]["start"] for r in replies.values())
    assert took < 4 * 2, f"spread builds, not four in a row: {took:.1f}s"


def test_sigkilled_builder_is_taken_over_after_its_lease(tmp_path: Path) -> None:
    replies, _ = torchrun(tmp_path, 4, 2, "kill", restarts=1, JITOPS_FAKE_BUILD_SECONDS="5", KILL_AFTER="3",
                          JITOPS_REMOTE_LEASE_SECONDS="2")
    killed = json.loads((tmp_path / "job" / "killed.json").read_text())["pid"]
    assert all(r["kill"]["attempt"] == 1 for r in replies.values())
    assert any(r["stale_holder_pid"] == killed for r in replies.values()), "the dead rank's lease was still there"
    assert builds(replies, "fakeadd") == 1, "one more build after the takeover"
    assert all(r["get"]["fakeadd"]["works"] for r in replies.values())


def test_without_torch_distributed_nothing_changes(tmp_path: Path) -> None:
    code = """
import json, sys
import torch
before = {m for m in sys.modules if m.startswith("torch.distributed")}
from tests import scenarios as S
r = S.get_and_check("fakeadd")
extra = sorted(m for m in sys.modules if m.startswith(("torch.distributed", "jitops.remote", "jitops.distributed"))
               and m not in before)
print(json.dumps({"built": r["built"], "extra": extra}))
"""
    job = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "WORLD_SIZE": "2"}
    for i, variables in enumerate(({}, {**job, "WORLD_SIZE": "1"}, {**job, "JITOPS_DISTRIBUTED": "0"})):
        base: dict[str, str | None] = {"JITOPS_CACHE_DIR": str(tmp_path / f"c{i}"), "JITOPS_BUILDER": "fake",
                                       "JITOPS_REMOTE_CACHE": None, "JITOPS_DISTRIBUTED": None}
        env = child_env(**{**base, **variables})
        out = last_json(run_py(code, env=env, timeout=120).stdout)
        assert out == {"built": True, "extra": []}, out


def test_settings() -> None:
    from jitops.errors import ConfigError
    from jitops.settings import Settings

    job = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "8", "RANK": "3"}
    d = Settings.from_env(job).distributed
    assert d is not None and d.in_job() and d.rank == 3 and d.tier.url == "c10d://10.0.0.1:29500" and not d.signed
    assert Settings.from_env({**job, "JITOPS_DISTRIBUTED": "0"}).distributed is None
    signed = Settings.from_env({**job, "JITOPS_DISTRIBUTED": "signed"}).distributed
    assert signed is not None and signed.signed
    assert Settings.from_env({**job, "WORLD_SIZE": "1"}).distributed.in_job() is False  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="JITOPS_DISTRIBUTED"):
        Settings.from_env({"JITOPS_DISTRIBUTED": "maybe"})
