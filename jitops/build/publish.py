"""Build one planned library in a private staging dir and publish it into the cache.

The miss path only: the loader imports this module after a cache miss, under
the key's lock, so the warm path never pays for it.

Imports: cache, compilers, errors, fsutil, key, manifest, plan, settings, toolchain, tubuild; ninja, progress, runner lazily.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from ..target import compilers, toolchain
from ..base import fsutil
from ..store import inputs
from ..store.cache import Cache
from ..errors import BuildError, CacheError, SourcesChanged
from ..key import INCLUDE_DIR, SCRUBBED_ENV_VARS
from ..store.manifest import Hit, Manifest
from ..plan import Plan
from ..base.settings import Settings
from .tubuild import compiler_hint, cuda_hint, summary

log = logging.getLogger("jitops")
# Ingredients an object or PCH key holds in other forms (the source's digest, the exact flags) or
# not at all.
_NOT_IDENTITY = (
    "library",
    "schemas",
    "sources",
    "build_sources",
    "cflags",
    "cuda_cflags",
    "ldflags",
)


def build_env(tmp: Path) -> dict[str, str]:
    """The compiler's environment: os.environ minus SCRUBBED_ENV_VARS, temp files in the staging dir.

    gcc and nvcc keep intermediates (``cc*.s``, ``tmpxft_*``) in $TMPDIR; a
    compiler killed mid-build never deletes them, so they go in the staging
    dir, which the cache sweeps, instead of piling up in /tmp.
    """
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV_VARS}
    env["TMPDIR"] = env["TMP"] = env["TEMP"] = str(tmp)
    return env


def pinned_dirs(plan: Plan, cache: Cache) -> tuple[str, ...]:
    """The folders whose files an ingredient of the plan's key already pins, so a build does not record
    them (store.inputs): torch's install (its version; a stable entry's target version), jitops's own
    headers (digested in the key), the compiler's own folder and the CUDA toolkit (their identities),
    and the cache (what jitops generated: inline sources named by their digest, objects, PCHs)."""
    import torch

    dirs = [os.path.dirname(torch.__file__), str(INCLUDE_DIR), str(cache.root)]
    if plan.compiler is not None:
        dirs += compilers.own_dirs(plan.compiler, cache.toolchains)
    if plan.nvcc is not None:
        dirs.append(toolchain.cuda_home_of(plan.nvcc.path))
    return tuple(dict.fromkeys(os.path.realpath(d) for d in dirs if d))


def _pch_kind(plan: Plan, settings: Settings) -> str:
    """ "gcc" / "clang" when the build precompiles its header prefixes (JITOPS_PCH, on by default), else ""."""
    kind = compilers.kind_of(plan.compiler.version)[0] if settings.pch and plan.compiler else ""
    return kind if kind in ("gcc", "clang") else ""


def _work_dir(staging: Path, device: str) -> Path:
    """Where the compilers run. nvcc puts its working directory, its temp dir and its sources,
    unescaped, into command lines it runs through sh; if the cache's path would make sh act
    (`cmd`, $(cmd), ;), a CUDA build runs in a private temporary directory instead, and only
    the finished library comes back to the staging dir."""
    from .ninja import sh_plain

    if device != "cuda" or sh_plain(str(staging)):
        return staging
    work = Path(tempfile.mkdtemp(prefix="jitops-build-"))
    return work if sh_plain(str(work)) else staging


def build_and_publish(
    plan: Plan, cache: Cache, jobs: int | None = None, settings: Settings | None = None
) -> Manifest:
    from . import runner as _build
    from ..base.progress import BuildProgress

    settings = Settings.from_env() if settings is None else settings
    cache.sweep_staging()
    staging: Path | None = None
    work: Path | None = None
    try:
        staging = cache.new_staging(plan.spec.name, plan.key)
        work = _work_dir(staging, plan.target.device)
        build_dir = work / "build"
        out_dir = staging / "entry"
        for d in (build_dir, out_dir, work / "tmp"):
            fsutil.makedirs(d)
        spec, target = plan.spec, plan.target
        omp = compilers.ingredient(plan.compiler) if plan.compiler else None
        # a user's library
        edited = spec.origin != "builtin" and not spec.origin.startswith("package ")
        n_jobs = jobs or _build.default_jobs(settings.jobs)
        job = _build.BuildJob(
            library=spec.name,
            target=target.name,
            device=target.device,
            namespace=plan.namespace,
            sources=tuple(spec.root / s for s in spec.sources_for(target.device)),
            include_dirs=(INCLUDE_DIR, spec.root, *spec.include_dirs),
            # clang: -fopenmp=libgomp and GCC's omp.h
            cflags=compilers.build_flags(plan.cflags, omp),
            cuda_cflags=plan.cuda_cflags,
            ldflags=compilers.build_flags(plan.ldflags, omp),
            cxx=plan.compiler.run
            if plan.compiler
            else "c++",  # the command the user named; the key holds its realpath
            ninja=""
            if plan.builder == "stable"
            else toolchain.find_ninja(spec.name),  # stable: one g++ command
            nvcc=plan.nvcc.path if plan.nvcc else None,
            build_dir=build_dir,
            env=build_env(work / "tmp"),
            jobs=n_jobs,
            builder=plan.builder,  # the builder its key names
            fake_seconds=settings.fake_build_seconds,
            cache=cache,  # per-file objects and precompiled headers (tubuild)
            root=spec.root,
            identity=json.dumps(
                {k: v for k, v in plan.ingredients.items() if k not in _NOT_IDENTITY},
                sort_keys=True,
            ),
            pch=_pch_kind(plan, settings),
            pch_build=edited,
            pch_background=settings.pch_background,
            pch_max_size=settings.pch_max_size,
            pch_pressure=settings.pch_pressure,
            lean_extension=edited and settings.lean_extension_h,
            speed=compilers.gc_words(plan.compiler.version, n_jobs) if plan.compiler else (),
            lock_timeout=settings.lock_timeout,
            # the key's files re-digested after each ninja run
            sources_changed=plan.sources_changed,
            pinned=pinned_dirs(plan, cache),
            variant=plan.namespace.rsplit("_", 1)[-1][:12] if plan.variant else "",
        )
        log.info("building %s (first use; cached afterwards)", plan.what)
        began = time.time_ns()
        with BuildProgress(plan.what, forced=settings.progress):
            try:
                result = _build.build(job, cache.log_file(spec.name, target.name))
            except BuildError as e:
                if _build.NO_SPACE_MARKER in e.log:
                    raise OSError(errno.ENOSPC, "the compiler ran out of disk space") from e
                raise
        # a file read was written while it compiled: its recorded digest may not be what was
        # compiled
        written, stamp = inputs.after_build(result.inputs or {}, spec.root, began)
        if written is not None:
            raise SourcesChanged(
                f"library {spec.name!r}: {written} changed while it was compiled; nothing was published"
            )
        if stamp is not None and cache.stamps is not None:  # the proof on publishing needs no hash
            cache.stamps.record_inputs_stamp(os.fsdecode(cache.path_of(plan.address)), stamp)
        toolchain.persist(cache.toolchains)  # so the next process's warm path runs no `--version`
        lib_path = out_dir / job.library_file
        shutil.copyfile(result.library, lib_path)
        os.chmod(lib_path, fsutil.LIB_MODE)
        with open(lib_path, "rb+") as f:
            os.fsync(f.fileno())
        manifest = Manifest(
            key=plan.key,
            library=spec.name,
            target=target.name,
            namespace=plan.namespace,
            library_file=job.library_file,
            sha256=fsutil.sha256_file(lib_path),
            size=lib_path.stat().st_size,
            build_seconds=round(result.seconds, 3),
            built_at=time.time(),
            ingredients=plan.ingredients,
            build_log=result.log[-65536:],
            timings=result.timings,
            inputs=result.inputs,
        )
        fsutil.atomic_write(out_dir / "manifest.json", manifest.to_json())  # written last
        found, ours = cache.publish_entry(out_dir, plan.address, plan.spec.root)
        if not ours:
            # an unusable entry that could not be set aside (not ours to move)
            if not isinstance(found, Hit):
                raise CacheError(
                    f"cannot publish {plan.what}: {plan.entry} is in the way and can be neither used nor moved "
                    f"({found.reason}). Fix: remove that directory, or set JITOPS_CACHE_DIR to a cache you own"
                )
            log.info("another process published %s first; using its entry", plan.what)
            return found.manifest
        where = summary(result.timings)
        log.info("built %s in %.1fs%s", plan.what, result.seconds, f" ({where})" if where else "")
        for hint in (compiler_hint(result.timings, job.pch), cuda_hint(result.timings)):
            if hint:
                log.info(hint)
        if not isinstance(found, Hit):  # e.g. a directory above the entry belongs to another user
            raise CacheError(
                f"built {plan.what} but cannot trust where it was published: {found.reason}. "
                "Fix: set JITOPS_CACHE_DIR to a cache directory you own"
            )
        return found.manifest
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise CacheError(
                f"no space left on the device holding {cache.root} while building {plan.what}; nothing was "
                "published. Fix: free space on that filesystem, or set JITOPS_CACHE_DIR to one with room"
            ) from e
        raise
    finally:
        for private in (staging, work):
            if private is not None:
                shutil.rmtree(private, ignore_errors=True)
