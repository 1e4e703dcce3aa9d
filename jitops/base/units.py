"""Sizes and ages as people write them (``5GB``, ``500MiB``, ``7d``) and as the cache's reports show
them.

One reading for every place that takes one: ``JITOPS_PCH_MAX_SIZE``, ``jitops cache prune`` and
:func:`jitops.cache.prune`, so a budget means the same bytes wherever it is given. Units are binary
(``1G``, ``1GB`` and ``1GiB`` are all 2**30 bytes), as the cache's listings print them.

Imports nothing of jitops.
"""

from __future__ import annotations

import re

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*")
_AGE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*")
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    """``500M``, ``1.5G``, ``2GiB``, ``5GB``, ``1048576`` -> bytes; ValueError naming the text
    otherwise."""
    m = _SIZE.fullmatch(text.lower())
    if m is None:
        raise ValueError(f"invalid size {text!r}: expected e.g. 500M, 2G, 1.5GiB or a byte count")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


def parse_age(text: str) -> float:
    """``45s``, ``30m``, ``12h``, ``7d``, ``2w`` -> seconds; ValueError naming the text
    otherwise."""
    m = _AGE.fullmatch(text.lower())
    if m is None:
        raise ValueError(f"invalid age {text!r}: expected e.g. 45s, 30m, 12h, 7d or 2w")
    return float(m.group(1)) * _AGE_UNITS[m.group(2)]


def human_size(n: float) -> str:
    """Bytes as the listings show them: ``512 B``, ``1.5 KiB`` ... ``3.0 GiB`` (GiB at most)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_age(seconds: float) -> str:
    """A time span as the listings show it: ``45s ago``, ``30m ago``, ``5h ago``, ``12d ago``."""
    for limit, unit, div in ((120, "s", 1), (7200, "m", 60), (172800, "h", 3600)):
        if seconds < limit:
            return f"{max(0, seconds) / div:.0f}{unit} ago"
    return f"{seconds / 86400:.0f}d ago"
