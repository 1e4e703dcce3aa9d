"""The checks of the CUDA leg (run by .ci/cuda-leg.sh inside the CUDA torch venv).

1. Build every builtin library for the arch list: through `jitops warm --all
   --device cuda --arch LIST` where the CLI exists, else through the loader.
2. For each entry, every nvcc command in its build log carries exactly the
   -gencode flags jitops computed, `cuobjdump --list-elf` lists exactly the
   requested SASS archs and `--list-ptx` exactly the requested PTX.
3. Each library loads in a fresh process that sees no GPU, and each of its
   ops that has a CPU kernel has a CUDA kernel registered with the dispatcher.

4. One small kernel on torch's stable ABI (tests/data/stable_cuda): built for the arch list, its
nvcc commands and SASS checked as above, its dependencies on torch only the C shim's library (no
libtorch_cuda, no c10_cuda), loaded without a GPU with its op's CUDA kernel registered.

Prints a table of build times. Exits non-zero on the first failed check.

``--load-stable`` (run by .ci/torch-versions.sh under another CUDA build of torch, pointed at this
leg's cache): only step 4's offline load, with no GPU: the entry built under this leg's torch
serves that torch with no build. Prints the child's report as JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import jitops.build.entry as jentry  # noqa: E402
import jitops.plan as jplan  # noqa: E402
import jitops.registry as jregistry  # noqa: E402
from jitops.target import choose_target, probe  # noqa: E402
from jitops.target.archs import arch_gencode_flags, ptx_archs, sass_archs  # noqa: E402
from jitops.errors import OfflineMiss  # noqa: E402
from jitops.spec import OpSpec  # noqa: E402


def fail(msg: str) -> None:
    print(f"cuda-leg: FAILED: {msg}", flush=True)
    raise SystemExit(1)


def warm(archs: str) -> float:
    """Build every library for cuda; returns the wall time."""
    start = time.monotonic()
    if importlib.util.find_spec("jitops.cli") is not None:
        cmd = [sys.executable, "-m", "jitops", "warm", "--all", "--device", "cuda", "--arch", archs]
        print("$ " + " ".join(cmd[2:]), flush=True)
        if subprocess.run(cmd, cwd=REPO).returncode != 0:
            fail("`jitops warm` failed (its output is above)")
    else:
        print(
            "(jitops.cli is not in this tree yet: building through entry.ensure_entry)", flush=True
        )
        for spec in cuda_specs():
            t = time.monotonic()
            jentry.ensure_entry(jplan.make_plan(spec, "cuda", archs))
            print(f"  built {spec.name} in {time.monotonic() - t:.1f}s", flush=True)
    return time.monotonic() - start


def cuda_specs() -> list[OpSpec]:
    return [s for s in jregistry.registry().specs() if s.cuda_sources]


def listed(cuobjdump: str, flag: str, lib: Path) -> set[str]:
    """The archs of the ELF (``--list-elf``) or PTX (``--list-ptx``) files in ``lib``."""
    proc = subprocess.run([cuobjdump, flag, str(lib)], capture_output=True, text=True, timeout=120)
    text = proc.stdout + proc.stderr
    if proc.returncode != 0 and "No PTX file found" not in text and "No ELF file found" not in text:
        fail(f"{cuobjdump} {flag} {lib} exited {proc.returncode}:\n{text}")
    # "ELF file    1: softmax_cuda.sm_80.cubin", "PTX file    1: softmax_cuda.sm_90.ptx"
    if flag == "--list-elf":
        return {"sm_" + m.group(1) for m in re.finditer(r"\.sm_(\d+[af]?)\.cubin\b", text)}
    return {"compute_" + m.group(1) for m in re.finditer(r"\.sm_(\d+[af]?)\.ptx\b", text)}


def check_nvcc_flags(spec: OpSpec, build_log: str, want: tuple[str, ...]) -> None:
    """Every nvcc command (ninja -v echoes build.ninja's) carries exactly jitops's -gencode flags."""
    commands = [ln for ln in build_log.splitlines() if re.search(r"/nvcc\s", ln)]
    if len(commands) < len(spec.cuda_sources):
        fail(
            f"{spec.name}: {len(commands)} nvcc commands in the build log for {len(spec.cuda_sources)} .cu files"
        )
    for cmd in commands:
        got = [
            w
            for w in cmd.split()
            if w.startswith(("-gencode", "-arch", "--gpu-architecture", "-code"))
        ]
        if got != list(want):
            fail(f"{spec.name}: nvcc got arch flags {got}, jitops computed {list(want)}:\n{cmd}")


_CHILD = """
import json, sys, torch
sys.path.insert(0, {repo!r})
from jitops.loading import loader
import jitops.build.entry as jentry
import jitops.plan as jplan
import jitops.registry as jregistry
spec = jregistry.registry().library({lib!r})
lib = loader.load_library(spec, "cuda", {archs!r})
has = torch._C._dispatch_has_kernel_for_dispatch_key
print(json.dumps({{
    "gpu": torch.cuda.is_available(),
    "namespace": lib.namespace,
    "kernels": {{op: [k for k in ("CPU", "CUDA") if has(lib.namespace + "::" + op, k)] for op in {ops!r}}},
}}))
"""


def op_names(spec: OpSpec) -> list[str]:
    """``add``, ``add.out``, ``softmax_backward``, ...: every op (overload) the library defines."""
    return [s.split("(", 1)[0].strip() for s in spec.schemas] or list(spec.exports)


def check_loads_without_gpu(spec: OpSpec, archs: str) -> float:
    """Every op with a CPU kernel also has a CUDA one (ops with neither are composite, e.g. backward formulas)."""
    start = time.monotonic()
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", JITOPS_OFFLINE="1")  # no GPU; load, never build
    code = textwrap.dedent(
        _CHILD.format(repo=str(REPO), lib=spec.name, archs=archs, ops=op_names(spec))
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        fail(
            f"loading {spec.name} in a process without a GPU failed:\n{proc.stdout}\n{proc.stderr}"
        )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if report["gpu"]:
        fail("the load check must run without a GPU, but torch.cuda.is_available() was True")
    kernels: dict[str, list[str]] = report["kernels"]
    device_ops = [op for op, keys in kernels.items() if keys]
    missing = [op for op in device_ops if "CUDA" not in kernels[op]]
    if not device_ops or missing:
        fail(
            f"{spec.name} ({report['namespace']}): no CUDA kernel registered for "
            f"{', '.join(missing or kernels)}; kernels by op: {kernels}"
        )
    print(
        f"  load  {spec.name}: CUDA kernels registered for {', '.join(device_ops)} (no GPU visible)",
        flush=True,
    )
    return time.monotonic() - start


STABLE_KERNEL = REPO / "tests" / "data" / "stable_cuda" / "scale_cuda.cu"
_STABLE_CHILD = """
import json, sys, time, torch
sys.path.insert(0, {repo!r})
import jitops
start = time.monotonic()
lib = jitops.load("stable_cuda_scale", [{src!r}], device="cuda")
has = torch._C._dispatch_has_kernel_for_dispatch_key
op = lib.library.namespace + "::scale"
print(json.dumps({{
    "gpu": torch.cuda.is_available(),
    "seconds": time.monotonic() - start,
    "built": lib.library.built,
    "target": lib.library.target,
    "library": str(lib.library.library_path),
    "build_log": lib.library.manifest.build_log,
    "kernels": [k for k in ("CPU", "CUDA") if has(op, k)],
}}))
"""


def stable_child(archs: str, offline: bool) -> dict:
    """Load the stable kernel in a process that sees no GPU (``offline``: never building), its
    report."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TORCH_CUDA_ARCH_LIST=archs)
    if offline:
        env["JITOPS_OFFLINE"] = "1"
    code = textwrap.dedent(_STABLE_CHILD.format(repo=str(REPO), src=str(STABLE_KERNEL)))
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        step = "load" if offline else "build"
        fail(f"the stable CUDA kernel ({step}):\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_stable(archs: str, cuobjdump: str) -> tuple[str, str, float, int, float]:
    """Build the stable kernel for ``archs``, check its nvcc flags, SASS and dependencies, then load
    it in a second process without a GPU (offline) and check its op has a CUDA kernel (and only
    that)."""
    from jitops.build import stable

    built = stable_child(archs, offline=False)
    if not built["built"]:
        fail(
            f"the stable kernel was not built here (a fresh cache was expected): {built['library']}"
        )
    spec = OpSpec(
        name="stable_cuda_scale",
        root=STABLE_KERNEL.parent,
        cpu_sources=(),
        cuda_sources=(STABLE_KERNEL.name,),
    )
    target = choose_target(probe(cuda=False), "cuda", archs)
    want = arch_gencode_flags(target.archs)
    check_nvcc_flags(spec, built["build_log"], want)
    lib = Path(built["library"])
    got = listed(cuobjdump, "--list-elf", lib), listed(cuobjdump, "--list-ptx", lib)
    if got != (set(sass_archs(target.archs)), set(ptx_archs(target.archs))):
        fail(f"{lib}: cuobjdump lists {got}; expected exactly SASS {sass_archs(target.archs)}")
    dynamic = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True)
    needed = set(re.findall(r"\(NEEDED\).*\[(.+)\]", dynamic.stdout))
    if dynamic.returncode == 0 and (
        {n for n in needed if "torch" in n or "c10" in n} != {f"lib{stable.SHIM_LIBRARY}.so"}
        or not any(n.startswith("libcudart.so") for n in needed)
    ):
        fail(f"{lib} needs {sorted(needed)}: of torch only lib{stable.SHIM_LIBRARY}.so, and cudart")
    print(f"  nvcc  stable_cuda_scale: exactly {' '.join(want)}", flush=True)
    print(f"  elf   stable_cuda_scale ({built['target']}): {', '.join(sorted(got[0]))}", flush=True)
    print(f"  deps  stable_cuda_scale: {', '.join(sorted(needed))}", flush=True)
    loaded = stable_child(archs, offline=True)
    if loaded["gpu"] or loaded["built"] or loaded["kernels"] != ["CUDA"]:
        fail(f"the stable kernel loaded without a GPU should have a CUDA kernel only: {loaded}")
    print(
        "  load  stable_cuda_scale: CUDA kernel registered for scale (no GPU visible)", flush=True
    )
    return (
        "stable_cuda_scale",
        built["target"],
        built["seconds"],
        lib.stat().st_size,
        loaded["seconds"],
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="8.0,9.0")
    p.add_argument("--cuobjdump")
    p.add_argument(
        "--load-stable", action="store_true", help="only the stable kernel's offline load"
    )
    args = p.parse_args(argv)
    if args.load_stable:
        loaded = stable_child(args.arch, offline=True)
        print(json.dumps(loaded))
        if loaded["gpu"] or loaded["built"] or loaded["kernels"] != ["CUDA"]:
            fail(f"the stable kernel loaded without a GPU should have a CUDA kernel only: {loaded}")
        return 0
    if not args.cuobjdump:
        p.error("--cuobjdump is required")

    warm_s = warm(args.arch)
    rows = []
    for spec in cuda_specs():
        plan = jplan.make_plan(spec, "cuda", args.arch)
        try:
            # warm built it; offline: never build here
            entry = jentry.ensure_entry(plan, offline=True)
        except OfflineMiss as e:
            fail(f"the warm step left no {plan.target.name} entry for {spec.name}: {e}")
        lib = entry.path / entry.manifest.library_file
        check_nvcc_flags(spec, entry.manifest.build_log, arch_gencode_flags(plan.target.archs))
        want_elf, want_ptx = set(sass_archs(plan.target.archs)), set(ptx_archs(plan.target.archs))
        got_elf, got_ptx = (
            listed(args.cuobjdump, "--list-elf", lib),
            listed(args.cuobjdump, "--list-ptx", lib),
        )
        if got_elf != want_elf or got_ptx != want_ptx:
            fail(
                f"{lib}: cuobjdump lists SASS {sorted(got_elf)} and PTX {sorted(got_ptx)}; "
                f"expected exactly SASS {sorted(want_elf)} and PTX {sorted(want_ptx)}"
            )
        print(
            f"  nvcc  {spec.name}: exactly {' '.join(arch_gencode_flags(plan.target.archs))}",
            flush=True,
        )
        print(
            f"  elf   {spec.name} ({plan.target.name}): {', '.join(sorted(got_elf))}"
            f"{'; ptx ' + ', '.join(sorted(got_ptx)) if got_ptx else ''}",
            flush=True,
        )
        load_s = check_loads_without_gpu(spec, args.arch)
        rows.append(
            (spec.name, plan.target.name, entry.manifest.build_seconds, lib.stat().st_size, load_s)
        )

    warmed = len(rows)
    rows.append(check_stable(args.arch, args.cuobjdump))

    print("\nlibrary            target              build_s   size_MiB  load_check_s")
    for name, target, build_s, size, load_s in rows:
        print(f"{name:<18} {target:<19} {build_s:>7.1f}  {size / 2**20:>9.2f}  {load_s:>12.1f}")
    jobs = os.environ.get("MAX_JOBS", "auto")
    print(f"warm wall time {warm_s:.1f}s for {warmed} libraries (MAX_JOBS={jobs})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
