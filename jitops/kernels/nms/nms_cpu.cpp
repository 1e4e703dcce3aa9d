// nms for CPU through torch's C++ API: floating boxes (the CPU key) and
// quantized ones (the QuantizedCPU key), with torchvision's semantics (see
// nms_common.h). The algorithms are nms_greedy.h's, which the stable-ABI
// build (nms_stable.cpp) shares: this file is the CPU half of a CUDA build.
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "nms_common.h"
#include "nms_greedy.h"

namespace jitops_nms {
namespace {

at::Tensor indices(const std::vector<int64_t>& keep) {
  const int64_t k = static_cast<int64_t>(keep.size());
  at::Tensor result = at::detail::empty_cpu({k}, at::kLong, /*pin_memory=*/false, std::nullopt);
  std::copy(keep.begin(), keep.end(), result.mutable_data_ptr<int64_t>());
  return result;
}

}  // namespace

at::Tensor nms_cpu(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  check_inputs(boxes, scores);
  const int64_t n = boxes.size(0);
  std::vector<int64_t> keep;
  if (n > 0) {
    const at::Tensor b = boxes.contiguous();
    const at::Tensor s = scores.contiguous();
    switch (b.scalar_type()) {
      case at::kFloat:
        keep = torchvision_cpu(b.const_data_ptr<float>(), s.const_data_ptr<float>(), n, iou_threshold);
        break;
      case at::kDouble:
        keep = torchvision_cpu(b.const_data_ptr<double>(), s.const_data_ptr<double>(), n, iou_threshold);
        break;
      default:  // float16 (check_inputs allows nothing else)
        keep = torchvision_cuda_half(b.const_data_ptr<c10::Half>(), s.const_data_ptr<c10::Half>(), n, iou_threshold);
    }
  }
  return indices(keep);
}

at::Tensor nms_quantized_cpu(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  check_quantized_inputs(boxes, scores);
  const int64_t n = boxes.size(0);
  std::vector<int64_t> keep;
  if (n > 0) {
    const at::Tensor b = boxes.contiguous();
    const at::Tensor s = scores.contiguous();
    switch (b.scalar_type()) {
      case c10::ScalarType::QInt8:
        keep = torchvision_quantized(b.const_data_ptr<c10::qint8>(), s.const_data_ptr<c10::qint8>(), n, iou_threshold);
        break;
      case c10::ScalarType::QUInt8:
        keep = torchvision_quantized(b.const_data_ptr<c10::quint8>(), s.const_data_ptr<c10::quint8>(), n,
                                     iou_threshold);
        break;
      default:  // qint32 (check_quantized_inputs allows nothing else)
        keep = torchvision_quantized(b.const_data_ptr<c10::qint32>(), s.const_data_ptr<c10::qint32>(), n,
                                     iou_threshold);
    }
  }
  return indices(keep);
}

}  // namespace jitops_nms
