"""Child programs for the bundle tier (tests/test_bundles.py): ``jitops.get("add")`` in a fresh process whose
path holds an installed bundle, audited (processes started, what got mapped).

Imports nothing of jitops at its top: the function imports what it needs, after the environment is set.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

SPAWNS = ("subprocess.Popen", "os.posix_spawn", "os.exec", "os.fork", "os.forkpty", "os.system")


def _audit_spawns() -> list[list[str]]:
    """From now on, each process this one starts: the audit event and its argv (filled in as they happen)."""
    spawned: list[list[str]] = []

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in SPAWNS:
            argv = args[1] if event in ("subprocess.Popen", "os.posix_spawn", "os.exec") else ()
            spawned.append([event, *map(str, argv or ())])

    sys.addaudithook(hook)
    return spawned


def _mapped(root: str) -> set[str]:
    """The files under ``root`` this process has mapped (/proc/self/maps)."""
    return {
        line.split()[-1]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if line.split() and line.split()[-1].startswith(root)
    }


def get_add(bundle_root: str) -> dict[str, Any]:
    """``jitops.get("add")``; (the error, or the loaded entry, whether it built, its bits against torch.add), the
    processes started, whether any file under ``bundle_root`` was mapped, the bundles this process found."""
    import torch

    import jitops
    from jitops.loading import loader
    from jitops.store import bundles

    # each process started: its argv (a compiler's --version probe is no build)
    spawned = _audit_spawns()
    out: dict[str, Any] = {}
    try:
        op = jitops.get("add")
    except Exception as e:  # noqa: BLE001 - the test reads it
        out["error"] = {
            "type": type(e).__name__,
            "mro": [c.__name__ for c in type(e).__mro__],
            "msg": str(e),
        }
    else:
        g = torch.Generator().manual_seed(31)
        same = []
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            a, b = (
                torch.randn(4099, generator=g).to(dtype),
                torch.randn(4099, generator=g).to(dtype),
            )
            mine, theirs = op(a, b, alpha=0.5), torch.add(a, b, alpha=0.5)
            same.append(
                mine.dtype == theirs.dtype
                and mine.view(torch.uint8).equal(theirs.view(torch.uint8))
            )
        out["bit_identical"] = same
        (lib,) = loader._libraries.values()
        out["entry"], out["built"] = str(lib.entry), lib.built
    out["mapped_from_bundle"] = sorted(_mapped(bundle_root))
    out["spawned"] = spawned
    out["bundles"] = [b.name for b in bundles.found()]
    from jitops.api import warm

    # `jitops explain add`, `doctor --offline-ready add`
    from jitops.cli.explain import (
        explain,
        offline_ready,
    )
    from jitops.registry import lookup

    ((_, ready, why),) = offline_ready(["add"])
    out["offline_ready"] = [ready, why]
    (warmed,) = warm.warm(warm.tasks_for([lookup("add")], ["cpu"]), jobs=1)  # `jitops warm add`
    out["warm"] = [warmed.status, warmed.message]

    ex = explain(lookup("add"))
    out["explain"] = {
        "verdict": ex.verdict,
        "ready": ex.ready,
        "nearest": str(ex.nearest) if ex.nearest else None,
        "diffs": [d[0] for d in ex.diffs],
    }
    return out


def get_every_op(bundle_root: str) -> dict[str, Any]:
    """``jitops.get`` of softmax, log_softmax, add and nms (frozen: a build would raise): per op, whether it matches
    torch's op (nms: jitops's Python reference, torchvision's formulas) bit for bit, whether it was built, its time
    per call and the baseline's; the processes started; what got mapped from ``bundle_root``."""
    import time

    import torch

    import jitops

    spawned = _audit_spawns()

    def per_call(fn: Any, *args: Any, **kw: Any) -> float:
        fn(*args, **kw)
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(20):
                fn(*args, **kw)
            best = min(best, (time.perf_counter() - t) / 20)
        return best

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and a.view(torch.uint8).equal(b.view(torch.uint8))
        )

    g = torch.Generator().manual_seed(31)
    x = torch.randn(64, 4099, generator=g)
    boxes = torch.rand(500, 4, generator=g) * 100
    boxes[:, 2:] += boxes[:, :2]
    scores = torch.rand(500, generator=g)
    out: dict[str, Any] = {}
    try:
        softmax, log_softmax, add, nms = (
            jitops.get(n) for n in ("softmax", "log_softmax", "add", "nms")
        )
    except Exception as e:  # noqa: BLE001 - the test reads it
        out["error"] = {
            "type": type(e).__name__,
            "mro": [c.__name__ for c in type(e).__mro__],
            "msg": str(e),
        }
    else:
        from jitops.kernels.nms.python import nms_reference

        b = torch.randn(64, 4099, generator=g)
        cases = {
            "softmax": (softmax, torch.softmax, (x, 1)),
            "log_softmax": (log_softmax, torch.log_softmax, (x, 1)),
            "add": (add, torch.add, (x, b)),
            "nms": (nms, nms_reference, (boxes, scores, 0.5)),
        }
        for name, (mine, theirs, args) in cases.items():
            out[name] = {
                "bit_identical": same(mine(*args), theirs(*args)),
                "built": mine.library.built,
                "entry": str(mine.library.entry),
                "seconds": per_call(mine, *args),
                "baseline_seconds": per_call(theirs, *args),
            }
    out["mapped_from_bundle"] = sorted(_mapped(bundle_root))
    out["spawned"] = spawned
    out["jitops_file"] = jitops.__file__
    return out


def other_torch(bundle_root: str) -> dict[str, Any]:
    """Under another torch than the bundle's (the torch-versions leg, .ci/torch-versions.sh): ``jitops explain add``
    before any use (the nearest entry is the bundle's; what differs), then :func:`get_add` (built here, never
    mapped from the bundle); then, under ``jitops.freeze()``, :func:`get_stable_nms` (nms's CPU build is on the
    stable ABI: the bundle's entry serves this torch too)."""
    from jitops.cli.explain import explain
    from jitops.registry import lookup

    before = explain(lookup("add"))
    out = get_add(bundle_root)
    out["before"] = {
        "ready": before.ready,
        "verdict": before.verdict,
        "nearest": str(before.nearest or ""),
        "diffs": [d[0] for d in before.diffs],
    }
    out["nms"] = get_stable_nms(bundle_root)
    return out


def get_stable_nms(bundle_root: str) -> dict[str, Any]:
    """``jitops.get("nms")`` with builds forbidden (``jitops.freeze()``): the error, or whether it was built, the
    files mapped from ``bundle_root`` that were not mapped before, the processes started, and whether its indices
    equal jitops's Python reference (torchvision's formulas) for float32, float64, float16, under autocast
    (bfloat16), and for quint8."""
    import torch

    import jitops
    from jitops.kernels.nms.python import nms_reference

    already = _mapped(bundle_root)
    spawned = _audit_spawns()
    out: dict[str, Any] = {}
    jitops.freeze()
    try:
        nms = jitops.get("nms")
    except Exception as e:  # noqa: BLE001 - the leg reads it
        out["error"] = {"type": type(e).__name__, "msg": str(e)}
    else:
        g = torch.Generator().manual_seed(31)
        boxes = torch.rand(800, 4, generator=g) * 100
        boxes[:, 2:] += boxes[:, :2]
        scores = torch.rand(800, generator=g)
        same = [
            nms(boxes.to(d), scores.to(d), 0.5).tolist()
            == nms_reference(boxes.to(d), scores.to(d), 0.5).tolist()
            for d in (torch.float32, torch.float64, torch.float16)
        ]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            b16, s16 = boxes.bfloat16(), scores.bfloat16()
            same.append(nms(b16, s16, 0.5).tolist() == nms_reference(b16, s16, 0.5).tolist())
        qb = torch.quantize_per_tensor(boxes, 0.5, 3, torch.quint8)
        qs = torch.quantize_per_tensor(scores, 0.01, 0, torch.quint8)
        same.append(nms(qb, qs, 0.5).tolist() == nms_reference(qb, qs, 0.5).tolist())
        out.update(same_as_reference=same, built=nms.library.built, entry=str(nms.library.entry))
    finally:
        jitops.unfreeze()
    out["mapped_from_bundle"] = sorted(_mapped(bundle_root) - already)
    out["spawned"] = spawned
    return out


def get_nms_here() -> dict[str, Any]:
    """``jitops.get("nms")`` (the caller sets ATEN_CPU_CAPABILITY and JITOPS_FREEZE): the CPU ISA torch dispatches to,
    whether the library was built, its entry, and whether its indices equal the Python reference's."""
    import torch

    import jitops
    from jitops.kernels.nms.python import nms_reference

    g = torch.Generator().manual_seed(5)
    boxes = torch.rand(300, 4, generator=g) * 50
    boxes[:, 2:] += boxes[:, :2]
    scores = torch.rand(300, generator=g)
    op = jitops.get("nms")
    return {
        "capability": str(torch.backends.cpu.get_cpu_capability()),
        "built": op.library.built,
        "entry": str(op.library.entry),
        "same_as_reference": op(boxes, scores, 0.5).tolist()
        == nms_reference(boxes, scores, 0.5).tolist(),
    }


def load_nms_cuda(arch: str) -> dict[str, Any]:
    """nms's CUDA library for ``arch`` loaded (not run: the caller may have no GPU), as a GPU of that arch plans it:
    whether it was built, its entry and target, or the JitopsError's type and message (the caller sets JITOPS_FREEZE
    and what compilers there are)."""
    from jitops import JitopsError, registry
    from jitops.loading.loader import load_library

    try:
        lib = load_library(registry.lookup("nms"), "cuda", arch)
    except JitopsError as e:
        return {"ok": False, "type": type(e).__name__, "msg": str(e)}
    return {"ok": True, "built": lib.built, "entry": str(lib.entry), "target": lib.target}
