// Dispatcher registration for the nms library (schema: the spec in
// jitops/kernels/__init__.py).
#include <jitops/op.h>

#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "nms_common.h"

namespace {

// Autocast (torchvision's rule for nms): boxes and scores of a lower
// precision floating dtype on the autocast device (float16, bfloat16) are
// cast to float32, float32 and float64 are left alone, and the op runs with
// autocast excluded. The result is int64 indices, so nothing is cast back:
// the indices are those of the float32 computation.
template <c10::DeviceType D>
bool cast_to_float(const at::Tensor& t) {
  const bool on_device = D == c10::DeviceType::CPU ? (t.is_cpu() || t.is_mkldnn()) : (t.is_cuda() || t.is_xla());
  return on_device && t.is_floating_point() && t.scalar_type() != at::kDouble && t.scalar_type() != at::kFloat;
}

template <c10::DispatchKey K, c10::DeviceType D>
void in_float32(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(n); it != stack->end(); ++it) {
    if (it->isTensor() && cast_to_float<D>(it->toTensor())) *it = it->toTensor().to(at::kFloat);
  }
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(K);
  op.redispatchBoxed(ks - c10::autocast_dispatch_keyset, stack);
}

}  // namespace

JITOPS_LIBRARY_IMPL(CPU, m) {
  m.impl("nms", &jitops_nms::nms_cpu);
}

JITOPS_LIBRARY_IMPL(QuantizedCPU, m) {
  m.impl("nms", &jitops_nms::nms_quantized_cpu);
}

#ifdef JITOPS_WITH_CUDA
JITOPS_LIBRARY_IMPL(CUDA, m) {
  m.impl("nms", &jitops_nms::nms_cuda);
}
#endif

JITOPS_LIBRARY_IMPL(AutocastCPU, m) {
  m.impl("nms", torch::CppFunction::makeFromBoxedFunction<
                    &in_float32<c10::DispatchKey::AutocastCPU, c10::DeviceType::CPU>>());
}

JITOPS_LIBRARY_IMPL(AutocastCUDA, m) {
  m.impl("nms", torch::CppFunction::makeFromBoxedFunction<
                    &in_float32<c10::DispatchKey::AutocastCUDA, c10::DeviceType::CUDA>>());
}

// Indices carry no gradient; boxes that require grad are fine (see jitops/op.h).
JITOPS_LIBRARY_IMPL(Autograd, m) {
  jitops::not_differentiable(m, "nms");
}
