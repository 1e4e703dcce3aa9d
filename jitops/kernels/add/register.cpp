// Dispatcher registration for the add library (schemas: the spec in
// jitops/kernels/__init__.py). The entry points pick the device kernel from
// the TensorIterator, so one function serves CPU and CUDA.
#include <jitops/op.h>

#include "add_common.h"

JITOPS_LIBRARY_IMPL(CPU, m) {
  m.impl("add", &jitops_add::add);
  m.impl("add.out", &jitops_add::add_out);
  m.impl("add_", &jitops_add::add_);
}

#ifdef JITOPS_WITH_CUDA
JITOPS_LIBRARY_IMPL(CUDA, m) {
  m.impl("add", &jitops_add::add);
  m.impl("add.out", &jitops_add::add_out);
  m.impl("add_", &jitops_add::add_);
}
#endif

// add is differentiable through its twin add_autograd (python.py); the
// in-place and out= variants refuse inputs that need grad (see jitops/op.h).
JITOPS_LIBRARY_IMPL(Autograd, m) {
  jitops::differentiable(m, "add");
  jitops::not_differentiable(m, "add.out");
  jitops::not_differentiable(m, "add_");
}

JITOPS_LIBRARY_IMPL(CompositeExplicitAutograd, m) {
  jitops::twin(m, "add");
}
