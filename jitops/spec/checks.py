"""Checks at the boundary: public arguments, before any work.

Every public function and CLI command checks what it was given here first, so
a wrong argument or an unparsable variable becomes a :class:`JitopsError` that
names the argument, what it got and what it expects, instead of a raw
``TypeError`` or ``ValueError`` from deep inside the loader. Environment
values are not parsed here: ``JITOPS_*`` and ``MAX_JOBS`` in
:mod:`jitops.base.settings`, flag variables (``CXXFLAGS``...) in :mod:`jitops.key`.

Pure: no file access, no torch. May import only :mod:`jitops.errors`,
:mod:`jitops.spec` (name rules), ``base.patterns`` and the standard library. Also what a flag word may not hold
(``NVCC_UNSAFE``, ``LINE_BREAK``) and how a flag string splits into words (``shell_words``), read by
spec.user_spec and key.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from ..errors import ArgumentError
from . import OpSpec, validate_name
from ..base.patterns import chars

_SHOWN = 80


# Characters that make sh run or redirect something. nvcc passes its -D values to sh inside double
# quotes and -Xcompiler values bare (it re-parses what ninja quoted), so no word nvcc gets may hold
# one.
NVCC_UNSAFE = chars("$`;&|<>\n\r")
LINE_BREAK = chars("\n\r")  # no flag needs one, and ninja cannot express one in a variable


# What makes shlex.split differ from str.split: quotes, its escape, and the ASCII whitespace it does
# not split on.
_SHELL_SPECIAL = frozenset("'\"\\\x0b\x0c\x1c\x1d\x1e\x1f")


def shell_words(text: str) -> list[str]:
    """``shlex.split(text)`` (ValueError for unbalanced quotes), without shlex for the usual flag string that holds
    no quote, backslash or unusual whitespace: the same words, for a fraction of the cost on the warm path."""
    if text.isascii() and _SHELL_SPECIAL.isdisjoint(text):
        return text.split()
    import shlex

    return shlex.split(text)


def shown(value: object) -> str:
    """``repr(value)``, cut to one short line."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _got(value: object) -> str:
    return f"got {type(value).__name__} {shown(value)}"


# ------------------------------------------------------------------ arguments


def op_name(func: str, value: object, arg: str = "name", what: str = "op name") -> str:
    """``value`` if it is one valid op (or library) name; else ArgumentError / InvalidNameError."""
    if not isinstance(value, str):
        example = "'softmax'" if what == "op name" else "'my_kernels'"
        raise ArgumentError(
            f"{func}() takes one {what} (a str such as {example}) as `{arg}`, {_got(value)}. "
            f"Fix: pass a single name; call {func}() once per name for several"
        )
    return validate_name(value, what)


def device(func: str, value: object) -> str | None:
    """None (the current device) or a device string; which strings are known is the target's call."""
    if value is None or isinstance(value, str):
        return value
    raise ArgumentError(f"{func}(): `device` must be None, 'cpu' or 'cuda', {_got(value)}")


def flag(func: str, arg: str, value: object) -> bool | None:
    """None or a bool (not 0/1, not a string: ``fallback="no"`` would read as true)."""
    if value is None or isinstance(value, bool):
        return value
    raise ArgumentError(f"{func}(): `{arg}` must be True, False or None, {_got(value)}")


def strings(func: str, arg: str, value: object, *, optional: bool = True) -> list[str]:
    """A str, or an iterable of str (list, tuple), as a list. None is [] when ``optional``."""
    if value is None and optional:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (Iterable,)) and not isinstance(value, (bytes, bytearray, Mapping)):
        items = list(value)
        bad = [v for v in items if not isinstance(v, str)]
        if not bad and any("\0" in v for v in items):  # no compiler, path or shell takes one
            raise ArgumentError(
                f"{func}(): `{arg}` holds a NUL byte: {shown(next(v for v in items if chr(0) in v))}"
            )
        if not bad:
            return items
        raise ArgumentError(f"{func}(): `{arg}` must hold only str, but holds {_got(bad[0])}")
    none = " or None" if optional else ""
    raise ArgumentError(f"{func}(): `{arg}` must be a str or a list of str{none}, {_got(value)}")


def path(func: str, arg: str, value: object) -> str:
    """A filesystem path given as str or os.PathLike (to str), without NUL bytes."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ArgumentError(f"{func}(): `{arg}` must be a path (str or os.PathLike), {_got(value)}")
    if "\0" in value or not value:
        raise ArgumentError(
            f"{func}(): `{arg}` must be a non-empty path without NUL bytes, got {shown(value)}"
        )
    return value


def spec(func: str, value: object) -> OpSpec:
    if isinstance(value, OpSpec):
        return value
    raise ArgumentError(
        f"{func}() takes a jitops.OpSpec, {_got(value)}. Fix: build one with jitops.OpSpec(name=..., "
        "root=..., cpu_sources=[...], schemas=[...])"
    )


def get_args(name: object, device_: object, fallback: object) -> None:
    """The checks of ``jitops.get``: cheap enough for every call (a few isinstance tests)."""
    op_name("jitops.get", name)
    device("jitops.get", device_)
    flag("jitops.get", "fallback", fallback)


def library_args(func: str, name: object, device_: object, **lists: object) -> None:
    """The checks of ``jitops.load``, ``load_inline`` and ``register_kernel_dir``: a library name
    (None where it defaults), a device, and str-or-list-of-str options (``sources`` is required)."""
    if name is not None or func != "jitops.register_kernel_dir":
        op_name(func, name, "name", "library name")
    device(func, device_)
    for arg, value in lists.items():
        strings(func, arg, value, optional=arg != "sources")
