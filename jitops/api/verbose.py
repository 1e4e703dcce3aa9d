"""What ``verbose=True`` shows for a drop-in load (``jitops.load`` / ``load_inline``): the build's output line by line
as it comes, then where the library came from (built now, or a cache entry), on the ``jitops.verbose`` logger, on
stderr where logging is not configured.

Imports: nothing of jitops at run time (plan for annotations).
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..plan import LoadedLibrary

verbose_log = logging.getLogger("jitops.verbose")


def show(text: str) -> None:
    """verbose=True output: the jitops.verbose logger, on stderr when logging is not configured."""
    if verbose_log.level == logging.NOTSET:
        verbose_log.setLevel(logging.INFO)
    if verbose_log.hasHandlers():
        verbose_log.info("%s", text)
        return
    handler = logging.StreamHandler(sys.stderr)
    verbose_log.addHandler(handler)
    try:
        verbose_log.info("%s", text)
    finally:
        verbose_log.removeHandler(handler)


def show_line(lines: list[str], line: str) -> None:
    """One line of a verbose build's output, as it comes (clearing the progress line on a terminal)."""
    lines.append(line)
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
    show(line.rstrip("\n"))


def describe(lib: LoadedLibrary, streamed: bool) -> str:
    m = lib.manifest
    if lib.built:  # by this call (its output streamed above), or earlier in this process
        return (
            f"jitops: built {lib.spec.name} for {lib.target} in {m.build_seconds:.1f}s (key {lib.key[:12]}, "
            f"library {lib.library_path}); "
            + (
                "its compiler commands and output are above"
                if streamed
                else f"compiler commands and output:\n{m.build_log}"
            )
        )
    return (
        f"jitops: loaded {lib.spec.name} for {lib.target} from the cache entry {lib.entry} (key {lib.key[:12]}, "
        f"built in {m.build_seconds:.1f}s by an earlier run); nothing was compiled"
    )
