"""Live build status: a ticking line in a terminal, an updating display in Jupyter.

The one place jitops writes to the user directly (everything else goes
through ``logging.getLogger("jitops")``). When neither a terminal nor a
notebook is attached, it shows nothing. ``JITOPS_PROGRESS=0/1`` forces it.

Imports: nothing of jitops.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any
from types import TracebackType


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None or "ipykernel" not in sys.modules:
        return False
    try:
        ip = shell.get_ipython()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - any failure means "no notebook"
        return False
    return ip is not None and getattr(ip, "kernel", None) is not None


def mode(forced: bool | None = None) -> str:
    """``forced`` is settings.progress (JITOPS_PROGRESS): False off, True on, None by the terminal."""
    if forced is False:
        return "off"
    if _in_notebook():
        return "notebook"
    if forced is True or (
        sys.stderr is not None and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
    ):
        return "terminal"
    return "off"


class BuildProgress:
    """``with BuildProgress("softmax for cpu-avx512"): ...`` shows elapsed time while it runs."""

    def __init__(self, what: str, interval: float = 0.5, *, forced: bool | None = None) -> None:
        self.what = what
        self.interval = interval
        self.mode = mode(forced)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = 0.0
        self._handle = None

    def _text(self, state: str = "building") -> str:
        return f"jitops: {state} {self.what} ... {time.monotonic() - self._start:.1f}s"

    def _show(self, text: str, final: bool = False) -> None:
        if self.mode == "terminal":
            sys.stderr.write("\r\033[K" + text + ("\n" if final else ""))
            sys.stderr.flush()
        elif self.mode == "notebook":
            from IPython.display import display  # type: ignore[import-not-found]

            if self._handle is None:
                self._handle = display({"text/plain": text}, raw=True, display_id=True)
            else:
                self._handle.update({"text/plain": text}, raw=True)

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self._show(self._text())

    def __enter__(self) -> BuildProgress:
        self._start = time.monotonic()
        if self.mode != "off":
            self._show(self._text())
            self._thread = threading.Thread(target=self._tick, name="jitops-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.mode != "off":
            state = (
                "built"
                if exc_type is None
                else ("interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed")
            )
            self._show(self._text(state), final=True)


class WarmDisplay:
    """One line per finished library; in a terminal also a live line of what is building."""

    def __init__(self, total: int, *, forced: bool | None = None) -> None:
        self.total = total
        self.done = 0
        self.live = mode(forced) == "terminal"
        self.running: dict[str, float] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._tick, daemon=True) if self.live else None

    def _line(self) -> str:
        now = time.monotonic()
        busy = ", ".join(f"{w} {now - t:.0f}s" for w, t in self.running.items())
        return f"jitops warm [{self.done}/{self.total}] {busy}"

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                sys.stderr.write("\r\033[K" + self._line())
                sys.stderr.flush()

    def start(self, task: Any) -> None:
        with self._lock:
            self.running[task.what] = time.monotonic()

    def finish(self, o: Any) -> None:
        with self._lock:
            self.running.pop(o.task.what, None)
            self.done += 1
            if self.live:
                sys.stderr.write("\r\033[K")
            first = o.message.splitlines()[0] if o.message else ""
            detail = f": {first}" if o.status in ("skipped", "failed") else ""
            print(
                f"[{self.done}/{self.total}] {o.status:<7} {o.task.spec.name} for {o.target} ({o.seconds:.1f}s){detail}"
            )
            if o.status == "failed" and len(o.message.splitlines()) > 1:
                print("\n".join(o.message.splitlines()[1:]), file=sys.stderr)
            sys.stdout.flush()

    def __enter__(self) -> WarmDisplay:
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            sys.stderr.write("\r\033[K")
