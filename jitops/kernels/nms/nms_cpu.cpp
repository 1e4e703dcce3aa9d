// nms for CPU.
//
// Boxes are sorted once by decreasing score (stable: ties keep index order)
// and copied into structure-of-arrays with their areas precomputed. Each
// round keeps the first remaining candidate, then one branch-free pass over
// the remaining ones computes their IoU with it (vectorised by the compiler)
// and a second pass compacts the survivors, so suppressed boxes are never
// looked at again and the work shrinks as boxes are suppressed.
#include <ATen/Dispatch.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "nms_common.h"

namespace jitops_nms {
namespace {

template <typename T>
std::vector<int64_t> nms_kernel(const T* boxes, const T* scores, int64_t n, T threshold) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [scores](int64_t a, int64_t b) { return scores[a] > scores[b]; });

  std::vector<T> x1(n), y1(n), x2(n), y2(n), area(n);
  std::vector<int64_t> idx(order);
  for (int64_t k = 0; k < n; ++k) {
    const T* b = boxes + 4 * order[k];
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
    // Pass 1, branch-free: suppressed when IoU > threshold (as torchvision,
    // inter / union; 0 / 0 is NaN and suppresses nothing).
    for (int64_t j = 1; j < m; ++j) {
      const T w = std::max(T(0), std::min(bx2, x2[j]) - std::max(bx1, x1[j]));
      const T h = std::max(T(0), std::min(by2, y2[j]) - std::max(by1, y1[j]));
      const T inter = w * h;
      drop[j] = (inter / (barea + area[j] - inter)) > threshold;
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

}  // namespace

at::Tensor nms_cpu(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  check_inputs(boxes, scores);
  const int64_t n = boxes.size(0);
  std::vector<int64_t> keep;
  if (n > 0) {
    const at::Tensor b = boxes.contiguous();
    const at::Tensor s = scores.contiguous();
    AT_DISPATCH_FLOATING_TYPES(b.scalar_type(), "nms", [&] {
      keep = nms_kernel<scalar_t>(b.const_data_ptr<scalar_t>(), s.const_data_ptr<scalar_t>(), n,
                                  static_cast<scalar_t>(iou_threshold));
    });
  }
  const int64_t k = static_cast<int64_t>(keep.size());
  at::Tensor result = at::detail::empty_cpu({k}, at::kLong, /*pin_memory=*/false, std::nullopt);
  std::copy(keep.begin(), keep.end(), result.mutable_data_ptr<int64_t>());
  return result;
}

}  // namespace jitops_nms
