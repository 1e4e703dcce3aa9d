"""The warm path's regex-free checks give what the regexes they replace give (issue 32 item 4):
``spec`` name rules against ``NAME_PATTERN``, ``patterns.chars`` against a character class's ``search``,
``torchcompat.parse`` against ``^(\\d+)\\.(\\d+)`` (on ASCII digits), ``patterns.lazy`` against ``re.compile``."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from jitops.base import torchcompat
from jitops.base.patterns import chars, lazy
from jitops.spec import NAME_PATTERN, _is_name
from jitops.spec.checks import LINE_BREAK, NVCC_UNSAFE

TEXT = st.text(alphabet=st.sampled_from("abcxyz019_-.AZ $`;&|<>\n\r\t\u00e9\u0131\u0661"), max_size=70)


@settings(max_examples=500, deadline=None)
@given(TEXT)
def test_name_rule_is_the_name_pattern(text: str) -> None:
    assert _is_name(text) == bool(re.fullmatch(NAME_PATTERN, text, re.ASCII))
    assert _is_name(text.lower()) == bool(re.fullmatch(NAME_PATTERN, text.lower(), re.ASCII))


@settings(max_examples=500, deadline=None)
@given(TEXT)
def test_chars_search_is_the_character_class(text: str) -> None:
    for klass, pattern in ((NVCC_UNSAFE, r"[$`;&|<>\n\r]"), (LINE_BREAK, r"[\n\r]"), (chars("|\n\r"), r"[|\n\r]")):
        found = re.search(pattern, text)
        assert klass.search(text) == (found.group() if found else None)


@settings(max_examples=300, deadline=None)
@given(st.from_regex(r"\A[0-9]{0,3}(\.[0-9]{0,3})?[.+a-z0-9]{0,6}\Z"))
def test_torch_version_parse_is_the_regex(version: str) -> None:
    m = re.match(r"^([0-9]+)\.([0-9]+)", version)
    assert torchcompat.parse(version) == ((int(m.group(1)), int(m.group(2))) if m else None)


def test_lazy_compiles_at_first_use_and_then_is_the_pattern() -> None:
    p = lazy(r"^\s*#\s*include\s*\"", re.MULTILINE)
    assert p._compiled is None  # nothing compiled at creation
    assert p.search('x\n  #include "a.h"') is not None and p.search("#include <a.h>") is None
    assert p.pattern == r"^\s*#\s*include\s*\"" and p.flags & re.MULTILINE
    assert p._compiled is re.compile(r"^\s*#\s*include\s*\"", re.MULTILINE)
    assert torchcompat.parse("\u0662.13") is None  # a non-ASCII digit is no release number (\d would take it)
