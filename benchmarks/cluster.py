"""Simulated cluster: N nodes (forked processes, each its own JITOPS_CACHE_DIR) on one cold store.

For N = 1, 4, 16, without the remote tier and with it (file:// and, when
``redis-server`` is installed, Redis started on loopback), prints builds per
op and the time until every node has every op (fake builder, each build
stretched to ``--build-seconds``). Then, in one process: the median time of
``jitops.get`` for a remote hit (local cache empty, store warm) against a
local hit in a fresh process, with and without the tier configured (the warm
local hit must not change).

Usage: ``python benchmarks/cluster.py [--build-seconds 1.0] [--nodes 1,4,16]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers import scenario_argv  # noqa: E402
from tests.remote_helpers import keygen, redis_server  # noqa: E402

OPS = ["fakeadd", "fakemul"]


def run(scenario: str, env: dict[str, str], **kwargs: object) -> dict:
    """Run the scenario function ``scenario(**kwargs)`` (tests/scenario_main.py) in a fresh interpreter; its reply."""
    out = subprocess.run(scenario_argv(scenario, **kwargs), env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise SystemExit(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def cluster(n: int, url: str | None, tmp: Path, build_s: float, cfg: Path) -> tuple[str, str]:
    base = tmp / f"n{n}-{'none' if url is None else url.split(':')[0]}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "JITOPS_BUILDER": "fake", "JITOPS_FAKE_BUILD_SECONDS": str(build_s),
           "JITOPS_CONFIG_DIR": str(cfg), "JITOPS_CACHE_DIR": str(base / "unused")}
    env.pop("JITOPS_REMOTE_CACHE", None)
    if url is not None:
        env["JITOPS_REMOTE_CACHE"] = url
    out = run("remote_scenarios.main_nodes", env, n=n, base=str(base), ops=OPS)
    replies = out["replies"]
    if len(replies) != n or not all(r["ok"] and r["exit"] == 0 for r in replies):
        raise SystemExit(f"a node failed: {[r for r in replies if not r['ok']][:1]}")
    builds = [sum(r["value"]["ops"][op]["built"] for r in replies) for op in OPS]
    last = max(r["value"]["done"] for r in replies) - out["start"]
    return "/".join(map(str, builds)), f"{last:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-seconds", type=float, default=1.0)
    ap.add_argument("--nodes", default="1,4,16")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="jitops-cluster-"))
    try:
        cfg = tmp / "cfg"
        keygen(cfg)
        with contextlib.ExitStack() as stack:
            stores: list[tuple[str, str | None]] = [("none", None)]
            (tmp / "shared").mkdir()
            stores.append(("file", f"file://{tmp / 'shared'}"))
            if shutil.which("redis-server"):
                (tmp / "redis").mkdir()
                url, _ = stack.enter_context(redis_server(tmp / "redis"))
                stores.append(("redis", url))
            print(f"build time per op {args.build_seconds:g}s (fake builder); ops {', '.join(OPS)}")
            print(f"{'store':<6} {'nodes':>5} {'builds/op':>10} {'all nodes have all ops (s)':>27}")
            for name, url in stores:
                for n in map(int, args.nodes.split(",")):
                    if url and url.startswith("file"):
                        shutil.rmtree(tmp / "shared")
                        (tmp / "shared").mkdir()
                    elif url:
                        subprocess.run(["redis-cli", "-u", url, "flushall"], capture_output=True)
                    builds, last = cluster(n, url, tmp, args.build_seconds, cfg)
                    print(f"{name:<6} {n:>5} {builds:>10} {last:>27}")
            base_env = {**os.environ, "PYTHONPATH": str(REPO), "JITOPS_BUILDER": "fake", "JITOPS_CONFIG_DIR": str(cfg)}
            base_env.pop("JITOPS_REMOTE_CACHE", None)
            for name, url in stores[1:]:
                env = {**base_env, "JITOPS_REMOTE_CACHE": url}
                remote, remote2, local_tier, local_plain = [], [], [], []
                for i in range(args.repeat):
                    cache = tmp / f"t-{name}-{i}"
                    first = run("remote_scenarios.timed_gets", {**env, "JITOPS_CACHE_DIR": str(cache)})
                    remote.append(first["first_get_s"])
                    remote2.append(first["second_get_s"])
                    pair = [(local_tier, env), (local_plain, base_env)]
                    for out, e in pair if i % 2 else pair[::-1]:  # alternate which goes first
                        out.append(run("remote_scenarios.timed_gets", {**e, "JITOPS_CACHE_DIR": str(cache)})["first_get_s"])
                med = statistics.median
                print(f"{name}: first get() in a fresh process, median of {args.repeat}: remote hit "
                      f"{1000 * med(remote):.1f} ms (connect, imports, compiler probe included), a second op's "
                      f"remote hit {1000 * med(remote2):.1f} ms; local hit {1000 * med(local_tier):.1f} ms with the "
                      f"tier set, {1000 * med(local_plain):.1f} ms without; remote-hit overhead "
                      f"{1000 * (med(remote) - med(local_tier)):.1f} ms first, "
                      f"{1000 * (med(remote2) - med(local_tier)):.1f} ms after")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
