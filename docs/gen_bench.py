"""Benchmark pages from result files: one command turns every benchmark's saved output into a page
with its conditions, a table and a plot, under ``docs/benchmarks/``.

    python docs/gen_bench.py    # every page; needs matplotlib (the `bench` extra)

Each page has its module in ``docs/benchpages/`` (which result files it reads, its table, its
plot); ``benchpages/common.py`` holds what they share. Result files live in dated folders under
``benchmarks/results/``, each with a README.md giving the machine, the commit and the commands.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchpages import PAGES  # noqa: E402
from benchpages.common import OUT, RESULTS  # noqa: E402


def main(results: Path = RESULTS, out: Path = OUT) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for page in PAGES:
        print("gen_bench: " + page.render(results, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
