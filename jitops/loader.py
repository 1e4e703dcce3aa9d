"""``jitops.loader``: the loading API, one module to read and to document.

[`get`][jitops.get] an op (built on first use for this device, cached by content),
[`reference`][jitops.reference] its pure-PyTorch twin, [`list_ops`][jitops.list_ops] and
[`register`][jitops.register] to see and add kernel libraries, [`load`][jitops.load] /
[`load_inline`][jitops.load_inline] / [`register_kernel_dir`][jitops.register_kernel_dir] for your
own sources (``load`` and ``load_inline`` take ``torch.utils.cpp_extension``'s parameters),
[`warm`][jitops.warm] to build entries ahead of time, and [`freeze`][jitops.freeze] /
[`unfreeze`][jitops.unfreeze] to make a build after warm-up an error. ``jitops.<name>`` is the same
object for each of these; the cache itself is [`jitops.cache`][jitops.cache].

Importing it is as inert as ``import jitops``: what each function needs is imported when it is first
called, so ``jitops.get`` on a warm cache costs what it cost before this module existed.
"""

# Imports: errors, spec; lazily api.dropin, api.user, api.warm, build.freeze, build.runner,
# loading.loader, registry, spec.checks, target; api.dropin, api.user, api.warm, loading.ops,
# registry (annotations).

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .spec import OpSpec

if TYPE_CHECKING:
    from .api.dropin import load, load_inline
    from .api.user import UserLibrary, register_kernel_dir
    from .api.warm import Outcome
    from .build.freeze import freeze, unfreeze
    from .loading.ops import Op
    from .registry import Registration

__all__ = [
    "UserLibrary",
    "freeze",
    "get",
    "list_ops",
    "load",
    "load_inline",
    "reference",
    "register",
    "register_kernel_dir",
    "unfreeze",
    "warm",
]

_DROPIN = ("load", "load_inline")
_USER = ("UserLibrary", "register_kernel_dir")
_FREEZE = ("freeze", "unfreeze")


def __getattr__(name: str) -> Any:
    """The user-kernel front doors and frozen mode, imported on first use (``import jitops`` stays
    cheap)."""
    if name in _DROPIN:
        from .api import dropin

        value = getattr(dropin, name)
    elif name in _USER:
        from .api import user

        value = getattr(user, name)
    elif name in _FREEZE:
        from .build import freeze

        value = getattr(freeze, name)
    else:
        raise AttributeError(f"module 'jitops.loader' has no attribute {name!r}")
    globals()[name] = value  # found once: later uses are a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def get(name: str, *, device: str | None = None, fallback: bool | None = None) -> Op:
    """Return op ``name`` for ``device`` (default: the current one), building it on first use.

    The first call on a machine compiles the op's library into the cache; every later call, in
    this process or another, loads the verified entry without a compiler. The result is a callable
    op registered with PyTorch's dispatcher, so ``torch.compile`` and ``torch.library.opcheck``
    see it as any other op.

    Args:
        name: an op from [`list_ops`][jitops.list_ops], e.g. ``"softmax"``.
        device: ``"cpu"`` or ``"cuda"``; ``None`` is the current device.
        fallback: ``True`` (or ``JITOPS_FALLBACK=1``) returns the pure-PyTorch reference, with one
            warning, when the op cannot be built here.

    Raises:
        UnknownOpError: no op of that name; the message lists close matches and the known ops.
        ToolchainError: no usable compiler, ninja or nvcc (before any lock).
        BuildError: the compiler failed; the message shows the first error.
        OfflineMiss: ``JITOPS_OFFLINE=1`` and nothing usable is cached.
        FrozenError: frozen mode and the op would have to be built.
    """
    from .loading.loader import get as _get
    from .spec.checks import get_args

    get_args(name, device, fallback)  # wrong types are an ArgumentError, not a deep TypeError
    return _get(name, device=device, fallback=fallback)


def list_ops() -> list[str]:
    """Names of every op [`get`][jitops.get] knows: builtins, registered libraries and kernel
    packages.

    Builds nothing and does not import torch."""
    from .registry import list_ops as _list_ops

    return _list_ops()


def reference(name: str) -> Any:
    """The pure-PyTorch reference implementation of op ``name``; builds nothing.

    The tests compare each kernel with it, and ``fallback=True`` answers with it.
    """
    from .loading.loader import reference as _reference
    from .spec.checks import op_name

    return _reference(op_name("jitops.reference", name))


def register(spec: OpSpec, *, replace: bool = False) -> Registration:
    """Make the kernel library described by ``spec`` reachable through [`get`][jitops.get].

    Args:
        spec: the library's declaration, in the builtins' format.
        replace: take over names another library already provides.

    Returns a handle whose ``undo()`` takes the registration back.
    """
    from .registry import register as _register
    from .spec import checks

    checks.flag("jitops.register", "replace", replace)
    return _register(checks.spec("jitops.register", spec), replace=replace)


def warm(
    ops: str | Sequence[str] | None = None,
    *,
    devices: str | Sequence[str] | None = None,
    arch: str | None = None,
    jobs: int | None = None,
) -> list[Outcome]:
    """Build the cache entries of ``ops`` (default: every known op) ahead of time, several at once,
    without loading them: what ``jitops warm`` does. ``devices``: default cpu, plus cuda where a GPU
    is visible or ``arch`` names CUDA archs (e.g. ``"8.0,9.0"``); ``jobs``: compiles in flight
    (default: ``MAX_JOBS``, else from cores and free memory). One outcome per library and device, in
    order, each ``built``, ``cached``, ``skipped`` (no CUDA toolchain here, with why) or ``failed``
    (with why)."""
    from .api import warm as _warm
    from .base.settings import Settings
    from .build.runner import default_jobs
    from .errors import ArgumentError, ConfigError
    from .registry import lookup, registry
    from .spec import checks
    from .target import probe

    func = "jitops.loader.warm"
    names = checks.strings(func, "ops", ops)
    wanted = checks.strings(func, "devices", devices)
    if arch is not None and not isinstance(arch, str):
        raise ArgumentError(f"{func}(): `arch` must be None or a str such as '8.0,9.0'")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ArgumentError(f"{func}(): `jobs` must be None or a whole number >= 1, got {jobs!r}")
    settings = Settings.from_env()
    if settings.offline:
        raise ConfigError(
            f"{func}() builds entries, and JITOPS_OFFLINE=1 forbids building. "
            "Fix: unset JITOPS_OFFLINE where the cache is warmed"
        )
    specs = [lookup(checks.op_name(func, n, "ops")) for n in names] or registry().specs()
    devs = wanted or _warm.default_devices(probe(), arch)
    tasks = _warm.tasks_for(specs, devs)
    return _warm.warm(
        tasks, archs=arch, jobs=jobs or default_jobs(settings.jobs), settings=settings
    )
