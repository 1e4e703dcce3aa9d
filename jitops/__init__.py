"""jitops: JIT-compiled PyTorch ops from kernel sources shipped in a pure wheel.

``jitops.get("softmax")`` compiles the op for the current device on first use,
caches it (content-addressed, per device) and returns a callable dispatcher
op. Importing jitops is inert: no torch import, no subprocess, no file access.
"""

# Imports: errors, spec, _version; checks, dropin, freeze, loader, registry and user on first use
# (import stays inert); ops for annotations.

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import (
    ArgumentError,
    BuildError,
    BuildInterrupted,
    CacheError,
    ConfigError,
    FrozenBuildWarning,
    FrozenError,
    InvalidNameError,
    JitopsError,
    KernelSourceError,
    LockTimeout,
    NoPythonModuleError,
    OfflineMiss,
    TargetError,
    ToolchainError,
    UnknownOpError,
)
from .spec import OpSpec

if TYPE_CHECKING:
    from .loading.ops import Op
    from .registry import Registration
    from .api.dropin import load, load_inline
    from .api.user import UserLibrary, register_kernel_dir
    from .build.freeze import freeze, unfreeze

_USER_API = ("UserLibrary", "load", "load_inline", "register_kernel_dir")


def __getattr__(name: str) -> Any:
    """The user-kernel API and frozen mode, imported on first use so that ``import jitops`` stays
    inert. ``load`` / ``load_inline`` take torch.utils.cpp_extension's parameters."""
    if name in ("load", "load_inline"):
        from .api import dropin

        return getattr(dropin, name)
    if name in _USER_API:
        from .api import user

        return getattr(user, name)
    if name in ("freeze", "unfreeze"):  # frozen mode: no build after warm-up
        from .build import freeze

        return getattr(freeze, name)
    raise AttributeError(f"module 'jitops' has no attribute {name!r}")


__all__ = [
    "ArgumentError",
    "BuildError",
    "BuildInterrupted",
    "CacheError",
    "ConfigError",
    "FrozenBuildWarning",
    "FrozenError",
    "InvalidNameError",
    "JitopsError",
    "KernelSourceError",
    "LockTimeout",
    "NoPythonModuleError",
    "OfflineMiss",
    "OpSpec",
    "TargetError",
    "ToolchainError",
    "UnknownOpError",
    "UserLibrary",
    "__version__",
    "freeze",
    "get",
    "list_ops",
    "load",
    "load_inline",
    "reference",
    "register",
    "register_kernel_dir",
    "unfreeze",
]


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
    from .spec.checks import get_args
    from .loading.loader import get as _get

    get_args(name, device, fallback)  # wrong types are an ArgumentError, not a deep TypeError
    return _get(name, device=device, fallback=fallback)


def list_ops() -> list[str]:
    """Names of every op [`get`][jitops.get] knows: builtins, registered libraries and kernel packages.

    Builds nothing and does not import torch.
    """
    from .registry import list_ops as _list_ops

    return _list_ops()


def reference(name: str) -> Any:
    """The pure-PyTorch reference implementation of op ``name``; builds nothing.

    The tests compare each kernel with it, and ``fallback=True`` answers with it.
    """
    from .spec.checks import op_name
    from .loading.loader import reference as _reference

    return _reference(op_name("jitops.reference", name))  # the name is checked first


def register(spec: OpSpec, *, replace: bool = False) -> Registration:
    """Make the kernel library described by ``spec`` reachable through [`get`][jitops.get].

    Args:
        spec: the library's declaration, in the builtins' format.
        replace: take over names another library already provides.

    Returns a handle whose ``undo()`` takes the registration back.
    """
    from .spec import checks
    from .registry import register as _register

    checks.flag("jitops.register", "replace", replace)  # arguments checked at the boundary
    return _register(checks.spec("jitops.register", spec), replace=replace)
