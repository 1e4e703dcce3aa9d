"""The message of a failed build: what failed, the first compiler error(s) with
``file:line`` and a few source lines, and where the full log is. One screen.

Imports: nothing of jitops at run time (job.BuildJob for annotations).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .job import BuildJob

_ERROR_RE = re.compile(
    r"^(?P<file>[^:\s][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)?\s*(?:fatal )?error\b[:\s]?(?P<msg>.*)$"
)
_NVCC_ERROR_RE = re.compile(r"^(?P<file>[^(\s][^(]*)\((?P<line>\d+)\): error:?\s*(?P<msg>.*)$")
# What GCC, clang, collect2 and the kernel's messages say when the OOM killer
# took a compiler or linker (both end as SIGKILL), or when memory ran out.
_OOM_MARKERS = (
    "Killed signal terminated program",
    "internal compiler error: Killed",
    "virtual memory exhausted",
    "out of memory allocating",
    "cannot allocate memory",
    "unable to execute command: Killed",
    "terminated with signal 9",
)
MAX_ERROR_LINES = 40
MAX_LINE_CHARS = 200  # template errors can run to thousands of characters
_LINE_DIRECTIVE = re.compile(r"\s*#\s*line\s+(\d+)\s*$")  # "#line N" without a file name


def error_sites(log_text: str, limit: int = 3) -> list[tuple[str, int, int | None, str]]:
    """(file, line, column or None, message) of the first compiler errors, one per line of source."""
    found: list[tuple[str, int, int | None, str]] = []
    for line in log_text.splitlines():
        m = _ERROR_RE.match(line.strip()) or _NVCC_ERROR_RE.match(line.strip())
        if not m:
            continue
        file, lineno = m.group("file"), int(m.group("line"))
        if any(f == file and n == lineno for f, n, _, _ in found):
            continue
        col = m.groupdict().get("col")
        found.append((file, lineno, int(col) if col else None, m.group("msg").strip()))
        if len(found) >= limit:
            break
    return found


def _excerpt(path: str, line: int, col: int | None = None, context: int = 2) -> list[str]:
    """A few numbered source lines around ``line``, marked with '>' (and a caret under ``col``).

    Numbers are the compiler's: a ``#line N`` directive (the drop-in's, after the headers it prepends) renumbers
    the lines after it, and the excerpt shows only lines after the last directive before ``line``."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return []
    numbered: list[tuple[int, int, str]] = []  # (segment, the compiler's line number, text)
    n, segment = 1, 0
    for text in lines:
        directive = _LINE_DIRECTIVE.match(text)
        if directive:
            n, segment = int(directive.group(1)), segment + 1
            continue
        numbered.append((segment, n, text))
        n += 1
    at = [i for i, (_, k, _) in enumerate(numbered) if k == line]
    if not at:
        return []
    i = at[-1]
    around = [e for e in numbered[max(0, i - context) : i + context + 1] if e[0] == numbered[i][0]]
    out = []
    for _, k, raw in around:
        text = raw.expandtabs(8)[:MAX_LINE_CHARS]  # gcc counts display columns, tabs to 8
        out.append(f"  {'>' if k == line else ' '} {k:5d} | {text}".rstrip())
        if k == line and col is not None and 1 <= col <= len(text) + 1:
            out.append(f"          | {' ' * (col - 1)}^")
    return out


def format_build_error(job: BuildJob, rc: int, log_text: str, log_path: Path | None) -> str:
    """One screen: what failed, the first error(s) with file:line and source, where the log is."""
    head = f"building op library {job.library!r} for {job.target} failed"
    lines = [head]
    oom = any(m in log_text for m in _OOM_MARKERS) or rc in (-9, 137)
    if oom:
        lines.append(
            "  the compiler was killed, most likely by the out-of-memory killer. "
            f"Fix: lower parallel compiles with MAX_JOBS=1 (this build used -j{job.jobs}) or free memory."
        )
    errors = [] if oom else error_sites(log_text, limit=2)
    for file, line, col, msg in errors:
        if len(msg) > MAX_LINE_CHARS:
            msg = msg[: MAX_LINE_CHARS - 3] + "..."
        lines.append(f"{file}:{line}{f':{col}' if col else ''}: error: {msg}")
        lines.extend(_excerpt(file, line, col))
    if not errors:
        tail = [ln for ln in log_text.splitlines() if ln.strip()][-12:]
        lines.append(f"  (exit code {rc}; no compiler error line found; last output:)")
        lines.extend("  " + ln[:MAX_LINE_CHARS] for ln in tail)
    else:
        first = errors[0][0]
        if os.path.abspath(first).startswith(str(Path(__file__).parent.parent) + os.sep):
            lines.append(
                "Fix: this error is in jitops's own kernel source: please report it with the full log"
            )
        else:
            lines.append(
                f"Fix: correct the first error above ({os.path.basename(first)}:{errors[0][1]}) and run again"
            )
    if log_path is not None:
        lines.append(f"full log: {log_path}")
    if len(lines) > MAX_ERROR_LINES:
        lines = lines[: MAX_ERROR_LINES - 1] + [lines[-1]]
    return "\n".join(lines)
