// Shared by the CPU and CUDA translation units of the nms library: input
// checks (the Python fake kernel repeats them word for word) and entry points.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <jitops/dtype.h>

namespace jitops_nms {

using jitops::dtype_name;

inline void check_inputs(const at::Tensor& boxes, const at::Tensor& scores) {
  TORCH_CHECK(boxes.dim() == 2 && boxes.size(1) == 4, "nms: boxes must be (N, 4), got ", boxes.sizes());
  TORCH_CHECK(scores.dim() == 1 && scores.size(0) == boxes.size(0), "nms: scores must be (N,) for N = ",
              boxes.size(0), " boxes, got ", scores.sizes());
  TORCH_CHECK(boxes.scalar_type() == at::kFloat || boxes.scalar_type() == at::kDouble,
              "nms: expected float32 or float64 boxes, got ", dtype_name(boxes.scalar_type()));
  TORCH_CHECK(scores.scalar_type() == boxes.scalar_type(), "nms: boxes and scores must have the same dtype, got ",
              dtype_name(boxes.scalar_type()), " and ", dtype_name(scores.scalar_type()));
  TORCH_CHECK(boxes.device() == scores.device(), "nms: boxes and scores must be on the same device, got ",
              boxes.device(), " and ", scores.device());
}

at::Tensor nms_cpu(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold);
#ifdef JITOPS_WITH_CUDA
at::Tensor nms_cuda(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold);
#endif

}  // namespace jitops_nms
