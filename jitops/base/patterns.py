"""``lazy``: a regular expression compiled at its first use, not at import (issue 32 item 4).

``re.compile`` at module level costs 50-300 us a pattern in a fresh process (``re``'s cache is empty);
the warm ``get()`` / ``load()`` imports some twenty of them and uses a handful. A ``lazy`` pattern
has ``re.Pattern``'s methods and attributes (``search``, ``match``, ``fullmatch``, ``sub``,
``finditer``, ``pattern``, ...), each forwarded to the pattern compiled the first time one is asked for.

Imports: nothing of jitops.
"""

from __future__ import annotations

import re
from typing import Any


class lazy:  # noqa: N801 - used as re.compile is
    """``re.compile(pattern, flags)``, deferred to the first use."""

    __slots__ = ("_args", "_compiled")

    def __init__(self, pattern: str, flags: int | re.RegexFlag = 0) -> None:
        self._args = (pattern, flags)
        self._compiled: re.Pattern[str] | None = None

    def compiled(self) -> re.Pattern[str]:
        if self._compiled is None:
            self._compiled = re.compile(*self._args)
        return self._compiled

    def __getattr__(self, name: str) -> Any:  # only for what __slots__ does not hold: the Pattern's API
        return getattr(self.compiled(), name)

    def __repr__(self) -> str:
        return f"lazy({self._args[0]!r})"
