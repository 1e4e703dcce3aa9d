// Shared by the CPU and CUDA translation units of the nms library: input
// checks (the Python fake kernel repeats them word for word), the entry
// points; the IoU test of torchvision's CUDA kernel is nms_iou.h.
//
// torchvision decides "suppress" in two slightly different ways, and jitops
// follows each where torchvision runs it:
//   - CPU (float32, float64): areas in the box dtype, IoU in the box dtype,
//     compared with the threshold as a double. nms_greedy.h.
//   - CUDA (float16, float32, float64): intersection and areas in the
//     accumulate type (float for float16), the float16 differences rounded
//     to float16 where torchvision's are, compared with the threshold as a
//     float. cuda_suppresses below, on the GPU; the CPU uses it for float16,
//     which torchvision's CPU kernel refuses, so float16 gives the same
//     indices on both devices.
// Two more ways in, as torchvision's:
//   - under torch.autocast (CPU or CUDA), float16 and bfloat16 boxes and
//     scores are cast to float32 first (register.cpp), so they get the
//     float32 indices;
//   - quantized boxes and scores (CPU): the greedy pass on their integer
//     values, as torchvision's QuantizedCPU kernel. nms_greedy.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/QScheme.h>
#include <c10/core/ScalarType.h>
#include <jitops/dtype.h>

#include "nms_iou.h"

namespace jitops_nms {

// torch's Python names (float32, quint8), which jitops::dtype_name gives
// for all but the quantized dtypes.
inline const char* dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::QInt8: return "qint8";
    case c10::ScalarType::QUInt8: return "quint8";
    case c10::ScalarType::QInt32: return "qint32";
    default: return jitops::dtype_name(t);
  }
}

inline void check_shapes(const at::Tensor& boxes, const at::Tensor& scores) {
  TORCH_CHECK(boxes.dim() == 2 && boxes.size(1) == 4, "nms: boxes must be (N, 4), got ", boxes.sizes());
  TORCH_CHECK(scores.dim() == 1 && scores.size(0) == boxes.size(0), "nms: scores must be (N,) for N = ",
              boxes.size(0), " boxes, got ", scores.sizes());
}

inline void check_same(const at::Tensor& boxes, const at::Tensor& scores) {
  TORCH_CHECK(scores.scalar_type() == boxes.scalar_type(), "nms: boxes and scores must have the same dtype, got ",
              dtype_name(boxes.scalar_type()), " and ", dtype_name(scores.scalar_type()));
  TORCH_CHECK(boxes.device() == scores.device(), "nms: boxes and scores must be on the same device, got ",
              boxes.device(), " and ", scores.device());
}

// Floating boxes (the CPU and CUDA kernels). bfloat16 reaches a kernel only
// outside autocast: under autocast register.cpp computes it in float32.
inline void check_inputs(const at::Tensor& boxes, const at::Tensor& scores) {
  check_shapes(boxes, scores);
  TORCH_CHECK(boxes.scalar_type() == at::kFloat || boxes.scalar_type() == at::kDouble ||
                  boxes.scalar_type() == at::kHalf,
              "nms: expected float16, float32 or float64 boxes, got ", dtype_name(boxes.scalar_type()),
              " (bfloat16 is taken under torch.autocast, which computes it in float32; quantized boxes need "
              "quantized scores)");
  check_same(boxes, scores);
}

// Quantized boxes (the QuantizedCPU kernel): qint8, quint8 or qint32,
// quantized per tensor, with scores of the same dtype.
inline void check_quantized_inputs(const at::Tensor& boxes, const at::Tensor& scores) {
  check_shapes(boxes, scores);
  check_same(boxes, scores);
  TORCH_CHECK(boxes.scalar_type() == c10::ScalarType::QInt8 || boxes.scalar_type() == c10::ScalarType::QUInt8 ||
                  boxes.scalar_type() == c10::ScalarType::QInt32,
              "nms: expected qint8, quint8 or qint32 quantized boxes, got ", dtype_name(boxes.scalar_type()));
  for (const at::Tensor* t : {&boxes, &scores}) {
    TORCH_CHECK(t->qscheme() == c10::kPerTensorAffine, "nms: quantized ", t == &boxes ? "boxes" : "scores",
                " must be quantized per tensor (torch.quantize_per_tensor), got ", c10::toString(t->qscheme()),
                ": per-channel scales would make the integer values of different boxes incomparable. Fix: "
                "dequantize them first");
  }
}

at::Tensor nms_cpu(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold);
at::Tensor nms_quantized_cpu(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold);
#ifdef JITOPS_WITH_CUDA
at::Tensor nms_cuda(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold);
#endif

}  // namespace jitops_nms
