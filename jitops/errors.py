"""The exceptions jitops raises.

Every error is a :class:`JitopsError`, and also inherits the built-in exception
that fits it, so ``except KeyError`` around ``jitops.get`` keeps working.
Messages name the op, the cause and one fix.

Imports: nothing.
"""

from __future__ import annotations

from pathlib import Path


class JitopsError(Exception):
    """Base class of every error jitops raises."""


class UnknownOpError(JitopsError, KeyError):
    """No op of that name is registered; the message lists close matches and the known names."""

    SHOWN = 20  # names listed in the message; the rest are counted

    def __init__(
        self,
        name: str,
        suggestions: list[str] | tuple[str, ...] = (),
        available: list[str] | tuple[str, ...] = (),
        what: str = "op",
    ) -> None:
        self.name = name
        self.suggestions = tuple(suggestions)
        self.available = tuple(sorted(available))
        hint = (
            f"; did you mean {', '.join(repr(s) for s in self.suggestions)}?"
            if self.suggestions
            else ""
        )
        shown = ", ".join(self.available[: self.SHOWN])
        more = len(self.available) - self.SHOWN
        known = (
            f"known {what}s: {shown}"
            + (f" and {more} more (jitops.list_ops() lists every op)" if more > 0 else "")
            if self.available
            else f"no {what} is registered"
        )
        super().__init__(f"unknown {what} {name!r}{hint} ({known})")

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class ArgumentError(JitopsError, TypeError):
    """A public function or command got an argument of the wrong type or shape; names it and what it expects."""


class InvalidNameError(JitopsError, ValueError):
    """A name that may not reach the filesystem (checked before any file access)."""


class ToolchainError(JitopsError, RuntimeError):
    """A compiler, ninja or nvcc is missing or unusable; raised before any lock or build."""


class BuildError(JitopsError, RuntimeError):
    """The compiler failed. ``log`` holds the full output, ``log_path`` where it is kept."""

    def __init__(
        self, message: str, *, op: str, target: str, log: str, log_path: Path | None
    ) -> None:
        super().__init__(message)
        self.op = op
        self.target = target
        self.log = log
        self.log_path = log_path


class SourcesChanged(JitopsError, RuntimeError):
    """A file the key covers changed while it was compiled: the build was discarded, nothing published.
    ``entry.ensure_entry`` builds again from fresh digests (a few times) and raises BuildError after that."""


class BuildInterrupted(JitopsError, KeyboardInterrupt):
    """A build was interrupted (Ctrl-C); the compiler was stopped and nothing was published."""


class CacheError(JitopsError, OSError):
    """The cache directory cannot be used (permissions, ownership, full disk)."""


class LockTimeout(JitopsError, TimeoutError):
    """Waiting for another process's build took longer than JITOPS_LOCK_TIMEOUT."""


class OfflineMiss(JitopsError, LookupError):
    """JITOPS_OFFLINE=1 and the cache has no usable entry for this op and target."""


class FrozenError(JitopsError, RuntimeError):
    """Frozen mode (``JITOPS_FREEZE=error`` or ``jitops.freeze()``) and a use that would build: names the op library,
    its key, the cache and why nothing there matched. Nothing was built."""


class FrozenBuildWarning(JitopsError, UserWarning):
    """Warn mode (``JITOPS_FREEZE=warn`` or ``jitops.freeze("warn")``): a build after warm-up, once per op library and
    process. A JitopsError too, so ``-W error::jitops.FrozenBuildWarning`` raises something ``except JitopsError`` catches."""


class ConfigError(JitopsError, ValueError):
    """An environment variable (``JITOPS_*``, build flags, ``MAX_JOBS``) has a value jitops cannot use."""


class TargetError(JitopsError, RuntimeError):
    """No device target can be built or loaded here; the message lists each candidate and why."""


class KernelSourceError(JitopsError, ValueError):
    """User kernel sources that jitops cannot use (missing, wrong kind, or defining no op)."""


class NoPythonModuleError(KernelSourceError, ImportError):
    """``is_python_module=True`` for a library that defines no Python module and no op (torch: ImportError)."""
