"""Building cache entries ahead of time (``jitops warm``), several libraries at once.

Entries are built without being loaded (:func:`entry.ensure_entry`), so CUDA
entries can be built on a machine without a GPU, given nvcc and a CUDA build
of torch. Where either is missing, CUDA work is *skipped* with its reason.

Imports: entry, errors, plan, settings, spec, target.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..build.entry import ensure_entry
from ..errors import JitopsError, TargetError, ToolchainError
from ..plan import make_plan
from ..base.settings import Settings
from ..spec import OpSpec
from ..target import System, probe


@dataclass(frozen=True)
class Task:
    spec: OpSpec
    device: str

    @property
    def what(self) -> str:
        return f"{self.spec.name} ({self.device})"


@dataclass(frozen=True)
class Outcome:
    task: Task
    status: str  # "built", "cached", "skipped" (no CUDA toolchain) or "failed"
    target: str
    seconds: float
    message: str = ""


def default_devices(system: System, archs: str | None) -> list[str]:
    """The devices warming builds for by default: cpu, plus cuda where a GPU is visible or CUDA
    archs were named (``jitops warm``, ``jitops cache fingerprint``, :func:`jitops.loader.warm`)."""
    return ["cpu", "cuda"] if (archs or system.cuda_available) else ["cpu"]


def tasks_for(specs: Sequence[OpSpec], devices: Sequence[str]) -> list[Task]:
    """One task per library and device it has sources for."""
    return [Task(s, d) for s in dict.fromkeys(specs) for d in devices if d in s.devices]


def _run(task: Task, archs: str | None, build_jobs: int, settings: Settings) -> Outcome:
    start = time.monotonic()
    try:
        plan = make_plan(task.spec, task.device, archs, settings=settings)
    except TargetError as e:
        return Outcome(
            task, "skipped" if task.device == "cuda" else "failed", task.device, 0.0, str(e)
        )
    try:
        entry = ensure_entry(plan, jobs=build_jobs, settings=settings)
    except ToolchainError as e:
        status = "skipped" if task.device == "cuda" else "failed"
        return Outcome(task, status, plan.target.name, time.monotonic() - start, str(e))
    except Exception as e:  # noqa: BLE001 - reported as this task's failure, never lost in a worker thread
        why = str(e) if isinstance(e, (JitopsError, OSError)) else f"{type(e).__name__}: {e}"
        return Outcome(task, "failed", plan.target.name, time.monotonic() - start, why)
    status = "built" if entry.built else "cached"
    return Outcome(task, status, plan.target.name, time.monotonic() - start, str(entry.path))


def warm(
    tasks: Sequence[Task],
    *,
    archs: str | None = None,
    jobs: int,
    on_start: Callable[[Task], None] = lambda t: None,
    on_done: Callable[[Outcome], None] = lambda o: None,
    settings: Settings | None = None,
) -> list[Outcome]:
    """Run ``tasks`` with at most ``jobs`` compiles in flight; outcomes in task order.

    Up to ``jobs`` libraries build at once and share the ``jobs`` compile
    slots, so the total never exceeds what the machine was sized for. Workers
    are daemon threads and the caller's thread only waits, so Ctrl-C returns
    at once; each build's supervisor then stops its compilers as this process
    exits, and nothing half-built is ever published.
    """
    if not tasks:
        return []
    settings = Settings.from_env() if settings is None else settings
    workers = max(1, min(jobs, len(tasks)))
    build_jobs = max(1, jobs // workers)
    guard = threading.Lock()
    pending = iter(enumerate(tasks))
    outcomes: list[Outcome | None] = [None] * len(tasks)

    def work() -> None:
        while True:
            with guard:
                i, task = next(pending, (-1, None))
                if task is None:
                    return
                on_start(task)
            outcome = _run(task, archs, build_jobs, settings)
            with guard:
                outcomes[i] = outcome
                on_done(outcome)

    probe()  # read torch's facts once, before the threads need them
    threads = [
        threading.Thread(target=work, name=f"jitops-warm-{n}", daemon=True) for n in range(workers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)
    return [o for o in outcomes if o is not None]
