"""What a benchmark's ``--out FILE.json`` holds besides its figures: when and under what load it
ran, from which commit, with which torch, and the text it printed.

A timing on a shared machine means little without its conditions, so every result file carries
them in one shape, and ``docs/gen_bench.py`` reads them the same way for every page::

    {"benchmark": "kernels", "meta": {...}, "printed": "...", "results": {...}}

``meta`` has ``started`` / ``ended`` (UTC), ``load_start`` / ``load_end`` (``os.getloadavg()``),
``cpus``, ``commit`` (of this checkout, ``+dirty`` when tracked files differ), ``torch``,
``python``, ``argv`` and ``conditions``: what the caller said (``--conditions``), else ``idle`` or
``busy`` from the 1-minute load at the start against the core count.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def as_installed() -> None:
    """Byte-compile the checkout's jitops as ``pip install`` does, so the fresh processes a
    benchmark times load it as a user's install would. Else, where PYTHONDONTWRITEBYTECODE is set
    (as on the project's machines), each of them compiles the modules it imports from source,
    which the loaders it is compared with, installed by pip, never do."""
    import compileall

    compileall.compile_dir(str(REPO / "jitops"), quiet=1, workers=0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--out`` and ``--conditions``, the same for every benchmark."""
    parser.add_argument(
        "--out", type=Path, metavar="FILE.json", help="also write the figures and conditions here"
    )
    parser.add_argument(
        "--conditions",
        help="what else ran, e.g. 'idle' or 'busy: CI beside' (default: idle or busy by the load)",
    )


def _utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _commit() -> str:
    def git(*args: str) -> str:
        proc = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30
        )
        return proc.stdout.strip() if proc.returncode == 0 else ""

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def start(conditions: str | None) -> dict[str, Any]:
    """The conditions at the start of a run (call it before the first timing)."""
    load = os.getloadavg()
    cpus = os.cpu_count() or 1
    if not conditions:
        conditions = "idle" if load[0] < cpus / 2 else "busy"
        conditions += f" (by the 1-minute load {load[0]:.2f} on {cpus} cores)"
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = "not installed"
    return {
        "started": _utc(),
        "load_start": [round(x, 2) for x in load],
        "cpus": cpus,
        "commit": _commit(),
        "torch": torch_version,
        "python": platform.python_version(),
        "argv": sys.argv[1:],
        "conditions": conditions,
    }


def write(path: Path, benchmark: str, meta: dict[str, Any], results: Any, printed: str) -> None:
    """Write the result file: the figures, the conditions (with the load at the end) and the text
    that was printed."""
    meta = dict(meta, ended=_utc(), load_end=[round(x, 2) for x in os.getloadavg()])
    doc = {"benchmark": benchmark, "meta": meta, "printed": printed, "results": results}
    path.write_text(json.dumps(doc, indent=1) + "\n")


class _Tee(io.TextIOBase):
    def __init__(self, real: Any) -> None:
        self.real, self.buf = real, io.StringIO()

    def write(self, s: str) -> int:
        self.buf.write(s)
        return int(self.real.write(s))

    def flush(self) -> None:
        self.real.flush()


@contextmanager
def tee() -> Iterator[io.StringIO]:
    """Print as usual and keep a copy of everything printed (the yielded buffer)."""
    real = sys.stdout
    t = _Tee(real)
    sys.stdout = t  # type: ignore[assignment]
    try:
        yield t.buf
    finally:
        sys.stdout = real
