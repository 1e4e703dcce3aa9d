"""jitops: JIT-compiled PyTorch ops from kernel sources shipped in a pure wheel.

``jitops.get("softmax")`` compiles the op for the current device on first use,
caches it (content-addressed, per device) and returns a callable dispatcher
op. Importing jitops is inert: no torch import, no subprocess, no file access.

The loading API lives in :mod:`jitops.loader` (``get``, ``load``, ``load_inline``, ``warm``...) and
the cache's in :mod:`jitops.cache`; each ``jitops.<name>`` here is the same object as its home's,
found on first use, so ``import jitops`` loads neither.
"""

# Imports: errors, spec, _version; on first use loader, api.dropin, api.user, build.freeze and cache
# (by name, through importlib, as ``jitops.cache`` / ``jitops.loader``); the same for annotations.

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
    from . import cache as cache, loader as loader
    from .api.dropin import load, load_inline
    from .api.user import UserLibrary, register_kernel_dir
    from .build.freeze import freeze, unfreeze
    from .loader import get, list_ops, reference, register, warm

_LOADER = ("get", "list_ops", "reference", "register", "warm")
_USER_API = ("UserLibrary", "register_kernel_dir")


def __getattr__(name: str) -> Any:
    """The public API, each name imported from its home on first use to keep ``import jitops``
    cheap: :mod:`jitops.loader` (``get``...), the drop-in and user-kernel front doors directly
    (their warm path imports no more than it did), frozen mode, and the :mod:`jitops.loader` /
    :mod:`jitops.cache` modules themselves."""
    if name in _LOADER:
        from . import loader

        value = getattr(loader, name)
    elif name in ("load", "load_inline"):
        from .api import dropin

        value = getattr(dropin, name)
    elif name in _USER_API:
        from .api import user

        value = getattr(user, name)
    elif name in ("freeze", "unfreeze"):  # frozen mode: no build after warm-up
        from .build import freeze

        value = getattr(freeze, name)
    elif name in ("cache", "loader"):
        import importlib

        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'jitops' has no attribute {name!r}")
    globals()[name] = value  # found once: later uses are a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "cache", "loader"})


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
    "warm",
]
