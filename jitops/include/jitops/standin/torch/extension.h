// jitops's stand-in for <torch/extension.h>, tried first for files that use no Python API.
//
// <torch/extension.h> is <torch/all.h> (the whole C++ frontend: nn, optim,
// data, jit, serialize...) plus <torch/python.h> (pybind11 and Python).
// A kernel file written for torch.utils.cpp_extension almost always uses only
// what <torch/types.h> declares: torch::Tensor, ATen's functions, torch::
// factories, AT_DISPATCH_*, TORCH_CHECK and torch/library.h. Compiled against
// this header, such a file parses a fifth of the headers and, above all, does
// not instantiate and optimise the frontend's and pybind11's inline code,
// which no precompiled header removes (3 s of every clang -O3 compile, more
// with gcc). A file that needs anything else fails to compile here and is
// compiled again, at once, with the real header (jitops/tubuild.py): what it
// shows the user, and what it builds, is then exactly torch's.
// JITOPS_LEAN_EXTENSION_H=0 turns the stand-in off.
#pragma once

#define JITOPS_EXTENSION_H_STANDIN 1
#include <torch/types.h>
