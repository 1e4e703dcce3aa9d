// softmax / log_softmax kernels for CPU: vectorized with at::vec, parallel
// with at::parallel_for. Half and bfloat16 accumulate in float.
//
// This translation unit avoids <torch/library.h> and the dispatcher headers
// so that it compiles in parallel with register_cpu.cpp; registration lives
// there, schemas live in the op's spec (jitops/kernels/softmax/__init__.py).
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/WrapDimMinimal.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "softmax_common.h"

namespace jitops_softmax {
namespace {

using at::Tensor;
namespace vec = at::vec;

// Elements per parallel task, as ATen's own kernels use.
constexpr int64_t kGrain = 32768;

// Rows per chunk of log_softmax: the chunk's rows stay in L1 between
// passes, and its log-sum-exps are taken with one vectorised log.
constexpr int64_t kMaxChunk = 256;

template <typename acc_t>
inline int64_t chunk_rows(int64_t n) {
  return std::clamp<int64_t>(kGrain / (int64_t(sizeof(acc_t)) * n), 1, kMaxChunk);
}

// log_softmax of `rows` (<= kMaxChunk) contiguous rows of length n >= 1, in
// the accumulation type: every max, then every sum of exp(x - max), one
// vectorised log of the sums, then x - max - log(sum) (in that order, which
// keeps precision when x is large and the spread small).
template <typename acc_t>
inline void log_rows_forward(const acc_t* in, acc_t* out, int64_t rows, int64_t n) {
  using Vec = vec::Vectorized<acc_t>;
  acc_t mx[kMaxChunk];
  acc_t lse[kMaxChunk];
  for (int64_t r = 0; r < rows; ++r) {
    mx[r] = vec::reduce_all<acc_t>([](Vec& a, Vec& b) { return vec::maximum(a, b); }, in + r * n, n);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const Vec vmx(mx[r]);
    lse[r] = vec::map_reduce_all<acc_t>(
        [vmx](Vec x) { return (x - vmx).exp_u20(); }, [](Vec a, Vec b) { return a + b; }, in + r * n, n);
  }
  vec::map([](Vec x) { return x.log(); }, lse, lse, rows);
  for (int64_t r = 0; r < rows; ++r) {
    const Vec vmx(mx[r]);
    const Vec vlse(lse[r]);
    vec::map([vmx, vlse](Vec x) { return x - vmx - vlse; }, out + r * n, in + r * n, n);
  }
}

// softmax of one contiguous row of length n >= 1, in the accumulation type.
template <typename acc_t>
inline void row_forward(const acc_t* in, acc_t* out, int64_t n) {
  using Vec = vec::Vectorized<acc_t>;
  const acc_t mx = vec::reduce_all<acc_t>(
      [](Vec& a, Vec& b) { return vec::maximum(a, b); }, in, n);
  const Vec vmx(mx);
  // Write exp(x - max) once and accumulate its sum in the same pass.
  Vec vsum(acc_t(0));
  int64_t j = 0;
  for (; j + Vec::size() <= n; j += Vec::size()) {
    Vec e = (Vec::loadu(in + j) - vmx).exp_u20();
    e.store(out + j);
    vsum = vsum + e;
  }
  acc_t sum = vec::vec_reduce_all<acc_t>(
      [](Vec& a, Vec& b) { return a + b; }, vsum);
  for (; j < n; ++j) {
    const acc_t e = std::exp(in[j] - mx);
    out[j] = e;
    sum += e;
  }
  const Vec vscale(acc_t(1) / sum);
  vec::map([vscale](Vec x) { return x * vscale; }, out, out, n);
}

// Softmax over the last (contiguous) dimension: rows of length n >= 1.
template <typename scalar_t, bool LOG>
void lastdim_forward(const scalar_t* in, scalar_t* out, int64_t rows, int64_t n) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t grain = std::max<int64_t>(1, kGrain / n);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<acc_t, scalar_t>) {
      if constexpr (LOG) {
        const int64_t chunk = chunk_rows<acc_t>(n);
        for (int64_t r = begin; r < end; r += chunk) {
          log_rows_forward<acc_t>(in + r * n, out + r * n, std::min(chunk, end - r), n);
        }
      } else {
        for (int64_t r = begin; r < end; ++r) {
          row_forward<acc_t>(in + r * n, out + r * n, n);
        }
      }
    } else {
      // Reduced precision: widen a row to float, work there, narrow back.
      std::vector<acc_t> buf(n);
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* src = in + r * n;
        for (int64_t j = 0; j < n; ++j) buf[j] = static_cast<acc_t>(src[j]);
        if constexpr (LOG) {
          log_rows_forward<acc_t>(buf.data(), buf.data(), 1, n);
        } else {
          row_forward<acc_t>(buf.data(), buf.data(), n);
        }
        scalar_t* dst = out + r * n;
        for (int64_t j = 0; j < n; ++j) dst[j] = static_cast<scalar_t>(buf[j]);
      }
    }
  });
}

// Softmax over a middle dimension: the layout is (outer, n, inner) and each
// task handles a strip of up to kStrip columns of one outer slice, so every
// inner loop below is contiguous.
template <typename scalar_t, bool LOG>
void strided_forward(const scalar_t* in, scalar_t* out, int64_t outer, int64_t n, int64_t inner) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int64_t kStrip = 64;
  const int64_t strips = (inner + kStrip - 1) / kStrip;
  at::parallel_for(0, outer * strips, 1, [&](int64_t begin, int64_t end) {
    acc_t mx[kStrip];
    acc_t sum[kStrip];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t o = t / strips;
      const int64_t k0 = (t % strips) * kStrip;
      const int64_t w = std::min(kStrip, inner - k0);
      const scalar_t* src = in + o * n * inner + k0;
      scalar_t* dst = out + o * n * inner + k0;
      for (int64_t k = 0; k < w; ++k) {
        mx[k] = -std::numeric_limits<acc_t>::infinity();
        sum[k] = 0;
      }
      for (int64_t d = 0; d < n; ++d) {
        for (int64_t k = 0; k < w; ++k) {
          const acc_t v = static_cast<acc_t>(src[d * inner + k]);
          mx[k] = (v > mx[k] || std::isnan(v)) ? v : mx[k];
        }
      }
      for (int64_t d = 0; d < n; ++d) {
        for (int64_t k = 0; k < w; ++k) {
          const acc_t e = std::exp(static_cast<acc_t>(src[d * inner + k]) - mx[k]);
          sum[k] += e;
          if (!LOG) dst[d * inner + k] = static_cast<scalar_t>(e);
        }
      }
      for (int64_t d = 0; d < n; ++d) {
        for (int64_t k = 0; k < w; ++k) {
          if (LOG) {
            dst[d * inner + k] = static_cast<scalar_t>(
                static_cast<acc_t>(src[d * inner + k]) - mx[k] - std::log(sum[k]));
          } else {
            // Recompute instead of re-reading the narrowed value, so that
            // half and bfloat16 round only once.
            const acc_t e = std::exp(static_cast<acc_t>(src[d * inner + k]) - mx[k]);
            dst[d * inner + k] = static_cast<scalar_t>(e / sum[k]);
          }
        }
      }
    }
  });
}

template <bool LOG>
Tensor forward_cpu(const Tensor& x, int64_t dim) {
  constexpr const char* op = LOG ? "log_softmax" : "softmax";
  jitops_softmax::check_input(op, x, dim);
  const int64_t d = c10::maybe_wrap_dim(dim, x.dim());
  const Tensor xc = x.contiguous();
  Tensor y = at::detail::empty_cpu(xc.sizes(), xc.scalar_type(), /*pin_memory=*/false,
                                   c10::MemoryFormat::Contiguous);
  if (xc.numel() == 0) return y;
  const int64_t n = x.dim() == 0 ? 1 : xc.size(d);
  int64_t inner = 1;
  for (int64_t i = d + 1; i < x.dim(); ++i) inner *= xc.size(i);
  const int64_t outer = xc.numel() / (n * inner);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), op, [&] {
    const scalar_t* in = xc.const_data_ptr<scalar_t>();
    scalar_t* out = y.mutable_data_ptr<scalar_t>();
    if (inner == 1) {
      lastdim_forward<scalar_t, LOG>(in, out, outer, n);
    } else {
      strided_forward<scalar_t, LOG>(in, out, outer, n, inner);
    }
  });
  return y;
}

}  // namespace

Tensor softmax_cpu(const Tensor& x, int64_t dim) { return forward_cpu<false>(x, dim); }
Tensor log_softmax_cpu(const Tensor& x, int64_t dim) { return forward_cpu<true>(x, dim); }

}  // namespace jitops_softmax
