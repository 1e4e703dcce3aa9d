"""Toolchain self-check verdicts, remembered per user across cache roots.

One small JSON record per toolchain identity in the user's state directory
(``Settings.state_root()``: ``JITOPS_STATE_DIR``, else platformdirs' user state
dir): ``<state>/selfcheck/<identity>.json``. A record is read like any record
jitops trusts: the state root and its ``selfcheck`` folder must be this user's
folders, not links, not group- or world-writable; the record is opened without
following a link, checked on its open descriptor (a regular file, this user's,
not group- or world-writable, small) and its JSON checked field by field. A
record that fails any check is ignored, never trusted: the probe runs again and
replaces it. One OS lock per identity (``lock.key_lock``) makes concurrent
processes run one probe while the others wait, a bounded time, for its verdict.

A pass is reused for :data:`MAX_AGE`; a failure only by processes that were
already waiting for the probe that found it (so a fixed setup is seen at once).

Imports: fsutil, lock, stamps (the state dir's check).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..base import fsutil
from .lock import key_lock
from .stamps import make_private, unusable

log = logging.getLogger("jitops")

# A pass is trusted this long. The identity covers the compiler binary, flags and torch, but not the
# system's unwinder (libgcc_s) or libstdc++, which the verdict also depends on: a month bounds how
# stale it can get, at the cost of about a second once a month.
MAX_AGE = 30 * 86400.0
MAX_BYTES = 16384
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "identity": str,
    "ok": bool,
    "detail": str,
    "compiler": str,
    "seconds": (int, float),
    "when": (int, float),
}


def folder(state_root: Path) -> Path:
    return state_root / "selfcheck"


def problem(state_root: Path) -> str | None:
    """Why verdicts under ``state_root`` must be neither read nor written, or None (absent folders are fine;
    the reason logged once per process)."""
    return unusable(state_root, folder(state_root).name)


def _load(path: Path) -> dict[str, Any]:
    """The record at ``path``, checked on its open descriptor (fsutil.read_private_record); ValueError if it
    cannot be trusted."""
    data = fsutil.read_private_record(path, MAX_BYTES)
    if data is None:
        raise ValueError(
            f"{path} is not a well-formed JSON object in a regular file of this user's, writable only by it"
        )
    for name, kind in _FIELDS.items():
        if not isinstance(data.get(name), kind) or (
            kind is not bool and isinstance(data.get(name), bool)
        ):
            raise ValueError(f"field {name!r} is missing or not {kind}")
    return data


def read(state_root: Path, ident: str, *, since: float | None = None) -> dict[str, Any] | None:
    """The verdict recorded for ``ident`` if it can be trusted and still counts, else None.

    A pass counts for :data:`MAX_AGE`; a failure only if recorded at or after ``since`` (by the probe this
    process was waiting for).
    """
    path = folder(state_root) / f"{ident}.json"
    if problem(state_root) is not None or not os.path.lexists(path):
        return None
    try:
        data = _load(path)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        log.info("ignoring the self-check verdict %s (%s); the check runs again", path, e)
        return None
    age = time.time() - data["when"]
    # another identity's, or from the future: not evidence
    if data["identity"] != ident or age < -300:
        log.info(
            "ignoring the self-check verdict %s (it is not this toolchain's, or dated ahead)", path
        )
        return None
    if data["ok"]:
        return data if age <= MAX_AGE else None
    return data if since is not None and data["when"] >= since else None


def write(
    state_root: Path, ident: str, *, ok: bool, detail: str, compiler: str, seconds: float
) -> None:
    """Record a verdict (best effort: an unusable state dir means the check runs again next process)."""
    body = {
        "identity": ident,
        "ok": ok,
        "detail": detail[:4000],
        "compiler": compiler[:2000],
        "seconds": round(seconds, 2),
        "when": time.time(),
    }
    try:
        make_private(state_root, folder(state_root).name)  # checked before anything is made
        fsutil.atomic_write(folder(state_root) / f"{ident}.json", json.dumps(body).encode())
    except OSError as e:
        log.info(
            "could not record the toolchain self-check verdict in %s: %s", folder(state_root), e
        )


@contextlib.contextmanager
def probing(state_root: Path, ident: str, timeout: float) -> Iterator[None]:
    """Hold the one lock under which a process probes ``ident`` (LockTimeout after ``timeout`` s); no lock
    where verdicts cannot be kept (nothing to wait for: each process probes)."""
    try:
        make_private(state_root, folder(state_root).name)
    except OSError:
        usable = False
    else:
        usable = True
    if not usable:
        yield
        return
    with key_lock(folder(state_root) / f"{ident}.lock", "the toolchain self-check", timeout):
        yield
