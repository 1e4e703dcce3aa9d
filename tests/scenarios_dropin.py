"""Child programs for the drop-in's parity with torch's loader (tests/test_dropin_parity.py and
tests/test_dropin_deepspeed.py).

Each runs in its own interpreter: a body that mishandles the GIL aborts the process, and the
test must see that as a failure, not lose its own process.
"""

from __future__ import annotations

import time
from typing import Any

# Functions whose bodies do what torch's own JIT tests do with the GIL and the autograd engine.
GIL_SOURCE = r"""
#include <torch/extension.h>

// Calls the autograd engine with the GIL held, as torch's binding holds it during the call.
void backward_holding_gil(at::Tensor x) { x.sum().backward(); }

// Releases the GIL first, as torch's message asks.
void backward_without_gil(at::Tensor x) {
  pybind11::gil_scoped_release no_gil;
  x.sum().backward();
}

// Releases the GIL, works, takes it back and makes a Python object.
int64_t release_then_reacquire(at::Tensor x, int64_t n) {
  int64_t total = 0;
  {
    pybind11::gil_scoped_release no_gil;
    total = x.numel() * n;
    {
      pybind11::gil_scoped_acquire again;
      pybind11::int_ check(total);
      total = check.cast<int64_t>();
    }
  }
  return total + (PyGILState_Check() ? 1000 : 0);  // +1000: the GIL is held again on the way out
}
"""
GIL_FUNCTIONS = {
    "backward_holding_gil": "Backward, GIL held",
    "backward_without_gil": "Backward after releasing the GIL",
    "release_then_reacquire": "Release and reacquire the GIL",
}


def gil_and_docstrings(loader: str = "jitops") -> dict[str, Any]:
    """Build GIL_SOURCE with ``loader`` ("jitops" or "torch") and report what each function does."""
    import torch

    if loader == "torch":
        import tempfile

        from torch.utils.cpp_extension import load_inline

        kwargs: dict[str, Any] = {"build_directory": tempfile.mkdtemp(prefix="torch-gil-")}
    else:
        from jitops import load_inline

        kwargs = {}
    module = load_inline(
        f"gil_parity_{time.time_ns() if loader == 'torch' else 0}",
        GIL_SOURCE,
        functions=GIL_FUNCTIONS,
        **kwargs,
    )
    out: dict[str, Any] = {"docs": {f: getattr(module, f).__doc__ or "" for f in GIL_FUNCTIONS}}
    t = torch.ones(3, requires_grad=True)
    try:
        module.backward_holding_gil(t * 1)
        out["holding"] = "returned"
    except RuntimeError as e:
        out["holding"] = str(e)
    module.backward_without_gil(t * 1)
    out["grad"] = t.grad.tolist() if t.grad is not None else None
    out["reacquire"] = module.release_then_reacquire(torch.ones(4), 5)
    try:
        module.release_then_reacquire(torch.ones(4), "five")
        out["bad_argument"] = "accepted"
    except (
        TypeError
    ) as e:  # pybind11's own error for a Python object it cannot convert, as under torch
        out["bad_argument"] = str(e).splitlines()[0]
    out["ops"] = sorted(
        n for n in dir(getattr(module, "ops", None) or object()) if n in GIL_FUNCTIONS
    )
    return out


WARM_SOURCE = r"""
#include <torch/extension.h>
torch::Tensor warm_twice(torch::Tensor x) { return x * 2; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("warm_twice", &warm_twice); }
"""


def warm_load(
    loader: str,
    folder: str,
    build_directory: str = "",
    source: str = "warm_twice.cpp",
    name: str = "warm_twice",
    includes: list[str] | None = None,
    cflags: list[str] | None = None,
) -> dict[str, Any]:
    """In a process that has imported torch.utils.cpp_extension (as DeepSpeed's has): the seconds of the
    first ``load`` of ``folder``/``source`` by ``loader`` ("jitops" or "torch"), the modules it imported, and
    what the module's one function returns for ones(2)."""
    import sys

    import torch
    import torch.utils.cpp_extension as ce

    paths = [f"{folder}/{source}"]
    spawned: list[str] = []  # a warm load starts no process (issue 32 item 4)
    sys.addaudithook(
        lambda event, args: (
            spawned.append(event)
            if event
            in (
                "subprocess.Popen",
                "os.posix_spawn",
                "os.exec",
                "os.fork",
                "os.forkpty",
                "os.system",
            )
            else None
        )
    )
    listed: list[int] = []  # nor lists the dispatcher's ops, once a process recorded the library's
    real_list = torch._C._dispatch_get_all_op_names
    torch._C._dispatch_get_all_op_names = lambda: listed.append(1) or real_list()
    before = set(sys.modules)
    start = time.perf_counter()
    if loader == "torch":
        module = ce.load(name, paths, extra_include_paths=includes, build_directory=build_directory)
    else:
        import jitops

        module = jitops.load(name, paths, extra_include_paths=includes, extra_cflags=cflags)
    seconds = time.perf_counter() - start
    function = next(getattr(module, n) for n in ("warm_twice", "scaled") if hasattr(module, n))
    return {
        "seconds": seconds,
        "imported": sorted(set(sys.modules) - before),
        "value": function(torch.ones(2)).tolist(),
        "spawned": spawned,
        "listed": len(listed),
    }


def deepspeed_cpu_optimizers(
    loader: str, out: str, optimizers: list[str], steps: int = 5
) -> dict[str, Any]:
    """DeepSpeed's CPU ``optimizers`` (of adam, adagrad, lion), built by DeepSpeed's own op
    builders through ``loader``'s ``torch.utils.cpp_extension.load`` ("torch", or "jitops" swapped
    in), stepped ``steps`` times on the same seeded parameters and gradients; the parameters' bytes
    are saved under ``out`` (one file each)."""
    import hashlib
    import os
    import sys

    import torch
    import torch.utils.cpp_extension as ce

    if loader == "jitops":
        import jitops

        ce.load = jitops.load  # what DeepSpeed's OpBuilder.jit_load imports at call time
    from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    from deepspeed.ops.lion import DeepSpeedCPULion

    classes = {"adam": DeepSpeedCPUAdam, "adagrad": DeepSpeedCPUAdagrad, "lion": DeepSpeedCPULion}
    report: dict[str, Any] = {}
    for name in optimizers:
        cls = classes[name]
        gen = torch.Generator().manual_seed(1234)
        count = 138_817  # not a multiple of any SIMD width: the scalar tail runs too
        param = torch.nn.Parameter(torch.randn(count, generator=gen))
        start = time.perf_counter()
        opt = cls([param])
        report[f"{name}_build_s"] = round(time.perf_counter() - start, 1)
        for _ in range(steps):
            param.grad = torch.randn(count, generator=gen)
            opt.step()
        data = param.detach().numpy().tobytes()
        with open(os.path.join(out, f"{name}.bin"), "wb") as f:
            f.write(data)
        report[name] = hashlib.sha256(data).hexdigest()
        report[f"{name}_module"] = getattr(sys.modules.get(cls.__module__), "__name__", "")
    report["loader_was"] = f"{ce.load.__module__}.{ce.load.__name__}"
    return report


def deepspeed_warm_load(loader: str) -> dict[str, Any]:
    """In DeepSpeed's own process: the seconds of the loader call inside ``CPUAdamBuilder().load()`` (a built
    op: torch's build folder, or jitops's cache entry), first call in the process."""
    import torch.utils.cpp_extension as ce
    from deepspeed.ops.op_builder import CPUAdamBuilder

    chosen = ce.load
    if loader == "jitops":
        import jitops

        chosen = jitops.load
    seconds: list[float] = []

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return chosen(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - start)

    ce.load = timed
    module = CPUAdamBuilder().load(verbose=False)
    return {"seconds": seconds, "module": getattr(module, "__name__", "")}


def inline_twice(source: str, name: str) -> dict[str, Any]:
    """``jitops.load_inline(name, source)`` twice in one fresh process: whether it planned (the planner imported),
    whether both calls gave the same module, and what its ``scaled`` returns for ones(2)."""
    import sys

    import torch

    import jitops

    first = jitops.load_inline(name, source)
    second = jitops.load_inline(name, source)
    return {
        "planned": "jitops.plan" in sys.modules,
        "same": first is second,
        "value": first.scaled(torch.ones(2)).tolist(),
        "ops": hasattr(first, "ops"),
    }
