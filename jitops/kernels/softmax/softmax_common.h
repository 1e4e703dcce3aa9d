// Shared by the CPU and CUDA translation units of the softmax library:
// input checks (the Python fake kernel repeats them word for word) and the
// backward formulas, which are device-agnostic ATen expressions.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <jitops/dtype.h>

#include <algorithm>
#include <cstdint>

namespace jitops_softmax {

using jitops::dtype_name;

inline void check_input(const char* op, const at::Tensor& x, int64_t dim) {
  const auto st = x.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kDouble || st == at::kHalf || st == at::kBFloat16,
              op, ": expected a float16, bfloat16, float32 or float64 tensor, got ", dtype_name(st));
  const int64_t ndim = std::max<int64_t>(x.dim(), 1);
  TORCH_CHECK(dim >= -ndim && dim < ndim, op, ": dim ", dim,
              " is out of range for a tensor with ", x.dim(), " dimensions");
}

at::Tensor softmax_cpu(const at::Tensor& x, int64_t dim);
at::Tensor log_softmax_cpu(const at::Tensor& x, int64_t dim);
#ifdef JITOPS_WITH_CUDA
at::Tensor softmax_cuda(const at::Tensor& x, int64_t dim);
at::Tensor log_softmax_cuda(const at::Tensor& x, int64_t dim);
#endif

inline bool reduced(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
}

// d softmax: y * (g - sum(g * y)), computed in float for half/bfloat16.
inline at::Tensor softmax_backward(const at::Tensor& grad, const at::Tensor& out, int64_t dim) {
  const bool widen = reduced(out);
  const at::Tensor g = widen ? grad.to(at::kFloat) : grad;
  const at::Tensor y = widen ? out.to(at::kFloat) : out;
  at::Tensor gi = y.mul(g.sub(g.mul(y).sum(dim, /*keepdim=*/true)));
  return widen ? gi.to(out.scalar_type()) : gi;
}

// d log_softmax: g - exp(y) * sum(g), computed in float for half/bfloat16.
inline at::Tensor log_softmax_backward(const at::Tensor& grad, const at::Tensor& out, int64_t dim) {
  const bool widen = reduced(out);
  const at::Tensor g = widen ? grad.to(at::kFloat) : grad;
  const at::Tensor y = widen ? out.to(at::kFloat) : out;
  at::Tensor gi = g.sub(y.exp().mul(g.sum(dim, /*keepdim=*/true)));
  return widen ? gi.to(out.scalar_type()) : gi;
}

}  // namespace jitops_softmax
