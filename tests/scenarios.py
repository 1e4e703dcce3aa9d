"""Building blocks for process scenarios, run inside a child interpreter.

A test starts one fresh interpreter (``helpers.run_scenario``) that imports torch
and jitops once and then forks a worker per scenario step: forking costs
milliseconds where a fresh interpreter costs a second of torch import, so the
race, kill and corruption tests can afford hundreds of real processes. Each
worker is a real process with its own memory, its own OS locks and its own
loader memo, and it is killed, raced and checked like any other.

A child program is a function here (or in a ``tests/scenarios_*.py`` module),
not a string: ``helpers.run_scenario("name", env=..., **kwargs)`` runs
``python -m tests.scenario_main name '<json kwargs>'``, which calls
``name(**kwargs)`` and reports its return value (or the exception, as
``_describe`` does) as the last line of stdout. Linters and tracebacks see
real code and real line numbers.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jitops
from tests import fakelib
from tests.scenario_main import describe as _describe


_popens = [0]


def _count_popens(event: str, args: tuple[Any, ...]) -> None:
    if event == "subprocess.Popen":
        _popens[0] += 1


sys.addaudithook(_count_popens)


def preload() -> None:
    """Import everything a build imports, so forked workers start warm."""
    import filelock  # noqa: F401
    import torch  # noqa: F401

    import jitops.build.runner  # noqa: F401
    import jitops.store.lock  # noqa: F401
    import jitops.loading.loader  # noqa: F401
    import jitops.base.progress  # noqa: F401

    fakelib.register_all()


def get_and_check(name: str = "fakeadd") -> dict[str, Any]:
    """``jitops.get(name)`` and call it; what a worker reports."""
    fakelib.register_all()
    before = _popens[0]
    op = jitops.get(name, device="cpu")
    lib = op.library
    assert lib is not None
    if name in fakelib.REFERENCES:
        works = fakelib.check(op, name)
    else:
        import torch

        x = torch.randn(3, 5)
        works = bool(torch.allclose(op(x), torch.softmax(x, -1), atol=1e-6))
    return {
        "pid": os.getpid(),
        "built": lib.built,
        "subprocesses": _popens[0] - before,
        "sha256": lib.manifest.sha256,
        "works": works,
        "entry": str(lib.entry),
        "op_id": id(op),
    }


def spawn(
    fn: Callable[..., Any],
    *args: Any,
    env: dict[str, str] | None = None,
    gate: tuple[int, int] | None = None,
) -> tuple[int, int]:
    """Fork a worker that runs ``fn(*args)`` and writes one JSON reply. Returns (pid, read fd).

    With ``gate`` (a pipe from ``os.pipe()``) the worker first blocks until
    the parent closes the write end, so a whole batch starts at one instant.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # worker
        try:
            os.close(r)
            if gate is not None:
                os.close(gate[1])
                os.read(gate[0], 1)
            if env:
                os.environ.update(env)
            out = {"ok": True, "value": fn(*args)}
        except BaseException as e:  # noqa: BLE001 - every failure is reported, typed
            out = _describe(e)
        try:
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    return pid, r


def collect(pid: int, fd: int, timeout: float) -> dict[str, Any]:
    """The worker's reply and exit status; a worker past ``timeout`` is killed and reported as a hang."""
    deadline = time.monotonic() + timeout
    chunks = []
    hung = False
    while True:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(0.0, left))
        if not ready:
            hung = True
            os.kill(pid, signal.SIGKILL)
            break
        b = os.read(fd, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    if hung:
        return {
            "ok": False,
            "type": "hang",
            "msg": f"worker {pid} still running after {timeout}s",
            "mro": [],
        }
    raw = b"".join(chunks)
    out = (
        json.loads(raw)
        if raw
        else {"ok": False, "type": "died", "mro": [], "msg": f"status {status}"}
    )
    out["exit"] = os.waitstatus_to_exitcode(status)
    return out


def call(
    fn: Callable[..., Any], *args: Any, timeout: float = 60, env: dict[str, str] | None = None
) -> dict[str, Any]:
    pid, fd = spawn(fn, *args, env=env)
    return collect(pid, fd, timeout)


def race(n: int, name: str = "fakeadd", timeout: float = 120) -> list[dict[str, Any]]:
    """``n`` workers released at one instant, each getting ``name``; their replies."""
    gate = os.pipe()
    workers = [spawn(get_and_check, name, gate=gate) for _ in range(n)]
    os.close(gate[1])
    replies = [collect(pid, fd, timeout) for pid, fd in workers]
    os.close(gate[0])
    return replies


def phase(cache: Path) -> str:
    """Where a build in ``cache`` stood (after a kill): the furthest step it reached."""
    if list((cache / "v1" / "entries").glob("*/*/*")):
        return "published"
    staged = list((cache / "v1" / "staging").glob("*"))
    if any((s / "entry" / "manifest.json").exists() for s in staged):
        return "publishing"
    if any((s / "build").exists() for s in staged):
        return "building"
    return "before-build"


PHASES = ("before-build", "building", "publishing", "published")


def wait_phase(cache: Path, at_least: str, within: float = 30) -> str:
    """Poll until a build in ``cache`` has reached phase ``at_least``; the phase it is in."""
    deadline = time.monotonic() + within
    while True:
        now = phase(cache)
        if PHASES.index(now) >= PHASES.index(at_least) or time.monotonic() > deadline:
            return now
        time.sleep(0.002)


def entry_of(cache: Path) -> Path:
    """The one entry in ``cache``."""
    (e,) = (cache / "v1" / "entries").glob("*/*/*")
    return e


def get_recording(name: str = "fakeadd") -> dict[str, Any]:
    """get_and_check, plus the inode of every library dlopened meanwhile (audit hook)."""
    seen: list[int] = []

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "ctypes.dlopen" and args[0]:
            try:
                seen.append(os.stat(args[0]).st_ino)
            except OSError:
                pass

    sys.addaudithook(hook)
    r = get_and_check(name)
    r["dlopened"] = seen
    return r


def builders_under(root: Path) -> list[str]:
    """Processes (not this one) whose working dir or argv lies under ``root``: live builds."""
    from tests.helpers import processes

    root_s = str(root)
    return [
        f"{p.pid}: {p.argv[:200]}"
        for p in processes()
        if p.pid != os.getpid() and p.cwd and (p.cwd.startswith(root_s) or root_s in p.argv)
    ]


def wait_builders(root: Path, within: float = 60) -> list[str]:
    """Poll until a build process runs under ``root`` (a compile has begun, so its key lock is held)."""
    deadline = time.monotonic() + within
    while True:
        found = builders_under(root)
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def wait_no_builders(root: Path, within: float) -> list[str]:
    """Poll until no build process is left under ``root``; what is left after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        left = builders_under(root)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def report(value: Any) -> None:
    """The child's result, as the last line of its stdout (see helpers.last_json)."""
    print(json.dumps(value), flush=True)


# ------------------------------------------------------------------ scenarios run by name


def get_all_reporting_warnings(names: list[str]) -> dict[str, Any]:
    """get_and_check for each name; whether each works, and every warning raised meanwhile."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        values = [get_and_check(n) for n in names]
    return {"works": [v["works"] for v in values], "warnings": [str(w.message) for w in caught]}


def load_inline_reporting(name: str, source: str, schemas: list[str]) -> dict[str, Any]:
    """``jitops.load_inline`` once; the entry it loaded and every RuntimeWarning raised meanwhile."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lib = jitops.load_inline(name, source, schemas=schemas)
    return {
        "ok": True,
        "entry": str(lib.library.entry),
        "ops": sorted(lib.ops),
        "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
    }


def attempt_get(
    name: str = "softmax",
    register_fakes: bool = False,
    hide_ninja: bool = False,
    library: dict[str, Any] | None = None,
    device: str | None = "cpu",
) -> dict[str, Any]:
    """``jitops.get(name, device=device)``: ok, or the error with how long it took and whether a lock was
    reached. ``library`` (OpSpec fields, ``root`` a path) is registered first. ``device`` is cpu by default:
    on a GPU node the default would build for cuda."""
    if library is not None:
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in library.items()}
        jitops.register(jitops.OpSpec(**{**fields, "root": Path(fields["root"])}))
    if hide_ninja:
        sys.modules["ninja"] = None  # type: ignore[assignment]  # as if the PyPI package were absent
    if register_fakes:
        fakelib.register_all()
    start = time.monotonic()
    try:
        jitops.get(name, device=device)
        return {"ok": True}
    except Exception as e:  # noqa: BLE001 - reported to the test
        return {
            **_describe(e),
            "seconds": time.monotonic() - start,
            "filelock_imported": "filelock" in sys.modules,
        }


def get_with_fake_cuda(op: str = "softmax", archs: str = "8.0") -> dict[str, Any]:
    """ensure_entry for ``op`` on CUDA, with a torch that claims CUDA 13.0 (CUDA_HOME comes from the env)."""
    import dataclasses

    import jitops.build.entry
    import jitops.plan
    import jitops.registry

    real = jitops.plan.probe
    jitops.plan.probe = lambda **_: dataclasses.replace(real(), torch_cuda="13.0")  # type: ignore[assignment]
    start = time.monotonic()
    try:
        spec = jitops.registry.registry().lookup(op)
        jitops.build.entry.ensure_entry(jitops.plan.make_plan(spec, "cuda", archs))
        return {"ok": True}
    except Exception as e:  # noqa: BLE001 - reported to the test
        return {
            **_describe(e),
            "seconds": time.monotonic() - start,
            "filelock_imported": "filelock" in sys.modules,
        }


def load_inline_cuda(name: str, cpp: str, cu: str) -> dict[str, Any]:
    """``jitops.load_inline`` of a CPU+CUDA library for CUDA (archs from TORCH_CUDA_ARCH_LIST; no GPU
    is needed to build it or to load it)."""
    lib = jitops.load_inline(name, cpp, cu, device="cuda")
    files = lib.library.manifest.timings.get("files", {})
    return {
        "ok": True,
        "built": lib.library.built,
        "entry": str(lib.library.entry),
        "target": lib.library.target,
        "ops": sorted(lib.ops),
        "headers": {f: i.get("header") for f, i in files.items()},
        "torch_headers": sorted(f for f, i in files.items() if i.get("torch_headers")),
    }


def load_inline_and_run(name: str, sources: list[str]) -> dict[str, Any]:
    """``jitops.load_inline`` of each source in turn, then one call of the last on fixed inputs; what the
    builds recorded (issue 17: PCH parity)."""
    import torch

    from jitops.build import pch_bg

    libs = []
    for (
        source
    ) in sources:  # each edit after the last one's background PCH, if any, is there (issue 29)
        libs.append(jitops.load_inline(name, source))
        pch_bg.wait(600)
    lib = libs[-1]
    states = [
        [i.get("pch") for i in x.library.manifest.timings.get("files", {}).values()] for x in libs
    ]
    x = torch.linspace(-3, 3, 13, dtype=torch.float64)
    op = getattr(lib, sorted(lib.ops)[0])
    m = lib.library.manifest
    return {
        "ok": True,
        "built": lib.library.built,
        "out": op(x).tolist(),
        "out32": op(x.float()).tolist(),
        "key": lib.library.key,
        "library": str(lib.library.library_path),
        "timings": m.timings,
        "states": states,
    }


def dropin_functions(
    name: str, source: str, functions: list[str], inputs: list[float]
) -> dict[str, Any]:
    """A torch-style ``load_inline(functions=)`` (issue 17): each function's result on ``inputs``, the
    build's key and per-file records, and how torch.compile meets ``module.<f>`` (an eager call)."""
    import torch

    from jitops.api import cpp_ext_style

    module = jitops.load_inline(name, source, functions=functions, extra_cflags=["-O1"])
    lib = next(r.library for r in cpp_ext_style._results.values() if r.value is module)
    x = torch.tensor(inputs)
    out = {f: getattr(module, f)(x).tolist() for f in functions}
    compiled = {
        f: torch.compile(lambda t, f=f: getattr(module, f)(t) + 1, backend="aot_eager")(x).tolist()
        for f in functions
    }
    return {
        "ok": True,
        "key": lib.key,
        "out": out,
        "compiled": compiled,
        "timings": lib.manifest.timings,
        "pybind_module": hasattr(module, "__loader__") and module.__loader__ is not None,
    }
