"""Simulated cluster: N nodes (forked processes, each its own JITOPS_CACHE_DIR) on one cold store.

For N = 1, 4, 16, without the remote tier and with it (file:// and, when
installed, Redis (``redis-server``) and moto's S3 server (``moto[server]``,
``s3fs``), each started on loopback and stopped by the benchmark), prints builds per
op and the time until every node has every op (fake builder, each build
stretched to ``--build-seconds``). Then, in one process: the median time of
``jitops.get`` for a remote hit (local cache empty, store warm) against a
local hit in a fresh process, with and without the tier configured (the warm
local hit must not change).

With ``--torchrun``: real torchrun jobs instead (``tests/dist_scenarios.py``;
8 ranks on 4 simulated nodes, each its own cache dir and host identity, the
job's c10d store as the tier): builds per op and the time until every rank
has every op with the store tier and with ``JITOPS_DISTRIBUTED=0``; then
``jitops.distributed.warm`` of 4 ops against a ``warm`` of one op alone (its
own job: the same collective's overhead, without the other builds' contention),
and, for reference, against the slowest build measured inside the 4-op warm
(which that contention inflates, flattering the ratio).

Usage: ``python benchmarks/cluster.py [--build-seconds 1.0] [--nodes 1,4,16] [--torchrun]
[--out FILE.json]`` (``--out``: the figures and conditions for ``docs/gen_bench.py``, see
``benchmarks/benchmeta.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import benchmeta  # noqa: E402

from tests.helpers import environ, scenario_argv  # noqa: E402
from tests.remote_helpers import keygen, moto_s3, redis_server  # noqa: E402

OPS = ["fakeadd", "fakemul"]


def run(scenario: str, env: dict[str, str], **kwargs: object) -> dict:
    """Run the scenario function ``scenario(**kwargs)`` (tests/scenario_main.py) in a fresh interpreter; its reply."""
    out = subprocess.run(
        scenario_argv(scenario, **kwargs),
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode:
        raise SystemExit(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def cluster(n: int, url: str | None, tmp: Path, build_s: float, cfg: Path) -> tuple[str, str]:
    base = tmp / f"n{n}-{'none' if url is None else url.split(':')[0]}"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "JITOPS_BUILDER": "fake",
        "JITOPS_FAKE_BUILD_SECONDS": str(build_s),
        "JITOPS_CONFIG_DIR": str(cfg),
        "JITOPS_CACHE_DIR": str(base / "unused"),
    }
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


def torchrun_job(
    tmp: Path, ranks: int, per_node: int, phases: str, build_s: float, store: bool
) -> list[dict]:
    from tests.remote_helpers import free_port

    out = tmp / f"job-{phases}-{'store' if store else 'none'}"
    out.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "JITOPS_BUILDER": "fake",
        "JITOPS_FAKE_BUILD_SECONDS": str(build_s),
        "OMP_NUM_THREADS": "1",
        "JITOPS_DISTRIBUTED": "1" if store else "0",
    }
    env.pop("JITOPS_REMOTE_CACHE", None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={ranks}",
        f"--master-port={free_port()}",
        "-m",
        "tests.dist_scenarios",
        phases,
        str(out),
        str(per_node),
    ]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    if proc.returncode:
        raise SystemExit(proc.stderr[-4000:])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def torchrun_bench(build_s: float) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="jitops-torchrun-"))
    try:
        print(
            f"torchrun, 8 ranks on 4 simulated nodes; build time per op {build_s:g}s (fake builder: a fixed sleep, "
            "so this 2-core machine's CPU is not the bottleneck)"
        )
        print(f"{'tier':<10} {'builds/op':>10} {'all ranks have all ops (s)':>27}")
        result: dict[str, Any] = {"ranks": 8, "nodes": 4, "build_seconds": build_s, "jobs": []}
        for store in (False, True):
            replies = torchrun_job(tmp, 8, 2, "get", build_s, store)
            builds = "/".join(str(sum(r["get"][op]["built"] for r in replies)) for op in OPS)
            last = max(r["get_done"] for r in replies) - min(r["get_start"] for r in replies)
            print(f"{'job store' if store else 'none':<10} {builds:>10} {last:>27.2f}")
            result["jobs"].append(
                {
                    "tier": "job store" if store else "none",
                    "builds_per_op": builds,
                    "all_done_s": last,
                }
            )
        one = torchrun_job(tmp, 8, 2, "warmone", build_s, True)
        alone = max(r["warmone"]["end"] for r in one) - min(r["warmone"]["start"] for r in one)
        replies = torchrun_job(tmp, 8, 2, "warm", build_s, True)
        report = replies[0]["warm"]["report"]
        wall = max(r["warm"]["end"] for r in replies) - min(r["warm"]["start"] for r in replies)
        slowest = max(e["seconds"] for e in report)
        nodes = len({e["node"] for e in report})
        print(
            f"warm of 1 op alone: {alone:.2f}s until every rank returned (its build "
            f"{one[0]['warmone']['report'][0]['seconds']:.2f}s)"
        )
        print(
            f"warm of {len(report)} ops on 4 nodes: {wall:.2f}s until every rank returned; ratio to the 1-op warm "
            f"{wall / alone:.2f}x (target < 1.5x); slowest build inside this warm {slowest:.2f}s (ratio "
            f"{wall / slowest:.2f}x; that denominator is inflated by contention); built on {nodes} different nodes, "
            f"builds per op {'/'.join(str(e['builds']) for e in report)}"
        )
        result["warm"] = {
            "one_op_s": alone,
            "ops": len(report),
            "all_ops_s": wall,
            "slowest_build_s": slowest,
            "nodes_built_on": nodes,
        }
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-seconds", type=float, default=1.0)
    ap.add_argument("--nodes", default="1,4,16")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--torchrun",
        action="store_true",
        help="real torchrun jobs with the job's store as the tier",
    )
    benchmeta.add_arguments(ap)
    args = ap.parse_args()
    meta = benchmeta.start(args.conditions)
    with benchmeta.tee() as printed:
        if args.torchrun:
            results = {"torchrun": torchrun_bench(args.build_seconds)}
        else:
            results = simulated(args)
    if args.out:
        benchmeta.write(args.out, "cluster", meta, results, printed.getvalue())


def simulated(args: argparse.Namespace) -> dict[str, Any]:
    """Simulated clusters on each store, then the first get's latency; prints both, returns them."""
    result: dict[str, Any] = {
        "build_seconds": args.build_seconds,
        "ops": OPS,
        "repeat": args.repeat,
        "clusters": [],
        "gets": {},
    }
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
            if Path(sys.executable).with_name("moto_server").exists() and importlib.util.find_spec(
                "s3fs"
            ):
                (tmp / "s3").mkdir()
                url, s3_env = stack.enter_context(moto_s3(tmp / "s3"))
                # the nodes (children) reach moto through these
                stack.enter_context(environ(**s3_env))
                stores.append(("s3", url))
            print(f"build time per op {args.build_seconds:g}s (fake builder); ops {', '.join(OPS)}")
            print(f"{'store':<6} {'nodes':>5} {'builds/op':>10} {'all nodes have all ops (s)':>27}")
            warm: dict[
                str, str
            ] = {}  # store -> a URL whose store holds every op (for the timings below)
            for name, url in stores:
                for n in map(int, args.nodes.split(",")):
                    if url and url.startswith("file"):
                        shutil.rmtree(tmp / "shared")
                        (tmp / "shared").mkdir()
                    elif url and url.startswith("redis"):
                        subprocess.run(
                            ["redis-cli", "-u", url, "flushall"], capture_output=True, timeout=30
                        )
                    # s3: a fresh prefix is cold
                    run_url = f"{url}-n{n}" if url and url.startswith("s3") else url
                    builds, last = cluster(n, run_url, tmp, args.build_seconds, cfg)
                    print(f"{name:<6} {n:>5} {builds:>10} {last:>27}")
                    result["clusters"].append(
                        {
                            "store": name,
                            "nodes": n,
                            "builds_per_op": builds,
                            "all_done_s": float(last),
                        }
                    )
                    if run_url is not None:
                        warm[name] = run_url
            base_env = {
                **os.environ,
                "PYTHONPATH": str(REPO),
                "JITOPS_BUILDER": "fake",
                "JITOPS_CONFIG_DIR": str(cfg),
            }
            base_env.pop("JITOPS_REMOTE_CACHE", None)
            for name, url in warm.items():
                env = {**base_env, "JITOPS_REMOTE_CACHE": url}
                remote, remote2, local_tier, local_plain = [], [], [], []
                for i in range(args.repeat):
                    cache = tmp / f"t-{name}-{i}"
                    first = run(
                        "remote_scenarios.timed_gets", {**env, "JITOPS_CACHE_DIR": str(cache)}
                    )
                    remote.append(first["first_get_s"])
                    remote2.append(first["second_get_s"])
                    pair = [(local_tier, env), (local_plain, base_env)]
                    for out, e in pair if i % 2 else pair[::-1]:  # alternate which goes first
                        out.append(
                            run(
                                "remote_scenarios.timed_gets", {**e, "JITOPS_CACHE_DIR": str(cache)}
                            )["first_get_s"]
                        )
                med = statistics.median
                print(
                    f"{name}: first get() in a fresh process, median of {args.repeat}: remote hit "
                    f"{1000 * med(remote):.1f} ms (connect, imports, compiler probe included), a second op's "
                    f"remote hit {1000 * med(remote2):.1f} ms; local hit {1000 * med(local_tier):.1f} ms with the "
                    f"tier set, {1000 * med(local_plain):.1f} ms without; remote-hit overhead "
                    f"{1000 * (med(remote) - med(local_tier)):.1f} ms first, "
                    f"{1000 * (med(remote2) - med(local_tier)):.1f} ms after"
                )
                result["gets"][name] = {
                    "remote_first_ms": [1000 * t for t in remote],
                    "remote_second_ms": [1000 * t for t in remote2],
                    "local_with_tier_ms": [1000 * t for t in local_tier],
                    "local_without_tier_ms": [1000 * t for t in local_plain],
                }
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
