"""Frozen mode runs nothing before FrozenError, and a miss names each installed bundle it could not use and why.

Audit 2026-11-28, defects 10 and 11.

- ``JITOPS_FREEZE=error`` with a remote tier: a miss may still be answered by a fetch, but nothing that runs a
  compiler (a stable-ABI plan's link stub, the toolchain self-check) starts before the FrozenError. A child
  process counts every process it starts once its plan is made (the compiler's identity is part of planning).
- A bundle that holds the op only for another machine (another CPU ISA, another compiler) is named in the
  FrozenError, and in the ToolchainError of a machine with no compiler, with the ingredients that differ; the
  text stays short with many bundles.

Tiers: one child process per case for the frozen ordering (no build); in-process with the fake builder for
the messages, a bundle made by rewriting a fake entry's manifest for another machine (a sound entry: its key
is its ingredients').
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import REPO, child_env, last_json

# ------------------------------------------------------------------ defect 10: nothing runs before FrozenError

FROZEN_REMOTE_GET = """
import json, sys, threading
import jitops, jitops.plan as jplan, jitops.registry as registry
from jitops.build import stable_fast

jplan.make_plan(registry.lookup(sys.argv[1]), "cpu")  # the compiler's identity: planning, a hit's too
spawned = []
def hook(event, args):
    if event in ("subprocess.Popen", "os.posix_spawn", "os.exec", "os.fork", "os.system"):
        spawned.append([event, *map(str, (args[1] or ()) if event != "os.fork" and len(args) > 1 else ())])
sys.addaudithook(hook)
try:
    jitops.get(sys.argv[1], device="cpu")
    out = {"type": None}
except Exception as e:
    out = {"type": type(e).__name__, "msg": str(e)}
for t in threading.enumerate():  # a thread begun before the error (a link stub) has its chance to run
    if t is not threading.current_thread() and t.daemon:
        t.join(30)
out["spawned"] = spawned
out["stubs"] = len(stable_fast._early) + len(stable_fast._stubs)
print(json.dumps(out))
"""


@pytest.mark.process
@pytest.mark.parametrize("op", ["nms", "softmax"], ids=["stable-abi", "aten"])
def test_frozen_with_a_remote_tier_starts_no_process_before_frozen_error(
    tmp_path: Path, op: str
) -> None:
    """nms's CPU library is on the stable ABI (a link stub would begin); softmax's is not (the self-check)."""
    remote = tmp_path / "remote"
    remote.mkdir()
    env = child_env(
        JITOPS_CACHE_DIR=str(tmp_path / "cache"),
        JITOPS_STATE_DIR=str(tmp_path / "state"),
        JITOPS_CONFIG_DIR=str(tmp_path / "config"),
        JITOPS_REMOTE_CACHE=f"file://{remote}",
        JITOPS_FREEZE="error",
        JITOPS_PROGRESS="0",
        JITOPS_BUILDER=None,
    )
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FROZEN_REMOTE_GET), op],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    out = last_json(proc.stdout)
    assert out["type"] == "FrozenError" and f"'{op}'" in out["msg"], out
    assert out["spawned"] == [], f"processes started before FrozenError: {out['spawned']}"
    assert out["stubs"] == 0, "a link stub was begun for a build that frozen mode forbids"
    assert not list((tmp_path / "cache").glob("v1/entries/*/*/*"))
