"""Where the CPU of a stable-ABI kernel's cold build and compile error goes: jitops against tvm-ffi.

For the steps of the edit loop that stay close to tvm-ffi's time with both cores busy, this splits
each step's time into the loading process's own CPU (``time.process_time``) and its children's
(compilers, the build supervisor: ``getrusage(RUSAGE_CHILDREN)``, counted as they are reaped), and
jitops's own CPU by what it does before and after its compiler runs. With the cores busy a step's
time follows the CPU it needs, so these show what a ratio below 1.0 is made of.

Each session is a fresh process with fresh caches, build folders and state dir (as in
``notebook_loop.py``): ``import`` of the loader and the cold build of ``notebook_loop.py``'s
one-function stable kernel, then (``--edits N``) N edits of its constant, then the kernel with a
syntax error. Rounds interleave the two
loaders; ``busy`` runs one CPU-bound process per core, each in a session of its own.

jitops's phases (its own CPU only): ``compiler`` (asking the C++ compiler its version, ``-###``,
its linker, and hashing the programs it runs: the key's defence against a switched compiler),
``bundles`` (looking for installed bundles), ``digests`` (hashing every file the build read, for
the entry's proof of inputs), ``load`` (loading the library) and ``rest`` (imports, planning, the
key, staging and publishing).

jitops's background PCH is off unless ``--pch``: the child it starts after a build is not a
child the process reaps, so its CPU is in no column; with ``--pch`` the steps show its effect.

Usage: ``python benchmarks/step_cpu.py [--conditions idle,busy] [--rounds N] [--pch] [--edits N]
[--out FILE.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmeta import as_installed, start, tee, write  # noqa: E402
from notebook_loop import _end_background, busy_loops, session_env, sources  # noqa: E402

LOADERS = ("jitops", "tvm-ffi")
STEPS = ("cold", "error")
# phase -> (module, attribute) of the jitops function whose own CPU it is
PHASES = {
    "compiler": [("jitops.target.toolchain", "_ask"), ("jitops.target.toolchain", "programs")],
    "bundles": [("jitops.store.bundles", "installed")],
    "digests": [("jitops.store.inputs", "record"), ("jitops.store.inputs", "after_build")],
    "load": [("jitops.loading.loader", "_load_into_process")],
}

CHILD = r"""
import importlib, json, os, resource, sys, time
import torch
loader, phases = sys.argv[1], json.loads(sys.argv[3])
texts = json.loads(sys.argv[2])  # [[step, offset, source], ...] in order
x = torch.arange(4, dtype=torch.float32)
spent = {name: 0.0 for name in phases}

def children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime

def timed(name, fn):
    def wrapper(*a, **k):
        c = time.process_time()
        try:
            return fn(*a, **k)
        finally:
            spent[name] += time.process_time() - c
    return wrapper

def load(text):
    if loader == "jitops":
        import jitops
        return jitops.load_inline("nb_scale", text).scale(x, 2.0)
    import tvm_ffi.cpp
    y = torch.empty_like(x)
    tvm_ffi.cpp.load_inline("nb_scale", cpp_sources=text, functions=["scale"]).scale(x, y, 2.0)
    return y

out = {}
for step, offset, text in texts:
    w, c, ch = time.perf_counter(), time.process_time(), children()
    if step == "cold":
        if loader == "jitops":
            import jitops
            for name, places in phases.items():  # nested phases are not used: no double count
                for mod, attr in places:
                    m = importlib.import_module(mod)
                    setattr(m, attr, timed(name, getattr(m, attr)))
        else:
            import tvm_ffi.cpp
    try:
        y = load(text)
    except Exception:
        if step != "error":
            raise
    else:
        if step == "error":
            raise SystemExit("the broken source built")
        assert torch.equal(y, x * 2 + offset), (step, y)
    out[step] = {"wall": time.perf_counter() - w, "self": time.process_time() - c,
                 "children": children() - ch}
    if step == "cold" and loader == "jitops":
        out[step]["phases"] = dict(spent)
print(json.dumps(out))
"""


def session(loader: str, base: dict[str, str], pch: bool, edits: int = 0) -> dict[str, dict]:
    """One fresh process and fresh caches: its cold build and compile error, each split."""
    steps = ["cold", *(f"edit {k}" for k in range(1, edits + 1)), "error"]
    texts = [
        [step, k, sources("stable", loader, k, broken=step == "error")["inline"]]
        for k, step in enumerate(steps)
    ]
    phases = PHASES if loader == "jitops" else {}
    with tempfile.TemporaryDirectory(prefix="step-cpu-") as tmp:
        env = dict(
            base,
            JITOPS_CACHE_DIR=os.path.join(tmp, "jitops-cache"),
            JITOPS_STATE_DIR=os.path.join(tmp, "jitops-state"),
            TVM_FFI_CACHE_DIR=os.path.join(tmp, "tvm"),
        )
        if not pch:  # no background PCH after the cold build (its CPU is no child's: not counted)
            env["JITOPS_PCH"] = "0"
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, loader, json.dumps(texts), json.dumps(phases)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        _end_background(Path(env["JITOPS_CACHE_DIR"]))  # sessions must not overlap
    if proc.returncode != 0:
        raise SystemExit(f"{loader} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(runs: list[dict]) -> None:
    med = statistics.median
    for cond in dict.fromkeys(r["condition"] for r in runs):
        print(f"\n{cond}: median over {sum(r['condition'] == cond for r in runs) // 2} rounds")
        print(f"{'step':<7}{'loader':<9}{'wall s':>8}{'own CPU s':>11}{'children s':>12}")
        for step in STEPS:
            walls = {}
            for loader in LOADERS:
                got = [
                    r["steps"][step]
                    for r in runs
                    if (r["condition"], r["loader"]) == (cond, loader)
                ]
                walls[loader] = med(g["wall"] for g in got)
                print(
                    f"{step:<7}{loader:<9}{walls[loader]:>8.3f}{med(g['self'] for g in got):>11.3f}"
                    f"{med(g['children'] for g in got):>12.3f}"
                )
            print(f"{'':<7}tvm-ffi / jitops: {walls['tvm-ffi'] / walls['jitops']:.2f}")
        cold = [
            r["steps"]["cold"] for r in runs if (r["condition"], r["loader"]) == (cond, "jitops")
        ]
        parts = {p: med(c["phases"][p] for c in cold) for p in PHASES}
        parts["rest"] = med(c["self"] - sum(c["phases"].values()) for c in cold)
        print("jitops's own CPU in the cold step, by phase (s): " + ", ".join(
            f"{p} {v:.3f}" for p, v in parts.items()))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conditions", default="idle,busy")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--pch", action="store_true", help="leave jitops's background PCH on")
    ap.add_argument(
        "--edits", type=int, default=0, help="edits between the cold build and the error"
    )
    a = ap.parse_args(argv)
    as_installed()
    base = session_env()
    meta = start(a.conditions)
    runs: list[dict] = []
    with tee() as printed:
        for cond in a.conditions.split(","):
            loops = busy_loops(os.cpu_count() or 1) if cond == "busy" else []
            try:
                for rnd in range(a.rounds):
                    for loader in LOADERS:
                        steps = session(loader, base, a.pch, a.edits)
                        runs.append(dict(condition=cond, round=rnd, loader=loader, steps=steps))
                        walls = "  ".join(f"{s} {v['wall']:.3f}" for s, v in steps.items())
                        print(f"  {cond} round {rnd + 1} {loader:<8}{walls}", flush=True)
            finally:
                for p in loops:
                    p.kill()
                    p.wait()
        report(runs)
    if a.out:
        write(a.out, "step_cpu", meta, runs, printed.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
