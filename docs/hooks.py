"""The docs' generated references: made from the code at build time, never copied by hand.

MkDocs runs ``on_page_markdown`` on every page; a page that holds ``<!-- jitops:NAME -->`` gets
that marker replaced by ``GENERATORS[NAME]()``:

- ``cli``: every ``jitops`` command, walked from ``jitops.cli.build_parser()`` (usage, help,
  options);
- ``settings``: every environment variable jitops reads, from ``jitops.base.settings.SETTINGS``;
- ``build-env``: the build variables the cache key holds or the build scrubs, from ``jitops.target``
  and ``jitops.key``;
- ``errors``: every exception class in ``jitops.errors``, with the built-in it also is.

The Python API is rendered by mkdocstrings (``::: jitops``) from docstrings and signatures.
``tests/test_docs_coverage.py`` loads this file and checks that every public name, command and
setting appears in what it generates. Nothing here imports mkdocs, so the test runs without the
``docs`` extra.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Document the checkout the docs live in, not another install of jitops: import the package from
# ROOT now (MkDocs restores sys.path after loading a hook; submodules then follow jitops.__path__).
sys.path.insert(0, str(ROOT))
try:
    import jitops  # noqa: F401  (import is inert: no torch, no files)
finally:
    sys.path.remove(str(ROOT))

MARKER = re.compile(r"<!--\s*jitops:([a-z-]+)\s*-->")


def _cell(text: object) -> str:
    """Text fit for one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


# ------------------------------------------------------------------ CLI


def cli_commands(
    parser: argparse.ArgumentParser | None = None, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, str]]:
    """(command words, parser, help) for every command and sub-command, depth first."""
    if parser is None:
        from jitops.cli import build_parser

        parser = build_parser()
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help or "" for a in action._choices_actions}
        for name, sub in action.choices.items():
            words = (*path, name)
            yield words, sub, helps.get(name, "")
            yield from cli_commands(sub, words)


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    formatter = parser._get_formatter()
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if a.help == argparse.SUPPRESS:
            continue
        name = formatter._format_action_invocation(a)
        help_ = a.help or ""
        extra = []
        if a.default not in (None, False, [], argparse.SUPPRESS) and "default" not in help_:
            extra.append(f"default `{a.default}`")
        if isinstance(a, argparse._AppendAction) and "repeatable" not in help_:
            extra.append("repeatable")
        text = help_ + (f" ({'; '.join(extra)})" if extra else "")
        rows.append(f"| `{_cell(name)}` | {_cell(text)} |")
    return rows


def cli_markdown() -> str:
    """One section per command: its help, usage line and a table of its arguments."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps usage to the terminal: fix the width
    try:
        out = []
        for words, sub, help_ in cli_commands():
            level = "#" * (2 + len(words) - 1)
            sentence = _cell(help_[:1].upper() + help_[1:]) + "."
            out += [f"{level} jitops {' '.join(words)}", "", sentence, ""]
            if sub.description:
                out += [sub.description, ""]
            out += ["```text", sub.format_usage().strip(), "```", ""]
            rows = _arguments(sub)
            if rows:
                out += ["| argument | meaning |", "| --- | --- |", *rows, ""]
        return "\n".join(out)
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


# ------------------------------------------------------------------ settings


def settings_markdown() -> str:
    """A table of every variable in ``jitops.base.settings.SETTINGS``."""
    from jitops.base.settings import SETTINGS

    rows = ["| variable | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name, kind, default, meaning in SETTINGS:
        rows.append(f"| `{name}` | {_cell(kind)} | {_cell(default)} | {_cell(meaning)} |")
    return "\n".join(rows) + "\n"


def build_env_markdown() -> str:
    """The build variables in the key (host, CUDA-only) and those removed from the build."""
    from jitops.key import SCRUBBED_ENV_VARS
    from jitops.target import CUDA_ENV_VARS, HOST_ENV_VARS

    def names(vs: tuple[str, ...]) -> str:
        return ", ".join(f"`{v}`" for v in vs)

    return "\n".join(
        [
            "| variables | what jitops does with them |",
            "| --- | --- |",
            f"| {names(HOST_ENV_VARS)} | part of every key: a change builds a new entry |",
            f"| {names(CUDA_ENV_VARS)} | part of CUDA keys only |",
            f"| {names(SCRUBBED_ENV_VARS)} | removed from the build's environment, so they "
            "cannot change a binary behind the key |",
            "",
        ]
    )


# ------------------------------------------------------------------ errors


def error_classes() -> list[type[BaseException]]:
    """Every exception class defined in ``jitops.errors``, in source order."""
    import jitops.errors as errors

    return [
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type)
        and issubclass(obj, BaseException)
        and obj.__module__ == errors.__name__
    ]


def _builtins_of(cls: type) -> list[str]:
    """The built-in exceptions ``cls`` and its jitops bases name directly (``KeyError``, not
    ``LookupError``)."""
    found = [
        b.__name__
        for c in cls.__mro__
        if c.__module__ == cls.__module__
        for b in c.__bases__
        if b.__module__ == "builtins" and b.__name__ != "Exception"
    ]
    return list(dict.fromkeys(found)) or ["-"]


def errors_markdown() -> str:
    """A table of the error classes: name (linked into the API reference when public), also-a,
    meaning."""
    import jitops

    rows = ["| class | also a | meaning |", "| --- | --- | --- |"]
    for cls in error_classes():
        name = cls.__name__
        shown = f"[`{name}`][jitops.{name}]" if name in jitops.__all__ else f"`{name}` (internal)"
        doc = (cls.__doc__ or "").strip().split("\n\n")[0]
        rows.append(
            f"| {shown} | {', '.join(f'`{b}`' for b in _builtins_of(cls))} | {_cell(doc)} |"
        )
    return "\n".join(rows) + "\n"


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_markdown,
    "settings": settings_markdown,
    "build-env": build_env_markdown,
    "errors": errors_markdown,
}


def render(markdown: str) -> str:
    """The page with each ``<!-- jitops:NAME -->`` marker replaced by its generated Markdown."""

    def one(m: re.Match[str]) -> str:
        if m.group(1) not in GENERATORS:
            raise KeyError(f"docs: unknown generated section {m.group(1)!r}")
        return GENERATORS[m.group(1)]()

    return MARKER.sub(one, markdown)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """MkDocs hook (``hooks:`` in mkdocs.yml)."""
    return render(markdown)
