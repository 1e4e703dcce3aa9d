"""Child programs about what jitops does before and without work: imports, names, file access.

Imports nothing of jitops or torch at its top (nor tests.scenarios, which does): each function
imports what it needs itself, so what it measures or audits starts from a bare interpreter.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any


def hostile_names(pickled_hex: str) -> tuple[list[tuple[str, str]], list[Any]]:
    """Each name (a pickle, as hex: some are not JSON) through get(), reference() and OpSpec() (as a name and
    as an export); the file, import and process events an audit hook saw meanwhile, and how each was rejected."""
    import jitops
    import jitops.loading.loader  # noqa: F401 - loaded before the hook: not under test
    from jitops import InvalidNameError, OpSpec

    jitops.list_ops()  # the registry is loaded before the hook: it is not under test
    names = pickle.loads(bytes.fromhex(pickled_hex))  # noqa: S301 - the test's own data
    events: list[tuple[str, str]] = []
    watch = (
        "open",
        "os.",
        "subprocess.",
        "shutil.",
        "ctypes.",
        "import",
        "glob.",
        "socket.",
        "tempfile.",
        "fcntl.",
    )
    sys.addaudithook(lambda e, a: events.append((e, repr(a)[:80])) if e.startswith(watch) else None)
    rejected: list[Any] = []
    for n in names:
        for call in (
            lambda: jitops.get(n),
            lambda: jitops.reference(n),
            lambda: OpSpec(
                name=n, root=Path("/nonexistent"), cpu_sources=("a.cpp",), exports=("x",)
            ),
            lambda: OpSpec(
                name="x", root=Path("/nonexistent"), cpu_sources=("a.cpp",), exports=(n,)
            ),
        ):
            try:
                call()
            except InvalidNameError as e:
                rejected.append(isinstance(e, ValueError))
                continue
            except TypeError:  # OpSpec's field type check sees a non-str first
                rejected.append(not isinstance(n, str))
                continue
            rejected.append(("accepted", repr(n)))
    return events, rejected


def import_is_inert() -> dict[str, Any]:
    """``import jitops`` under an audit hook: the processes, directories and written files it caused, and
    which heavy modules it pulled in."""
    events: list[Any] = []

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in (
            "subprocess.Popen",
            "os.posix_spawn",
            "os.exec",
            "os.fork",
            "os.system",
            "os.mkdir",
        ):
            events.append(event)
        if event == "open" and args[1] not in (None, "r", "rb") and isinstance(args[1], str):
            events.append(("open", str(args[0]), args[1]))

    sys.addaudithook(hook)
    import jitops  # noqa: F401 - the import is what is audited

    return {
        "events": events,
        "torch": "torch" in sys.modules,
        "cpp_extension": "torch.utils.cpp_extension" in sys.modules,
        "loader": "jitops.loading.loader" in sys.modules,
        "platformdirs": "platformdirs" in sys.modules,
    }


def public_modules_are_inert(cache: str, state: str) -> dict[str, Any]:
    """``import jitops.cache`` and ``jitops.loader`` (and ``jitops.cache.location()``) under an
    audit hook: the processes started and every event naming the cache or state root, and which
    jitops stages came in."""
    events: list[Any] = []
    spawn = ("subprocess.", "os.posix_spawn", "os.exec", "os.fork", "os.system", "os.mkdir")

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event.startswith(spawn) or any(root in repr(args) for root in (cache, state)):
            events.append((event, repr(args)[:120]))

    sys.addaudithook(hook)
    import jitops

    found = (jitops.cache, jitops.loader)  # as attributes first: imported on first use
    import jitops.cache
    import jitops.loader

    location = str(jitops.cache.location())

    def stage(name: str) -> list[str]:
        return sorted(m for m in sys.modules if m.startswith(f"jitops.{name}"))

    return {
        "events": events,
        "torch": "torch" in sys.modules,
        "store": stage("store"),
        "remote": stage("remote"),
        "loading": stage("loading"),
        "platformdirs": "platformdirs" in sys.modules,
        "location": location,
        "same": found == (jitops.cache, jitops.loader),
    }


def user_roots() -> dict[str, Any]:
    """The default cache and state roots, and whether finding them imported platformdirs."""
    from jitops.base.settings import Settings

    s = Settings.from_env({})
    return {
        "cache": str(s.cache_root()),
        "state": str(s.state_root()),
        "platformdirs": "platformdirs" in sys.modules,
    }


def plan_key(name: str = "softmax", device: str = "cpu") -> str:
    """The key make_plan decides for ``name`` on ``device``."""
    import jitops.plan as jplan
    import jitops.registry as jregistry

    return jplan.make_plan(jregistry.registry().lookup(name), device).key


def warm_get_softmax() -> dict[str, Any]:
    """Import torch and jitops and get softmax under an audit hook: the processes it started, and whether it works."""
    events: list[str] = []

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in (
            "subprocess.Popen",
            "os.posix_spawn",
            "os.exec",
            "os.fork",
            "os.forkpty",
            "os.system",
        ):
            events.append(event)

    sys.addaudithook(hook)
    import torch

    import jitops

    op = jitops.get("softmax", device="cpu")
    x = torch.randn(32, 17)
    ok = torch.allclose(op(x, dim=-1), torch.softmax(x, -1), atol=1e-6)
    lib = op.library
    return {
        "events": events,
        "built": lib.built,
        "ok": ok,
        "key": lib.key,
        "cpp_extension": "torch.utils.cpp_extension" in sys.modules,
        "cache_api": "jitops.cache" in sys.modules,
    }


def installed_get_refused() -> dict[str, Any] | None:
    """jitops from site-packages (run as a script by a venv's python): get softmax with no compiler on PATH;
    the ToolchainError and how long it took (None if it built)."""
    import time

    import torch  # noqa: F401 - imported first, as a user would

    import jitops

    assert "site-packages" in jitops.__file__, jitops.__file__
    start = time.monotonic()
    try:
        jitops.get("softmax", device="cpu")
    except jitops.ToolchainError as e:
        return {"error": str(e), "seconds": time.monotonic() - start}
    return None


def installed_get() -> dict[str, Any]:
    """jitops from site-packages: get softmax and check it."""
    import torch

    import jitops

    op = jitops.get("softmax", device="cpu")
    x = torch.randn(16, 33)
    return {
        "ok": bool(torch.allclose(op(x, 0), torch.softmax(x, 0), atol=1e-6)),
        "built": op.library.built,
    }


def bench_help() -> dict[str, Any]:
    """``jitops bench --help`` in-process: whether it shows --trace, and the torch modules it imported."""
    import contextlib
    import io

    from jitops.cli import main

    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main(["bench", "--help"])
        except SystemExit:
            pass
    return {
        "help": "--trace FILE" in out.getvalue(),
        "torch": [m for m in sys.modules if m.split(".")[0] == "torch"],
    }


def cache_commands(archive: str) -> dict[str, Any]:
    """Help, list and every cache command in-process (export/import through ``archive``): their exit
    codes and the torch modules they imported."""
    import contextlib
    import io

    from jitops.cli import main

    rcs = []
    for argv in (
        ["--help"],
        ["list"],
        ["cache", "path"],
        ["cache", "ls"],
        ["cache", "verify"],
        ["cache", "prune", "--max-size", "1G"],
        ["cache", "export", archive],
        ["cache", "import", archive],
        ["cache", "clear"],
    ):
        with contextlib.redirect_stdout(io.StringIO()):
            rcs.append(main(argv))
    return {"rcs": rcs, "torch": sorted(m for m in sys.modules if m.split(".")[0] == "torch")}


def keys_with_torch_version(version: str) -> dict[str, Any]:
    """Plan softmax and add with ``torch.__version__`` set to ``version``: jitops's warnings meanwhile, and
    whether the two keys differ."""
    import warnings

    import torch

    torch.__version__ = version  # type: ignore[assignment]
    from jitops.loading import loader
    from jitops import registry

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        a = loader.make_plan(registry.lookup("softmax"), "cpu").key
        b = loader.make_plan(registry.lookup("add"), "cpu").key
    return {"msgs": [str(x.message) for x in w if "jitops" in str(x.message)], "differ": a != b}


def get_or_refusal(name: str, device: str = "cpu") -> str:
    """get ``name``: "BUILT", or "REFUSED <message>" for a ToolchainError."""
    import jitops

    try:
        jitops.get(name, device=device)
    except jitops.ToolchainError as e:
        return f"REFUSED {e}"
    return "BUILT"


def no_file_locking() -> dict[str, Any]:
    """fakeadd and fakemul with flock/lockf failing ENOLCK (as on NFS without lockd): whether they work, and
    the warnings about it."""
    import errno
    import fcntl
    import logging

    def no_locks(*a: Any, **k: Any) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    fcntl.flock = no_locks
    fcntl.lockf = no_locks
    warned = []

    class H(logging.Handler):
        def emit(self, rec: logging.LogRecord) -> None:
            if "file locking is not supported" in rec.getMessage():
                warned.append(rec.getMessage())

    logging.getLogger("jitops").addHandler(H())
    from tests import scenarios as S

    return {
        "works": [S.get_and_check(n)["works"] for n in ("fakeadd", "fakemul")],
        "warned": warned,
    }


def installed_package_op() -> dict[str, Any]:
    """An op from an installed package's entry point: listed (its module not imported), working, with a
    reference and under torch.compile."""
    import torch

    import jitops

    assert "jitops_demo_kernels" not in sys.modules  # nothing read at import
    listed = "demo_axpy" in jitops.list_ops()
    op = jitops.get("demo_axpy")
    x, y = torch.randn(64), torch.randn(64)
    ok = bool(torch.allclose(op(x, y, alpha=0.5), x + 0.5 * y))
    ref = jitops.reference("demo_axpy")(x, y, 2.0)
    compiled = torch.compile(lambda a, b: op(a, b, alpha=3.0), fullgraph=True)(x, y)
    want = x + 3 * y
    return {
        "listed": listed,
        "ok": ok,
        "ref": bool(torch.allclose(ref, x + 2 * y)),
        "compiled": bool(torch.allclose(compiled, want)),
        "origin": op.library.spec.origin,
        "qualname": op.qualname,
        # what a wrong compiled result looked like (an intermittent failure once seen in CI, not
        # reproduced)
        "compiled_detail": {
            "max_abs_diff": float((compiled - want).abs().max()),
            "head": compiled[:4].tolist(),
            "want_head": want[:4].tolist(),
            "x_plus_y": bool(torch.allclose(compiled, x + y)),
            "inductor_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        },
    }


def ctrl_c_load_inline(name: str, source: str) -> dict[str, Any]:
    """Build ``source`` with load_inline and report (a JSON line) when it starts and when SIGINT ends it; wait for
    a line on stdin (the test inspects processes and the lock meanwhile); then build it again and check it."""
    import json

    import torch

    import jitops
    from jitops.plan import make_plan
    from jitops.registry import lookup
    from jitops.build.selfcheck import ensure_sound
    from jitops.base.settings import Settings

    def say(**kw: Any) -> None:
        print(json.dumps(kw), flush=True)

    # The toolchain self-check runs before the first build in a new cache: done first, so the
    # interrupt lands in the build itself.
    ensure_sound(make_plan(lookup("softmax"), "cpu"), Settings.from_env())
    say(state="building")
    try:
        jitops.load_inline(name, source)
        say(state="finished before the interrupt")
        sys.exit(3)
    except KeyboardInterrupt as e:
        say(
            state="interrupted",
            type=type(e).__name__,
            jitops_error=isinstance(e, jitops.JitopsError),
        )
    sys.stdin.readline()
    lib = jitops.load_inline(name, source)
    x = torch.randn(1000)
    return {
        "state": "rebuilt",
        "built": lib.library.built,
        "ok": bool(torch.equal(lib.squared_relu(x), torch.relu(x) ** 2)),
    }


def build_progress_demo(root: str) -> dict[str, Any]:
    """Build a one-source library from the folder ``root`` (as the user's own kernel): whether it was built,
    and for which target. Its progress line goes to stderr (or a Jupyter display)."""
    import jitops.build.entry as jentry
    import jitops.plan as jplan
    from jitops.spec import OpSpec

    spec = OpSpec(
        name="progress_demo", root=Path(root), cpu_sources=("k.cpp",), exports=("progress_demo",)
    )
    entry = jentry.ensure_entry(jplan.make_plan(spec, "cpu"))
    return {"built": entry.built, "target": entry.plan.target.name}


def get_without_remote() -> dict[str, Any]:
    """Get fakeadd with no remote cache configured: whether it built, and which remote-tier modules got imported."""
    from tests import scenarios as S

    r = S.get_and_check("fakeadd")
    mods = [
        m
        for m in (
            "redis",
            "cryptography",
            "fsspec",
            "s3fs",
            "botocore",
            "jitops.remote.tier",
            "jitops.remote.session",
            "jitops.remote.signing",
            "jitops.remote.store",
        )
        if m in sys.modules
    ]
    return {"built": r["built"], "mods": mods}


def local_hit_connects() -> dict[str, Any]:
    """Get fakeadd (a local hit) under an audit hook installed first: every socket it connected, and whether
    redis was imported."""
    connects: list[str] = []
    sys.addaudithook(
        lambda ev, args: connects.append(str(args[1])) if ev == "socket.connect" else None
    )
    from tests import scenarios as S

    r = S.get_and_check("fakeadd")
    return {"built": r["built"], "connects": connects, "redis": "redis" in sys.modules}


def local_hit_in_job() -> dict[str, Any]:
    """Get fakeadd (a local hit, in a job's environment) under an audit hook installed first: every socket it
    connected, every child it started, and whether the job-store tier was imported."""
    seen: dict[str, list[str]] = {"connects": [], "spawns": []}

    def hook(ev: str, args: tuple[Any, ...]) -> None:
        if ev == "socket.connect":
            seen["connects"].append(str(args[1]))
        elif ev in ("subprocess.Popen", "os.posix_spawn", "os.system", "os.exec", "os.fork"):
            seen["spawns"].append(f"{ev} {args[0]!r}"[:200])

    sys.addaudithook(hook)
    from tests import scenarios as S

    r = S.get_and_check("fakeadd")
    return {"built": r["built"], **seen, "job_tier": "jitops.remote.job" in sys.modules}


def s3_mkdir(bucket: str) -> bool:
    """Create ``bucket`` through s3fs (the store the environment's AWS_* variables name)."""
    import s3fs

    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(bucket)
    return True


def get_reporting_distributed_imports() -> dict[str, Any]:
    """Get fakeadd after importing torch: whether it built, and which torch.distributed / remote-tier modules
    that imported beyond what torch had."""
    import torch  # noqa: F401 - its own torch.distributed imports are not counted

    before = {m for m in sys.modules if m.startswith("torch.distributed")}
    from tests import scenarios as S

    r = S.get_and_check("fakeadd")
    extra = sorted(
        m
        for m in sys.modules
        if m.startswith(("torch.distributed", "jitops.remote", "jitops.distributed"))
        and m not in before
    )
    return {"built": r["built"], "extra": extra}


def tcp_store_server(port: int, seconds: float) -> None:
    """A torch.distributed TCPStore server on ``port``: prints "up" once listening, then lives ``seconds``."""
    import time

    import torch.distributed as d

    s = d.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)  # noqa: F841 - kept alive
    print("up", flush=True)
    time.sleep(seconds)


def dropin_warm_load(name: str, source: str, functions: list[str], call: str) -> dict[str, Any]:
    """A cached torch-style ``load_inline`` in a fresh process: one call's result, and whether the
    load imported torch._dynamo (its 1.2 s belong to torch.compile, not to a warm load)."""
    import torch

    import jitops

    before = "torch._dynamo" in sys.modules
    module = jitops.load_inline(name, source, functions=functions, extra_cflags=["-O1"])
    x = torch.linspace(-1, 1, 5)
    return {
        "dynamo_before": before,
        "dynamo_after": "torch._dynamo" in sys.modules,
        "out": getattr(module, call)(x, x).tolist(),
        "want": (x.sin() + x.sin()).tolist(),
        "stable": "jitops.build.stable" in sys.modules,
    }
