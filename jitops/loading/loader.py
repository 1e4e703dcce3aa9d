"""Loading into this process, and the per-process memo: ``get``, ``load_library``, ``reference``.

The warm path (a verified cache entry) reads a manifest, hashes one library
(or finds it stamped as verified: ``stamps``) and dlopens it: no ninja, no compiler,
no subprocess, no import of ``torch.utils.cpp_extension``. Settings are read once
per public call here and passed down. ``get``'s memo answers while the spec, the build variables its
key holds and (an editable kernel folder) its files' stamps are as they were when it was planned.
Which build holds each fixed operator namespace in this process (``check_fixed``) is kept here too,
for both front doors.

Imports: fsutil, cache (an entry's library path; its stamps: a library's recorded op names), entry, errors, functionalize (lazily), key, manifest, ops, plan, registry
(lazily: ``get`` and ``reference`` only, not the drop-in), settings, spec.
"""

from __future__ import annotations

import importlib
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..base import fsutil
from ..store import inputs
from ..store.cache import Cache
from ..build.entry import ensure_entry
from ..errors import (
    ConfigError,
    FrozenError,
    JitopsError,
    KernelSourceError,
    OfflineMiss,
    ToolchainError,
)
from ..key import env_vars_for, source_stamp
from ..store.manifest import MANIFEST, Manifest
from .ops import Op, op_from_library, ops_in_namespace, reference_for
from ..plan import LoadedLibrary, Plan, make_plan, runnable_here
from ..base.settings import Settings
from ..spec import OpSpec, validate_name

_state_lock = threading.RLock()
_libraries: dict[str, LoadedLibrary] = {}  # key -> loaded build
# (name, device) -> (Op, the spec it came from, its kernel folder's files when loaded or None, the
# build variables its key holds, and their values when it was planned: see _build_env)
_ops: dict[tuple[str, str | None], tuple[Op, OpSpec, Any, tuple[Any, ...], list[Any]]] = {}
_torch_libs: dict[str, Any] = {}  # namespace -> torch.library.Library (kept alive)
_torch_impls: dict[str, Any] = {}  # namespace -> its Functionalize kernels' Library (kept alive)
_fallback_warned: set[str] = set()
# namespaces whose Python side (fake kernels, autograd) torch already holds
_python_registered: set[str] = set()


# The build variables as os.environ holds them (its encoded keys and values: a dict read per
# variable, not os.environ's own lookup, which costs ~1 us each); os.environ itself where it has no
# such mapping.
def _environ_reader() -> tuple[Callable[[Any], Any], Callable[[str], Any]]:
    data, encode = getattr(os.environ, "_data", None), getattr(os.environ, "encodekey", None)
    if isinstance(data, dict) and callable(encode):
        return data.get, encode
    return os.environ.get, str


_env_get, _env_key = _environ_reader()


def _build_env(device: str) -> tuple[tuple[Any, ...], list[Any]]:
    """(the variables a ``device`` key holds, their values now): what a memo hit compares, so that a change made
    in this process (a notebook setting ``CXXFLAGS``) plans again, as ``load`` and a fresh process do."""
    names = tuple(map(_env_key, env_vars_for(device)))
    return names, [*map(_env_get, names)]


def _reset_after_fork() -> None:
    # A fork taken while another thread held a lock must not deadlock the child.
    global _state_lock
    _state_lock = threading.RLock()


os.register_at_fork(after_in_child=_reset_after_fork)


def _load_into_process(plan: Plan, manifest: Manifest, entry: Any, built: bool) -> LoadedLibrary:
    import torch

    ns = manifest.namespace
    if plan.spec.schemas and ns not in _torch_libs:
        _define_schemas(ns, plan.spec)
    torch.ops.load_library(str(Cache.library_path(entry, manifest)))
    # torch's registrations are per process, as this set
    if plan.spec.python and ns not in _python_registered:
        importlib.import_module(plan.spec.python).register(ns)
        _python_registered.add(ns)
    ops = plan.spec.exports or _user_ops(plan.cache, entry, manifest, ns)
    if ops and ns not in _torch_impls:  # a library without ops (a pybind11 module) needs none
        from . import functionalize

        impl = _torch_impls[ns] = torch.library.Library(ns, "IMPL")
        functionalize.register(ns, ops, impl)  # in-place and out= ops inside torch.compile
    return LoadedLibrary(plan.spec, plan.key, ns, plan.target.name, entry, manifest, built, ops)


def _user_ops(cache: Cache, entry: Any, manifest: Manifest, ns: str) -> tuple[str, ...]:
    """A user library's ops: those recorded for this verified library and namespace (``stamps``), else listed
    from the dispatcher (thousands of names, a few ms) and recorded for the next process, as stamps are (not
    offline, not from a read-only cache)."""
    stamps = cache.stamps
    known = stamps.op_names(manifest.key, manifest.sha256, ns) if stamps is not None else None
    if known is not None:
        return known
    ops = tuple(ops_in_namespace(ns))
    if stamps is not None and fsutil.writable(Path(entry) / MANIFEST):
        stamps.record_op_names(manifest.key, manifest.sha256, ns, ops)
    return ops


# Fixed operator namespaces (TORCH_LIBRARY(myns, m), STABLE_TORCH_LIBRARY(myns, m)): the dispatcher
# registers one once per process, and a second registration throws from the library's static
# initialisers, which aborts the process. Both front doors (torch-style and stable-ABI sources)
# check here before anything is built or loaded. FIXED_LOCK is held from the check until the library
# is loaded: two edits loaded by two threads must not both pass.
FIXED_LOCK = threading.Lock()
_fixed_owners: dict[str, str] = {}  # fixed namespace -> key of the build that registered it here


def check_fixed(library: str, key: str, namespaces: Sequence[str], macro: str, fix: str) -> None:
    """KernelSourceError when one of ``namespaces`` is registered here by another build or by code jitops
    did not load (the same build again is the library loaded); ``macro`` is how the sources spell the
    registration, ``fix`` the way to edit without restarting."""
    for ns in namespaces:
        owner = _fixed_owners.get(ns)
        if owner == key:
            continue
        how = (
            f"from a different build of its source (key {owner[:12]})"
            if owner is not None
            else "by code jitops did not load"
            if ops_in_namespace(ns)
            else None
        )
        if how is None:
            continue
        raise KernelSourceError(
            f"library {library!r} defines the operator namespace {ns!r} ({macro}({ns}, m)), which this process "
            f"has already registered {how}. A namespace can be registered only once per process, so this code cannot "
            "be loaded next to the old one, and jitops will not keep calling the old code. Fix: restart the Python "
            f"process (the notebook kernel) to load the edit; or, for edits without restarts, {fix}"
        )


def claim_fixed(namespaces: Sequence[str], key: str) -> None:
    """Record that the build ``key`` registered ``namespaces`` in this process (the first build keeps them)."""
    for ns in namespaces:
        _fixed_owners.setdefault(ns, key)


def library_ops(cache: Cache, lib: LoadedLibrary, namespace: str) -> tuple[str, ...]:
    """The ops a loaded library registered in ``namespace`` (a fixed one its sources name, which no other
    library holds: check_fixed): recorded for it, else listed from the dispatcher, as its own namespace's."""
    return _user_ops(cache, lib.entry, lib.manifest, namespace)


def load_library(
    spec: OpSpec,
    device: str | None = None,
    archs: str | None = None,
    *,
    offline: bool | None = None,
    settings: Settings | None = None,
    plan: Plan | None = None,
) -> LoadedLibrary:
    """Get one library loaded: from memory, from the cache, or by building it. ``plan``: the caller's, made
    moments ago for the same arguments (``make_plan`` + ``runnable_here``; its key from the sources as they are)."""
    settings = Settings.from_env() if settings is None else settings
    offline = settings.offline if offline is None else offline
    if plan is None:
        plan = runnable_here(make_plan(spec, device, archs, settings=settings), archs, settings)
    hit = _libraries.get(plan.key)
    # still built from what is there now: else the entry is replaced, and its successor loaded
    # beside it
    if hit is not None and plan.cache.stale(hit.entry, hit.manifest, spec.root) is None:
        return hit
    entry = ensure_entry(plan, offline=offline, settings=settings)
    with _state_lock:  # loading takes milliseconds; one thread loads, the others reuse
        hit = _libraries.get(entry.plan.key)
        if hit is None or hit.manifest != entry.manifest:
            hit = _load_into_process(entry.plan, entry.manifest, entry.path, built=entry.built)
            _libraries[entry.plan.key] = hit
            if not entry.built and not offline:
                # once per process: last use, for LRU pruning
                entry.plan.cache.record_use(entry.path)
        return hit


def _define_schemas(ns: str, spec: OpSpec) -> None:
    """Define ``spec``'s schemas in namespace ``ns``, once per process.

    A namespace can be opened for definitions only once, so a schema torch
    refuses (found by the property test) is remembered and raised
    again as the same KernelSourceError, rather than as torch's "Only a single
    TORCH_LIBRARY" on the next call.
    """
    import torch

    if ns in _bad_schemas:
        raise KernelSourceError(_bad_schemas[ns])
    lib = torch.library.Library(ns, "DEF")
    for schema in spec.schemas:
        try:
            lib.define(schema)
        except (RuntimeError, ValueError) as e:
            first = (str(e).strip().splitlines() or ["invalid"])[0][:300]
            # torch keeps the namespace registered: keep its Library alive too
            _failed_libs.append(lib)
            _bad_schemas[ns] = (
                f"library {spec.name!r}: torch refuses the schema {schema[:200]!r} ({first}). Fix: "
                "write it as 'name(Tensor x, int dim) -> Tensor', each op defined once"
            )
            raise KernelSourceError(_bad_schemas[ns]) from None
    _torch_libs[ns] = lib


_bad_schemas: dict[str, str] = {}  # namespace -> why its schemas could not be defined
_failed_libs: list[Any] = []  # their torch.library.Library objects, kept alive as torch expects


def reference(name: str) -> Callable[..., Any]:
    """The pure-PyTorch reference implementation of a builtin op (builds nothing)."""
    from .. import registry as _registry

    spec = _registry.lookup(name)
    ref = reference_for(spec, name)
    if ref is None:
        raise KeyError(f"op {name!r} has no pure-PyTorch reference")
    return ref


def get(name: str, *, device: str | None = None, fallback: bool | None = None) -> Op:
    """The op ``name``, built for ``device`` (default: the current device) on first use."""
    from .. import registry as _registry

    key = (name, device)
    memo = _ops.get(key)  # lock-free fast path: dict reads are atomic
    if memo is not None:
        op, spec, stamp, names, seen = memo
        # Still the registered spec (register/undo change it), the build variables its key holds
        # unchanged, and its kernel folder unedited.
        if (
            _registry.find(name) is spec
            and [*map(_env_get, names)] == seen
            and (stamp is None or stamp == _edits(spec, stamp[1]))
        ):
            return op
    validate_name(name)  # before the registry import or any other file access
    settings = Settings.from_env()
    spec = _registry.lookup(name)
    # before the plan reads them: a change made meanwhile plans again on the next call
    env = {d: _build_env(d) for d in ("cpu", "cuda")}
    # A kernel folder is being edited in place: note its files now, so an edit made
    # during the build is seen by the next get().
    before = source_stamp(spec) if spec.editable else None
    try:
        lib = load_library(spec, device, settings=settings)
    except (
        ToolchainError,
        OfflineMiss,
        FrozenError,
        ConfigError,
    ) as e:  # ConfigError: e.g. unsplittable CXXFLAGS
        if not (settings.fallback if fallback is None else fallback):
            raise
        return _fallback_op(spec, name, e)
    op = op_from_library(lib, name)
    names, seen = env["cuda" if lib.target.startswith("cuda") else "cpu"]
    # and the other files its build read that a user may edit (headers outside the folder)
    stamp = None
    if before is not None:
        paths = inputs.watched(lib.manifest.inputs or {}, spec.root)
        stamp = (before, paths, inputs.stat_stamp(paths))
    with _state_lock:
        current = _ops.get(key)
        if (
            current is not None
            and current[0].library is not None
            and current[0].library.namespace == lib.namespace
        ):
            op = current[0]  # the same library: the same Op, with what it was planned from now
        _ops[key] = (op, spec, stamp, names, seen)
        return op


def _edits(spec: OpSpec, paths: tuple[str, ...]) -> tuple[Any, ...]:
    """What an editable library's memo compares: its folder's files and the others it watches."""
    return (source_stamp(spec), paths, inputs.stat_stamp(paths))


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
