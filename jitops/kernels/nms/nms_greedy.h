// nms's CPU algorithms, with torchvision's semantics (see nms_common.h),
// on raw arrays: the ATen build (nms_cpu.cpp) and the stable-ABI build
// (nms_stable.cpp) run the same code, so they return the same indices.
// Header-only torch only (c10::Half and the quantized integer types of
// torch/headeronly). Both are built with -ffp-contract=off (the spec's
// cflags): torchvision's CPU kernel rounds every product, so a fused
// multiply-add would decide some ties differently.
//
// Boxes are sorted once by decreasing score (stable: ties keep index order,
// as torchvision's sort) and copied into structure-of-arrays. Each round
// keeps the first remaining candidate, then one branch-free pass over the
// remaining ones decides which it suppresses (vectorised by the compiler) and
// a second pass compacts the survivors, so suppressed boxes are never looked
// at again and the work shrinks as boxes are suppressed.
#pragma once

#include <torch/headeronly/util/Half.h>
#include <torch/headeronly/util/qint32.h>
#include <torch/headeronly/util/qint8.h>
#include <torch/headeronly/util/quint8.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <type_traits>
#include <utility>
#include <vector>

#include "nms_iou.h"

namespace jitops_nms {

// torchvision compares the float IoU with the threshold as a double. For a
// float x, double(x) > t exactly when x > the largest float not above t.
inline float float_threshold(double t) {
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

// Boxes in score order, structure-of-arrays; area[k] is box k's area.
template <typename T>
struct SortedBoxes {
  std::vector<int64_t> idx;  // original index of each box
  std::vector<T> x1, y1, x2, y2, area;
  explicit SortedBoxes(std::vector<int64_t> order)
      : idx(std::move(order)), x1(idx.size()), y1(idx.size()), x2(idx.size()), y2(idx.size()), area(idx.size()) {}
};

// torchvision's CPU greedy pass: IoU in T, compared with the threshold (cmp_t:
// see float_threshold). Consumes b.
template <typename T, typename cmp_t>
std::vector<int64_t> greedy(SortedBoxes<T>& b, cmp_t threshold) {
  std::vector<uint8_t> drop(b.idx.size());
  std::vector<int64_t> keep;
  int64_t m = static_cast<int64_t>(b.idx.size());  // candidates left, in positions [0, m)
  while (m > 0) {
    keep.push_back(b.idx[0]);
    const T bx1 = b.x1[0], by1 = b.y1[0], bx2 = b.x2[0], by2 = b.y2[0], barea = b.area[0];
    // Pass 1, branch-free (inter / union; 0 / 0 is NaN and suppresses nothing).
    for (int64_t j = 1; j < m; ++j) {
      const T w = std::max(T(0), std::min(bx2, b.x2[j]) - std::max(bx1, b.x1[j]));
      const T h = std::max(T(0), std::min(by2, b.y2[j]) - std::max(by1, b.y1[j]));
      const T inter = w * h;
      drop[j] = static_cast<cmp_t>(inter / (barea + b.area[j] - inter)) > threshold;
    }
    // Pass 2: compact the survivors to the front.
    int64_t out = 0;
    for (int64_t j = 1; j < m; ++j) {
      if (drop[j]) continue;
      b.x1[out] = b.x1[j];
      b.y1[out] = b.y1[j];
      b.x2[out] = b.x2[j];
      b.y2[out] = b.y2[j];
      b.area[out] = b.area[j];
      b.idx[out] = b.idx[j];
      ++out;
    }
    m = out;
  }
  return keep;
}

template <typename T>
std::vector<int64_t> torchvision_cpu(const T* boxes, const T* scores, int64_t n, double iou_threshold) {
  // torchvision's CPU kernel: areas and IoU in T, threshold compared as a double.
  SortedBoxes<T> b(sorted_order(scores, n));
  for (int64_t k = 0; k < n; ++k) {
    const T* p = boxes + 4 * b.idx[k];
    b.x1[k] = p[0];
    b.y1[k] = p[1];
    b.x2[k] = p[2];
    b.y2[k] = p[3];
    b.area[k] = (p[2] - p[0]) * (p[3] - p[1]);
  }
  if constexpr (std::is_same_v<T, float>) {
    return greedy(b, float_threshold(iou_threshold));
  } else {
    return greedy(b, iou_threshold);
  }
}

// Quantized boxes, as torchvision's QuantizedCPU kernel: the stored integers
// stand for the values (the zero point cancels in every difference and the
// scale in the IoU ratio), sorted by the scores' integers (stable,
// descending); coordinates as float, areas as the integer product converted
// to float (exact for 8-bit values; for qint32 jitops multiplies in 64 bits
// where torchvision's 32-bit product may overflow), IoU in float compared
// with the threshold as a double.
template <typename Q>
std::vector<int64_t> torchvision_quantized(const Q* boxes, const Q* scores, int64_t n, double iou_threshold) {
  using raw_t = typename Q::underlying;
  std::vector<raw_t> s(n);
  for (int64_t k = 0; k < n; ++k) s[k] = scores[k].val_;
  SortedBoxes<float> b(sorted_order(s.data(), n));
  for (int64_t k = 0; k < n; ++k) {
    const Q* p = boxes + 4 * b.idx[k];
    b.x1[k] = static_cast<float>(p[0].val_);
    b.y1[k] = static_cast<float>(p[1].val_);
    b.x2[k] = static_cast<float>(p[2].val_);
    b.y2[k] = static_cast<float>(p[3].val_);
    const int64_t w = int64_t{p[2].val_} - p[0].val_, h = int64_t{p[3].val_} - p[1].val_;
    b.area[k] = static_cast<float>(w * h);
  }
  return greedy(b, float_threshold(iou_threshold));
}

// float16: torchvision's CUDA formula (its CPU kernel refuses float16), so
// both devices return the same indices. Boxes are held in float (exact).
inline std::vector<int64_t> torchvision_cuda_half(const c10::Half* boxes, const c10::Half* scores, int64_t n,
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

}  // namespace jitops_nms
