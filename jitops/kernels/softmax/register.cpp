// Dispatcher registration for the softmax library. Kept apart from the
// kernels: <torch/library.h> is the slowest header to parse, and two
// translation units compile in parallel.
#include <jitops/op.h>

#include "softmax_common.h"

JITOPS_LIBRARY_IMPL(CPU, m) {
  m.impl("softmax", &jitops_softmax::softmax_cpu);
  m.impl("log_softmax", &jitops_softmax::log_softmax_cpu);
}

#ifdef JITOPS_WITH_CUDA
JITOPS_LIBRARY_IMPL(CUDA, m) {
  m.impl("softmax", &jitops_softmax::softmax_cuda);
  m.impl("log_softmax", &jitops_softmax::log_softmax_cuda);
}
#endif

// The backward formulas are device-agnostic ATen expressions, registered for
// every backend at once.
JITOPS_LIBRARY_IMPL(CompositeExplicitAutograd, m) {
  m.impl("softmax_backward", &jitops_softmax::softmax_backward);
  m.impl("log_softmax_backward", &jitops_softmax::log_softmax_backward);
}
