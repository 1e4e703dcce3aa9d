"""Line and branch coverage per subpackage of jitops/, side by side for several runs.

    python benchmarks/coverage_by_package.py NAME=coverage.json [NAME=coverage.json ...] [--out F]

Each file is ``coverage json`` output of one run (for example the whole suite under ``coverage run
-m pytest --full``, subprocesses measured), made in the checkout: only its own ``jitops/`` files
count (their names are relative), not copies the tests run elsewhere. A subpackage is the first
folder under ``jitops/``; the package's own top-level modules are one row (``jitops``). Per row and
run: lines run of lines, branches taken of branches, both as percentages; the last run is compared
with the first (its change in points). ``--omit PATTERN`` leaves files out (a module that only
runs where coverage cannot measure it). ``--out`` writes the rows as JSON.

``--lost REV_FIRST REV_LAST`` also lists, file by file, the lines and branches the first run ran
and the last did not: a file's lines are matched between the two commits by content (difflib),
so an unchanged line keeps its identity wherever edits moved it.
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import json
import subprocess
from collections import defaultdict
from pathlib import Path


def by_package(report: dict, omit: tuple[str, ...] = ()) -> dict[str, list[int]]:
    """{subpackage: [statements, covered, branches, covered branches]}, less the files ``omit``
    names (fnmatch patterns)."""
    rows: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for name, data in report["files"].items():
        parts = Path(name).parts
        if any(fnmatch.fnmatch(name, pattern) for pattern in omit):
            continue
        if parts[0] != "jitops":  # a copy elsewhere (tests run the package from odd folders)
            continue
        rest = parts[1:]
        package = rest[0] if len(rest) > 1 else "jitops"
        s = data["summary"]
        row = rows[package]
        row[0] += s["num_statements"]
        row[1] += s["covered_lines"]
        row[2] += s.get("num_branches", 0)
        row[3] += s.get("covered_branches", 0)
    return dict(rows)


def _text(rev: str, name: str) -> list[str] | None:
    got = subprocess.run(["git", "show", f"{rev}:{name}"], capture_output=True, text=True)
    return got.stdout.splitlines() if got.returncode == 0 else None


def lost(first: dict, last: dict, revs: tuple[str, str]) -> list[str]:
    """Per file in both runs: lines and branches (line pairs; a negative end leaves the function)
    that ran in ``first`` and not in ``last``, in ``last``'s line numbers."""
    out = []
    for name in sorted(set(first["files"]) & set(last["files"])):
        if not name.startswith("jitops/"):
            continue
        a, b = _text(revs[0], name), _text(revs[1], name)
        if a is None or b is None:
            continue
        moved: dict[int, int] = {}
        for block in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
            moved.update({block.a + k + 1: block.b + k + 1 for k in range(block.size)})

        def to_last(n: int) -> int | None:
            got = moved.get(abs(n))
            return None if got is None else (got if n > 0 else -got)

        f, g = first["files"][name], last["files"][name]
        missing = set(g["missing_lines"])
        lines = sorted(m for n in f["executed_lines"] if (m := to_last(n)) in missing)
        not_taken = {tuple(x) for x in g.get("missing_branches", [])}
        branches = sorted(
            pair
            for x, y in f.get("executed_branches", [])
            if (pair := (to_last(x), to_last(y))) in not_taken
        )
        if lines or branches:
            out.append(f"{name}: lines {lines}, branches {branches}")
            out += [f"    {n}: {b[n - 1].strip()}" for n in lines]
    return out


def pct(done: int, of: int) -> float:
    return 100.0 * done / of if of else 100.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="NAME=coverage.json")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--lost", nargs=2, metavar=("REV_FIRST", "REV_LAST"))
    ap.add_argument("--omit", action="append", default=[], help="a file pattern left out")
    a = ap.parse_args(argv)
    runs, reports = {}, []
    for arg in a.runs:
        name, _, path = arg.partition("=")
        reports.append(json.loads(Path(path).read_text()))
        runs[name] = by_package(reports[-1], tuple(a.omit))
    names = list(runs)
    packages = sorted(set().union(*runs.values()))
    totals = {n: [sum(r[i] for r in runs[n].values()) for i in range(4)] for n in names}
    head = f"{'subpackage':<12}" + "".join(
        f"{n + ' lines':>22}{n + ' branches':>22}" for n in names
    )
    print(head + ("" if len(names) < 2 else f"{'change (points)':>20}"))
    out = []
    for package in packages + ["all"]:
        cells, got = "", {}
        for n in names:
            r = totals[n] if package == "all" else runs[n].get(package, [0, 0, 0, 0])
            got[n] = r
            cells += f"{f'{r[1]}/{r[0]} {pct(r[1], r[0]):.1f}%':>22}"
            cells += f"{f'{r[3]}/{r[2]} {pct(r[3], r[2]):.1f}%':>22}"
        change = ""
        if len(names) > 1:
            a0, a1 = got[names[0]], got[names[-1]]
            dl = pct(a1[1], a1[0]) - pct(a0[1], a0[0])
            db = pct(a1[3], a1[2]) - pct(a0[3], a0[2])
            change = f"{f'{dl:+.1f} / {db:+.1f}':>20}"
        print(f"{package:<12}{cells}{change}")
        out.append({"subpackage": package, **{n: got[n] for n in names}})
    if a.lost:
        gone = lost(reports[0], reports[-1], tuple(a.lost))
        print(f"\nran in {names[0]}, not in {names[-1]}:" if gone else "\nnothing ran only first")
        print("\n".join(gone))
    if a.out:
        a.out.write_text(json.dumps({"benchmark": "coverage", "rows": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
