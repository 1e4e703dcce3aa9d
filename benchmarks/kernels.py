"""Kernel benchmarks: jitops ops against torch (and torchvision's nms when importable).

Run from the repository root::

    python benchmarks/kernels.py                  # CPU
    python benchmarks/kernels.py --device cuda    # GPU: issue 12's table
    python benchmarks/kernels.py --quick ...      # one shape per class (a smoke run)

The timing and the tables come from :mod:`jitops.bench` (also behind
``jitops bench OP``), so the script and the command measure the same way.

CPU: one line per case: median times and the speed ratio (torch time / jitops
time, so > 1 means jitops is faster; the median of ratios taken in
interleaved rounds, see ``jitops.bench.interleaved``). "alloc" cases allocate
the output on every call; "prealloc" cases write into an existing buffer
(torch._softmax / torch._log_softmax out=, torch.add out=, jitops add out=).
jitops softmax has no out= variant: the issue's schema is functional, so its
softmax rows are allocating only (torch's prealloc row is printed for
reference). "fwd+bwd" rows run the forward and ``torch.autograd.grad`` every
call.

CUDA: first the device-to-device copy bandwidth, then Markdown tables: each
softmax/log_softmax case of issue 12 (forward and backward, float32 and
bfloat16) against torch eager and torch.compile (inductor), and nms against
torchvision. Each side is timed alone with ``triton.testing.do_bench`` (L2
flushed, median) or, without triton, ``torch.utils.benchmark``. A case whose
result differs from torch's, or that fails, is marked; the script then exits 1.

Per call (``--mode per-call`` alone; ``all``, the default, runs it first): what one call of a
1x8 float32 softmax and add costs through jitops's ``Op``, through its raw ``torch.ops`` packet and
as torch's own op, the best of 25 blocks of 2,000 calls (on CUDA, synchronized at each block's end):
the dispatch overhead a small op pays, not the kernel.

``--out FILE.json`` writes the figures with the device and the run's conditions
(``benchmarks/benchmeta.py``); ``docs/gen_bench.py`` makes the CPU, GPU and per-call pages from
such files.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchmeta  # noqa: E402

import torch  # noqa: E402

import jitops  # noqa: E402
from jitops import bench  # noqa: E402
from jitops.bench.bench_ops import (
    SOFTMAXES,
    call,
    nms_case,
    random_boxes,
    softmax_case,
    torchvision_nms,
)  # noqa: E402

# (shape, dim): issue 12's cases, and one per kernel class for --quick (last dim; a dim before it)
GPU_SHAPES = [
    ((4096, 4096), -1),
    ((65536, 128), -1),
    ((128, 65536), -1),
    ((16384, 1000), -1),
    ((4096, 50257), -1),
    ((4096, 4096), 0),
    ((64, 512, 256), 1),
]
QUICK_SHAPES = [((4096, 4096), -1), ((64, 512, 256), 1)]
NMS_SIZES, QUICK_NMS = (1000, 5000, 20000, 50000), (1000, 20000)
# CPU against torch.compile too: each case compiles its own graph, so a few shapes (one per class)
CPU_COMPILE_SHAPES = [((2048, 2048), -1), ((64, 512, 256), 1)]

Rows = list[dict[str, Any]]  # what --out keeps of each measured case (a jitops.bench.Row as a dict)


# ------------------------------------------------------------------ CPU


def row(
    label: str, ours: Callable[[], Any], theirs: Callable[[], Any], against: str, out: Rows
) -> None:
    (a, b), (ratio,), _ = bench.interleaved([ours, theirs])
    print(
        f"{label:46s} jitops {a * 1e3:9.3f} ms   {against} {b * 1e3:9.3f} ms   ratio {ratio:5.2f}x",
        flush=True,
    )
    out.append({"label": label, "times": {"jitops": a, against: b}, "ratios": {against: ratio}})


def per_call(device: str) -> Rows:
    """Seconds per call of a 1x8 float32 softmax and add: jitops's Op, its raw torch.ops packet,
    torch's own op (the best of 25 blocks of 2,000 calls, after 2,000 to warm up)."""
    x, y = torch.randn(1, 8, device=device), torch.randn(1, 8, device=device)
    cases: dict[tuple[str, str, str], Callable[[], Any]] = {}
    for name, args, native in (
        ("softmax", (x, -1), torch.softmax),
        ("add", (x, y), torch.add),
    ):
        op = jitops.get(name, device=device)
        raw = getattr(getattr(torch.ops, op.namespace), name)
        cases[(name, "jitops", "jitops Op")] = lambda op=op, args=args: op(*args)
        cases[(name, "torch.ops packet", f"torch.ops.<ns>.{name}")] = lambda raw=raw, args=args: (
            raw(*args)
        )
        cases[(name, "torch", f"torch.{name}")] = lambda native=native, args=args: native(*args)
    out: Rows = []
    for (name, side, how), fn in cases.items():
        for _ in range(2000):
            fn()
        bench.sync(device)
        best = float("inf")
        for _ in range(25):
            t0 = time.perf_counter()
            for _ in range(2000):
                fn()
            bench.sync(device)
            best = min(best, (time.perf_counter() - t0) / 2000)
        print(
            f"per call, 1x8 float32 on {device}, {name:8s} {how:24s} {best * 1e6:6.2f} us",
            flush=True,
        )
        out.append({"op": name, "side": side, "call": how, "seconds": best})
    return out


def softmaxes(quick: bool, out: Rows) -> None:
    for name, torch_fn, torch_out in (
        ("softmax", torch.softmax, torch._softmax),
        ("log_softmax", torch.log_softmax, torch._log_softmax),
    ):
        op = jitops.get(name)
        for shape in ((4096, 4096),) if quick else ((4096, 4096), (65536, 128), (128, 65536)):
            x = torch.randn(shape)
            buf = torch.empty_like(x)
            row(f"{name} {shape} alloc", lambda: op(x, -1), lambda: torch_fn(x, -1), "torch", out)
            t = bench.cpu_time(lambda: torch_out(x, -1, False, out=buf))
            print(
                f"{name} {str(shape) + ' prealloc (torch only)':36s} {'':22s} torch {t * 1e3:9.3f} ms"
            )
            out.append({"label": f"{name} {shape} prealloc (torch only)", "times": {"torch": t}})
        # Forward + backward (issue 12 asks for >= 1.0x torch here).
        x = torch.randn(2048, 2048)
        row(
            f"{name} (2048, 2048) fwd+bwd",
            call(op, [x], "fwd+bwd", dim=-1),
            call(torch_fn, [x], "fwd+bwd", dim=-1),
            "torch",
            out,
        )


def adds(quick: bool, rows: Rows) -> None:
    add = jitops.get("add")
    cases = {
        "(4096, 4096) + (4096, 4096)": (torch.randn(4096, 4096), torch.randn(4096, 4096)),
        "(4096, 4096) + (4096,) broadcast": (torch.randn(4096, 4096), torch.randn(4096)),
        "(1024, 1024) int64 + int64, alpha=3": (
            torch.randint(0, 9, (1024, 1024)),
            torch.randint(0, 9, (1024, 1024)),
        ),
        "(64, 64) + (64, 64) small": (torch.randn(64, 64), torch.randn(64, 64)),
    }
    for label, (a, b) in list(cases.items())[:1] if quick else cases.items():
        alpha = 3 if a.dtype == torch.int64 else 1
        row(
            f"add {label} alloc",
            lambda: add(a, b, alpha=alpha),
            lambda: torch.add(a, b, alpha=alpha),
            "torch",
            rows,
        )
        out = torch.empty_like(a)
        row(
            f"add {label} prealloc",
            lambda: add(a, b, alpha=alpha, out=out),
            lambda: torch.add(a, b, alpha=alpha, out=out),
            "torch",
            rows,
        )
    if quick:
        return
    # The floor for any op called through torch.ops: torch's own add kernel, reached the same way.
    a, b = cases["(64, 64) + (64, 64) small"]
    aten_add = torch.ops.aten.add.Tensor
    _, (ratio,), _ = bench.interleaved([lambda: aten_add(a, b), lambda: torch.add(a, b)])
    print(
        f"{'add (64, 64) small: torch.ops.aten.add.Tensor':46s} (torch's own kernel via torch.ops)  ratio {ratio:5.2f}x"
    )


def nmses(quick: bool, rows: Rows) -> None:
    nms = jitops.get("nms")
    theirs, against = torchvision_nms(), "torchvision"
    if theirs is None:  # not installed, or its C++ ops do not load with this torch
        theirs, against = jitops.reference("nms"), "reference"
    sizes = (1000,) if quick else (1000, 10000)
    if against == "reference" and not quick:
        # the pure-PyTorch reference runs its greedy pass in Python: a third of a second per call
        # at 1,000 boxes, minutes of rounds at 10,000
        sizes = (1000,)
        print("nms: torchvision not importable here; 1000 boxes only against the reference")
    for n in sizes:
        boxes, scores = random_boxes(n)
        assert torch.equal(nms(boxes, scores, 0.5), jitops.reference("nms")(boxes, scores, 0.5))
        row(
            f"nms {n} boxes, iou 0.5",
            lambda: nms(boxes, scores, 0.5),
            lambda: theirs(boxes, scores, 0.5),
            against,
            rows,
        )


def cpu_main(quick: bool, results: dict[str, Any]) -> int:
    """The CPU cases against torch eager, then softmax and log_softmax against torch.compile."""
    rows: Rows = results.setdefault("rows", [])
    softmaxes(quick, rows)
    adds(quick, rows)
    nmses(quick, rows)
    shapes = CPU_COMPILE_SHAPES[:1] if quick else CPU_COMPILE_SHAPES
    crows, failed = softmax_rows("cpu", shapes, [torch.float32], True)
    print("\n".join(bench.table(crows)), flush=True)
    rows += [dataclasses.asdict(r) for r in crows]
    results["failed"] = failed
    for line in failed:
        print(line, file=sys.stderr)
    return 1 if failed or any(r.note for r in crows) else 0


def device_name(device: str) -> str:
    """The GPU's name, or the CPU's model (from /proc/cpuinfo where there is one)."""
    if device == "cuda":
        return torch.cuda.get_device_name()
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ---------------------------------------------------- GPU (and any device: the tests run it on CPU)


def _eager(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    return lambda x, dim: fn(x, dim)


def _compiled(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    # A fresh compile per case: the lambdas share one code object, and dynamo's
    # per-code cache (and its automatic dynamic shapes) would otherwise mix the cases.
    torch._dynamo.reset()
    return torch.compile(_eager(fn), dynamic=False)


def softmax_rows(
    device: str,
    shapes: list[tuple[tuple[int, ...], int]],
    dtypes: list[torch.dtype],
    use_compile: bool,
    timing: bench.Timing = bench.Timing(),
    progress: Callable[[bench.Row], None] | None = None,
) -> tuple[list[bench.Row], list[str]]:
    """softmax and log_softmax, forward and backward: jitops vs torch eager (and torch.compile).
    ``progress`` sees each row as it is measured (a run cut short still shows what it measured)."""
    rows, failed = [], []
    for name, fn in SOFTMAXES.items():
        op = jitops.get(name, device=device)
        for shape, dim in shapes:
            for dtype in dtypes:
                for mode in ("forward", "backward"):
                    try:
                        x = torch.randn(shape, device=device).to(dtype)
                        sides = {"jitops": op, "eager": _eager(fn)}
                        if use_compile:
                            sides["compile"] = _compiled(fn)
                        case = softmax_case(name, x, dim, mode, sides, check_against="eager")
                        rows.append(bench.measure(case, device, timing))
                        if progress is not None:
                            progress(rows[-1])
                    except (
                        RuntimeError
                    ) as e:  # report it and go on: one broken case must not lose the run
                        failed.append(
                            f"FAILED {name} {shape} dim={dim} {dtype} {mode}: {str(e).splitlines()[0]}"
                        )
    return rows, failed


def nms_rows(
    device: str,
    sizes: tuple[int, ...],
    theirs: Callable[..., torch.Tensor],
    timing: bench.Timing = bench.Timing(),
    progress: Callable[[bench.Row], None] | None = None,
) -> tuple[list[bench.Row], list[str]]:
    """nms: jitops vs torchvision (``theirs``), the kept indices checked equal."""
    op, rows, failed = jitops.get("nms", device=device), [], []
    for n in sizes:
        try:
            case = nms_case(
                n, {"jitops": op, "torchvision": theirs}, device=device, check_against="torchvision"
            )
            rows.append(bench.measure(case, device, timing))
            if progress is not None:
                progress(rows[-1])
        except RuntimeError as e:
            failed.append(f"FAILED nms {n} boxes: {str(e).splitlines()[0]}")
    return rows, failed


def gpu_main(quick: bool, results: dict[str, Any]) -> int:
    copy = results["copy_bandwidth"]
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda}), jitops {jitops.__version__}",
        f"timer: {bench.gpu_timer_name()}; each side timed alone",
        f"copy bandwidth: {copy / 1e9:.0f} GB/s (device-to-device copy_ of 1 GiB, 2 * bytes / time)",
        "ratios: other time / jitops time (> 1: jitops faster); fastest = the faster of eager and compile",
        "fwd: x read + y written. bwd: the backward alone, torch.autograd.grad of an output computed once "
        "(graph kept), in all three columns; grad and output read + grad_in written",
        "",
        sep="\n",
        flush=True,
    )

    def progress(
        r: bench.Row,
    ) -> None:  # the tables come at the end; this line per case as it is measured (and kept)
        results.setdefault("rows", []).append(dataclasses.asdict(r))
        print(
            f"  measured {r.label}: "
            + ", ".join(f"{k} {v * 1e3:.4f} ms" for k, v in r.times.items())
            + (f", fastest/jitops {r.fastest:.2f}x" if r.fastest else "")
            + (f" (!) {r.note}" if r.note else ""),
            flush=True,
        )

    # nms first: it needs no torch.compile, so a run cut short still has it
    theirs, nrows, failed = torchvision_nms(), [], []
    if theirs is None:
        print(
            "nms: skipped: torchvision is not importable here (or its C++ ops do not load with this torch)"
        )
    else:
        nrows, failed = nms_rows(
            "cuda", QUICK_NMS if quick else NMS_SIZES, theirs, progress=progress
        )
        print("\n".join(bench.table(nrows)), "", sep="\n", flush=True)
    rows, sfailed = softmax_rows(
        "cuda",
        QUICK_SHAPES if quick else GPU_SHAPES,
        [torch.float32, torch.bfloat16],
        True,
        progress=progress,
    )
    print("\n".join(bench.table(rows, copy)), flush=True)
    failed += sfailed
    results["failed"] = failed
    for line in failed:
        print(line, file=sys.stderr)
    bad = failed or any(r.note for r in rows + nrows)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--quick", action="store_true", help="one shape per class: a smoke run")
    p.add_argument(
        "--mode",
        choices=("all", "kernels", "per-call"),
        default="all",
        help="per-call: only the per-call cost of a small op; kernels: only the kernels",
    )
    benchmeta.add_arguments(p)
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "benchmarks/kernels.py --device cuda: no usable CUDA GPU here "
            "(torch.cuda.is_available() is False)",
            file=sys.stderr,
        )
        return 2
    meta = benchmeta.start(args.conditions)
    results: dict[str, Any] = {"device": args.device, "mode": args.mode, "quick": args.quick}
    rc = 0
    with benchmeta.tee() as printed:
        results["device_name"] = device_name(args.device)
        results["threads"] = torch.get_num_threads()
        if args.device == "cuda":
            results["cuda"] = torch.version.cuda
            results["timer"] = bench.gpu_timer_name()
        else:
            results["timer"] = "jitops.bench.interleaved (paired rounds, median ratio)"
        if args.mode != "per-call":
            results["copy_bandwidth"] = bench.copy_bandwidth(args.device)
            if args.device == "cpu":
                print(
                    f"torch {torch.__version__}, {torch.get_num_threads()} threads; copy bandwidth "
                    f"{results['copy_bandwidth'] / 1e9:.0f} GB/s (256 MiB copy_, read + write)"
                )
        if args.mode != "kernels":
            results["per_call"] = per_call(args.device)
        if args.mode != "per-call":
            run = gpu_main if args.device == "cuda" else cpu_main
            try:
                rc = run(args.quick, results)
            except KeyboardInterrupt:  # a time limit's SIGINT: keep what was measured
                print("interrupted: the result file keeps the cases measured so far", flush=True)
                results["interrupted"] = True
                rc = 130
    if args.out:
        benchmeta.write(args.out, "kernels", meta, results, printed.getvalue())
    return rc


if __name__ == "__main__":
    sys.exit(main())
