// softmax / log_softmax forward kernels for CPU: vectorised with at::vec,
// parallel with at::parallel_for.
//
// Numerics follow torch's own CPU kernels (ATen/native/cpu/SoftMaxKernel.cpp)
// step for step, so that the last-dim results are bit-identical: the same
// at::vec reductions (same lane order, same tail handling), the same exp, the
// same `x - max - log(sum)` order, and half/bfloat16 computed in float and
// rounded once. Other dims differ from torch only where torch's own split
// into vector and scalar columns depends on its thread partition (<= 1 ulp).
//
// This translation unit avoids <torch/library.h>; registration lives in
// softmax_cpu_backward.cpp, schemas in the op's spec (jitops/kernels/__init__.py).
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/EmptyTensor.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "softmax_common.h"
#include "softmax_cpu_vec.h"

namespace jitops_softmax {
namespace {

using at::Tensor;
namespace vec = at::vec;

// ---------------------------------------------------------------- last dim

// softmax of one row, float or double: max, then exp(x - max) written and
// summed in one pass (the lanes summed in reduce_all's order), then scaled.
template <typename T>
inline void softmax_row(const T* in, T* out, int64_t n) {
  using Vec = vec::Vectorized<T>;
  constexpr int64_t W = Vec::size();
  const T mx = vec::reduce_all<T>([](Vec& a, Vec& b) { return vec::maximum(a, b); }, in, n);
  const Vec vmx(mx);
  T sum;
  if (n < W) {
    const Vec e = (Vec::loadu(in, n) - vmx).exp();
    e.store(out, n);
    sum = vec::vec_reduce_all<T>([](Vec& a, Vec& b) { return a + b; }, e, n);
  } else {
    Vec acc(T(0));
    int64_t j = 0;
    for (; j + W <= n; j += W) {
      const Vec e = (Vec::loadu(in + j) - vmx).exp();
      e.store(out + j);
      acc = acc + e;
    }
    if (j < n) {
      const Vec e = (Vec::loadu(in + j, n - j) - vmx).exp();
      e.store(out + j, n - j);
      acc = Vec::set(acc, acc + e, n - j);
    }
    sum = vec::vec_reduce_all<T>([](Vec& a, Vec& b) { return a + b; }, acc);
  }
  const Vec scale(T(1) / sum);
  vec::map([scale](Vec x) { return x * scale; }, out, out, n);
}

// softmax of one half/bfloat16 row through a float buffer of n.
template <typename T>
inline void softmax_row_reduced(const T* in, T* out, float* buf, int64_t n) {
  using bVec = vec::Vectorized<T>;
  using fVec = vec::Vectorized<float>;
  fVec vmx(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + bVec::size() <= n; j += bVec::size()) {
    auto [a, b] = vec::convert_to_float<T>(bVec::loadu(in + j));
    vmx = vec::maximum(vmx, a);
    vmx = vec::maximum(vmx, b);
    a.store(buf + j);
    b.store(buf + j + fVec::size());
  }
  float mx = vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return vec::maximum(a, b); }, vmx);
  for (; j < n; ++j) {
    const float v = static_cast<float>(in[j]);
    mx = std::max(mx, v);
    buf[j] = v;
  }
  fVec acc(0.f);
  j = 0;
  for (; j + fVec::size() <= n; j += fVec::size()) {
    const fVec e = (fVec::loadu(buf + j) - fVec(mx)).exp();
    acc += e;
    e.store(buf + j);
  }
  float sum = vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, acc);
  for (; j < n; ++j) {
    const float e = std::exp(buf[j] - mx);
    sum += e;
    buf[j] = e;
  }
  const float scale = 1.f / sum;
  j = 0;
  for (; j + bVec::size() <= n; j += bVec::size()) {
    const fVec a = fVec::loadu(buf + j) * fVec(scale);
    const fVec b = fVec::loadu(buf + j + fVec::size()) * fVec(scale);
    vec::convert_from_float<T>(a, b).store(out + j);
  }
  for (; j < n; ++j) out[j] = static_cast<T>(buf[j] * scale);
}

// log_softmax of `rows` rows at once (they stay in L1 between passes): every
// max, every sum of exp(x - max), one vectorised log, then x - max - log(sum)
// in that order (it keeps precision when x is large and the spread small).
// As in torch, the maxima and log-sums are kept in T: for half and bfloat16
// the sum and its log are rounded to T before the last step. That is torch's
// rounding (not "round once"), kept so that results are bit-identical.
template <typename T>
inline void log_softmax_rows(const T* in, T* out, int64_t rows, int64_t n, T* scratch) {
  using acc_t = at::opmath_type<T>;
  using Vec = vec::Vectorized<acc_t>;
  T* mx = scratch;
  T* lse = mx + rows;
  for (int64_t r = 0; r < rows; ++r) {
    mx[r] = vec::reduce_all<T>([](Vec& a, Vec& b) { return vec::maximum(a, b); }, in + r * n, n);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const acc_t m = mx[r];
    lse[r] = vec::map_reduce_all<T>([m](Vec x) { return (x - Vec(m)).exp(); },
                                    [](Vec a, Vec b) { return a + b; }, in + r * n, n);
  }
  vec::map([](Vec x) { return x.log(); }, lse, lse, rows);
  for (int64_t r = 0; r < rows; ++r) {
    const acc_t m = mx[r];
    const acc_t l = lse[r];
    vec::map([m, l](Vec x) { return x - Vec(m) - Vec(l); }, out + r * n, in + r * n, n);
  }
}

template <typename T, bool LOG>
void lastdim_forward(const T* in, T* out, int64_t rows, int64_t n) {
  if constexpr (LOG) {
    const int64_t chunk = std::max<int64_t>(1, kGrain / (int64_t(sizeof(T)) * n));
    at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / (16 * n)), [&](int64_t begin, int64_t end) {
      const int64_t c = std::min(chunk, end - begin);
      std::unique_ptr<T[]> scratch(new T[2 * c]);
      for (int64_t r = begin; r < end; r += c) {
        log_softmax_rows<T>(in + r * n, out + r * n, std::min(c, end - r), n, scratch.get());
      }
    });
  } else {
    at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / (16 * n)), [&](int64_t begin, int64_t end) {
      if constexpr (is_reduced<T>) {
        std::unique_ptr<float[]> buf(new float[n]);
        for (int64_t r = begin; r < end; ++r) softmax_row_reduced<T>(in + r * n, out + r * n, buf.get(), n);
      } else {
        for (int64_t r = begin; r < end; ++r) softmax_row<T>(in + r * n, out + r * n, n);
      }
    });
  }
}

// ---------------------------------------------------------------- other dims

// log_softmax over a middle dim. The layout is (outer, n, inner). Each task
// takes a strip of columns of one outer slice (the strip's n rows fit in about 128 KiB), so every inner loop
// is contiguous and vectorised over columns, and the strip's max and sum
// stay in L1. Passes: max, sum of exp(x - max), then the output.
template <typename T, bool LOG>
void strided_forward(const T* in, T* out, int64_t outer, int64_t n, int64_t inner) {
  using acc_t = at::opmath_type<T>;
  using Vec = vec::Vectorized<acc_t>;
  constexpr int64_t W = Vec::size();
  const int64_t strip = strip_width<T>(n, W);
  const int64_t strips = (inner + strip - 1) / strip;
  const int64_t grain = std::max<int64_t>(1, kGrain / (16 * n * std::min(strip, inner)));
  at::parallel_for(0, outer * strips, grain, [&](int64_t begin, int64_t end) {
    std::unique_ptr<acc_t[]> scratch(new acc_t[2 * strip]);
    acc_t* mx = scratch.get();
    acc_t* sum = mx + strip;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t o = t / strips;
      const int64_t k0 = (t % strips) * strip;
      const int64_t w = std::min(strip, inner - k0);
      const int64_t wv = w / W * W;
      const T* src = in + o * n * inner + k0;
      T* dst = out + o * n * inner + k0;
      std::fill(mx, mx + w, -std::numeric_limits<acc_t>::infinity());
      std::fill(sum, sum + w, acc_t(0));
      for (int64_t d = 0; d < n; ++d) {
        const T* row = src + d * inner;
        for (int64_t k = 0; k < wv; k += W) vec::maximum(Vec::loadu(mx + k), load_acc(row + k)).store(mx + k);
        for (int64_t k = wv; k < w; ++k) {
          const acc_t v = static_cast<acc_t>(row[k]);
          mx[k] = (v > mx[k] || std::isnan(v)) ? v : mx[k];
        }
      }
      for (int64_t d = 0; d < n; ++d) {
        const T* row = src + d * inner;
        for (int64_t k = 0; k < wv; k += W) {
          (Vec::loadu(sum + k) + (load_acc(row + k) - Vec::loadu(mx + k)).exp()).store(sum + k);
        }
        for (int64_t k = wv; k < w; ++k) sum[k] += std::exp(static_cast<acc_t>(row[k]) - mx[k]);
      }
      if constexpr (LOG) vec::map([](Vec v) { return v.log(); }, sum, sum, w);
      for (int64_t d = 0; d < n; ++d) {
        const T* row = src + d * inner;
        T* o_row = dst + d * inner;
        for (int64_t k = 0; k < wv; k += W) {
          const Vec v = load_acc(row + k) - Vec::loadu(mx + k);
          store_acc(o_row + k, LOG ? v - Vec::loadu(sum + k) : v.exp() / Vec::loadu(sum + k));
        }
        for (int64_t k = wv; k < w; ++k) {
          const acc_t v = static_cast<acc_t>(row[k]) - mx[k];
          o_row[k] = static_cast<T>(LOG ? v - sum[k] : std::exp(v) / sum[k]);
        }
      }
    }
  });
}

// softmax over a middle dim, in torch's own order so that the results are
// bit-identical: the (outer, inner) columns are split evenly over the threads
// (grain 0, as torch), each thread walks its columns in vectors of `step`
// columns, and the columns left at the end of an outer slice or of the
// thread's range go one by one with std::exp (for half/bfloat16 the scalar
// exp is rounded to T before the division, as torch does). The split into
// vector and scalar columns depends on the thread count, exactly as torch's.
template <typename T>
void strided_softmax(const T* in, T* out, int64_t outer, int64_t n, int64_t inner) {
  using acc_t = at::opmath_type<T>;
  using Vec = vec::Vectorized<acc_t>;
  constexpr int64_t W = Vec::size();
  constexpr int64_t step = is_reduced<T> ? vec::Vectorized<T>::size() : W;
  at::parallel_for(0, outer * inner, 0, [&](int64_t begin, int64_t end) {
    // half/bfloat16 keep the float exps in a buffer; float/double keep them in the output, as torch
    std::unique_ptr<acc_t[]> buf(is_reduced<T> ? new acc_t[n * step] : nullptr);
    int64_t idx = begin;
    while (idx < end) {
      const int64_t o = idx / inner, k = idx % inner;
      const T* src = in + o * n * inner + k;
      T* dst = out + o * n * inner + k;
      if (k + step <= inner && idx + step <= end) {
        for (int64_t c = 0; c < step; c += W) {
          Vec m = load_acc(src + c);
          for (int64_t d = 1; d < n; ++d) m = vec::maximum(m, load_acc(src + d * inner + c));
          Vec sum(acc_t(0));
          for (int64_t d = 0; d < n; ++d) {
            const Vec e = (load_acc(src + d * inner + c) - m).exp();
            if constexpr (is_reduced<T>) e.store(buf.get() + d * step + c); else e.store(dst + d * inner + c);
            sum = sum + e;
          }
          for (int64_t d = 0; d < n; ++d) {
            const Vec e = is_reduced<T> ? Vec::loadu(buf.get() + d * step + c) : load_acc(dst + d * inner + c);
            store_acc(dst + d * inner + c, e / sum);
          }
        }
        idx += step;
      } else {
        const int64_t tail = idx + step > end ? end - idx : inner - k;
        for (int64_t i = 0; i < tail; ++i) {
          const int64_t oi = (idx + i) / inner, ki = (idx + i) % inner;
          const T* s = in + oi * n * inner + ki;
          T* t = out + oi * n * inner + ki;
          acc_t m = static_cast<acc_t>(s[0]);
          for (int64_t d = 1; d < n; ++d) m = std::max(m, static_cast<acc_t>(s[d * inner]));
          acc_t sum = 0;
          for (int64_t d = 0; d < n; ++d) {
            const acc_t e = std::exp(static_cast<acc_t>(s[d * inner]) - m);
            sum += e;
            t[d * inner] = static_cast<T>(e);
          }
          for (int64_t d = 0; d < n; ++d) t[d * inner] = static_cast<T>(static_cast<acc_t>(t[d * inner]) / sum);
        }
        idx += tail;
      }
    }
  });
}

template <bool LOG>
Tensor forward_cpu(const Tensor& x0, int64_t dim, Opt dtype) {
  constexpr const char* op = LOG ? "log_softmax" : "softmax";
  const Tensor xc = checked_input(op, x0, dim, dtype).contiguous();
  Tensor y = at::detail::empty_cpu(xc.sizes(), xc.scalar_type(), /*pin_memory=*/false, c10::MemoryFormat::Contiguous);
  if (xc.numel() == 0) return y;
  const Geometry g = geometry(xc, dim);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), op, [&] {
    const scalar_t* in = xc.const_data_ptr<scalar_t>();
    scalar_t* out = y.mutable_data_ptr<scalar_t>();
    if (g.inner == 1) {
      lastdim_forward<scalar_t, LOG>(in, out, g.outer, g.n);
    } else if constexpr (LOG) {
      strided_forward<scalar_t, true>(in, out, g.outer, g.n, g.inner);
    } else {
      strided_softmax<scalar_t>(in, out, g.outer, g.n, g.inner);
    }
  });
  return y;
}

}  // namespace

Tensor softmax_cpu(const Tensor& x, int64_t dim, Opt dtype) { return forward_cpu<false>(x, dim, dtype); }
Tensor log_softmax_cpu(const Tensor& x, int64_t dim, Opt dtype) { return forward_cpu<true>(x, dim, dtype); }

}  // namespace jitops_softmax
