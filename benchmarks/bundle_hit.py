"""The first ``jitops.get(op)`` in a fresh process: from an installed bundle (unsigned, and signed), from the local
cache, and a cold build.

    python benchmarks/bundle_hit.py [--op add] [--runs 5] [--cold-runs 5] [--json OUT]

Setup (not timed): ``jitops bundle build --ops OP`` into a private cache (one build, which also warms that
cache), then again with ``--sign`` and a fresh key pair (``jitops cache keygen``: the same entry, signed); each wheel
pip-installed (``--no-deps --target``) into a private folder. Then, each in a fresh interpreter, ``--runs``
times: BUNDLE (an empty cache of its own each run, the unsigned bundle's folder on the path: the local miss,
the entry points read once, the bundle's entry verified with a full sha256, loaded in place), SIGNED (the same
with the signed bundle, its key trusted and JITOPS_REQUIRE_SIGNED=1: the signature checked too), LOCAL (the
warmed cache, no bundle on the path: a verified-stamp hit), and ``--cold-runs`` times COLD (an empty cache, no
bundle: a real build). Timed in the child: ``jitops.get(op)`` alone, after ``import torch,
jitops``. Printed: the median and each run per mode, BUNDLE / LOCAL, the wheel's size and its size per op.
A private JITOPS_STATE_DIR is shared by all runs (LOCAL's stamps live there, as on a real machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def child(op: str) -> None:
    """In the fresh interpreter: the seconds of the first get (imports excluded), and where it came from."""
    import torch  # noqa: F401 - imported before the clock, as a program would have

    import jitops
    from jitops.loading import loader

    start = time.perf_counter()
    jitops.get(op)
    seconds = time.perf_counter() - start
    (lib,) = loader._libraries.values()
    print(json.dumps({"get_s": seconds, "entry": str(lib.entry), "built": lib.built}))


def _run(op: str, env: dict[str, str]) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", op],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="add")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cold-runs", type=int, default=5)
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--child", metavar="OP", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return 0
    with tempfile.TemporaryDirectory(prefix="jitops-bundle-bench-") as tmp:
        t = Path(tmp)
        base = {k: v for k, v in os.environ.items() if not k.startswith("JITOPS_")}
        base.update(JITOPS_STATE_DIR=str(t / "state"), JITOPS_PROGRESS="0", PYTHONPATH=str(REPO))
        warmed = t / "warmed"
        keygen = subprocess.run(
            [sys.executable, "-m", "jitops", "cache", "keygen"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            env={**base, "JITOPS_CONFIG_DIR": str(t / "signer")},
        )
        public = next(
            (w.partition("=")[2] for w in keygen.stdout.split() if "=ed25519:" in w), None
        )
        if public is None:
            raise SystemExit(keygen.stdout + keygen.stderr)
        sites = {}
        for kind, config in (("bundle", t / "no-key"), ("signed", t / "signer")):
            build = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "jitops",
                    "bundle",
                    "build",
                    "--ops",
                    args.op,
                    "--out",
                    str(t / kind),
                    "--name",
                    "bench",
                    "--version",
                    "1",
                    *(["--sign"] if kind == "signed" else []),
                ],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=900,
                env={**base, "JITOPS_CACHE_DIR": str(warmed), "JITOPS_CONFIG_DIR": str(config)},
            )
            if build.returncode != 0:
                raise SystemExit(build.stdout + build.stderr)
            (wheel,) = (t / kind).glob("*.whl")
            sites[kind] = t / f"site-{kind}"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--no-deps",
                    "--no-index",
                    "--target",
                    str(sites[kind]),
                    str(wheel),
                ],
                check=True,
                capture_output=True,
                timeout=300,
            )
        trusting = {
            "JITOPS_CONFIG_DIR": str(t / "no-key"),
            "JITOPS_REMOTE_TRUSTED_KEYS": public,
            "JITOPS_REQUIRE_SIGNED": "1",
        }
        # the first local hit stamps the entry, as any use would
        _run(args.op, {**base, "JITOPS_CACHE_DIR": str(warmed)})
        times: dict[str, list[float]] = {"bundle": [], "signed": [], "local": [], "cold": []}
        for i in range(max(args.runs, args.cold_runs)):
            if i < args.runs:
                for kind, more in (("bundle", {}), ("signed", trusting)):
                    site = sites[kind]
                    r = _run(
                        args.op,
                        {
                            **base,
                            **more,
                            "JITOPS_CACHE_DIR": str(t / f"empty-{kind}-{i}"),
                            "PYTHONPATH": f"{REPO}{os.pathsep}{site}",
                        },
                    )
                    assert not r["built"] and str(r["entry"]).startswith(str(site)), r
                    times[kind].append(float(r["get_s"]))  # type: ignore[arg-type]
                r = _run(args.op, {**base, "JITOPS_CACHE_DIR": str(warmed)})
                assert not r["built"] and str(r["entry"]).startswith(str(warmed)), r
                times["local"].append(float(r["get_s"]))  # type: ignore[arg-type]
            if i < args.cold_runs:
                r = _run(args.op, {**base, "JITOPS_CACHE_DIR": str(t / f"cold-{i}")})
                assert r["built"], r
                times["cold"].append(float(r["get_s"]))  # type: ignore[arg-type]
        report = {
            "op": args.op,
            "wheel_bytes": wheel.stat().st_size,
            "build_output": build.stdout.strip().splitlines(),
            **{f"{k}_s": v for k, v in times.items()},
            **{f"{k}_median_s": statistics.median(v) for k, v in times.items() if v},
        }
    print(
        f"first jitops.get({args.op!r}) in a fresh process (median of runs; each run in seconds):"
    )
    for k, v in times.items():
        if v:
            print(
                f"  {k:<7} {statistics.median(v) * 1000:9.1f} ms   {' '.join(f'{x * 1000:.1f}' for x in v)}"
            )
    if times["bundle"] and times["local"]:
        for kind in ("bundle", "signed"):
            print(
                f"  {kind} / local: {statistics.median(times[kind]) / statistics.median(times['local']):.2f}x"
            )
    print(
        f"wheel: {report['wheel_bytes']} bytes; "
        + "; ".join(str(x).strip() for x in report["build_output"][1:-1])
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
