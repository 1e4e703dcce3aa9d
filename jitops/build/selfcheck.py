"""Toolchain self-check: does a C++ error from an op this toolchain builds reach Python?

Some toolchains build extensions that load and run, but kill the process the
first time a kernel throws (a ``TORCH_CHECK`` on a bad shape): the exception
cannot unwind through the extension's frames, so the user sees a segfault or
an abort instead of a ``RuntimeError``. jitops finds out with the first build
of a new toolchain: it compiles a tiny probe op whose kernel throws (c10's
Exception.h and torch's C shim, -O0, one command that compiles and links), loads it in a
CHILD process and checks that the error arrives as ``RuntimeError``.

The probe runs in a thread beside the first build (:class:`Pending`); the
build publishes its entry, and the loader loads it, only after a pass. A
refusal publishes and loads nothing. The verdict is remembered per user, across
cache roots, in the state directory (verdicts.py), keyed by everything that
shapes the probe's binary: the compiler's canonical path, file stamp, identity
and driver, its OpenMP flags, CFLAGS/CXXFLAGS/LDFLAGS, and the torch and Python
ABI. Concurrent processes probe once per identity (one lock; the others wait a
bounded time and reuse its verdict). A probe that does not even build gives no
verdict: the real build goes on and reports its own error (file:line, an
OOM-killed compiler), which says more. Only cache misses reach :func:`start`,
so the warm path never runs it. Offline mode never builds, and the fake builder
(``settings.builder == "fake"``, a test seam that runs no C++ compiler) skips
it. Settings come in as a value (only settings.py reads the environment).

Imports: cache, compilers, errors, selfprobe, target, toolchain, verdicts; manifest, plan, settings (types only).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..target import compilers, toolchain
from ..store import verdicts
from ..store.cache import Cache
from ..errors import CacheError, ConfigError, LockTimeout, ToolchainError
from .selfprobe import NAMESPACE, PROBE_VERSION, Result, run_probe
from ..target import System

__all__ = [
    "NAMESPACE",
    "PROBE_VERSION",
    "Pending",
    "Result",
    "check",
    "doctor",
    "ensure_sound",
    "identity",
    "refusal",
    "run_probe",
    "start",
]

if TYPE_CHECKING:
    from ..store.manifest import Address, Hit, Miss
    from ..plan import Plan
    from ..base.settings import Settings
    from ..store.stamps import Stamps

log = logging.getLogger("jitops")

_passed: set[str] = set()  # identities that passed in this process
_lock = threading.Lock()


def _reset_after_fork() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def identity(system: System, compiler: dict[str, Any]) -> str:
    """Hash of everything that shapes the probe's binary. Pure, apart from the compiler's file stamp."""
    try:
        stamp = toolchain._fingerprint(compiler["path"])
    except OSError:
        stamp = "?"
    env = {k: system.env(k) or "" for k in ("CFLAGS", "CXXFLAGS", "LDFLAGS")}
    parts = [
        PROBE_VERSION,
        compiler,
        stamp,
        env,
        system.torch_version,
        system.torch_git_version,
        system.cxx11_abi,
        system.python_abi,
        system.machine,
    ]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


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


def refusal(result: Result, op: str) -> ToolchainError:
    return ToolchainError(
        f"cannot build op {op!r}: the C++ compiler {result.compiler} fails the toolchain self-check: {result.detail}. "
        "C++ exceptions thrown by ops it builds would crash the process (every TORCH_CHECK error would kill "
        f"Python) instead of raising RuntimeError. Fix: set CXX to the compiler torch was built with "
        f"({_torch_compiler()}; see torch.__config__.show()) or to the system g++, or unset CXX"
    )


# seconds a process waits for another's probe of the same toolchain before running its own
PROBE_WAIT = 300.0


def _recalled(state: Path, ident: str, cxx: str, since: float | None) -> Result | None:
    data = verdicts.read(state, ident, since=since)
    if data is None:
        return None
    if data["ok"]:
        _passed.add(ident)
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(data["when"]))
        return Result(
            True,
            f"passed on {when} (remembered in {verdicts.folder(state)})",
            0.0,
            cxx,
            cached=True,
        )
    return Result(False, data["detail"], data["seconds"], data["compiler"], cached=True)


def _probe_now(
    system: System, compiler: dict[str, Any], cxx: str, ident: str, state: Path | None
) -> Result:
    result = run_probe(system, cxx, compiler)
    log.info(
        "toolchain self-check of %s: %s (%.1f s)",
        cxx,
        "passed" if result.ok else result.detail,
        result.seconds,
    )
    if result.ok:
        _passed.add(ident)
    if state is not None and result.built:  # a probe that did not build is no verdict
        verdicts.write(
            state,
            ident,
            ok=result.ok,
            detail=result.detail,
            compiler=result.compiler,
            seconds=result.seconds,
        )
    return result


def check(
    system: System,
    compiler: dict[str, Any],
    cxx: str,
    state: Path | None,
    *,
    recheck: bool = False,
    wait: float = PROBE_WAIT,
) -> Result:
    """This toolchain's verdict: remembered (this process, then ``state``) unless ``recheck``, else probed now.

    Concurrent processes probe one at a time under one lock per identity; one that waited reuses the
    verdict the probe it waited for recorded (a pass, or a failure found while it waited).
    """
    ident = identity(system, compiler)
    if not recheck:
        if ident in _passed:
            return Result(True, "passed earlier in this process", 0.0, cxx, cached=True)
        found = _recalled(state, ident, cxx, None) if state is not None else None
        if found is not None:
            return found
    if state is None or verdicts.problem(state) is not None:
        if state is not None:
            log.info(
                "not using the state dir %s for self-check verdicts: %s",
                state,
                verdicts.problem(state),
            )
        return _probe_now(system, compiler, cxx, ident, None)
    since = time.time()
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(verdicts.probing(state, ident, wait))
        except (
            LockTimeout,
            CacheError,
            OSError,
        ) as e:  # bounded: after `wait`, or with no usable lock, probe here
            log.warning(
                "running the toolchain self-check without waiting for another process's: %s",
                str(e).split(" Fix: ")[0],
            )
            return _probe_now(system, compiler, cxx, ident, state)
        found = None if recheck else _recalled(state, ident, cxx, since)
        return found if found is not None else _probe_now(system, compiler, cxx, ident, state)


class Pending:
    """A self-check running beside the first build (a thread). ``result()`` waits for it; ``gate(cache)``
    is the cache to build into: it publishes an entry only after a pass, and refuses otherwise."""

    def __init__(self, plan: Plan, settings: Settings) -> None:
        compiler = plan.ingredients["compiler"]
        self.op = plan.spec.name
        self._outcome: Result | BaseException | None = None
        args = (
            plan.system,
            compiler,
            plan.compiler.run if plan.compiler else compiler["path"],
            settings.state_root(),
        )
        self._thread = threading.Thread(
            target=self._run, args=args, name="jitops-selfcheck", daemon=True
        )
        self._thread.start()

    def _run(self, *args: Any) -> None:
        try:
            # threads of one process probe one at a time (then reuse the verdict in memory)
            with _lock:
                self._outcome = check(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the thread that waits
            self._outcome = e

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> Result:
        """The verdict (waits for it); raises the refusal if C++ errors would crash the process."""
        self._thread.join()
        outcome = self._outcome
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        if not outcome.ok and outcome.built:
            raise refusal(outcome, self.op)
        # no verdict: the real build reports its own error (file:line, OOM, ...) better
        if not outcome.built:
            log.info(
                "toolchain self-check could not build its probe (%s); going on with %s",
                outcome.detail,
                self.op,
            )
        return outcome

    def gate(self, cache: Cache) -> Cache:
        return _Gated(cache.root, self, cache.stamps)


class _Gated(Cache):
    """The same cache root; publishing waits for the self-check's verdict first (a refusal publishes nothing)."""

    def __init__(self, root: Path, pending: Pending, stamps: Stamps | None = None) -> None:
        super().__init__(root, stamps)
        self._pending = pending

    def publish_entry(
        self, staged: Path, address: Address, root: Path | None = None
    ) -> tuple[Hit | Miss, bool]:
        self._pending.result()
        return super().publish_entry(staged, address, root)


def start(plan: Plan, settings: Settings) -> Pending | None:
    """Start the self-check beside the first build (None: nothing to check: no C++ compiler, or the fake
    builder). Called on a cache miss only: the warm path never runs it."""
    if plan.ingredients.get("compiler") is None or settings.builder == "fake":
        return None
    # its probe is a C++-API op; see stable.py's docstring
    if plan.ingredients.get("abi") == "stable":
        return None
    return Pending(plan, settings)


def ensure_sound(plan: Plan, settings: Settings) -> None:
    """The self-check, waited for now: ToolchainError if C++ errors from this toolchain would crash."""
    pending = start(plan, settings)
    if pending is not None:
        pending.result()


def doctor(
    system: System, tool_dir: Path, settings: Settings, *, offline: bool, recheck: bool = False
) -> tuple[str, str, str]:
    """(status, detail, fix) for ``jitops doctor``: a remembered verdict unless ``recheck``, else the probe now."""
    if offline:
        return "info", "skipped: JITOPS_OFFLINE=1 never builds", ""
    if settings.builder == "fake":
        return "info", "skipped: JITOPS_BUILDER=fake runs no C++ compiler", ""
    try:
        tool = compilers.cxx(system, "<any>", tool_dir)
        compiler = compilers.ingredient(tool)
        cxx = tool.run
        result = check(system, compiler, cxx, settings.state_root(), recheck=recheck)
    except (
        ToolchainError,
        ConfigError,
    ) as e:  # no compiler, or unusable flag variables (the settings row says which)
        return "warn", f"not run: {str(e).split(' Fix: ')[0]}", ""
    if result.ok:
        if result.cached:
            return "ok", f"{result.detail} ({cxx}; `jitops doctor --recheck` runs it again)", ""
        return "ok", f"{result.detail} ({cxx}; {result.seconds:.1f} s)", ""
    if not result.built:
        return (
            "warn",
            f"could not build the probe op: {result.detail} ({result.seconds:.1f} s)",
            "check the compiler and flags (CXX, CXXFLAGS, LDFLAGS); a real build would likely fail the same way",
        )
    message = str(refusal(result, "<any>"))
    head, _, fix = message.partition(" Fix: ")
    head = head.replace("cannot build op '<any>': ", "")
    return "fail", f"{head} ({result.seconds:.1f} s)", fix
