"""``lazy``: a regular expression compiled at its first use, not at import; ``chars``: a character class with
no regex at all.

``re.compile`` at module level costs 50-300 us a pattern in a fresh process (``re``'s cache is empty);
the warm ``get()`` / ``load()`` imports some twenty of them and uses a handful. A ``lazy`` pattern
has ``re.Pattern``'s methods and attributes (``search``, ``match``, ``fullmatch``, ``sub``,
``finditer``, ``pattern``, ...), each forwarded to the pattern compiled the first time one is asked for.
``chars("|\n\r")`` is what ``[|\n\r]`` is to ``search``: the first such character of a text, or None.

Imports: nothing of jitops.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any


class lazy:  # noqa: N801 - used as re.compile is
    """``re.compile(pattern, flags)``, deferred to the first use. ``needs``: literal texts one of which every match
    contains (``"TORCH_LIBRARY"`` for ``\\bTORCH_LIBRARY\\s*\\(``): ``search``, ``match``, ``fullmatch``,
    ``finditer`` and ``findall`` of a text holding none of them find nothing without compiling the pattern."""

    __slots__ = ("_args", "_compiled", "_needs")

    def __init__(
        self, pattern: str, flags: int | re.RegexFlag = 0, *, needs: str | tuple[str, ...] = ()
    ) -> None:
        self._args = (pattern, flags)
        self._compiled: re.Pattern[str] | None = None
        self._needs = (needs,) if isinstance(needs, str) else needs

    def compiled(self) -> re.Pattern[str]:
        if self._compiled is None:
            self._compiled = re.compile(*self._args)
        return self._compiled

    def _absent(self, text: str) -> bool:
        return bool(self._needs) and not any(n in text for n in self._needs)

    def search(self, text: str, *args: int) -> re.Match[str] | None:
        return None if self._absent(text) else self.compiled().search(text, *args)

    def match(self, text: str, *args: int) -> re.Match[str] | None:
        return None if self._absent(text) else self.compiled().match(text, *args)

    def fullmatch(self, text: str, *args: int) -> re.Match[str] | None:
        return None if self._absent(text) else self.compiled().fullmatch(text, *args)

    def finditer(self, text: str, *args: int) -> Iterator[re.Match[str]]:
        return iter(()) if self._absent(text) else self.compiled().finditer(text, *args)

    def findall(self, text: str, *args: int) -> list[Any]:
        return [] if self._absent(text) else self.compiled().findall(text, *args)

    def __getattr__(
        self, name: str
    ) -> Any:  # what the methods above are not: the rest of the Pattern's API
        return getattr(self.compiled(), name)

    def __repr__(self) -> str:
        return f"lazy({self._args[0]!r})"


class chars:  # noqa: N801 - used as a compiled character class is
    """A character class (``[$`;&|<>]``) whose ``search(text)`` gives the first of its characters in ``text``,
    or None: what the class's pattern's ``search`` finds, as truth and as text, with nothing to compile."""

    __slots__ = ("_set",)

    def __init__(self, characters: str) -> None:
        self._set = frozenset(characters)

    def search(self, text: str) -> str | None:
        return None if self._set.isdisjoint(text) else next(c for c in text if c in self._set)

    def __repr__(self) -> str:
        return f"chars({''.join(sorted(self._set))!r})"
