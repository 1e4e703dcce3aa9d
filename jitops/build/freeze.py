"""Frozen mode: after warm-up, a build is a bug.

``JITOPS_FREEZE=error|warn`` (``Settings.freeze``) or :func:`freeze` / :func:`unfreeze` (``jitops.freeze()``,
which win over the variable for the rest of the process) set it. :func:`entry.ensure_entry` asks
:func:`check` on a miss, just before it would build: ``error`` raises FrozenError, ``warn`` lets the build
go on with one FrozenBuildWarning per op library and process. A hit, a compatible entry and a fetch from
the remote tier build nothing, so they never get here.

Imports: errors, settings.
"""

from __future__ import annotations

import os
import threading
import warnings

from ..base.settings import FREEZE_MODES, Settings
from ..errors import ArgumentError, FrozenBuildWarning, FrozenError

_lock = threading.Lock()
_api: list[
    str | None
] = []  # [mode] once freeze()/unfreeze() was called in this process: it wins over JITOPS_FREEZE
_warned: set[str] = set()  # op libraries warn mode has warned about in this process


def _reset_after_fork() -> None:
    global _lock  # a fork taken while another thread held the lock must not deadlock the child
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def freeze(mode: str = "error") -> None:
    """From now on in this process, a use that would build raises FrozenError (``"error"``) or builds and warns
    once per op library (``"warn"``). Wins over ``JITOPS_FREEZE``; loads from the cache are unaffected."""
    if not isinstance(mode, str) or mode not in FREEZE_MODES:
        raise ArgumentError(
            f"jitops.freeze: mode must be one of {list(FREEZE_MODES)}, got {mode!r}. "
            "Fix: jitops.freeze() (a build raises FrozenError) or jitops.freeze('warn')"
        )
    with _lock:
        _api[:] = [mode]


def unfreeze() -> None:
    """Builds are allowed again in this process, whatever ``JITOPS_FREEZE`` says."""
    with _lock:
        _api[:] = [None]


def mode(settings: Settings) -> tuple[str | None, str]:
    """This process's freeze mode (None: builds allowed) and what set it, for messages."""
    api = _api[:]
    if api:
        return api[0], f"jitops.freeze({api[0]!r})" if api[0] else "jitops.unfreeze()"
    return settings.freeze, f"JITOPS_FREEZE={settings.freeze}"


def check(settings: Settings, library: str, what: str, why: str, warm_hint: str) -> None:
    """Before a build of op library ``library`` (``what``: it, its target and key; ``why``: why nothing matched):
    nothing in mode off, FrozenError in ``error``, the first time for ``library`` a warning in ``warn``."""
    frozen, source = mode(settings)
    if frozen is None:
        return
    if frozen == "error":
        raise FrozenError(
            f"{source} forbids building, and {what} would need a build: {why}. Nothing was built. "
            f"Fix: {warm_hint} before freezing, or allow builds (jitops.unfreeze(), or unset JITOPS_FREEZE)"
        )
    with _lock:
        first = library not in _warned
        _warned.add(library)
    if first:
        warnings.warn(
            f"jitops: {source}: building {what} after warm-up ({why}); further builds of "
            f"{library!r} in this process are not reported. Fix: {warm_hint} before freezing",
            FrozenBuildWarning,
            stacklevel=2,
        )
