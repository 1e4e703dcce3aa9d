// Dispatcher registration for the nms library (schema: the spec in
// jitops/kernels/__init__.py).
#include <jitops/op.h>

#include "nms_common.h"

JITOPS_LIBRARY_IMPL(CPU, m) {
  m.impl("nms", &jitops_nms::nms_cpu);
}

#ifdef JITOPS_WITH_CUDA
JITOPS_LIBRARY_IMPL(CUDA, m) {
  m.impl("nms", &jitops_nms::nms_cuda);
}
#endif

// Indices carry no gradient; boxes that require grad are fine (see jitops/op.h).
JITOPS_LIBRARY_IMPL(Autograd, m) {
  jitops::not_differentiable(m, "nms");
}
