"""Answers about this machine: ``doctor`` (would a build work?) and the cache ``fingerprint``
CI jobs key their cache by (``explain`` lives in :mod:`jitops.explain`).

Every answer about an op comes from :func:`entry.entry_status`, the same
question ``get`` asks.

Imports: _version, api.warm (default_devices), store.cache, compilers, entry, errors, key, manifest,
plan, runner, selfcheck, settings, spec, target, toolchain; repair lazily; remote.commands lazily,
only when ``settings.remote`` is set (doctor's remote rows).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..target import compilers, toolchain
from ..build import selfcheck
from .. import plan as planning
from .._version import __version__
from ..build.runner import default_jobs
from ..base import fsutil
from ..store.cache import Cache
from ..build.entry import Compatible, entry_status
from ..errors import ConfigError, JitopsError, TargetError, ToolchainError
from ..key import extra_env_flags, without_tools
from ..target import BUILD_ENV_VARS
from ..store.manifest import Hit
from ..base.settings import Settings
from ..spec import OpSpec
from ..api.warm import default_devices
from ..target import System, choose_target, probe

_SMOKE_CXX = "#include <vector>\nint main() { std::vector<int> v{1}; return v[0] - 1; }\n"


def fingerprint(
    specs: Sequence[OpSpec],
    devices: Sequence[str],
    archs: str | None = None,
    settings: Settings | None = None,
) -> str:
    """A short hash of every key ingredient of the given libraries and devices.

    The toolchain identity is left out, so a test job without a compiler
    computes the same value as the job that warmed the cache (the loader then
    uses entries equal in everything but the compiler).
    """
    settings = Settings.from_env() if settings is None else settings
    parts = []
    for spec in specs:
        for device in devices:
            if device not in spec.devices:
                continue
            try:
                plan = planning.make_plan(spec, device, archs, settings=settings)
            except TargetError:
                continue
            ingr = without_tools(plan.ingredients)
            parts.append([spec.name, plan.target.name, ingr])
    blob = json.dumps(
        sorted(parts, key=lambda p: (p[0], p[1])), sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


# ------------------------------------------------------------------ doctor


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok", "info", "warn" or "fail" (a build would fail)
    detail: str
    fix: str = ""


def _split_fix(message: str) -> tuple[str, str]:
    head, sep, fix = message.partition(" Fix: ")
    return (head, fix) if sep else (message, "")


def _toolchain_fail(name: str, e: ToolchainError, status: str = "fail") -> Check:
    detail, fix = _split_fix(str(e))
    return Check(name, status, detail, fix)


def _compiler(system: System, offline: bool, tool_dir: Path) -> Check:
    status = "warn" if offline else "fail"  # offline never builds
    try:
        tool = compilers.cxx(system, "<any>", tool_dir, record=not offline)
        path, version = tool.run, tool.version
    except ToolchainError as e:
        return _toolchain_fail("compiler", e, status)
    try:
        proc = subprocess.run(
            [path, "-std=c++17", "-fsyntax-only", "-x", "c++", "-"],
            input=_SMOKE_CXX,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        failed = proc.returncode != 0
        why = (proc.stderr or proc.stdout).strip().splitlines()[:1]
    except (OSError, subprocess.TimeoutExpired) as e:
        failed, why = True, [str(e)]
    if failed:
        return Check(
            "compiler",
            status,
            f"{path} ({version}) cannot compile a C++17 test program: {' '.join(why)}",
            "install a working C++ compiler with its standard library (e.g. `apt-get install g++`), "
            "or set CXX to one",
        )
    real = f" -> {tool.path}" if tool.path != path else ""
    omp = f"; OpenMP {' '.join(tool.openmp)}" if tool.openmp else ""
    return Check("compiler", "ok", f"{path}{real} ({version}{omp})")


def _ninja(offline: bool) -> Check:
    try:
        path = toolchain.find_ninja("<any>")
        version = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=20, check=False
        ).stdout.strip()
    except ToolchainError as e:
        return _toolchain_fail("ninja", e, "warn" if offline else "fail")
    except (OSError, subprocess.TimeoutExpired) as e:
        return Check(
            "ninja", "warn" if offline else "fail", f"cannot run ninja: {e}", "`pip install ninja`"
        )
    return Check("ninja", "ok", f"{path} ({version})")


def _nvcc(system: System, offline: bool, tool_dir: Path) -> Check:
    if not system.torch_cuda:
        return Check(
            "nvcc",
            "info",
            "not needed: this torch is a CPU-only build (no CUDA entries can be built)",
        )
    status = "fail" if system.cuda_available and not offline else "warn"
    try:
        path = toolchain.find_nvcc(system, "<any>")
        version = toolchain.identify(path, tool_dir, record=not offline)
        toolchain.check_nvcc_matches_torch(version, system.torch_cuda, "<any>")
    except ToolchainError as e:
        return _toolchain_fail("nvcc", e, status)
    return Check("nvcc", "ok", f"{path} ({version}); torch CUDA {system.torch_cuda}")


def _cache(root: Path, offline: bool, strict: bool) -> Check:
    cache = Cache(root)
    if not root.exists():
        parent = next((p for p in root.parents if p.exists()), Path("/"))
        if offline:
            return Check(
                "cache",
                "fail",
                f"{root} does not exist (offline mode needs a warmed cache)",
                "run `jitops warm --all` with this JITOPS_CACHE_DIR, or unset JITOPS_OFFLINE",
            )
        if not os.access(parent, os.W_OK | os.X_OK):
            return Check(
                "cache",
                "warn",
                f"{root} does not exist and {parent} is not writable; builds would go to "
                "a private temporary cache",
                "set JITOPS_CACHE_DIR to a directory you own",
            )
        return Check("cache", "ok", f"{root} (will be created on first build)")
    st = os.stat(root)
    free = shutil.disk_usage(root).free
    detail = (
        f"{root} (owner uid {st.st_uid}, mode {st.st_mode & 0o777:o}, {free / 2**30:.1f} GiB free)"
    )
    fresh = not os.path.lexists(cache.base)  # nothing built here yet: the first build makes v1
    if fresh and offline:
        return Check(
            "cache",
            "fail",
            f"{root} holds no cache yet (offline mode needs a warmed cache)",
            "run `jitops warm --all` with this JITOPS_CACHE_DIR, or unset JITOPS_OFFLINE",
        )
    problem = cache.root_problem() if not fresh else fsutil.insecure_reason(root, want_dir=True)
    if problem is not None:
        return Check(
            "cache",
            "fail",
            f"{detail}: refused: {problem}",
            "make it yours with mode 0700 (`chmod 700` as its owner), or set JITOPS_CACHE_DIR elsewhere",
        )
    if not offline and not (os.access(root, os.W_OK) and st.st_mode & 0o200):
        return Check(
            "cache",
            "fail" if strict else "warn",
            f"{detail}: not writable; builds would go to a private "
            "temporary cache" + (" (refused: JITOPS_STRICT=1)" if strict else ""),
            "make it writable by this user, or set JITOPS_CACHE_DIR to a directory you own",
        )
    if not offline and free < 2**30:
        return Check(
            "cache",
            "warn",
            f"{detail}: little free space",
            "free space or `jitops cache prune --max-size 1G`",
        )
    return Check(
        "cache",
        "ok",
        detail + (" (read-only use: offline)" if offline else "") + (" (empty)" if fresh else ""),
    )


def _obstructions(root: Path) -> Check:
    """Folders, files or links standing where the cache keeps something else."""
    from ..store.repair import REPAIR, scan

    found = scan(Cache(root))
    if not found:
        return Check("layout", "ok", "no obstructed paths in the cache tree")
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    return Check("layout", "warn", "; ".join(str(o) for o in found[:3]) + more, f"`{REPAIR}`")


def _devices(system: System) -> list[Check]:
    cpu = choose_target(system, "cpu")
    out = [
        Check(
            "cpu",
            "info",
            f"{system.machine}, torch dispatches to {system.cpu_capability}; target {cpu.name}",
        )
    ]
    if system.cuda_available and system.device_capability:
        import torch

        major, minor = system.device_capability
        out.append(
            Check(
                "gpu",
                "info",
                f"{torch.cuda.get_device_name()} (capability {major}.{minor}); "
                f"target {choose_target(system, 'cuda').name}",
            )
        )
    else:
        out.append(
            Check(
                "gpu", "info", "none visible" + ("" if system.torch_cuda else " (CPU-only torch)")
            )
        )
    return out


def _settings(settings: Settings, system: System) -> Check:
    shown = settings.shown()
    shown += [
        f"{k}={os.environ[k]!r}"
        for k in BUILD_ENV_VARS
        if os.environ.get(k) and not any(s.startswith(k + "=") for s in shown)
    ]
    try:
        extra_env_flags(system, "cuda")  # unsplittable flag variables
    except ConfigError as e:
        return Check("settings", "fail", *_split_fix(str(e)))
    return Check(
        "settings",
        "info",
        (", ".join(shown) or "none set") + f"; default build jobs {default_jobs(settings.jobs)}",
    )


def _ops(specs: Sequence[OpSpec], settings: Settings) -> list[Check]:
    out = []
    for spec in specs:
        try:
            plan = planning.make_plan(spec, settings=settings)
        except JitopsError as e:
            out.append(Check(f"op {spec.name}", "warn", str(e)))
            continue
        status = entry_status(plan)
        if isinstance(status, Hit):
            out.append(
                Check(f"op {spec.name}", "ok", f"cached for {plan.target.name} ({plan.key[:12]})")
            )
        elif isinstance(status, Compatible):
            out.append(
                Check(
                    f"op {spec.name}",
                    "ok",
                    f"cached for {plan.target.name} (built by another compiler)",
                )
            )
        elif settings.offline or settings.freeze == "error":
            var = "JITOPS_OFFLINE" if settings.offline else "JITOPS_FREEZE"
            out.append(
                Check(
                    f"op {spec.name}",
                    "fail",
                    f"not cached for {plan.target.name}; {var} forbids building it",
                    f"run `jitops warm {spec.exports[0]}` with this cache, or unset {var}",
                )
            )
        else:
            out.append(
                Check(
                    f"op {spec.name}",
                    "info",
                    f"not built yet for {plan.target.name} (first use builds it)",
                )
            )
    return out


def _fingerprint_check(specs: Sequence[OpSpec], system: System, settings: Settings) -> Check:
    try:
        devices = default_devices(system, None)
        return Check(
            "fingerprint",
            "info",
            f"{fingerprint(specs, devices, settings=settings)} (this machine: every op, "
            f"{', '.join(devices)}; = `jitops cache fingerprint`, a CI cache key; `jitops info OP` has one op's)",
        )
    except (
        ConfigError
    ) as e:  # reported by the settings check; doctor still prints every other check
        return Check("fingerprint", "warn", f"cannot compute: {_split_fix(str(e))[0]}")


def doctor(
    specs: Sequence[OpSpec], settings: Settings | None = None, *, recheck: bool = False
) -> list[Check]:
    """Every check, in display order. Any ``fail`` means a build (or offline load) would fail.
    ``recheck``: run the toolchain self-check even if a fresh verdict is remembered."""
    settings = Settings.from_env() if settings is None else settings
    system = probe()
    offline = settings.offline
    root = settings.cache_root()
    tool_dir = Cache(root).toolchains
    checks = [
        Check(
            "jitops",
            "info",
            f"{__version__} on python {sys.version.split()[0]} ({system.python_abi})",
        ),
        Check(
            "torch",
            "info",
            f"{system.torch_version}, CUDA {system.torch_cuda or 'none (CPU-only build)'}",
        ),
        _compiler(system, offline, tool_dir),
        _ninja(offline),
        Check(
            "self-check",
            *selfcheck.doctor(system, tool_dir, settings, offline=offline, recheck=recheck),
        ),
        _nvcc(system, offline, tool_dir),
        _cache(root, offline, settings.strict),
        _obstructions(root),
        *_devices(system),
        Check(
            "modes",
            "info",
            f"offline {'on' if offline else 'off'} (JITOPS_OFFLINE), fallback to PyTorch "
            f"{'on' if settings.fallback else 'off'} (JITOPS_FALLBACK), frozen "
            f"{settings.freeze or 'off'} (JITOPS_FREEZE)",
        ),
        _settings(settings, system),
        *_ops(specs, settings),
        _fingerprint_check(specs, system, settings),
    ]
    if settings.remote is not None:  # the remote tier: store, trust, upload, leases
        from ..remote.commands import doctor_checks

        checks += [
            Check(name, status, detail, fix)
            for name, status, detail, fix in doctor_checks(settings)
        ]
    return checks
