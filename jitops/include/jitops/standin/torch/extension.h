// jitops's stand-in for <torch/extension.h>, tried first for jitops-style files that use no Python API.
//
// <torch/extension.h> is <torch/all.h> (the whole C++ frontend: nn, optim,
// data, jit, serialize...) plus <torch/python.h> (pybind11 and Python). A
// kernel file almost always uses only what <torch/types.h> declares. Compiled
// against this header, such a file does not instantiate and optimise the
// frontend's and pybind11's inline code, which no precompiled header removes
// (3 s of every clang -O3 compile).
//
// It must not change what the user's code means. The real header brings in,
// besides torch's own declarations, system headers that change overload sets
// and declarations: Python.h includes <math.h> and <stdlib.h>, whose C++
// wrappers put the float and long overloads of sqrt, exp, pow, abs... into
// the global namespace (without them an unqualified sqrt(float) is C's
// double sqrt(double)), and pyconfig.h's feature macros. So this header
// includes, after <torch/types.h>, exactly the system and standard headers
// the real header reaches that <torch/types.h> does not, Python.h through the
// torch header torch uses for it (python_headers.h), in the real header's
// order: the set of system headers read, the macros libc sees and the
// overloads math calls resolve to are the real header's
// (tests/test_dropin_parity.py compares them). What is left out is torch's
// and pybind11's own API: code that needs it fails to compile here and is
// compiled again with the real header (jitops/tubuild.py), and code that
// spells pybind11 or Python's API never uses this header.
//
// The drop-in (sources written for torch.utils.cpp_extension) never uses it:
// parsing less lets GCC's unit-wide inlining limits decide differently, so
// only the real header gives torch's object code. JITOPS_LEAN_EXTENSION_H=0
// turns it off for jitops-style libraries too.
#if !defined(TORCH_STABLE_ONLY) && !defined(TORCH_TARGET_VERSION)
#pragma once

#define JITOPS_EXTENSION_H_STANDIN 1
#include <torch/types.h>
// <torch/all.h>'s standard headers beyond <torch/types.h>'s
#include <stack>
#include <queue>
// <torch/python.h>: Python.h as torch includes it (feature macros kept, <math.h>, <stdlib.h>...)
#include <torch/csrc/python_headers.h>
// pybind11's standard headers beyond those
#include <forward_list>
#if defined(__has_include)
#if __has_include(<version>)
#include <version>
#endif
#endif
#if defined(__GNUG__)
#include <cxxabi.h>
#endif
#include <stddef.h>
#include <valarray>
// pybind11/typing.h's, under its own condition (C++20, torch's standard since 2.12: <ranges> brings <span>)
#if defined(__cpp_nontype_template_args) && __cpp_nontype_template_args >= 201911L
#include <numeric>
#include <ranges>
#include <string_view>
#endif

#else
#error "This file should not be included when either TORCH_STABLE_ONLY or TORCH_TARGET_VERSION is defined."
#endif
