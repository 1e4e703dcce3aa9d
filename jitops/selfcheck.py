"""Toolchain self-check: does a C++ error from an op this toolchain builds reach Python?

Some toolchains build extensions that load and run, but kill the process the
first time a kernel throws (a ``TORCH_CHECK`` on a bad shape): the exception
cannot unwind through the extension's frames, so the user sees a segfault or
an abort instead of a ``RuntimeError``. jitops finds out before it builds
anything with a new toolchain: it compiles a tiny probe op whose kernel throws
(lean dispatcher header, -O0, one command that compiles and links), loads it
in a CHILD process and checks that the error arrives as ``RuntimeError``.

A pass is remembered under the cache's ``v1/toolchains/`` (like the compiler
identity), keyed by everything that shapes the probe's binary: the compiler's
canonical path, file stamp, identity and driver, its OpenMP flags,
CFLAGS/CXXFLAGS/LDFLAGS, and the torch and Python ABI. A failure is not
remembered: it is re-checked, so a fixed setup is seen at once. A probe that
does not even build gives no verdict: the real build goes on and reports its
own error (file:line, an OOM-killed compiler), which says more. Only cache
misses reach :func:`ensure_sound`, so the warm path never runs it. Offline
mode never builds, and the fake builder (``settings.builder == "fake"``, a test
seam that runs no C++ compiler) skips it. Settings come in as a value (only
settings.py reads the environment).

Imports: build (lazily), compilers, errors, fsutil (lazily), key, settings (types), target, toolchain.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import compilers, toolchain
from .errors import BuildInterrupted, ConfigError, ToolchainError
from .key import extra_env_flags
from .target import System

if TYPE_CHECKING:
    from .plan import Plan
    from .settings import Settings

log = logging.getLogger("jitops")

PROBE_VERSION = 1  # bump when the probe's source or command line changes
NAMESPACE = "jitops_selfcheck"
_PROBE_CPP = """\
// jitops toolchain self-check: a kernel that throws a c10::Error (TORCH_CHECK).
#include <torch/library.h>
static void jitops_probe(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const int64_t x = stack->back().toInt();
  TORCH_CHECK(x < 0, "jitops self-check: expected error for ", x);
  stack->back() = c10::IValue(x);
}
TORCH_LIBRARY(NAMESPACE, m) {
  m.def("probe(int x) -> int", torch::CppFunction::makeFromBoxedFunction<&jitops_probe>());
}
""".replace("NAMESPACE", NAMESPACE)
_CHILD = f"""\
import sys, torch
torch.ops.load_library(sys.argv[1])
try:
    torch.ops.{NAMESPACE}.probe(7)
except RuntimeError as e:
    ok = "jitops self-check: expected error for 7" in str(e)
    print("JITOPS_SELFCHECK " + ("ok" if ok else "wrong message: " + str(e).splitlines()[0][:200]), flush=True)
    sys.exit(0 if ok else 3)
print("JITOPS_SELFCHECK no error raised", flush=True)
sys.exit(4)
"""

_passed: set[str] = set()  # identities that passed in this process
_lock = threading.Lock()


def _reset_after_fork() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


@dataclass(frozen=True)
class Result:
    ok: bool
    detail: str  # what happened, one line
    seconds: float
    compiler: str  # the command run, with its identity
    cached: bool = False
    built: bool = True  # False: the probe did not even compile and link


def identity(system: System, compiler: dict[str, Any]) -> str:
    """Hash of everything that shapes the probe's binary. Pure, apart from the compiler's file stamp."""
    try:
        stamp = toolchain._fingerprint(compiler["path"])
    except OSError:
        stamp = "?"
    env = {k: system.env(k) or "" for k in ("CFLAGS", "CXXFLAGS", "LDFLAGS")}
    parts = [PROBE_VERSION, compiler, stamp, env, system.torch_version, system.torch_git_version,
             system.cxx11_abi, system.python_abi, system.machine]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _record_path(tool_dir: Path, ident: str) -> Path:
    return tool_dir / f"selfcheck-{ident}.json"


def _torch_compiler() -> str:
    """What torch was built with, from ``torch.__config__.show()``: "GCC 13.3 (/opt/.../c++)"."""
    try:
        import torch

        shown = torch.__config__.show()
    except Exception:  # noqa: BLE001 - only used to word a message
        return "the compiler torch was built with"
    family = re.search(r"^\s*-\s*((?:GCC|clang|Clang)\s+[\d.]+)", shown, re.M)
    path = re.search(r"CXX_COMPILER=([^,\s]+)", shown)
    words = family.group(1) if family else "the compiler torch was built with"
    return f"{words} ({path.group(1)})" if path else words


def _cxx_standard(torch_root: Path) -> str:
    """The -std= that torch's cpp_extension compiles with (c++17 up to torch 2.9ish, c++20 since), read
    from its source so the probe parses torch's headers as real builds do; importing it costs ~33 ms more."""
    try:
        text = (torch_root / "utils" / "cpp_extension.py").read_text()
    except OSError:
        return "-std=c++17"
    m = re.search(r"common_cflags \+= \['-std=(c\+\+\d+)'", text)
    return f"-std={m.group(1)}" if m else "-std=c++17"


def _probe_command(system: System, cxx: str, compiler: dict[str, Any], src: Path, out: Path) -> list[str]:
    import torch

    root = Path(torch.__file__).parent
    env_cflags, env_ldflags = extra_env_flags(system)
    omp = compilers.build_flags(["-fopenmp"], compiler) if compiler.get("openmp") else []
    return [cxx, "-shared", "-fPIC", _cxx_standard(root), "-O0", f"-D_GLIBCXX_USE_CXX11_ABI={int(system.cxx11_abi)}",
            "-isystem", str(root / "include"), "-isystem", str(root / "include" / "torch" / "csrc" / "api" / "include"),
            *omp, *env_cflags, str(src), "-o", str(out), f"-L{root / 'lib'}", "-lc10", "-ltorch_cpu", *omp,
            *env_ldflags]


def run_probe(system: System, cxx: str, compiler: dict[str, Any]) -> Result:
    """Build the probe with ``cxx`` and check it in a child process. Writes nothing outside a temp dir."""
    from .build import run_supervised  # miss path only

    start = time.monotonic()
    who = f"{cxx} ({compiler.get('version', '?')})"
    with tempfile.TemporaryDirectory(prefix="jitops-selfcheck-") as tmp:
        src, lib = Path(tmp) / "probe.cpp", Path(tmp) / "libjitops_selfcheck.so"
        src.write_text(_PROBE_CPP)
        env = dict(os.environ, TMPDIR=tmp)
        cmd = _probe_command(system, cxx, compiler, src, lib)
        try:
            rc, out = run_supervised(cmd, cwd=Path(tmp), env=env)
        except KeyboardInterrupt as e:  # the supervisor already stopped the compiler
            raise BuildInterrupted("toolchain self-check interrupted; the compiler was stopped and nothing was "
                                   "cached") from e
        if rc != 0 or not lib.is_file():
            first = next((ln for ln in out.splitlines() if "error" in ln), out.strip().splitlines()[-1:] or [""])
            first = first if isinstance(first, str) else first[0]
            return Result(False, f"cannot build the probe op (exit {rc}): {first[:300]}  [command: "
                          f"{shlex.join(cmd)}]", time.monotonic() - start, who, built=False)
        loaded: int | None
        try:
            child = subprocess.run([sys.executable, "-c", _CHILD, str(lib)], capture_output=True, text=True,
                                   timeout=180, stdin=subprocess.DEVNULL, env=env, cwd=tmp, check=False)
            loaded, text = child.returncode, (child.stdout + child.stderr)
        except subprocess.TimeoutExpired:
            loaded, text = None, "timed out after 180 s"
        except KeyboardInterrupt as e:  # subprocess.run killed the child
            raise BuildInterrupted("toolchain self-check interrupted; nothing was cached") from e
    seconds = time.monotonic() - start
    if loaded == 0:
        return Result(True, "a C++ error thrown by the probe op arrived as RuntimeError", seconds, who)
    if loaded is not None and loaded < 0:
        try:
            sig = signal.Signals(-loaded).name
        except ValueError:
            sig = f"signal {-loaded}"
        why = f"the process was killed by {sig} when the probe op threw a C++ error"
    else:
        said = [ln for ln in text.splitlines() if ln.strip()]
        mark = next((ln for ln in said if ln.startswith("JITOPS_SELFCHECK")), said[-1] if said else "")
        why = f"the probe op did not raise RuntimeError (exit {loaded}): {mark[:300]}"
    return Result(False, why, seconds, who)


def refusal(result: Result, op: str) -> ToolchainError:
    return ToolchainError(
        f"cannot build op {op!r}: the C++ compiler {result.compiler} fails the toolchain self-check: {result.detail}. "
        "C++ exceptions thrown by ops it builds would crash the process (every TORCH_CHECK error would kill "
        f"Python) instead of raising RuntimeError. Fix: set CXX to the compiler torch was built with "
        f"({_torch_compiler()}; see torch.__config__.show()) or to the system g++, or unset CXX"
    )


def check(system: System, compiler: dict[str, Any], cxx: str, tool_dir: Path | None, *, record: bool) -> Result:
    """The self-check's result for this toolchain: remembered if it passed before, else run now."""
    ident = identity(system, compiler)
    if ident in _passed:
        return Result(True, "passed earlier in this process", 0.0, cxx, cached=True)
    if tool_dir is not None:
        from .fsutil import read_record

        data = read_record(_record_path(tool_dir, ident)) or {}  # damaged: checked again and rewritten
        if data.get("ok") is True:
            _passed.add(ident)
            when = data.get("when") if isinstance(data.get("when"), str) else "?"
            return Result(True, f"passed before (recorded {when})", 0.0, cxx, cached=True)
    result = run_probe(system, cxx, compiler)
    log.info("toolchain self-check of %s: %s (%.1f s)", cxx, "passed" if result.ok else result.detail, result.seconds)
    if result.ok:
        _passed.add(ident)
        if record and tool_dir is not None:
            _remember(tool_dir, ident, result)
    return result


def _remember(tool_dir: Path, ident: str, result: Result) -> None:
    from .fsutil import atomic_write, makedirs, may_hold

    if not may_hold(tool_dir):  # a link at v1 or v1/toolchains: never written through
        return
    try:
        makedirs(tool_dir)
        body = {"ok": True, "compiler": result.compiler, "seconds": round(result.seconds, 2),
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        atomic_write(_record_path(tool_dir, ident), json.dumps(body).encode())
    except OSError as e:  # read-only or unusable cache: check again next process
        log.debug("could not record the toolchain self-check in %s: %s", tool_dir, e)


def ensure_sound(plan: Plan, settings: Settings) -> None:
    """Before the first build with a toolchain: refuse (ToolchainError) if C++ errors would crash.

    Called on a cache miss only, before any lock or staging dir. Skipped for the
    fake builder, which compiles no C++.
    """
    compiler = plan.ingredients.get("compiler")
    if compiler is None or settings.builder == "fake":
        return
    from .fsutil import insecure_reason

    cache = plan.cache
    usable = not os.path.lexists(cache.root) or insecure_reason(cache.root, want_dir=True) is None
    with _lock:  # threads of one process run the probe once
        result = check(plan.system, compiler, plan.compiler.run if plan.compiler else compiler["path"],
                       cache.toolchains if usable else None, record=True)
    if not result.ok and result.built:
        raise refusal(result, plan.spec.name)
    if not result.built:  # no verdict: the real build reports its own error (file:line, OOM, ...) better
        log.info("toolchain self-check could not build its probe (%s); building %s anyway", result.detail, plan.what)


def doctor(system: System, tool_dir: Path, settings: Settings, *, offline: bool) -> tuple[str, str, str]:
    """(status, detail, fix) for ``jitops doctor``: runs the probe every time (and records a pass)."""
    if offline:
        return "info", "skipped: JITOPS_OFFLINE=1 never builds", ""
    if settings.builder == "fake":
        return "info", "skipped: JITOPS_BUILDER=fake runs no C++ compiler", ""
    try:
        tool = compilers.cxx(system, "<any>", tool_dir)
        compiler = compilers.ingredient(tool)
        cxx = tool.run
        result = run_probe(system, cxx, compiler)
    except (ToolchainError, ConfigError) as e:  # no compiler, or unusable flag variables (the settings row says which)
        return "warn", f"not run: {str(e).split(' Fix: ')[0]}", ""
    if result.ok:
        _passed.add(identity(system, compiler))
        if os.path.isdir(tool_dir.parent):  # doctor never creates a cache root
            _remember(tool_dir, identity(system, compiler), result)
        return "ok", f"{result.detail} ({cxx}; {result.seconds:.1f} s)", ""
    if not result.built:
        return "warn", f"could not build the probe op: {result.detail} ({result.seconds:.1f} s)", \
            "check the compiler and flags (CXX, CXXFLAGS, LDFLAGS); a real build would likely fail the same way"
    message = str(refusal(result, "<any>"))
    head, _, fix = message.partition(" Fix: ")
    head = head.replace("cannot build op '<any>': ", "")
    return "fail", f"{head} ({result.seconds:.1f} s)", fix
