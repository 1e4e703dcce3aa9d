"""The path of ``jitops.get(op)`` through the package: which modules it passes and how often it climbs back up.

    python benchmarks/get_path.py --repo PATH [--op softmax] [--json OUT]

PATH is a checkout (its ``jitops/`` package is traced, whatever its layout). In a child process whose
sys.path has PATH first, with a private temporary JITOPS_CACHE_DIR and JITOPS_STATE_DIR, ``sys.setprofile``
records each Python 'call' event of a frame whose module (``f_globals["__name__"]``) is under ``jitops``,
module bodies (``<module>``, i.e. imports) left out. Twice in the same cache: the COLD get (a real build)
in one child, then the WARM get (a cache hit) in a fresh child.

Per run: the modules passed (distinct jitops modules with a call), the call sequence collapsed to module
transitions (consecutive repeats merged), and the climbs: transitions A -> B where B imports A, directly
or transitively (annotation-only imports included), in that checkout's import graph, read from its source
(tests/import_graph.py; nothing of the target is imported in this process). A transition inside an import
circle is a climb whichever way it goes. A climb is often just the return from a lower helper (fsutil ->
cache); the upcalls count only direct calls from a function in A into one in B where B imports A.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from import_graph import graph  # noqa: E402

# The child: import the checkout's jitops (module bodies run before the profiler starts), trace one
# get.
_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import jitops
assert jitops.__file__.startswith(sys.argv[1]), jitops.__file__
calls = []
def prof(frame, event, arg):
    if event == "call":
        mod = frame.f_globals.get("__name__", "")
        if (mod == "jitops" or mod.startswith("jitops.")) and frame.f_code.co_name != "<module>":
            back = frame.f_back
            calls.append([mod, back.f_globals.get("__name__", "") if back is not None else ""])
sys.setprofile(prof)
try:
    jitops.get(sys.argv[2])
finally:
    sys.setprofile(None)
sys.stdout.write("\nGET_PATH_JSON " + json.dumps(calls) + "\n")
"""


def collapse(calls: Iterable[str]) -> list[str]:
    """The call sequence as module transitions: consecutive repeats of one module merged."""
    out: list[str] = []
    for mod in calls:
        if not out or out[-1] != mod:
            out.append(mod)
    return out


def closure(g: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """Each module's transitive imports (itself included only when it lies on an import circle)."""
    reach: dict[str, set[str]] = {}
    for start in g:
        seen: set[str] = set()
        todo = list(g[start])
        while todo:
            mod = todo.pop()
            if mod not in seen:
                seen.add(mod)
                todo.extend(g.get(mod, ()))
        reach[start] = seen
    return reach


def climbs(
    sequence: list[str], reach: Mapping[str, set[str]]
) -> collections.Counter[tuple[str, str]]:
    """Transitions A -> B of a collapsed sequence where B (transitively) imports A: the trace moves up."""
    return collections.Counter(
        (a, b) for a, b in zip(sequence, sequence[1:]) if a in reach.get(b, ())
    )


def trace(repo: Path, op: str, env: Mapping[str, str], timeout: float = 600.0) -> list[list[str]]:
    """[callee module, caller module] of each call into jitops, in order, of one ``jitops.get(op)`` in a fresh
    child (the calling thread only: background threads such as the self-check's are not traced)."""
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(repo), op],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tempfile.gettempdir(),
    )
    marker = [line for line in proc.stdout.splitlines() if line.startswith("GET_PATH_JSON ")]
    if proc.returncode or not marker:
        raise RuntimeError(
            f"traced get failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
    return json.loads(marker[-1].removeprefix("GET_PATH_JSON "))


def upcalls(
    pairs: Iterable[list[str]], reach: Mapping[str, set[str]]
) -> collections.Counter[tuple[str, str]]:
    """Direct calls from a function of module A into one of module B where B imports A: a stage calling back into
    a higher one (a climb that is only the return from a helper is not one)."""
    return collections.Counter(
        (caller, callee)
        for callee, caller in pairs
        if caller != callee and caller in reach.get(callee, ())
    )


def report(pairs: list[list[str]], reach: Mapping[str, set[str]]) -> dict:
    calls = [callee for callee, _ in pairs]
    seq = collapse(calls)
    up = climbs(seq, reach)
    back = upcalls(pairs, reach)
    return {
        "calls": len(calls),
        "modules": sorted(set(calls)),
        "transitions": seq,
        "climbs": sum(up.values()),
        "climb_counts": [[a, b, n] for (a, b), n in up.most_common()],
        "upcalls": sum(back.values()),
        "upcall_counts": [[a, b, n] for (a, b), n in back.most_common()],
        "trace": pairs,  # [callee module, caller module] of each call
    }


def measure(repo: Path, op: str = "softmax", extra_env: Mapping[str, str] | None = None) -> dict:
    """Cold then warm get of ``op`` from checkout ``repo`` in one private cache, each traced in its own child."""
    repo = repo.resolve()
    if not (repo / "jitops" / "__init__.py").is_file():
        raise SystemExit(
            f"get_path: {repo} holds no jitops/ package: pass --repo a jitops checkout"
        )
    reach = closure(graph(annotations=True, package=repo / "jitops"))
    with tempfile.TemporaryDirectory(prefix="jitops-get-path-") as tmp:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith("JITOPS_") and k != "PYTHONPATH"
        }
        env.update(extra_env or {})
        env.update(
            JITOPS_CACHE_DIR=str(Path(tmp) / "cache"), JITOPS_STATE_DIR=str(Path(tmp) / "state")
        )
        runs = {name: report(trace(repo, op, env), reach) for name in ("cold", "warm")}
    return {"repo": str(repo), "op": op, **runs}


def table(result: dict, top: int = 0) -> str:
    lines = [f"repo {result['repo']}  op {result['op']}"]
    for name in ("cold", "warm"):
        r = result[name]
        lines.append(
            f"\n{name.upper()}: {r['calls']} calls, {len(r['modules'])} modules passed, "
            f"{len(r['transitions']) - 1} transitions, {r['climbs']} climbs "
            f"({len(r['climb_counts'])} distinct)"
        )
        lines.append(
            "  modules: " + " ".join(m.removeprefix("jitops.") or "jitops" for m in r["modules"])
        )
        for a, b, n in r["climb_counts"][: top or None]:
            lines.append(f"  {n:4d}  {a} -> {b}")
        if top and len(r["climb_counts"]) > top:
            rest = r["climb_counts"][top:]
            lines.append(
                f"  ....  {len(rest)} more distinct climbs, {sum(n for *_, n in rest)} in all"
            )
        lines.append(f"  upcalls (a call from A into B where B imports A): {r['upcalls']}")
        for a, b, n in r["upcall_counts"][: top or None]:
            lines.append(f"  {n:4d}  {a} => {b}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, required=True, help="a checkout holding jitops/")
    ap.add_argument("--op", default="softmax")
    ap.add_argument("--json", type=Path, help="write everything (sequences included) here")
    ap.add_argument(
        "--top", type=int, default=0, help="climbs listed per run (0: all; all go to --json)"
    )
    args = ap.parse_args(argv)
    result = measure(args.repo, args.op)
    print(table(result, args.top))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
