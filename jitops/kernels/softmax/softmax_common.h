// Shared by the CPU and CUDA translation units of the softmax library: the
// kernel entry points, the input checks (the Python fake kernel repeats them
// word for word) and the shape normalisation to (outer, n, inner).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/core/WrapDimMinimal.h>
#include <jitops/dtype.h>

#include <algorithm>
#include <cstdint>
#include <optional>

namespace jitops_softmax {

using jitops::dtype_name;

inline bool is_float_type(at::ScalarType st) {
  return st == at::kFloat || st == at::kDouble || st == at::kHalf || st == at::kBFloat16;
}

// Checks the input and returns it converted as torch converts it: to `dtype`
// when one is given (torch.softmax(x, dim, dtype=...) casts first), else as is.
// The exception types are torch's: NotImplementedError for a dtype,
// IndexError for a dim.
inline at::Tensor checked_input(const char* op, const at::Tensor& x, int64_t dim,
                                std::optional<at::ScalarType> dtype) {
  const at::ScalarType st = dtype.value_or(x.scalar_type());
  TORCH_CHECK_NOT_IMPLEMENTED(is_float_type(st), op, ": expected a float16, bfloat16, float32 or float64 ",
              dtype.has_value() ? "dtype" : "tensor", ", got ", dtype_name(st),
              dtype.has_value() ? "" : ". Fix: convert the input, or pass dtype=torch.float32");
  const int64_t ndim = std::max<int64_t>(x.dim(), 1);
  TORCH_CHECK_INDEX(dim >= -ndim && dim < ndim, op, ": dim ", dim,
                    " is out of range for a tensor with ", x.dim(), " dimensions");
  return st == x.scalar_type() ? x : x.to(st);
}

inline void check_backward(const char* op, const at::Tensor& grad, const at::Tensor& out, int64_t dim) {
  TORCH_CHECK(is_float_type(out.scalar_type()), op, ": expected a float16, bfloat16, float32 or float64 output, got ",
              dtype_name(out.scalar_type()));
  TORCH_CHECK(grad.scalar_type() == out.scalar_type(), op, ": grad and out must have the same dtype, got ",
              dtype_name(grad.scalar_type()), " and ", dtype_name(out.scalar_type()));
  TORCH_CHECK(grad.sizes() == out.sizes(), op, ": grad and out must have the same shape, got ", grad.sizes(),
              " and ", out.sizes());
  const int64_t ndim = std::max<int64_t>(out.dim(), 1);
  TORCH_CHECK_INDEX(dim >= -ndim && dim < ndim, op, ": dim ", dim,
                    " is out of range for a tensor with ", out.dim(), " dimensions");
}

// A contiguous tensor seen as (outer, n, inner) around `dim`.
struct Geometry {
  int64_t outer, n, inner;
};

inline Geometry geometry(const at::Tensor& t, int64_t dim) {
  if (t.dim() == 0) return {1, 1, 1};
  const int64_t d = c10::maybe_wrap_dim(dim, t.dim());
  Geometry g{1, t.size(d), 1};
  for (int64_t i = 0; i < d; ++i) g.outer *= t.size(i);
  for (int64_t i = d + 1; i < t.dim(); ++i) g.inner *= t.size(i);
  return g;
}

using Opt = std::optional<at::ScalarType>;

at::Tensor softmax_cpu(const at::Tensor& x, int64_t dim, Opt dtype);
at::Tensor log_softmax_cpu(const at::Tensor& x, int64_t dim, Opt dtype);
at::Tensor softmax_backward_cpu(const at::Tensor& grad, const at::Tensor& out, int64_t dim);
at::Tensor log_softmax_backward_cpu(const at::Tensor& grad, const at::Tensor& out, int64_t dim);
// softmax_backward over the last dim, into `gin` (softmax_cpu_backward_lastdim.cpp).
void softmax_lastdim_backward_cpu(const at::Tensor& grad, const at::Tensor& out, at::Tensor& gin, int64_t rows,
                                  int64_t n);
#ifdef JITOPS_WITH_CUDA
at::Tensor softmax_cuda(const at::Tensor& x, int64_t dim, Opt dtype);
at::Tensor log_softmax_cuda(const at::Tensor& x, int64_t dim, Opt dtype);
at::Tensor softmax_backward_cuda(const at::Tensor& grad, const at::Tensor& out, int64_t dim);
at::Tensor log_softmax_backward_cuda(const at::Tensor& grad, const at::Tensor& out, int64_t dim);
#endif

}  // namespace jitops_softmax
