// Dispatcher registration for the add library (schemas: the spec in
// jitops/kernels/__init__.py, named after torch's native overloads). The
// entry points pick the device kernel from the TensorIterator, so one
// function serves CPU and CUDA.
#include <jitops/op.h>

#include "add_common.h"

#define JITOPS_ADD_IMPLS(m)                                 \
  m.impl("add", &jitops_add::add);                          \
  m.impl("add.out", &jitops_add::add_out);                  \
  m.impl("add_", &jitops_add::add_);                        \
  m.impl("add.Scalar", &jitops_add::add_scalar);            \
  m.impl("add.Scalar_out", &jitops_add::add_scalar_out);    \
  m.impl("add_.Scalar", &jitops_add::add_scalar_)

JITOPS_LIBRARY_IMPL(CPU, m) {
  JITOPS_ADD_IMPLS(m);
}

#ifdef JITOPS_WITH_CUDA
JITOPS_LIBRARY_IMPL(CUDA, m) {
  JITOPS_ADD_IMPLS(m);
}
#endif

// add and add.Scalar are differentiable through their twins add_autograd and
// add_autograd.Scalar (python.py); the in-place and out= variants refuse
// inputs that need grad (see jitops/op.h).
JITOPS_LIBRARY_IMPL(Autograd, m) {
  jitops::differentiable(m, "add");
  jitops::differentiable(m, "add.Scalar");
  jitops::not_differentiable(m, "add.out");
  jitops::not_differentiable(m, "add_");
  jitops::not_differentiable(m, "add.Scalar_out");
  jitops::not_differentiable(m, "add_.Scalar");
}

JITOPS_LIBRARY_IMPL(CompositeExplicitAutograd, m) {
  jitops::twin(m, "add");
  jitops::twin(m, "add.Scalar");
}
