// nms for CPU, with torchvision's semantics (see nms_common.h).
//
// Boxes are sorted once by decreasing score (stable: ties keep index order,
// as torchvision's sort) and copied into structure-of-arrays. Each round
// keeps the first remaining candidate, then one branch-free pass over the
// remaining ones decides which it suppresses (vectorised by the compiler) and
// a second pass compacts the survivors, so suppressed boxes are never looked
// at again and the work shrinks as boxes are suppressed.
//
// Built with -ffp-contract=off (the spec's cflags): torchvision's CPU kernel
// rounds every product, so a fused multiply-add would decide some ties
// differently.
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "nms_common.h"

namespace jitops_nms {
namespace {

// torchvision compares the float IoU with the threshold as a double. For a
// float x, double(x) > t exactly when x > the largest float not above t.
float float_threshold(double t) {
  float f = static_cast<float>(t);
  if (static_cast<double>(f) > t) f = std::nextafter(f, -std::numeric_limits<float>::infinity());
  return f;
}

template <typename T>
std::vector<int64_t> sorted_order(const T* scores, int64_t n) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  // torch's descending sort puts NaN first (NaN counts as the largest value).
  std::stable_sort(order.begin(), order.end(), [scores](int64_t a, int64_t b) {
    const double x = static_cast<double>(scores[a]), y = static_cast<double>(scores[b]);
    return x > y || (std::isnan(x) && !std::isnan(y));
  });
  return order;
}

template <typename T>
std::vector<int64_t> torchvision_cpu(const T* boxes, const T* scores, int64_t n, double iou_threshold) {
  // torchvision's CPU kernel: IoU in T, threshold compared as a double.
  using cmp_t = std::conditional_t<std::is_same_v<T, float>, float, double>;
  const cmp_t threshold = std::is_same_v<T, float> ? float_threshold(iou_threshold) : iou_threshold;
  std::vector<int64_t> idx = sorted_order(scores, n);
  std::vector<T> x1(n), y1(n), x2(n), y2(n), area(n);
  for (int64_t k = 0; k < n; ++k) {
    const T* b = boxes + 4 * idx[k];
    x1[k] = b[0];
    y1[k] = b[1];
    x2[k] = b[2];
    y2[k] = b[3];
    area[k] = (b[2] - b[0]) * (b[3] - b[1]);
  }
  std::vector<uint8_t> drop(n);
  std::vector<int64_t> keep;
  int64_t m = n;  // candidates left, in positions [0, m)
  while (m > 0) {
    keep.push_back(idx[0]);
    const T bx1 = x1[0], by1 = y1[0], bx2 = x2[0], by2 = y2[0], barea = area[0];
    // Pass 1, branch-free (inter / union; 0 / 0 is NaN and suppresses nothing).
    for (int64_t j = 1; j < m; ++j) {
      const T w = std::max(T(0), std::min(bx2, x2[j]) - std::max(bx1, x1[j]));
      const T h = std::max(T(0), std::min(by2, y2[j]) - std::max(by1, y1[j]));
      const T inter = w * h;
      drop[j] = static_cast<cmp_t>(inter / (barea + area[j] - inter)) > threshold;
    }
    // Pass 2: compact the survivors to the front.
    int64_t out = 0;
    for (int64_t j = 1; j < m; ++j) {
      if (drop[j]) continue;
      x1[out] = x1[j];
      y1[out] = y1[j];
      x2[out] = x2[j];
      y2[out] = y2[j];
      area[out] = area[j];
      idx[out] = idx[j];
      ++out;
    }
    m = out;
  }
  return keep;
}

// float16: torchvision's CUDA formula (its CPU kernel refuses float16), so
// both devices return the same indices. Boxes are held in float (exact).
std::vector<int64_t> torchvision_cuda_half(const c10::Half* boxes, const c10::Half* scores, int64_t n,
                                           double iou_threshold) {
  const float threshold = static_cast<float>(iou_threshold);  // torchvision's kernel takes a float
  std::vector<int64_t> idx = sorted_order(scores, n);
  std::vector<float> b(4 * n);
  for (int64_t k = 0; k < n; ++k) {
    for (int c = 0; c < 4; ++c) b[4 * k + c] = static_cast<float>(boxes[4 * idx[k] + c]);
  }
  std::vector<int64_t> keep;
  int64_t m = n;
  while (m > 0) {
    keep.push_back(idx[0]);
    float first[4] = {b[0], b[1], b[2], b[3]};
    int64_t out = 0;
    for (int64_t j = 1; j < m; ++j) {
      if (cuda_suppresses<c10::Half>(first, &b[4 * j], threshold)) continue;
      for (int c = 0; c < 4; ++c) b[4 * out + c] = b[4 * j + c];
      idx[out] = idx[j];
      ++out;
    }
    m = out;
  }
  return keep;
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
  const int64_t k = static_cast<int64_t>(keep.size());
  at::Tensor result = at::detail::empty_cpu({k}, at::kLong, /*pin_memory=*/false, std::nullopt);
  std::copy(keep.begin(), keep.end(), result.mutable_data_ptr<int64_t>());
  return result;
}

}  // namespace jitops_nms
