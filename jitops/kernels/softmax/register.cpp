// Dispatcher registration for the softmax library. Kept apart from the
// kernels: <torch/library.h> is the slowest header to parse, and two
// translation units compile in parallel.
#include <jitops/op.h>

#include "softmax_common.h"

JITOPS_LIBRARY_IMPL(CPU, m) {
  m.impl("softmax", &jitops_softmax::softmax_cpu);
  m.impl("log_softmax", &jitops_softmax::log_softmax_cpu);
  m.impl("softmax_backward", &jitops_softmax::softmax_backward_cpu);
  m.impl("log_softmax_backward", &jitops_softmax::log_softmax_backward_cpu);
}

#ifdef JITOPS_WITH_CUDA
JITOPS_LIBRARY_IMPL(CUDA, m) {
  m.impl("softmax", &jitops_softmax::softmax_cuda);
  m.impl("log_softmax", &jitops_softmax::log_softmax_cuda);
  m.impl("softmax_backward", &jitops_softmax::softmax_backward_cuda);
  m.impl("log_softmax_backward", &jitops_softmax::log_softmax_backward_cuda);
}
#endif

// Autograd: C++ kernels that skip autograd when no input needs grad, and
// otherwise call the twins softmax_autograd / log_softmax_autograd, whose
// derivatives are registered from python.py (see jitops/op.h).
JITOPS_LIBRARY_IMPL(Autograd, m) {
  jitops::differentiable(m, "softmax");
  jitops::differentiable(m, "log_softmax");
}

// The twins' forwards: they call softmax / log_softmax below autograd.
// The backward ops are fused kernels per backend (above).
JITOPS_LIBRARY_IMPL(CompositeExplicitAutograd, m) {
  jitops::twin(m, "softmax");
  jitops::twin(m, "log_softmax");
}
