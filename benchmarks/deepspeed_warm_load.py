"""DeepSpeed's CPU Adam loaded by DeepSpeed itself (``CPUAdamBuilder().load()``), built already: the seconds of the
loader call inside it, torch's ``cpp_extension.load`` against ``jitops.load`` swapped in (issue 32 item 4).

Each measurement is one fresh process (``tests/scenarios_dropin.deepspeed_warm_load``); only the loader call that
DeepSpeed makes is timed (DeepSpeed, torch and jitops are imported before it, as in a program that swapped the
loader at startup). The first run of each loader builds (minutes); after it, one untimed jitops process hashes and
stamps the library and remembers the call (``loading.recall``), as any process after the first does. Then
``--repeat`` rounds alternate the two loaders; medians and minima in ms.

Needs DeepSpeed: ``pip install --no-deps deepspeed==0.19.8 einops hjson msgpack py-cpuinfo tqdm``.
Usage: ``python benchmarks/deepspeed_warm_load.py [--repeat N] [--dir FOLDER]`` (FOLDER keeps both builds between runs).
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


def run(loader: str, env: dict[str, str]) -> float:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.scenario_main",
            "scenarios_dropin.deepspeed_warm_load",
            json.dumps({"loader": loader}),
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode:
        raise SystemExit(
            f"{loader}: the scenario failed\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        )
    reply = json.loads([line for line in proc.stdout.splitlines() if line.strip()][-1])
    return float(reply["seconds"][0]) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9, help="fresh processes per loader")
    parser.add_argument(
        "--dir", help="where both loaders keep their builds (default: a temporary folder)"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="jitops-bench-ds-") as tmp:
        root = Path(args.dir or tmp)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("JITOPS_") and k != "PYTHONDONTWRITEBYTECODE"
        }
        env.update(
            PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            TORCH_EXTENSIONS_DIR=str(root / "torch_extensions"),
            JITOPS_CACHE_DIR=str(root / "cache"),
            JITOPS_STATE_DIR=str(root / "state"),
            JITOPS_PROGRESS="0",
        )
        print("first loads (builds, unless --dir holds them) ...", flush=True)
        start = time.monotonic()
        run("torch", env), run("jitops", env)
        print(f"  {time.monotonic() - start:.0f} s", flush=True)
        time.sleep(2.5)  # settled (stamps.SETTLED)
        run("jitops", env)  # stamps the library, remembers the call
        results: dict[str, list[float]] = {"torch": [], "jitops": []}
        for _ in range(args.repeat):
            for loader, values in results.items():
                values.append(run(loader, env))
    med = statistics.median
    for loader, values in results.items():
        print(f"{loader:7} median {med(values):6.1f} ms   min {min(values):6.1f} ms")
    print(f"jitops / torch, medians: {med(results['jitops']) / med(results['torch']):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
