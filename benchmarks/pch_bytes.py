"""What the edit loop leaves on disk: each kernel's PCHs and its whole cache, in bytes.

For each kernel of notebook_loop.py (``--styles``), in a fresh process with a fresh cache and state
dir: the cold build and two edits, with the PCHs a quiet machine would have by then (the torch-
style kernel's built beside its second build, ``JITOPS_PCH_BACKGROUND=0``; the stable kernels'
shared PCH, only ever built after a build, waited for). Then the size of each PCH folder under
``v1/pch`` (the precompiled file, its prefix and records), the cache's total. Timing is not
measured: run it beside anything.

Usage: ``python benchmarks/pch_bytes.py [--styles torch,stable,stable-local,stable-3file]
[--out FILE.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from notebook_loop import CHILD, REPO, background_pids, sources  # noqa: E402  (not a package)


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _wait_background(cache: Path, limit: float = 900.0) -> None:
    """Wait for the background PCH builds of the session's cache (they outlive its process)."""
    deadline = time.monotonic() + limit
    while background_pids(cache):
        if time.monotonic() > deadline:
            raise SystemExit(f"background PCH builds for {cache} still running after {limit:.0f} s")
        time.sleep(0.5)


def measure(style: str, base: dict[str, str]) -> dict[str, Any]:
    steps = [[s, off, sources(style, "jitops", off, broken=False)] for s, off in
             (("cold", 0), ("edit 1", 1), ("edit 2", 2))]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pch-bytes-") as tmp:
        cache = Path(tmp, "cache")
        env = dict(base, BENCH_WORK=tmp, JITOPS_CACHE_DIR=str(cache))
        if style == "torch":  # on a busy machine its background PCH would wait for idle CPU
            env["JITOPS_PCH_BACKGROUND"] = "0"
        env["JITOPS_STATE_DIR"] = os.path.join(tmp, "state")
        argv = [sys.executable, "-c", CHILD, style, "jitops", "0", json.dumps(steps)]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"{style} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}")
        _wait_background(cache)
        pch_root = cache / "v1" / "pch"
        pchs = sorted(
            folder_bytes(d) for d in (pch_root.iterdir() if pch_root.is_dir() else ()) if d.is_dir()
        )
        return {"style": style, "pch_bytes": pchs, "cache_bytes": folder_bytes(cache)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--styles", default="torch,stable,stable-local,stable-3file")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    base = {k: v for k, v in os.environ.items() if not k.startswith("JITOPS_") and k != "CXX"}
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), base.get("PYTHONPATH")) if p)
    rows = [measure(style, base) for style in a.styles.split(",")]
    mb = 1e6
    print(f"{'kernel':<14}{'PCHs (MB each)':>28}{'cache, MB':>12}")
    for r in rows:
        each = ", ".join(f"{b / mb:.1f}" for b in r["pch_bytes"]) or "none"
        print(f"{r['style']:<14}{each:>28}{r['cache_bytes'] / mb:>12.1f}")
    if a.out:
        a.out.write_text(json.dumps({"benchmark": "pch_bytes", "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
