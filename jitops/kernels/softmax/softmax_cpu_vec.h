// Helpers shared by the CPU softmax kernels (forward and backward): the task
// grain, and loads/stores that widen half and bfloat16 to float vectors, as
// torch's own softmax kernels do. Header-only; each TU gets its own copy.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace jitops_softmax {
namespace {

constexpr int64_t kGrain = 32768;  // at::internal::GRAIN_SIZE: elements per task, and bytes of L1

template <typename T>
constexpr bool is_reduced = std::is_same_v<T, at::Half> || std::is_same_v<T, at::BFloat16>;

// Columns per task for the (outer, n, inner) kernels: a strip whose n rows fit in about
// 128 KiB, a whole number of vectors of W lanes, at most 4096.
template <typename T>
inline int64_t strip_width(int64_t n, int64_t W) {
  return std::clamp<int64_t>((128 * 1024 / int64_t(sizeof(T)) / n) / W * W, W, 4096);
}

// A vector of the accumulation type loaded from / stored to T (half and
// bfloat16 widen to float: one float vector's worth of elements).
template <typename T>
inline at::vec::Vectorized<at::opmath_type<T>> load_acc(const T* p) {
  if constexpr (is_reduced<T>) {
    at::vec::Vectorized<float> v;
    at::vec::load_to_float<T>(p, v);
    return v;
  } else {
    return at::vec::Vectorized<T>::loadu(p);
  }
}

template <typename T>
inline void store_acc(T* p, at::vec::Vectorized<at::opmath_type<T>> v) {
  if constexpr (is_reduced<T>) {
    at::vec::convert_from_float<T>(v, v).store(p, at::vec::Vectorized<float>::size());
  } else {
    v.store(p);
  }
}

}  // namespace
}  // namespace jitops_softmax
