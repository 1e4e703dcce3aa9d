"""Subpackage ``jitops.plan`` (stage 9), one module: what is decided before any lock. Public names:
``make_plan``, ``Plan``, ``LoadedLibrary``, ``runnable_here``. May import: ``jitops.store`` and the stages
below it (key, target, registry, kernels, spec, base, errors, _version).

A frozen, typed Plan: what ``get()`` would build for one library and target.

``make_plan`` probes once (torch, compiler identity, ISA, arch), decides the
target and computes the key, before any lock. The plan's fields are typed
(the compiler and nvcc as :class:`toolchain.Tool`, flags as tuples);
``ingredients`` is a view derived from them, used only for the key and the
manifest. Also the data type of a loaded library, which ops and user use.

Imports: archs, cache, compilers, errors, key, manifest, record, roots, settings, spec, target,
toolchain.
"""

from __future__ import annotations

import dataclasses
import hashlib
import functools
import logging
import os
from pathlib import Path
from typing import Any

from ..target import compilers, toolchain
from ..store.cache import Cache
from ..errors import ToolchainError
from ..key import (
    STABLE_ABI_FLAG,
    STABLE_BUILDER,
    Stamp,
    build_flags,
    changed_source,
    compute_key,
    ingredients,
    namespace_for,
    source_state,
)
from ..store.manifest import Address, Manifest
from ..store.roots import cache_for_reading
from ..base.record import record
from ..base.settings import Settings
from ..spec import OpSpec
from ..target import System, Target, choose_target, probe
from ..target.toolchain import Tool, check_nvcc_matches_torch

log = logging.getLogger("jitops.plan")


@record
class Plan:
    """Everything decided about one build of one library, before any lock."""

    spec: OpSpec
    target: Target
    system: System
    compiler: Tool | None
    nvcc: Tool | None
    digests: tuple[tuple[str, str], ...]  # (source label, sha256), sorted
    cflags: tuple[str, ...]
    cuda_cflags: tuple[str, ...]
    ldflags: tuple[str, ...]
    key: str
    cache: Cache
    toolchain_error: ToolchainError | None = None
    builder: str = "real"  # Settings.builder: which builder makes the entry (keyed unless "real")
    # each digested file's stamp when it was read (not in the key)
    stamps: tuple[tuple[str, Stamp], ...] = ()
    # the namespace of the entry a build of this key replaces (one built from other inputs, which
    # this process may have loaded): the new library's namespace is derived from it, so both can
    # coexist
    variant: str = ""

    @functools.cached_property
    def ingredients(self) -> dict[str, Any]:
        """The key's input (and the manifest's record) as plain data; derived, never parsed back."""
        return ingredients(
            self.spec,
            self.target,
            self.system,
            self.compiler,
            self.nvcc,
            dict(self.digests),
            self.builder,
        )

    @property
    def namespace(self) -> str:
        if not self.variant:
            return namespace_for(self.spec.name, self.key)
        return namespace_for(
            self.spec.name, hashlib.sha256(f"{self.key}:{self.variant}".encode()).hexdigest()
        )

    @property
    def address(self) -> Address:
        return Address(self.spec.name, self.target.name, self.key)

    @property
    def entry(self) -> Path:
        return self.cache.path_of(self.address)

    @property
    def what(self) -> str:
        return f"{self.spec.name} for {self.target.name}"

    def sources_changed(self) -> str | None:
        """None if every file the key covers still holds the bytes digested for it; else what changed."""
        return changed_source(self.spec, dict(self.digests), dict(self.stamps))

    def redigested(self) -> Plan:
        """This plan for the sources as they are now: fresh digests, stamps and key; the rest as it was."""
        digests, stamps = source_state(self.spec)
        ordered = tuple(sorted(digests.items()))
        key = compute_key(
            ingredients(
                self.spec,
                self.target,
                self.system,
                self.compiler,
                self.nvcc,
                dict(ordered),
                self.builder,
            )
        )
        return dataclasses.replace(
            self, digests=ordered, stamps=tuple(sorted(stamps.items())), key=key
        )

    def with_tools_of(self, manifest: Manifest) -> Plan:
        """This plan with the toolchain an entry equal in every other ingredient was built with."""
        compiler, nvcc = (
            _tool(name, manifest.ingredients.get(field))
            for name, field in (("cxx", "compiler"), ("nvcc", "nvcc"))
        )
        return dataclasses.replace(self, compiler=compiler, nvcc=nvcc, key=manifest.key)


def _tool(name: str, recorded: Any) -> Tool | None:
    """The Tool an entry's manifest records; never run (a Compatible entry is loaded, not built)."""
    if not isinstance(recorded, dict):
        return None
    driver = recorded.get("driver")
    command = os.path.join(os.path.dirname(recorded["path"]), driver) if driver else ""
    return Tool(
        name,
        recorded["path"],
        recorded["version"],
        command=command,
        openmp=tuple(recorded.get("openmp") or ()),
        programs=tuple(
            (str(k), str(v)) for k, v in sorted((recorded.get("programs") or {}).items())
        ),
    )


def make_plan(
    spec: OpSpec,
    device: str | None = None,
    archs: str | None = None,
    *,
    settings: Settings | None = None,
    cache: Cache | None = None,
    isa: str | None = None,
) -> Plan:
    """Decide target and key. A missing compiler is recorded (``toolchain_error``) within ~ms, before any lock.
    ``isa``: the CPU ISA torch dispatches to (``DEFAULT``, ``AVX2``, ``AVX512``) instead of this process's: the plan of
    an entry that a process with another ``ATEN_CPU_CAPABILITY`` builds (``jitops bundle build --isa``)."""
    settings = Settings.from_env() if settings is None else settings
    if device is None and "cuda" not in spec.devices:
        device = "cpu"  # a library without CUDA sources is a CPU library, on a GPU node too
    # A CPU plan reads no CUDA facts: torch would initialise CUDA for them, which a DataLoader
    # worker forked from a process that used CUDA cannot do (an H100 node failed jitops.get(name,
    # device="cpu") in such a worker).
    system = probe(cuda=device != "cpu")
    if isa is not None:
        system = dataclasses.replace(system, cpu_capability=isa)
    target = choose_target(system, device, archs)
    spec = spec.for_target(target.device, system.torch_version)
    builder = settings.builder
    if builder == "real" and STABLE_ABI_FLAG in spec.cflags:
        # one compiler command against the stable headers (build/stable.py)
        builder = STABLE_BUILDER
    cache = cache_for_reading(settings) if cache is None else cache
    tool_dir = cache.toolchains
    record = not settings.offline  # offline never writes, not even identity records
    compiler = nvcc = None
    missing: ToolchainError | None = None
    try:
        compiler = compilers.cxx(system, spec.name, tool_dir, record=record)
        if target.device == "cuda":
            nvcc = toolchain.tool(
                "nvcc", toolchain.find_nvcc(system, spec.name), tool_dir, record=record
            )
            check_nvcc_matches_torch(nvcc.version, system.torch_cuda, spec.name)
    except ToolchainError as e:
        missing = e
    found, stamps = source_state(spec)
    digests = tuple(sorted(found.items()))
    cflags, cuda_cflags, ldflags = build_flags(spec, target, system)
    key = compute_key(ingredients(spec, target, system, compiler, nvcc, dict(digests), builder))
    return Plan(
        spec,
        target,
        system,
        compiler,
        nvcc,
        digests,
        cflags,
        cuda_cflags,
        ldflags,
        key,
        cache,
        missing,
        builder=builder,
        stamps=tuple(sorted(stamps.items())),
    )


def runnable_here(plan: Plan, archs: str | None, settings: Settings | None = None) -> Plan:
    """Check before load: ``plan``, unless its CUDA arch list holds no code the current GPU runs.

    The entry loaded for a plan holds exactly the plan's archs (they are in
    the key, and a verified manifest's ingredients hash to it), so checking
    here, before any build, checks the entry. A list the caller named is an
    error; one from TORCH_CUDA_ARCH_LIST gives way, with a warning, to the
    current GPU's own arch. Without a GPU there is nothing to check.
    """
    cap = plan.system.device_capability
    if plan.target.device != "cuda" or cap is None:
        return plan
    from ..target.archs import check_runnable, default_arch, runnable_code  # (CUDA only)

    if runnable_code(plan.target.archs, cap) is not None:
        return plan
    if archs:
        check_runnable(
            plan.target.archs, cap, f"op library {plan.spec.name!r} built for {plan.target.name}"
        )
    here = default_arch(cap, plan.system.torch_cuda_archs)
    log.warning(
        "TORCH_CUDA_ARCH_LIST=%r has no code for this GPU (compute capability %d.%d); building %s for %s instead",
        plan.system.env("TORCH_CUDA_ARCH_LIST"),
        *cap,
        plan.spec.name,
        here,
    )
    return make_plan(plan.spec, "cuda", here, settings=settings)


@record
class LoadedLibrary:
    """One library loaded into this process."""

    spec: OpSpec
    key: str
    namespace: str
    target: str
    entry: Path
    manifest: Manifest
    built: bool  # True if this process compiled it
    ops: tuple[
        str, ...
    ] = ()  # the op names it defines: the spec's exports, else found in the dispatcher

    @property
    def library_path(self) -> Path:  # the loaded shared library, in its cache entry
        return Cache.library_path(self.entry, self.manifest)
