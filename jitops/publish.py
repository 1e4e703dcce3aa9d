"""Build one planned library in a private staging dir and publish it into the cache.

The miss path only: the loader imports this module after a cache miss, under
the key's lock, so the warm path never pays for it.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from . import compilers, fsutil, toolchain
from .cache import Cache, EntryProblem, Manifest
from .errors import BuildError, CacheError
from .target import SCRUBBED_ENV_VARS

if TYPE_CHECKING:
    from .loader import Plan

log = logging.getLogger("jitops")


def build_env(tmp: Path) -> dict[str, str]:
    """The compiler's environment: os.environ minus SCRUBBED_ENV_VARS, temp files in the staging dir.

    gcc and nvcc keep intermediates (``cc*.s``, ``tmpxft_*``) in $TMPDIR; a
    compiler killed mid-build never deletes them, so they go in the staging
    dir, which the cache sweeps, instead of piling up in /tmp.
    """
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV_VARS}
    env["TMPDIR"] = env["TMP"] = env["TEMP"] = str(tmp)
    return env


def build_and_publish(plan: Plan, cache: Cache, jobs: int | None = None) -> Manifest:
    from . import build as _build
    from .progress import BuildProgress

    cache.sweep_staging()
    staging: Path | None = None
    try:
        staging = cache.new_staging(plan.spec.name, plan.key)
        build_dir = staging / "build"
        out_dir = staging / "entry"
        for d in (build_dir, out_dir, staging / "tmp"):
            fsutil.makedirs(d)
        spec, target = plan.spec, plan.target
        job = _build.BuildJob(
            library=spec.name,
            target=target.name,
            device=target.device,
            namespace=plan.namespace,
            sources=tuple(spec.root / s for s in spec.sources_for(target.device)),
            include_dirs=(Path(__file__).parent / "include", spec.root, *spec.include_dirs),
            cflags=compilers.build_flags(plan.ingredients["cflags"], plan.ingredients["compiler"]),
            cuda_cflags=tuple(plan.ingredients["cuda_cflags"]),
            ldflags=compilers.build_flags(plan.ingredients["ldflags"], plan.ingredients["compiler"]),
            cxx=toolchain.find_cxx(plan.system, spec.name),  # the command the user named; the key holds its realpath
            ninja=toolchain.find_ninja(spec.name),
            nvcc=(plan.ingredients["nvcc"] or {}).get("path"),
            build_dir=build_dir,
            env=build_env(staging / "tmp"),
            jobs=jobs or _build.default_jobs(),
        )
        log.info("building %s (first use; cached afterwards)", plan.what)
        with BuildProgress(plan.what):
            try:
                result = _build.build(job, cache.logs)
            except BuildError as e:
                if _build.NO_SPACE_MARKER in e.log:
                    raise OSError(errno.ENOSPC, "the compiler ran out of disk space") from e
                raise
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
        )
        fsutil.atomic_write(out_dir / "manifest.json", manifest.to_json())  # written last
        if not cache.publish(out_dir, spec.name, target.name, plan.key):
            try:
                theirs = cache.verify(plan.entry, plan.key, spec.name, target.name)
            except EntryProblem as e:  # an unusable entry that could not be set aside (not ours to move)
                raise CacheError(
                    f"cannot publish {plan.what}: {plan.entry} is in the way and can be neither used nor moved "
                    f"({e}). Fix: remove that directory, or set JITOPS_CACHE_DIR to a cache you own"
                ) from e
            log.info("another process published %s first; using its entry", plan.what)
            return theirs
        log.info("built %s in %.1fs", plan.what, result.seconds)
        try:
            return cache.verify(plan.entry, plan.key, spec.name, target.name)
        except EntryProblem as e:  # e.g. a directory above the entry belongs to another user
            raise CacheError(f"built {plan.what} but cannot trust where it was published: {e}. "
                             "Fix: set JITOPS_CACHE_DIR to a cache directory you own") from e
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise CacheError(
                f"no space left on the device holding {cache.root} while building {plan.what}; nothing was "
                "published. Fix: free space on that filesystem, or set JITOPS_CACHE_DIR to one with room"
            ) from e
        raise
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
