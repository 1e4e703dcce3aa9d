"""Orchestration: spec -> target -> key -> cache hit, or lock + build + publish -> load.

The warm path (a verified cache entry) reads a manifest, hashes one library
and dlopens it: no ninja, no compiler, no subprocess, no import of
``torch.utils.cpp_extension``.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import compilers, fsutil, selfcheck, toolchain
from .cache import Cache, EntryProblem, Manifest, compute_key, default_root, namespace_for, source_digests, source_stamp
from .errors import CacheError, JitopsError, OfflineMiss, ToolchainError, UnknownOpError
from .ops import Op, op_from_library, ops_in_namespace, reference_for
from .spec import OpSpec, Registry, validate_name
from .toolchain import check_nvcc_matches_torch
from .archs import check_runnable, default_arch, runnable_code
from .target import System, Target, choose_target, extra_env_flags, probe

log = logging.getLogger("jitops")

REGISTRY = Registry()
_builtins_loaded = False
_state_lock = threading.RLock()
_libraries: dict[str, LoadedLibrary] = {}  # key -> loaded build
_ops: dict[tuple[str, str | None], Any] = {}  # (name, device) -> Op
_stamps: dict[tuple[str, str | None], Any] = {}  # (name, device) -> its kernel folder's files when loaded
_torch_libs: dict[str, Any] = {}  # namespace -> torch.library.Library (kept alive)
_torch_impls: dict[str, Any] = {}  # namespace -> its Functionalize kernels' Library (kept alive)
_fallback_warned: set[str] = set()
_private_cache: Path | None = None


def _reset_after_fork() -> None:
    # A fork taken while another thread held a lock must not deadlock the child.
    global _state_lock
    _state_lock = threading.RLock()


os.register_at_fork(after_in_child=_reset_after_fork)


def registry() -> Registry:
    global _builtins_loaded
    if not _builtins_loaded:
        with _state_lock:
            if not _builtins_loaded:
                from .kernels import BUILTINS

                REGISTRY.extend(BUILTINS)
                _builtins_loaded = True
    return REGISTRY


_entry_points_seen: set[str] = set()


def lookup(name: str) -> OpSpec:
    """The spec exporting op ``name``; on a miss, kernel packages' entry points are read first."""
    try:
        return registry().lookup(name)
    except UnknownOpError:
        if not _load_entry_points():
            raise
    return registry().lookup(name)


def _load_entry_points() -> bool:
    from .entrypoints import load_entry_points

    with _state_lock:
        return load_entry_points(registry(), _entry_points_seen)


def env_flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if environ is None else environ).get(name, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


# ------------------------------------------------------------------ plan


@dataclass(frozen=True)
class Plan:
    """Everything decided about one build of one library, before any lock."""

    spec: OpSpec
    target: Target
    system: System
    ingredients: dict[str, Any]
    key: str
    cache: Cache
    toolchain_error: ToolchainError | None = None

    @property
    def namespace(self) -> str:
        return namespace_for(self.spec.name, self.key)

    @property
    def entry(self) -> Path:
        return self.cache.entry_dir(self.spec.name, self.target.name, self.key)

    @property
    def what(self) -> str:
        return f"{self.spec.name} for {self.target.name}"


def ingredients(
    spec: OpSpec,
    target: Target,
    system: System,
    compiler: toolchain.Tool | None,
    nvcc: toolchain.Tool | None,
    digests: Mapping[str, str],
) -> dict[str, Any]:
    """Every input that changes the binary, and nothing that does not. Pure."""
    env_cflags, env_ldflags = extra_env_flags(system)
    return {
        "library": spec.name,
        "schemas": list(spec.schemas),
        "sources": dict(sorted(digests.items())),
        "build_sources": list(spec.sources_for(target.device)),
        "cflags": [*target.cflags(), *spec.cflags, *env_cflags],
        "cuda_cflags": [*target.cuda_cflags(), *spec.cuda_cflags] if target.device == "cuda" else [],
        "ldflags": [*target.ldflags(), *spec.ldflags, *env_ldflags],
        "target": {"name": target.name, "device": target.device, "isa": target.isa, "cuda_archs": list(target.archs)},
        "jitops_version": system.jitops_version,
        "torch_version": system.torch_version,
        "torch_git_version": system.torch_git_version,
        "torch_cuda": system.torch_cuda,
        "cxx11_abi": system.cxx11_abi,
        "python_abi": system.python_abi,
        "platform": system.platform,
        "machine": system.machine,
        "compiler": compilers.ingredient(compiler) if compiler else None,
        "nvcc": {"path": nvcc.path, "version": nvcc.version} if nvcc else None,
        "env": dict(system.build_env),
    }


def cache_for_reading(environ: Mapping[str, str] | None = None) -> Cache:
    return Cache(_private_cache or default_root(environ))


def make_plan(spec: OpSpec, device: str | None = None, archs: str | None = None) -> Plan:
    """Decide target and key. Raises ToolchainError (no compiler) within ~ms, before any lock."""
    system = probe()
    if device is None and "cuda" not in spec.devices:
        device = "cpu"  # a library without CUDA sources is a CPU library, on a GPU node too
    target = choose_target(system, device, archs)
    cache = cache_for_reading()
    tool_dir = cache.toolchains
    record = not env_flag("JITOPS_OFFLINE")  # offline never writes, not even identity records
    compiler = nvcc = None
    missing: ToolchainError | None = None
    try:
        compiler = compilers.cxx(system, spec.name, tool_dir, record=record)
        if target.device == "cuda":
            nvcc = toolchain.tool("nvcc", toolchain.find_nvcc(system, spec.name), tool_dir, record=record)
            check_nvcc_matches_torch(nvcc.version, system.torch_cuda, spec.name)
    except ToolchainError as e:
        missing = e
    ingr = ingredients(spec, target, system, compiler, nvcc, source_digests(spec))
    return Plan(spec, target, system, ingr, compute_key(ingr), cache, missing)


_TOOL_INGREDIENTS = ("compiler", "nvcc")


def find_compatible(plan: Plan) -> tuple[Path, Manifest] | None:
    """With no compiler here, an entry equal to the plan in every ingredient but the toolchain.

    This is how a slim container without a compiler loads a cache that was
    warmed elsewhere (same torch, flags and sources).
    """
    wanted = {k: v for k, v in plan.ingredients.items() if k not in _TOOL_INGREDIENTS}
    parent = plan.cache.entry_dir(plan.spec.name, plan.target.name, "x").parent
    if plan.cache.root_problem() is not None or not os.path.isdir(parent):
        return None
    for entry in sorted(parent.iterdir()):
        m = plan.cache.read_manifest(entry)
        if m is None or {k: v for k, v in m.ingredients.items() if k not in _TOOL_INGREDIENTS} != wanted:
            continue
        try:
            return entry, plan.cache.verify(entry, m.key, plan.spec.name, plan.target.name)
        except EntryProblem:
            continue
    return None


# ------------------------------------------------------------------ load


@dataclass(frozen=True)
class LoadedLibrary:
    spec: OpSpec
    key: str
    namespace: str
    target: str
    entry: Path
    manifest: Manifest
    built: bool  # True if this process compiled it
    ops: tuple[str, ...] = ()  # the op names it defines: the spec's exports, else found in the dispatcher


def _load_into_process(plan: Plan, manifest: Manifest, entry: Path, built: bool) -> LoadedLibrary:
    import torch

    ns = manifest.namespace
    if plan.spec.schemas and ns not in _torch_libs:
        lib = torch.library.Library(ns, "DEF")
        for schema in plan.spec.schemas:
            lib.define(schema)
        _torch_libs[ns] = lib
    torch.ops.load_library(str(entry / manifest.library_file))
    if plan.spec.python:
        importlib.import_module(plan.spec.python).register(ns)
    ops = plan.spec.exports or tuple(ops_in_namespace(ns))  # a user library's ops: from the dispatcher
    if ns not in _torch_impls:
        from . import functionalize

        impl = _torch_impls[ns] = torch.library.Library(ns, "IMPL")
        functionalize.register(ns, ops, impl)  # in-place and out= ops inside torch.compile
    return LoadedLibrary(plan.spec, plan.key, ns, plan.target.name, entry, manifest, built, ops)


def _try_cached(plan: Plan, cache: Cache) -> tuple[Manifest | None, str | None]:
    """(manifest, None) for a loadable entry; (None, why) otherwise."""
    entry = cache.entry_dir(plan.spec.name, plan.target.name, plan.key)
    if not os.path.lexists(entry):  # os.path: an unreachable cache is a miss, not a PermissionError
        return None, None
    problem = cache.root_problem()
    if problem is not None:
        return None, f"cache root refused: {problem}"
    try:
        return cache.verify(entry, plan.key, plan.spec.name, plan.target.name), None
    except EntryProblem as e:
        return None, str(e)


@dataclass(frozen=True)
class Entry:
    """A verified cache entry; ``plan`` is the plan whose key and cache it matches."""

    plan: Plan
    path: Path
    manifest: Manifest
    built: bool  # True if this call compiled it


def ensure_entry(plan: Plan, *, offline: bool | None = None, jobs: int | None = None) -> Entry:
    """Make sure a verified entry exists for ``plan``, building it if needed. Loads nothing.

    ``jitops warm`` uses this directly (a CUDA entry can be built on a machine
    without a GPU); :func:`load_library` loads what it returns. ``jobs`` caps
    the build's parallel compiles (default: :func:`build.default_jobs`).
    """
    spec = plan.spec
    offline = env_flag("JITOPS_OFFLINE") if offline is None else offline
    if plan.toolchain_error is not None:
        found = find_compatible(plan)
        if found is not None:
            entry, manifest = found
            plan = Plan(plan.spec, plan.target, plan.system, manifest.ingredients, manifest.key, plan.cache)
            return Entry(plan, entry, manifest, built=False)
        if not offline:
            raise plan.toolchain_error
    manifest, problem = _try_cached(plan, plan.cache)
    if manifest is not None:
        return Entry(plan, plan.entry, manifest, built=False)
    if offline:
        why = f" ({problem})" if problem else ""
        raise OfflineMiss(
            f"JITOPS_OFFLINE=1 and the cache {plan.cache.root} has no usable entry for op library "
            f"{spec.name!r} ({plan.target.name}, key {plan.key[:12]}){why}. Fix: run `jitops warm {spec.exports[0]}` "
            "with the same torch, compiler and flags, or unset JITOPS_OFFLINE"
        )
    toolchain.find_ninja(spec.name)  # a missing tool fails here, before any lock
    selfcheck.ensure_sound(plan)  # once per toolchain: C++ errors must arrive as RuntimeError, not crash
    from .lock import key_lock, lock_timeout  # miss path only: keeps the warm path's imports small
    from .publish import build_and_publish

    cache = _writable_cache(plan.cache, plan.what)
    if cache is not plan.cache:
        plan = Plan(plan.spec, plan.target, plan.system, plan.ingredients, plan.key, cache, plan.toolchain_error)
    with key_lock(cache.lock_path(spec.name, plan.key), plan.what, lock_timeout()):
        manifest, problem = _try_cached(plan, cache)
        if manifest is not None:
            return Entry(plan, plan.entry, manifest, built=False)
        if problem is not None and os.path.lexists(plan.entry):
            cache.set_aside(plan.entry, problem)
        return Entry(plan, plan.entry, build_and_publish(plan, cache, jobs), built=True)


def load_library(spec: OpSpec, device: str | None = None, archs: str | None = None, *, offline: bool | None = None) -> LoadedLibrary:
    """Get one library loaded: from memory, from the cache, or by building it."""
    plan = _runnable_here(make_plan(spec, device, archs), archs)
    hit = _libraries.get(plan.key)
    if hit is not None:
        return hit
    entry = ensure_entry(plan, offline=offline)
    with _state_lock:  # loading takes milliseconds; one thread loads, the others reuse
        hit = _libraries.get(entry.plan.key)
        if hit is None:
            hit = _load_into_process(entry.plan, entry.manifest, entry.path, built=entry.built)
            _libraries[entry.plan.key] = hit
            if not entry.built and not (env_flag("JITOPS_OFFLINE") if offline is None else offline):
                entry.plan.cache.record_use(entry.path)  # once per process: last use, for LRU pruning
        return hit


def _runnable_here(plan: Plan, archs: str | None) -> Plan:
    """Check before load: ``plan``, unless its CUDA arch list holds no code the current GPU runs.

    The entry loaded for a plan holds exactly the plan's archs (they are in
    the key, and a verified manifest's ingredients hash to it), so checking
    here, before any build, checks the entry. A list the caller named is an
    error; one from TORCH_CUDA_ARCH_LIST gives way, with a warning, to the
    current GPU's own arch. Without a GPU there is nothing to check.
    """
    cap = plan.system.device_capability
    if plan.target.device != "cuda" or cap is None or runnable_code(plan.target.archs, cap) is not None:
        return plan
    if archs:
        check_runnable(plan.target.archs, cap, f"op library {plan.spec.name!r} built for {plan.target.name}")
    here = default_arch(cap, plan.system.torch_cuda_archs)
    log.warning("TORCH_CUDA_ARCH_LIST=%r has no code for this GPU (compute capability %d.%d); building %s for %s instead",
                plan.system.env("TORCH_CUDA_ARCH_LIST"), *cap, plan.spec.name, here)
    return make_plan(plan.spec, "cuda", here)


def _writable_cache(cache: Cache, what: str) -> Cache:
    """The cache itself if it can take a build; else a private temporary one (one warning)."""
    global _private_cache
    try:
        cache.ensure_base()
        problem = cache.root_problem()
        if problem is None:
            probe_file = cache.staging / f".probe.{os.getpid()}.{threading.get_ident()}"
            fsutil.atomic_write(probe_file, b"")
            probe_file.unlink()
            return cache
    except OSError as e:
        problem = f"{cache.root} is not writable ({e.strerror or e})"
    if env_flag("JITOPS_STRICT"):
        raise CacheError(
            f"cannot build {what}: the jitops cache is unusable ({problem}). Fix: make it writable by this user with mode 0700, "
            "or point JITOPS_CACHE_DIR at a directory you own (JITOPS_STRICT=1 forbids a temporary cache)"
        )
    with _state_lock:
        if _private_cache is None:
            _private_cache = Path(tempfile.mkdtemp(prefix="jitops-cache-"))
            os.chmod(_private_cache, fsutil.DIR_MODE)
            atexit.register(shutil.rmtree, _private_cache, ignore_errors=True)
            warnings.warn(
                f"jitops: cannot use the cache for {what} ({problem}); building into the private temporary cache "
                f"{_private_cache} for this process. Fix: set JITOPS_CACHE_DIR to a directory you own",
                RuntimeWarning,
                stacklevel=3,
            )
    fallback = Cache(_private_cache)
    fallback.ensure_base()
    return fallback


# ------------------------------------------------------------------ ops


def reference(name: str) -> Callable[..., Any]:
    """The pure-PyTorch reference implementation of a builtin op (builds nothing)."""
    spec = lookup(name)
    ref = reference_for(spec, name)
    if ref is None:
        raise KeyError(f"op {name!r} has no pure-PyTorch reference")
    return ref


def get(name: str, *, device: str | None = None, fallback: bool | None = None) -> Op:
    """The op ``name``, built for ``device`` (default: the current device) on first use."""
    key = (name, device)
    op = _ops.get(key)  # lock-free fast path: dict reads are atomic
    if op is not None:
        stamp = _stamps.get(key)
        if stamp is None or stamp == source_stamp(op.library.spec):
            return op
    validate_name(name)  # before the registry import or any other file access
    spec = lookup(name)
    # A kernel folder is being edited in place: note its files now, so an edit made
    # during the build is seen by the next get().
    stamp = source_stamp(spec) if spec.editable else None
    try:
        lib = load_library(spec, device)
    except (ToolchainError, OfflineMiss) as e:
        use_fallback = env_flag("JITOPS_FALLBACK") if fallback is None else fallback
        if not use_fallback:
            raise
        return _fallback_op(spec, name, e)
    op = op_from_library(lib, name)
    with _state_lock:
        current = _ops.get(key)
        if current is not None and current.library is not None and current.library.key == lib.key:
            return current
        _ops[key] = op
        if stamp is not None:
            _stamps[key] = stamp
        return op


def _fallback_op(spec: OpSpec, name: str, cause: JitopsError) -> Op:
    ref = reference_for(spec, name)
    if ref is None:
        raise cause
    if name not in _fallback_warned:
        _fallback_warned.add(name)
        warnings.warn(
            f"jitops: using the pure-PyTorch reference for op {name!r} because it cannot be built here: {cause}",
            RuntimeWarning,
            stacklevel=3,
        )
    return Op(name, None, ref, None, ref)


def list_ops() -> list[str]:
    _load_entry_points()
    return registry().names()


def register(spec: OpSpec, *, replace: bool = False) -> None:
    """Make a kernel library reachable through :func:`get`."""
    validate_name(spec.name, "library name")
    registry().add(spec, replace=replace)
    with _state_lock:
        for e in spec.exports:
            for k in [k for k in _ops if k[0] == e]:
                del _ops[k]
                _stamps.pop(k, None)
