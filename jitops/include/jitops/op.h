// jitops registration helpers.
//
// jitops compiles every build of a kernel library with -DJITOPS_NS=<namespace>,
// a namespace derived from the cache key, so that a rebuilt library can be
// loaded next to an older one in the same process. Kernel sources never spell
// a namespace themselves; they register through these macros:
//
//   JITOPS_LIBRARY(m) { m.def("my_relu(Tensor x) -> Tensor", &my_relu); }
//   JITOPS_LIBRARY_IMPL(CPU, m) { m.impl("softmax", &softmax_cpu); }
//
// Builtin ops declare their schemas once, in their Python spec, and only use
// JITOPS_LIBRARY_IMPL. User kernels (jitops.load / load_inline) may define
// their schemas in C++ with JITOPS_LIBRARY.
#pragma once

#include <torch/library.h>

#ifndef JITOPS_NS
#error "JITOPS_NS is not defined: build this file through jitops (jitops.get / jitops.load), which supplies the op namespace."
#endif

#define JITOPS_LIBRARY_EXPAND_(ns, m) TORCH_LIBRARY(ns, m)
#define JITOPS_LIBRARY_IMPL_EXPAND_(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)
#define JITOPS_LIBRARY(m) JITOPS_LIBRARY_EXPAND_(JITOPS_NS, m)
#define JITOPS_LIBRARY_IMPL(k, m) JITOPS_LIBRARY_IMPL_EXPAND_(JITOPS_NS, k, m)
