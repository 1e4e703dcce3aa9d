// torchvision's CUDA IoU test, shared by the GPU kernel (nms_cuda.cu) and the
// CPU's float16 path (nms_greedy.h). Header-only torch (torch/headeronly),
// so the stable-ABI build (nms_stable.cpp) includes it too.
#pragma once

#include <torch/headeronly/macros/Macros.h>
#include <torch/headeronly/util/Half.h>

#include <cmath>

namespace jitops_nms {

// The accumulate type of torchvision's CUDA IoU (at::acc_type<T, true>).
template <typename T> struct Acc { using type = T; };
template <> struct Acc<c10::Half> { using type = float; };

// T -> accumulate type, and a value of the accumulate type rounded to T and
// back, where torchvision's CUDA arithmetic happens in T (c10::Half's
// operators compute in float and round to half).
template <typename T>
C10_HOST_DEVICE inline typename Acc<T>::type in_t(typename Acc<T>::type v) {
  return static_cast<typename Acc<T>::type>(static_cast<T>(v));
}

C10_HOST_DEVICE inline float max_(float a, float b) { return fmaxf(a, b); }
C10_HOST_DEVICE inline float min_(float a, float b) { return fminf(a, b); }
C10_HOST_DEVICE inline double max_(double a, double b) { return fmax(a, b); }
C10_HOST_DEVICE inline double min_(double a, double b) { return fmin(a, b); }

// Does box a (x1, y1, x2, y2) suppress box b? torchvision's CUDA formula,
// values already in the accumulate type. max/min are fmax/fmin (NaN-ignoring)
// as CUDA's max/min of floats are.
template <typename T>
C10_HOST_DEVICE inline bool cuda_suppresses(const typename Acc<T>::type* a, const typename Acc<T>::type* b,
                                            float threshold) {
  using acc_t = typename Acc<T>::type;
  const acc_t left = max_(a[0], b[0]), right = min_(a[2], b[2]);
  const acc_t top = max_(a[1], b[1]), bottom = min_(a[3], b[3]);
  const acc_t width = max_(in_t<T>(right - left), acc_t(0));
  const acc_t height = max_(in_t<T>(bottom - top), acc_t(0));
  const acc_t inter = width * height;
  const acc_t area_a = (a[2] - a[0]) * in_t<T>(a[3] - a[1]);
  const acc_t area_b = (b[2] - b[0]) * in_t<T>(b[3] - b[1]);
  return (inter / (area_a + area_b - inter)) > threshold;
}

}  // namespace jitops_nms
