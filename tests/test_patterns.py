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

TEXT = st.text(
    alphabet=st.sampled_from("abcxyz019_-.AZ $`;&|<>\n\r\t\u00e9\u0131\u0661"), max_size=70
)


@settings(max_examples=500, deadline=None)
@given(TEXT)
def test_name_rule_is_the_name_pattern(text: str) -> None:
    assert _is_name(text) == bool(re.fullmatch(NAME_PATTERN, text, re.ASCII))
    assert _is_name(text.lower()) == bool(re.fullmatch(NAME_PATTERN, text.lower(), re.ASCII))


@settings(max_examples=500, deadline=None)
@given(TEXT)
def test_chars_search_is_the_character_class(text: str) -> None:
    for klass, pattern in (
        (NVCC_UNSAFE, r"[$`;&|<>\n\r]"),
        (LINE_BREAK, r"[\n\r]"),
        (chars("|\n\r"), r"[|\n\r]"),
    ):
        found = re.search(pattern, text)
        assert klass.search(text) == (found.group() if found else None)


@settings(max_examples=300, deadline=None)
@given(st.from_regex(r"\A[0-9]{0,3}(\.[0-9]{0,3})?[.+a-z0-9]{0,6}\Z"))
def test_torch_version_parse_is_the_regex(version: str) -> None:
    m = re.match(r"^([0-9]+)\.([0-9]+)", version)
    assert torchcompat.parse(version) == ((int(m.group(1)), int(m.group(2))) if m else None)
    # a non-ASCII digit is no release number (\d would take it)
    assert torchcompat.parse("\u0662.13") is None


def test_lazy_compiles_at_first_use_and_then_is_the_pattern() -> None:
    p = lazy(r"^\s*#\s*include\s*\"", re.MULTILINE)
    assert p._compiled is None  # nothing compiled at creation
    assert p.search('x\n  #include "a.h"') is not None and p.search("#include <a.h>") is None
    assert p.pattern == r"^\s*#\s*include\s*\"" and p.flags & re.MULTILINE
    assert p._compiled is re.compile(r"^\s*#\s*include\s*\"", re.MULTILINE)


def test_needs_skips_texts_without_the_literal_and_finds_what_the_regex_finds() -> None:
    from jitops.api.cpp_ext_style import _FIXED_NS, _PYBIND
    from jitops.api.dropin import _JITOPS_STYLE, _REGISTERS
    from jitops.build.stable import _INCLUDE, _NAMESPACE, _STABLE
    from jitops.spec import _TARGET_FLAG as _TARGET
    from jitops.spec.headers import EXTENSION_H

    fresh = lazy(r"\bTORCH_LIBRARY\s*\(", needs="TORCH_LIBRARY")
    # absent: nothing compiled
    assert fresh.search("int main() {}") is None and fresh._compiled is None
    texts = [
        '#include <torch/extension.h>\nPYBIND11_MODULE(m, mod) { mod.def("f", &f); }',
        'TORCH_LIBRARY(ns, m) { m.def("g(Tensor x) -> Tensor"); }\nTORCH_LIBRARY_FRAGMENT(ns2, m) {}',
        "JITOPS_LIBRARY(m) {}\nstatic c10::RegisterOperators r;",
        'STABLE_TORCH_LIBRARY(JITOPS_NS, m) { m.def("scale(Tensor x) -> Tensor"); }\n'
        "STABLE_TORCH_LIBRARY_IMPL(JITOPS_NS, CPU, m) {}\n#include <ATen/ATen.h>",
        "-DTORCH_TARGET_VERSION=0x020d000000000000",
        "Python.h",
        "torch/csrc/stable/tensor.h",
        "c10/util/Half.h",
        "int main() { return 0; }",
    ]
    for p in (
        _FIXED_NS,
        _PYBIND,
        _JITOPS_STYLE,
        _REGISTERS,
        _INCLUDE,
        _NAMESPACE,
        _STABLE,
        _TARGET,
        EXTENSION_H,
    ):
        for t in texts:
            plain = re.compile(p.pattern, p.flags)
            assert [m.span() for m in p.finditer(t)] == [m.span() for m in plain.finditer(t)], (
                p,
                t,
            )
            assert p.findall(t) == plain.findall(t) and bool(p.search(t)) == bool(plain.search(t))
            assert bool(p.match(t)) == bool(plain.match(t)) and bool(p.fullmatch(t)) == bool(
                plain.fullmatch(t)
            )


def test_stable_full_api_answers_as_the_pattern_it_replaced() -> None:
    """stable.full_api (prefix tests: each warm load of a stable library checks its includes, and a pattern costs a
    fresh process its compile) says of each header what the regex before it said."""
    from jitops.build.stable import full_api

    former = re.compile(
        r"^(ATen|c10|caffe2|pybind11|jitops)/|^Python\.h$|^torch/(?!csrc/stable/|headeronly/|"
        r"csrc/inductor/aoti_torch/(c|generated)/)"
    )
    headers = [
        "ATen/Tensor.h",
        "c10/util/Half.h",
        "caffe2/core/x.h",
        "pybind11/pybind11.h",
        "jitops/op.h",
        "Python.h",
        "Python.hh",
        "xPython.h",
        "torch/extension.h",
        "torch/library.h",
        "torch/csrc/stable/library.h",
        "torch/headeronly/util/Exception.h",
        "torch/csrc/inductor/aoti_torch/c/shim.h",
        "torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h",
        "torch/csrc/inductor/aoti_torch/utils.h",
        "torch/csrc/inductor/aoti_torch/cx/a.h",
        "torch/csrc/inductor/aoti_torch/generatedx/a.h",
        "torch/",
        "torch",
        "torch/csrc/stable",
        "vector",
        "ATen",
        "ATenx/a.h",
        "mytorch/x.h",
        "c10",
        "cuda_runtime.h",
    ]
    assert [h for h in headers if full_api(h) != bool(former.search(h))] == []
    # both answers occur above
    assert full_api("ATen/ATen.h") and not full_api("torch/csrc/stable/ops.h")


def test_compiler_version_patterns_with_needs_are_the_plain_ones() -> None:
    from jitops.target.compilers import _CLANG, _GCC, kind_of

    lines = [
        "g++ (Debian 12.2.0-14) 12.2.0",
        "g++ (GCC) 8.5.0 20210514",
        "c++ (GCC) 11.4.1 20231218",
        "x86_64-linux-gnu-g++-12 (Debian 12.2.0) 12.2.0",
        "gcc (GCC) 9.1.0",
        "Debian clang version 14.0.6",
        "Ubuntu clang version 18.1.3 (1ubuntu1)",
        "icpx (ICX) 2024.0.0",
        "true",
        "",
    ]
    for line in lines:
        for p in (_CLANG, _GCC):
            plain = re.compile(p.pattern, p.flags)
            assert bool(p.search(line)) == bool(plain.search(line)) and bool(p.match(line)) == bool(
                plain.match(line)
            )
    assert kind_of("g++ (Debian 12.2.0-14) 12.2.0") == ("gcc", (12, 2, 0))
    assert (
        kind_of("Debian clang version 14.0.6") == ("clang", (14, 0, 6))
        and kind_of("icpx (ICX) 2024.0.0")[0] == "unknown"
    )
