"""Per-key build lock: an OS lock (released by the kernel if its holder dies).

The lock only avoids duplicate work; correctness comes from private staging
and atomic publishing. Where the filesystem has no file locking (ENOLCK or
ENOSYS on some network filesystems) jitops warns once and builds unlocked.
While waiting, a line names the holder (pid, host, age) at least every 30 s.

Imports: errors, fsutil, obstruct (filelock).
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import filelock

from ..base import fsutil
from . import obstruct
from ..errors import CacheError, LockTimeout

log = logging.getLogger("jitops")

PROGRESS_EVERY = 30.0
_UNSUPPORTED = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP}
_warned_unsupported = False
_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()
_FILELOCK_KW = (
    {"fallback_to_soft": False}
    if "fallback_to_soft" in inspect.signature(filelock.FileLock.__init__).parameters
    else {}
)


def _holder_text(holder: Path) -> str:
    info = fsutil.read_record(holder, 4096)  # bounded, never a link nor a FIFO
    if info is None:
        return "holder unknown"
    try:
        age = time.time() - float(info["since"])
        return f"pid {info['pid']} on {info['host']}, building for {age:.0f}s"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"


def _reset_after_fork() -> None:
    # A child forked while a thread of its parent held a key (a DataLoader
    # worker forked during a build) must not wait for a thread it does not
    # have. The parent's OS lock stays the parent's: the child's own attempt
    # opens the lock file anew and waits for that build like any process.
    global _thread_locks_guard
    _thread_locks_guard = threading.Lock()
    _thread_locks.clear()


os.register_at_fork(after_in_child=_reset_after_fork)


def _thread_lock(path: Path) -> threading.Lock:
    with _thread_locks_guard:
        return _thread_locks.setdefault(str(path), threading.Lock())


@contextlib.contextmanager
def key_lock(path: Path, what: str, timeout: float | None = None) -> Iterator[None]:
    """Hold the lock for one key, across threads and processes.

    ``what`` names the build in progress lines (``"softmax for cpu-avx512"``).
    """
    global _warned_unsupported
    deadline = None if timeout is None else time.monotonic() + timeout
    holder = path.with_suffix(".holder")
    tlock = _thread_lock(path)
    waited_since = time.monotonic()
    # Threads of this process queue on a threading lock first.
    while not tlock.acquire(
        timeout=PROGRESS_EVERY
        if deadline is None
        else max(0.0, min(PROGRESS_EVERY, deadline - time.monotonic()))
    ):
        if deadline is not None and time.monotonic() >= deadline:
            raise LockTimeout(_timeout_message(what, path, holder, timeout))
        log.warning(
            "waiting for another thread's build of %s (%.0fs so far)",
            what,
            time.monotonic() - waited_since,
        )
    try:
        # a folder or link at the lock path must not make the op unbuildable
        _clear_way(path, holder)
        flock = filelock.FileLock(
            str(path),
            mode=fsutil.FILE_MODE,
            thread_local=False,
            **_FILELOCK_KW,  # type: ignore[arg-type]
        )
        locked = False
        while True:
            step = PROGRESS_EVERY
            if deadline is not None:
                step = max(0.0, min(step, deadline - time.monotonic()))
            try:
                flock.acquire(timeout=step, poll_interval=0.05)
                locked = True
                break
            except filelock.Timeout:
                if deadline is not None and time.monotonic() >= deadline:
                    raise LockTimeout(_timeout_message(what, path, holder, timeout)) from None
                log.warning(
                    "waiting for the build of %s by another process (%s); lock %s",
                    what,
                    _holder_text(holder),
                    path,
                )
            except OSError as e:
                if e.errno not in _UNSUPPORTED:
                    raise CacheError(
                        f"cannot take the build lock {path} for {what}: {e.strerror or e}. Fix: make "
                        f"{path.parent} a folder writable by this user, or run `jitops cache repair`"
                    ) from e
                if not _warned_unsupported:
                    _warned_unsupported = True
                    log.warning(
                        "file locking is not supported on the filesystem of %s (%s); building without a lock. "
                        "Results stay correct (builds publish atomically) but concurrent processes may build twice",
                        path.parent,
                        e.strerror,
                    )
                break
        try:
            if locked:
                with contextlib.suppress(OSError):
                    fsutil.atomic_write(
                        holder,
                        json.dumps(
                            {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
                        ).encode(),
                    )
            yield
        finally:
            if locked:
                with contextlib.suppress(OSError):
                    holder.unlink()
                flock.release()
    finally:
        tlock.release()


def _clear_way(path: Path, holder: Path) -> None:
    """Heal what obstructs the lock folder, the lock file or its holder record (or raise CacheError)."""
    obstruct.heal(path.parent, want_dir=True, what="the locks folder")
    fsutil.makedirs(path.parent)
    obstruct.heal(path, want_dir=False, what="a build lock file")
    obstruct.heal(holder, want_dir=False, what="a lock holder record")


def _timeout_message(what: str, path: Path, holder: Path, timeout: float | None) -> str:
    return (
        f"gave up after {timeout:g}s (JITOPS_LOCK_TIMEOUT) waiting for the build of {what}: "
        f"the lock {path} is held ({_holder_text(holder)}). Fix: wait for that build, stop it, "
        "or raise JITOPS_LOCK_TIMEOUT; a lock whose holder died is released automatically"
    )
