"""Precompiled headers built off the user's wait: a detached, low-priority child after the build returns.

A PCH of ``<torch/extension.h>`` costs a compile of its own (20-40 s under
load with g++) and, built beside the compiles that need a result, it doubled
the first edit of a user kernel. So when a build wants a PCH
(tubuild decides which, pch how), the build compiles without it and, once it
has succeeded, :func:`spawn` starts one child per PCH that:

* runs in a session of its own (no terminal signal, no wait by the parent:
  the process that asked exits whenever it likes), its output appended to
  ``logs/pch-<key>.log``, on CPU time nothing else wants (:func:`yield_cpu`):
  a compile the user waits for, or any other program, runs as if it were not
  there;
* takes the PCH's key lock without waiting (another process building it:
  nothing to do) and builds through :func:`pch.start` / :func:`pch.finish`:
  privately in staging, manifest last, one rename, verified before any use;
  never a half PCH in ``pch/``;
* is bounded: the compile is killed after ``limit`` seconds (and on SIGTERM),
  its staging removed;
* then bounds the rebuildable caches (:func:`store.admin.cap_parts`).

It starts only where the CPUs had time to spare during the build that wants it
(:func:`contention`, Linux's CPU pressure, under ``JITOPS_PCH_PRESSURE``): on
cores that other programs keep busy it would never run, and a starved child,
still runnable, slows the user's next compiles all the same. Such a build says
``deferred``; the next build that wants the PCH decides again.

An edit that arrives meanwhile finds the lock held and compiles without the
PCH (state ``busy``); later edits find it published (``hit``).
``JITOPS_PCH_BACKGROUND=0`` builds it beside the compiles instead, as before.
Tests and benchmarks that want the PCH now call :func:`wait`.

Imports: fsutil, pch; cache and admin (in the child only).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..base import fsutil
from . import pch

if TYPE_CHECKING:
    from ..store.cache import Cache

log = logging.getLogger("jitops")

# seconds a background PCH compile may take before it is killed (and nothing published)
LIMIT = 600.0
NICE = 19
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
_CHILD = (
    "import sys; sys.path.insert(0, sys.argv[1]); from jitops.build.pch_bg import child_main; "
    "sys.exit(child_main(sys.argv[2]))"
)
_children: list[
    subprocess.Popen[bytes]
] = []  # started by this process (wait(), and reaped as they end)
_keys: dict[int, str] = {}  # pid -> the PCH key its child builds
# Linux's pressure stall information: its first line's total is the microseconds in which some
# runnable task waited for a CPU, machine-wide
PRESSURE = "/proc/pressure/cpu"
Sample = tuple[float, float]  # (monotonic seconds, seconds some task waited for a CPU)


def cpu_waited() -> Sample | None:
    """Now, and how long runnable tasks have waited for a CPU so far; None where the system keeps
    no CPU pressure (not Linux, or a kernel without it). Cheap: one small read, no subprocess."""
    try:
        with open(PRESSURE, "rb") as f:
            first = f.readline()
        waited = int(first.rsplit(b"total=", 1)[1]) / 1e6
    except (OSError, ValueError, IndexError):
        return None
    return time.monotonic(), waited


def contention(since: Sample | None) -> float | None:
    """The share of the time since ``since`` (a :func:`cpu_waited`) in which some task waited for a
    CPU: near 0 with a core to spare, near 1 when other programs keep every core busy."""
    now = cpu_waited()
    if since is None or now is None or now[0] <= since[0]:
        return None
    return min(1.0, max(0.0, (now[1] - since[1]) / (now[0] - since[0])))


def busy(cache: Cache, key: str) -> bool:
    """Whether the PCH is being built: by a child of this process (even one still starting), or under its lock."""
    return any(_keys.get(c.pid) == key and c.poll() is None for c in _children) or pch.building(
        cache, key
    )


def start(
    cache: Cache,
    wanted: dict[str, dict[str, Any]],
    env: dict[str, str],
    max_size: int,
    since: Sample | None,
    pressure: float,
    infos: Iterable[dict[str, Any]],
) -> str:
    """:func:`spawn`, then its outcome as a build's PCH state: ``background`` (started),
    ``deferred`` (the CPUs were contended) or ``unavailable``; written into each of ``infos``
    (the build's per-file records) whose state was ``background``, the one that waited on it."""
    pids = spawn(cache, wanted, env, max_size, since, pressure)
    state = "deferred" if pids is None else "background" if pids else "unavailable"
    for info in infos:
        if info.get("pch") == "background":
            info["pch"] = state
    return state


def spawn(
    cache: Cache,
    wanted: dict[str, dict[str, Any]],
    env: dict[str, str],
    max_size: int,
    since: Sample | None = None,
    pressure: float = 1.0,
) -> list[int] | None:
    """Start one detached child per wanted PCH ({key: pch.start's keywords}); their pids. None: not
    now, the CPUs were contended more than ``pressure`` since ``since`` (the build's start). Never
    raises."""
    _children[:] = [c for c in _children if c.poll() is None]
    share = contention(since) if pressure < 1.0 else None
    if share is not None and share > pressure:
        log.info(
            "PCH %s: not started: programs waited for a CPU %.0f%% of the build (over "
            "JITOPS_PCH_PRESSURE=%g); a later build starts it",
            ", ".join(k[:12] for k in wanted),
            share * 100,
            pressure,
        )
        return None
    pids = []
    for key, kw in wanted.items():
        spec = {
            "cache": str(cache.root),
            "key": key,
            "limit": LIMIT,
            "max_size": max_size,
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in kw.items()},
        }
        log_path = cache.logs / f"pch-{key[:12]}.log"
        keep_log = fsutil.may_hold(cache.logs)  # never written through a link: no log then
        try:
            with contextlib.ExitStack() as stack:
                out: Any = subprocess.DEVNULL
                if keep_log:
                    fsutil.makedirs(cache.logs)
                    fd = os.open(
                        log_path,
                        os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                        fsutil.FILE_MODE,
                    )
                    out = stack.enter_context(os.fdopen(fd, "ab"))
                child = subprocess.Popen(
                    [sys.executable, "-I", "-c", _CHILD, _PACKAGE_PARENT, json.dumps(spec)],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as e:
            log.info(
                "note: could not start the background build of PCH %s (%s)",
                key[:12],
                e.strerror or e,
            )
            continue
        _lower(child.pid)
        _children.append(child)
        _keys[child.pid] = key
        pids.append(child.pid)
        log.info(
            "PCH %s: building in the background (pid %d; %s)",
            key[:12],
            child.pid,
            f"log {log_path}" if keep_log else f"no log: {cache.logs} is not a folder of the cache",
        )
    return pids


def _lower(pid: int) -> None:
    """A child just started: on idle CPU time at once, not only once it has imported jitops and
    lowered itself (yield_cpu): that start-up, at full weight in a new session's autogroup, would
    take CPU from the build that spawned it. Best effort, as yield_cpu."""
    _set_priority([pid], NICE, "SCHED_IDLE", group=pid)


def _hurry(pid: int) -> None:
    """A waiter wants this child's PCH now: the child, what it runs and its session's autogroup back
    at ordinary priority, where this process may raise priorities (CAP_SYS_NICE); else they stay on
    idle CPU time."""
    _set_priority([pid, *_below(pid)], 0, "SCHED_OTHER", group=pid)


def _set_priority(pids: list[int], nice: int, policy: str, group: int | None) -> None:
    """Best effort: each process of ``pids`` in scheduling class ``policy`` (its name in ``os``;
    none where the OS has none) at ``nice``, and the autogroup of ``group``, a session's leader, at
    ``nice`` too. The class first: a process leaves the idle class before its nice is raised."""
    for p in pids:
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setscheduler(p, getattr(os, policy), os.sched_param(0))
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, p, nice)
    if group is not None:
        with contextlib.suppress(OSError), open(f"/proc/{group}/autogroup", "w") as f:
            f.write(str(nice))


def _below(pid: int) -> list[int]:
    """The processes below ``pid`` (Linux's /proc; [] elsewhere)."""
    parent: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    with open(f"/proc/{name}/stat") as f:
                        parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
    found, todo = [], [pid]
    while todo:
        at = todo.pop()
        kids = [p for p, pp in parent.items() if pp == at]
        found += kids
        todo += kids
    return found


def wait(timeout: float | None = None) -> bool:
    """Wait for the background PCH builds this process started, hurrying them each second (a child
    that had not yet lowered itself does so once: :func:`_hurry`); True if none is left running."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for child in list(_children):
        while child.poll() is None:
            _hurry(child.pid)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(1.0 if left is None else min(1.0, left))
        _children.remove(child)
    return True


def running() -> list[int]:
    """The pids of this process's background PCH builds still running."""
    return [c.pid for c in _children if c.poll() is None]


def yield_cpu() -> None:
    """Give this process, and what it starts, only CPU time nothing else wants: the lowest nice, the
    idle scheduling class, and the lowest nice of its session's autogroup (where Linux groups
    processes by session, a process's own nice only ranks it within its session: a detached child
    at nice 19 would otherwise take a core from the user's compile as an equal). The autogroup is
    every process of the session: it is lowered only by the session's leader (spawn's child), never
    in a session shared with the user's processes. Best effort."""
    me = os.getpid()
    _set_priority([me], NICE, "SCHED_IDLE", group=me if os.getsid(0) == me else None)


def child_main(raw: str) -> int:
    """The detached child: lock, build in staging, publish, cap the caches. Its exit code is 0 unless it was killed."""
    from ..store import admin as cache_admin
    from ..store.cache import Cache

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s pch-bg[{os.getpid()}] %(message)s")
    yield_cpu()
    spec = json.loads(raw)
    cache = Cache(Path(spec["cache"]))
    # e.g. the parent's private temporary cache,
    if not fsutil.is_real_dir(cache.base) or cache.root_problem():
        # removed at
        log.info(
            "PCH %s: the cache %s is gone or unsafe; nothing to do", spec["key"][:12], cache.root
        )
        # its exit: never made again here (its path was in argv, another user could have made it)
        return 0
    p = pch.start(
        cache,
        key=spec["key"],
        kind=spec["kind"],
        cxx=spec["cxx"],
        flags=spec["flags"],
        prefix=spec["prefix"],
        root=Path(spec["root"]),
        pinned=tuple(str(d) for d in spec.get("pinned", ())),
        speed=tuple(spec.get("speed", ())),
    )
    if p is None:
        log.info(
            "PCH %s: published or being built by another process; nothing to do", spec["key"][:12]
        )
        return 0
    start, ok = time.monotonic(), False
    # the build's own staging may be gone by now
    tmp = {k: str(p.staging) for k in ("TMPDIR", "TMP", "TEMP")}
    procs: list[subprocess.Popen[bytes]] = []

    def stop(signum: int, frame: object) -> None:
        for proc in procs:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # before the compile starts
        signal.signal(sig, stop)
    # coreutils' timeout bounds the compile's whole process group even if this child is SIGKILLed
    bound = (
        ["timeout", "-s", "KILL", str(int(float(spec["limit"])) + 5)]
        if shutil.which("timeout")
        else []
    )
    # a process group of its own (killed as one), in this child's session: a new session would be
    # a new autogroup, at the default nice again
    proc = subprocess.Popen(
        [*bound, "/bin/sh", "-c", p.command],
        stdin=subprocess.DEVNULL,
        preexec_fn=os.setpgrp,  # noqa: PLW1509  (this child runs no threads)
        env={**os.environ, **tmp},
    )
    procs.append(proc)
    try:
        proc.wait(timeout=float(spec["limit"]))
        ok = True
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.info(
            "note: PCH %s took more than %gs; stopped, nothing published",
            spec["key"][:12],
            spec["limit"],
        )
    finally:
        made = pch.finish(cache, p, time.monotonic() - start, publish=ok)
    log.info(
        "PCH %s: %s in %.1fs",
        spec["key"][:12],
        "published" if made else "not made",
        time.monotonic() - start,
    )
    if spec.get("max_size"):
        cache_admin.cap_parts(cache, int(spec["max_size"]))
    return 0
