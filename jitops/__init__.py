"""jitops: JIT-compiled PyTorch ops from kernel sources shipped in a pure wheel.

``jitops.get("softmax")`` compiles the op for the current device on first use,
caches it (content-addressed, per device) and returns a callable dispatcher
op. Importing jitops is inert: no torch import, no subprocess, no file access.

Imports: errors, spec, _version; checks, dropin, freeze, loader, registry and user on first use (import stays inert); ops for annotations.
"""

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
    """The user-kernel API (:mod:`jitops.dropin`, :mod:`jitops.user`), imported on first use to keep
    ``import jitops`` cheap. ``load`` / ``load_inline`` take torch.utils.cpp_extension's parameters."""
    if name in ("load", "load_inline"):
        from .api import dropin

        return getattr(dropin, name)
    if name in _USER_API:
        from .api import user

        return getattr(user, name)
    if name in ("freeze", "unfreeze"):  # frozen mode (issue 31): no build after warm-up
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

    ``fallback=True`` (or ``JITOPS_FALLBACK=1``) returns the pure-PyTorch
    reference, with one warning, when the op cannot be built here.
    """
    from .spec.checks import get_args
    from .loading.loader import get as _get

    get_args(name, device, fallback)  # boundary check (issue 20)
    return _get(name, device=device, fallback=fallback)


def list_ops() -> list[str]:
    """Names of every op ``get`` knows: builtins and registered libraries."""
    from .registry import list_ops as _list_ops

    return _list_ops()


def reference(name: str) -> Any:
    """The pure-PyTorch reference implementation of op ``name``; builds nothing."""
    from .spec.checks import op_name
    from .loading.loader import reference as _reference

    return _reference(op_name("jitops.reference", name))  # boundary check (issue 20)


def register(spec: OpSpec, *, replace: bool = False) -> Registration:
    """Make the kernel library described by ``spec`` reachable through :func:`get`.

    Returns a handle whose ``undo()`` takes the registration back.
    """
    from .spec import checks
    from .registry import register as _register

    checks.flag("jitops.register", "replace", replace)  # boundary checks (issue 20)
    return _register(checks.spec("jitops.register", spec), replace=replace)
